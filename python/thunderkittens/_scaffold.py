"""What every op shares: its kernel families and the choice among them, the plan that its
explain() returns, strict mode, the device/dtype/build checks, and the operand layout the
kernels read.

An op package (``_attention``, ``_matmul``, ...) declares its families with
register_families(), asks choose_family() which one runs a call (or why none can), describes the
call with a Plan subclass, and calls fallback_or_raise() before it takes the PyTorch path.

Every function here reads shapes, strides, dtypes, devices and configuration, never tensor
data: it is cheap, and torch.compile traces it (the outcome is baked into the graph, guarded on
those same properties).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from . import _config, _extension
from .errors import FallbackError

# The device type the kernels run on. A module constant (not a literal in the check) so the CPU
# test suite can trace the kernel path against CPU stand-ins of the ops.
KERNEL_DEVICE_TYPE = "cuda"
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
REBUILD = "pip install --no-build-isolation ."


# ---- the GPU and the kernel families ------------------------------------------------------


@torch.compiler.assume_constant_result
def device_capability(index: int) -> tuple[int, int]:
    """(major, minor) compute capability of CUDA device ``index``. A trace-time constant under
    torch.compile: the device a tensor lives on is already guarded on, and the GPU behind a
    device index does not change while a process runs."""
    return torch.cuda.get_device_capability(index)


def _sm(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


@dataclass(frozen=True)
class KernelFamily:
    """One kernel implementation of an op, with its hardware needs (an op may subclass this to
    add what its kernels are built for, such as attention's head dims)."""

    op: str                         # the op it implements, e.g. "attention"
    name: str                       # what use_kernel / TK_<OP>_KERNEL take, e.g. "sm80"
    description: str                # shown by explain(), e.g. "sm80 mma.sync"
    op_name: str                    # the torch.ops.tk op that runs it
    min_capability: tuple[int, int]
    exact_capability: tuple[int, int] | None = None  # arch-specific code (sm_90a) runs only there
    backward_op_name: str | None = None  # the torch.ops.tk op of its backward pass, if any
    # The reason on a GPU other than exact_capability, if not the default; {gpu} is this GPU.
    wrong_gpu_reason: str | None = None
    # False: "auto" does not pick it by its place in the op's families; the op's plan decides when
    # it runs (attention's decode kernel: short queries against long keys). It can be forced.
    in_auto_order: bool = True

    @property
    def has_backward(self) -> bool:
        return self.backward_op_name is not None

    def unavailable_reason(self, capability: tuple[int, int]) -> str | None:
        """Why this family cannot run on a GPU of ``capability`` with this build, or None."""
        # The messages are made only when returned: this runs on every op call.
        if self.exact_capability is not None and capability != self.exact_capability:
            if self.wrong_gpu_reason is not None:
                return self.wrong_gpu_reason.format(gpu=_sm(capability))
            return (f"the {self.name} kernels need an {_sm(self.exact_capability)} GPU, this one is "
                    f"{_sm(capability)}")
        if capability < self.min_capability:
            return (f"the {self.name} kernels need {_sm(self.min_capability)} or newer, this GPU is "
                    f"{_sm(capability)}")
        if self.exact_capability is not None:
            # wgmma, TMA multicast and setmaxnreg exist only in arch-specific code (sm_90a).
            if not _extension.has_arch_specific_code_for(capability):
                target = f"{capability[0]}{capability[1]}a"
                return (f"this build has no sm_{target} code (built for {_built_archs()}); rebuild "
                        f"with e.g. TK_CUDA_ARCHS={target} {REBUILD}")
        elif not _extension.has_kernel_image_for(capability):
            # An sm_90 build is a 90a build: the sm90 kernels need it, and it runs these too.
            target = f"{capability[0]}{capability[1]}{'a' if capability == (9, 0) else ''}"
            return (f"this build has no code for {_sm(capability)} (built for {_built_archs()}); "
                    f"rebuild with e.g. TK_CUDA_ARCHS={target} {REBUILD}")
        return None


def _built_archs() -> str:
    return ",".join(_extension.BUILT_ARCHS)


# Each op's families, in the order "auto" prefers them.
_FAMILIES: dict[str, tuple[KernelFamily, ...]] = {}
_BY_NAME: dict[str, dict[str, KernelFamily]] = {}


def register_families(*families: KernelFamily) -> dict[str, KernelFamily]:
    """Declare an op's kernel families, in the order ``auto`` prefers them; returns them by
    name. An op with several families has a switch in _config.KNOWN_KERNELS naming them all."""
    op = families[0].op
    names = tuple(family.name for family in families)
    assert all(family.op == op for family in families), names
    assert set(_config.KNOWN_KERNELS.get(op, names)) == set(names), \
        f"keep _config.KNOWN_KERNELS[{op!r}] in step with the {op} families {names}"
    _FAMILIES[op] = tuple(families)
    _BY_NAME[op] = {family.name: family for family in families}
    return dict(_BY_NAME[op])


def kernel_choice(op: str) -> str:
    """"auto" or the family forced for ``op`` (use_kernel / TK_<OP>_KERNEL; ops without that
    switch are always "auto")."""
    return _config.kernel_choice(op) if op in _config.KNOWN_KERNELS else "auto"


def forced_prefix(family: KernelFamily) -> str:
    """What a fallback reason starts with when the user forced ``family``."""
    return f"kernel {family.name} was forced but " if kernel_choice(family.op) != "auto" else ""


def unsupported_input_reason(op: str, t: torch.Tensor) -> str | None:
    """Why no kernel of ``op`` takes inputs with ``t``'s device type and dtype, or None."""
    if t.device.type != KERNEL_DEVICE_TYPE:
        kernels = "the kernels need" if len(_FAMILIES[op]) > 1 else "the kernel needs"
        return f"inputs are on {t.device.type}; {kernels} a CUDA GPU"
    if t.dtype not in KERNEL_DTYPES:
        return f"dtype {t.dtype} is not supported by the kernel (bfloat16 and float16 only)"
    return None


def choose_family(op: str, device: torch.device) -> tuple[KernelFamily | None, str | None]:
    """(family, None) if a family of ``op`` built into this extension runs on ``device`` (the
    forced one, or under "auto" the first that can), else (None, reason)."""
    if op not in _extension.BUILT_OPS:
        built = ",".join(sorted(_extension.BUILT_OPS)) or "none"
        return None, (f"the {op} op family was not compiled into this build (families built: "
                      f"{built}); rebuild with TK_OPS unset")
    found = _family_or_reason(op, device.index, kernel_choice(op))
    if found.startswith(_NO_FAMILY):
        return None, found[len(_NO_FAMILY):]
    return _BY_NAME[op][found], None


_NO_FAMILY = "\x00"


@torch.compiler.assume_constant_result
def _family_or_reason(op: str, index: int, choice: str) -> str:
    """The name of the family of ``op`` to run on CUDA device ``index`` (``choice``: "auto" or a
    forced family), or _NO_FAMILY + why none can. One string, a trace-time constant under
    torch.compile: torch 2.11's dynamo cannot guard a comparison of the capability tuple
    (NotImplementedError for a constant source), so the tuple never reaches traced code."""
    capability = device_capability(index)
    if choice != "auto":
        reason = _BY_NAME[op][choice].unavailable_reason(capability)
        return choice if reason is None else f"{_NO_FAMILY}kernel {choice} was forced but {reason}"
    reasons = []
    for family in _FAMILIES[op]:
        if not family.in_auto_order:
            continue
        reason = family.unavailable_reason(capability)
        if reason is None:
            return family.name
        reasons.append(reason)
    return _NO_FAMILY + "; ".join(reasons)


# ---- the plan: what explain() returns, and strict mode ------------------------------------


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The path a call takes, printable in one line: ``kernel <op> [<kernel>] <dtype> <details>``
    or ``fallback <PyTorch function>: <reason>``. Each op subclasses it with its own fields,
    its names (``function``, ``fallback``) and details()."""

    function: ClassVar[str]         # the public function, e.g. "tk.attention"
    fallback: ClassVar[str]         # what computes a call the kernels do not take, e.g. "torch SDPA"

    uses_kernel: bool
    reason: str | None              # why it falls back (None on the kernel path)
    kernel: str | None              # family name, e.g. "sm80"
    kernel_description: str | None  # e.g. "sm80 mma.sync"
    op: str | None                  # e.g. "tk.attention_fwd_sm80"
    dtype: torch.dtype
    # Inputs that get one fresh contiguous copy: for the kernel, or on the fallback for the peer.
    copies: tuple[str, ...] = ()
    peer_note: str | None = None    # on the fallback: how the peer is called, where that differs
    strict: bool                    # strict mode: a fallback would raise FallbackError

    def details(self) -> list[str]:
        """The words after the dtype on the kernel path (shapes, flags)."""
        return []

    def __str__(self) -> str:
        if not self.uses_kernel:
            text = f"fallback {self.fallback}: {self.reason}"
            if self.copies:
                text += f" (copies {', '.join(self.copies)} with .contiguous() for {self.fallback})"
            if self.peer_note:
                text += f" ({self.peer_note})"
            return text + (f" (strict mode: {self.function} raises FallbackError)" if self.strict else "")
        parts = [f"kernel {self.op} [{self.kernel_description}]",
                 DTYPE_NAMES.get(self.dtype, str(self.dtype)), *self.details()]
        if self.copies:
            parts.append(f"(copies {', '.join(self.copies)} with .contiguous())")
        return " ".join(parts)


def fallback_or_raise(plan_type: type[Plan], reason: str) -> None:
    """Returns if the call may take the PyTorch path; in strict mode raises FallbackError."""
    if _config.strict_enabled():
        raise FallbackError(f"{plan_type.function} would fall back to {plan_type.fallback}: {reason}")


# ---- operand layout -----------------------------------------------------------------------
# The kernels load 16 bytes at a time (vector loads, TMA): every stride but the contiguous one
# must be a multiple of 16 bytes and the data 16-byte aligned. Under torch.compile the data
# pointer is unknown while tracing (and dynamo cannot trace storage_offset()), so only strides
# are checked there; a view at an address that is not 16-byte aligned then makes the op raise
# instead of being copied. The C++ ops check the real pointer.

ELEMENTS_PER_16_BYTES = 8  # bf16 / fp16


def is_aligned(t: torch.Tensor) -> bool:
    """Whether ``t``'s data is 16-byte aligned (True where there is no data pointer to check)."""
    if torch.compiler.is_compiling():
        return True
    if type(t) is torch.Tensor and not t.is_meta:  # the common case, decided in two calls
        return t.data_ptr() % 16 == 0
    if isinstance(t, (FakeTensor, FunctionalTensor)) or t.device.type == "meta":
        return True  # no data: e.g. AOT autograd or opcheck tracing a backward formula
    try:
        return t.data_ptr() % 16 == 0
    except RuntimeError:  # another tensor subclass without storage
        return True


def conforms(t: torch.Tensor) -> bool:
    """Whether a kernel can read ``t`` in place: last dim contiguous, the stride of every other
    dim of size > 1 a multiple of 16 bytes, data 16-byte aligned (strides of size-1 dims never
    matter: the C++ side replaces them with well-formed values)."""
    return strides_conform(t) and is_aligned(t)


def strides_conform(t: torch.Tensor) -> bool:
    """conforms() but for the data pointer: what ``t``'s shape, strides and dtype decide."""
    strides = t.stride()  # one call for all dims: this runs on every op call's operands
    if strides[-1] != 1:
        return False
    per_16_bytes = max(1, 16 // t.element_size())
    for size, stride in zip(t.shape[:-1], strides[:-1]):
        if size != 1 and stride % per_16_bytes != 0:
            return False
    return True


def fresh_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy in a new (so 16-byte aligned) allocation. clone, not .contiguous(): a
    contiguous view at a misaligned address must be copied too."""
    return t.clone(memory_format=torch.contiguous_format)


def operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself if a kernel can read it in place (conforms), else a fresh contiguous copy."""
    return t if conforms(t) else fresh_copy(t)


# A fallback hands the call to PyTorch's own function, whose fused CUDA kernels load 16 bytes at
# a time too but do not all check the layout: SDPA (torch 2.11, H200) returned garbage for views
# 8 bytes off a 16-byte boundary and faulted with "misaligned address" on others. On the
# kernels' device a fallback therefore gets the layout the kernels read (conforms) wherever one
# copy gives it.


def peer_needs_copy(t: torch.Tensor) -> bool:
    """Whether the fallback hands PyTorch a fresh contiguous copy of ``t`` rather than ``t``:
    on the kernels' device, when ``t`` does not conform and its copy would, or when its data is
    not 16-byte aligned or its last dim not contiguous. (A last dim whose bytes are not a
    multiple of 16 gives unaligned strides even contiguous: PyTorch's fused kernels pad such
    tensors into a new allocation themselves, or leave them to its math path.)"""
    if t.device.type != KERNEL_DEVICE_TYPE or t.dim() == 0 or conforms(t):
        return False
    if (t.shape[-1] * t.element_size()) % 16 == 0:
        return True
    return (t.stride(-1) != 1 and t.shape[-1] != 1) or not is_aligned(t)
