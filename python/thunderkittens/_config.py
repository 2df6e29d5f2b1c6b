"""Run-time switches: which kernel family an op uses, and whether fallbacks are errors.

Each switch has an environment variable (read at call time) and a context manager (which wins
over the variable while it is active):

  TK_ATTENTION_KERNEL = auto | sm90 | sm80 | decode  ``with thunderkittens.use_kernel("sm80"):``
  TK_BASED_KERNEL = auto | sm90 | sm80       ``with thunderkittens.use_kernel("sm80", op="based"):``
  TK_FFTCONV_KERNEL = auto | sm80 | sm90     ``with thunderkittens.use_kernel("sm80", op="fftconv"):``
  TK_STRICT = 1 | 0                          ``with thunderkittens.strict():``

The context managers keep their state in module globals, not thread-locals, because
torch.compile can read (and guard on) plain globals; do not flip them from several threads at
once. Under torch.compile the environment variables are read once, when a function is traced.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})

# Ops with a choice of kernel families, and those families, besides "auto". Kept here (not
# imported from the op packages) so that this module has no dependencies;
# _scaffold.register_families checks each op's table against it.
KNOWN_KERNELS: dict[str, tuple[str, ...]] = {
    "attention": ("sm90", "sm80", "decode"),
    "based": ("sm90", "sm80"),
    "fftconv": ("sm80", "sm90"),
}

_strict_stack: list[bool] = []
_kernel_stack: dict[str, list[str]] = {op: [] for op in KNOWN_KERNELS}


# Names as os.environ stores them (POSIX: encoded bytes), made once per name.
_ENV_KEYS: dict[str, object] = {}


def environ_value(name: str) -> str:
    """``os.environ.get(name, "")``, read now, without its cost for a variable that is not set
    (os.environ's get raises and catches a KeyError then: 0.7 us, on every op call that reads a
    switch). On POSIX it looks in the dict under os.environ, which os.environ's own writes (and
    monkeypatch.setenv/delenv) keep in step; elsewhere it is os.environ.get."""
    env = os.environ
    data = getattr(env, "_data", None)
    if os.name != "posix" or type(data) is not dict:
        return env.get(name, "")
    key = _ENV_KEYS.get(name)
    if key is None:
        key = _ENV_KEYS[name] = env.encodekey(name)
    raw = data.get(key)
    return "" if raw is None else env.decodevalue(raw)


@torch.compiler.assume_constant_result
def _environ(name: str) -> str:
    # Dynamo cannot trace os.environ; this makes the value a trace-time constant instead.
    return environ_value(name)


def _check_op(op: str) -> None:
    if op not in KNOWN_KERNELS:
        raise ValueError(f"unknown op {op!r}; known ops: {sorted(KNOWN_KERNELS)}")


def _check_kernel(op: str, kernel: object, source: str) -> str:
    allowed = ("auto",) + KNOWN_KERNELS[op]
    if not isinstance(kernel, str) or kernel.strip().lower() not in allowed:
        raise ValueError(f"{source}: kernel must be one of {list(allowed)} for {op}, got {kernel!r}")
    return kernel.strip().lower()


def env_var_for(op: str) -> str:
    return f"TK_{op.upper()}_KERNEL"


def kernel_choice(op: str) -> str:
    """The kernel family requested for ``op``: 'auto' or a family name such as 'sm80'."""
    stack = _kernel_stack[op]
    if stack:
        return stack[-1]
    name = env_var_for(op)
    raw = _environ(name)
    return _check_kernel(op, raw or "auto", f"environment variable {name}")


@contextlib.contextmanager
def use_kernel(kernel: str, op: str = "attention") -> Iterator[None]:
    """Select the kernel family for ``op`` inside the block ('auto' restores automatic choice).

    'auto' picks the best family built for the GPU the inputs live on; naming a family forces it
    (e.g. the sm_80 mma.sync kernels on a Hopper GPU). A forced family that cannot run on the
    inputs' GPU makes the call fall back (or raise, in strict mode) with the reason.
    """
    _check_op(op)
    choice = _check_kernel(op, kernel, "use_kernel")
    _kernel_stack[op].append(choice)
    try:
        yield
    finally:
        _kernel_stack[op].pop()


def strict_enabled() -> bool:
    """Whether a fallback to the PyTorch path must raise FallbackError instead."""
    if _strict_stack:
        return _strict_stack[-1]
    raw = _environ("TK_STRICT").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"environment variable TK_STRICT must be one of 1/0/true/false/yes/no/on/off, "
                     f"got {raw!r}")


@contextlib.contextmanager
def strict(enabled: bool = True) -> Iterator[None]:
    """Inside the block, a call that would fall back to PyTorch raises FallbackError instead
    (``strict(False)`` turns strict mode off inside the block, whatever TK_STRICT says)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"strict(enabled): enabled must be a bool, got {enabled!r}")
    _strict_stack.append(enabled)
    try:
        yield
    finally:
        _strict_stack.pop()
