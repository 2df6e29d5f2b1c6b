"""thunderkittens.based_step and explain_based_step: decoding against the recurrent state of
tk.based, by the step kernel (csrc/based/step.cu) or by PyTorch ops.

The ops (csrc/registration.cpp): ``tk::based_step_sm80(q, k, v, state, scale, normalize, eps)
-> (o, new_state)`` returns a new contiguous float32 state and leaves ``state`` alone (it reads
any float32 state: the op copies one that is not contiguous and 16-byte aligned);
``tk::based_step_inplace_sm80(...) -> o`` writes the new state into ``state`` (float32, rows
contiguous, no two (batch, head) slices sharing memory). q, k (B, H, T, 16), v (B, H, T, Dv),
Dv 64 or 128, bf16/fp16, any strides; o is a new contiguous (B, H, T, Dv) tensor in q's dtype.
Their fake (meta) implementations below serve torch.compile, torch.export and opcheck.

Like the rest of the package's path choice, nothing here reads tensor data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _config, _scaffold
from .._scaffold import Plan
from . import reference, step_calls
from .api import _compute_dtype
from .step_calls import check_step_arguments, decide

STEP = torch.ops.tk.based_step_sm80.default
STEP_INPLACE = torch.ops.tk.based_step_inplace_sm80.default
STEP_OP_NAME = "based_step_sm80"
STEP_INPLACE_OP_NAME = "based_step_inplace_sm80"
DESCRIPTION = "sm80 CUDA cores"  # memory-bound: the state is read and written once, no tensor cores


@dataclass(frozen=True, kw_only=True)
class BasedStepPlan(Plan):
    """What thunderkittens.explain_based_step() returns: the path a based_step call would take."""

    function = "tk.based_step"
    fallback = "PyTorch ops"

    value_dim: int
    tokens: int
    normalize: bool
    inplace: bool

    def details(self) -> list[str]:
        parts = [f"dv={self.value_dim}", f"tokens={self.tokens}"]
        if self.normalize:
            parts.append("normalized")
        parts.append("in place" if self.inplace else "-> new state")
        return parts


def _updates_in_place(state: torch.Tensor) -> bool:
    """Whether the in-place op can take ``state`` as it is (else: the op that returns a new state,
    then one copy_ back)."""
    return state.is_contiguous()


def _state_copied(state: torch.Tensor, inplace: bool) -> bool:
    """Whether the kernel path copies ``state`` first (the op returning a new state reads only a
    contiguous, 16-byte aligned one in place)."""
    if inplace and _updates_in_place(state):
        return False
    return not (state.is_contiguous() and _scaffold.is_aligned(state))


def reference_step(q, k, v, state, scale: float, normalize: bool, eps: float, inplace: bool):
    """The step by PyTorch ops (the fallback; differentiable), in the state's precision (float32
    for a 16-bit state): (o in q's dtype, the new state or ``state`` updated)."""
    dtype = _compute_dtype(state)
    out, new_state = reference.chunked(q.to(dtype), k.to(dtype), v.to(dtype), scale, normalize,
                                       eps, state.to(dtype))
    if inplace:
        return out.to(q.dtype), state.copy_(new_state)
    return out.to(q.dtype), new_state.to(state.dtype)


def based_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
               scale: float | None = None, normalize: bool = False, eps: float = 1e-6,
               inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoding: T new tokens (q, k (B, H, T, F), v (B, H, T, Dv), usually T = 1) against the
    recurrent state of tk.based (B, H, 1 + F + F*F, Dv + 1). Returns ``(o, new_state)``, o in
    q's dtype, exactly what tk.based over the whole sequence gives for these rows: the tokens
    are applied in order, each one's o seeing the state with itself added. With
    ``inplace=True`` the new state is written into ``state`` (which is returned), so a
    preallocated state serves a whole generation (and CUDA-graph capture).

    Runs our kernel for CUDA bfloat16/float16 tokens with F = 16, Dv 64 or 128 and a float32
    state on sm_80 or newer GPUs: it reads and writes the state once per call, whatever T
    (up to 4 tokens per pass over it); q, k and v are read in place whatever their strides. A
    state that is not contiguous is copied once (and, in place, copied back). Calls that need
    gradients, other dims and dtypes, and CPU tensors run PyTorch ops in the state's precision
    (float32 for a 16-bit state), whose autograd gives gradients of q, k, v and state.
    thunderkittens.explain_based_step says which path a call takes; thunderkittens.strict
    makes the PyTorch path an error. For a long piece (prefill), tk.based with initial_state is
    the faster path.
    """
    call = step_calls.prepare(q, k, v, state, scale, normalize, eps, inplace)
    if call.family is None:
        if not call.no_tokens:  # no tokens: nothing to compute on any path
            _scaffold.fallback_or_raise(BasedStepPlan, call.reason)
        return reference_step(q, k, v, state, call.scale, normalize, call.eps, inplace)
    if inplace and _updates_in_place(state):
        return STEP_INPLACE(q, k, v, state, call.scale, normalize, call.eps), state
    out, new_state = STEP(q, k, v, state, call.scale, normalize, call.eps)
    if inplace:
        return out, state.copy_(new_state)
    return out, new_state


def explain_based_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
                       scale: float | None = None, normalize: bool = False, eps: float = 1e-6,
                       inplace: bool = False) -> BasedStepPlan:
    """Which path ``based_step`` would take for these arguments, and why; ``str()`` of the result
    is one line, e.g. ``kernel tk.based_step_inplace_sm80 [sm80 CUDA cores] bf16 dv=64 tokens=1
    in place`` or ``fallback PyTorch ops: state dtype torch.float64 is not supported by the
    kernel (float32 only)``. Raises the same argument errors as ``based_step``; runs nothing."""
    check_step_arguments(q, k, v, state, scale, normalize, eps, inplace)
    family, reason = decide(q, k, v, state)
    op = None
    if family is not None:
        op = STEP_INPLACE_OP_NAME if inplace and _updates_in_place(state) else STEP_OP_NAME
    return BasedStepPlan(uses_kernel=family is not None, reason=reason,
                         kernel=family.name if family else None,
                         kernel_description=DESCRIPTION if family else None,
                         op=f"tk.{op}" if op else None, dtype=q.dtype,
                         copies=("state",) if family and _state_copied(state, inplace) else (),
                         strict=_config.strict_enabled(), value_dim=int(v.shape[-1]),
                         tokens=int(q.shape[2]), normalize=normalize, inplace=inplace)


# ---- fake (meta) implementations ------------------------------------------------------------


def _check_fake(who: str, q, k, v, state) -> tuple[int, int, int, int]:
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                 lambda: f"{who}: q, k and v must be 4-D (batch, heads, tokens, dim)")
    torch._check(q.dtype in _scaffold.KERNEL_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype,
                 lambda: f"{who}: q, k and v must all be bfloat16 or all float16")
    torch._check(k.shape == q.shape and v.shape[:3] == q.shape[:3],
                 lambda: f"{who}: k must have q's shape and v q's batch, heads and tokens")
    batch, heads, tokens, features = q.shape
    value_dim = v.shape[-1]
    state_shape = (batch, heads, reference.state_features(features), value_dim + 1)
    torch._check(state.dtype == torch.float32 and state.shape == state_shape,
                 lambda: f"{who}: state must be a float32 {state_shape} tensor")
    return batch, heads, tokens, value_dim


@torch.library.register_fake(f"tk::{STEP_OP_NAME}")
def _step_fake(q, k, v, state, scale, normalize, eps):
    batch, heads, tokens, value_dim = _check_fake(f"tk::{STEP_OP_NAME}", q, k, v, state)
    return q.new_empty((batch, heads, tokens, value_dim)), state.new_empty(state.shape)


@torch.library.register_fake(f"tk::{STEP_INPLACE_OP_NAME}")
def _step_inplace_fake(q, k, v, state, scale, normalize, eps):
    batch, heads, tokens, value_dim = _check_fake(f"tk::{STEP_INPLACE_OP_NAME}", q, k, v, state)
    return q.new_empty((batch, heads, tokens, value_dim))
