"""thunderkittens.based and explain_based (based_step and explain_based_step: step.py)."""

from __future__ import annotations

import math

import torch

from .. import _scaffold
from . import plan, reference
from .checks import check_arguments
from .ops import FORWARD
from .plan import BasedPlan


def _scale_or_default(scale: float | None, feature_dim: int) -> float:
    return 1.0 / math.sqrt(feature_dim) if scale is None else float(scale)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    # The reference accumulates in float32 for 16-bit inputs (as the kernels do), float64 stays.
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _reference(q, k, v, scale, normalize, eps, initial_state):
    dtype = _compute_dtype(q)
    state = None if initial_state is None else initial_state.to(dtype)
    out, final = reference.chunked(q.to(dtype), k.to(dtype), v.to(dtype), scale, normalize, eps, state)
    return out.to(q.dtype), final


def based(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
          normalize: bool = False, eps: float = 1e-6, initial_state: torch.Tensor | None = None,
          output_final_state: bool = False):
    """Based linear attention (causal), with a second-order Taylor feature map.

    q, k (B, H, N, F) and v (B, H, N, Dv) give o (B, H, N, Dv) in q's dtype::

        s_ij = scale * <q_i, k_j>              (scale defaults to 1 / sqrt(F))
        o_i  = sum_{j <= i} (1 + s_ij + s_ij^2 / 2) v_j
        normalize=True: o_i / (sum_{j <= i} (1 + s_ij + s_ij^2 / 2) + eps)

    The recurrent state is S = sum_j phi(k_j) [v_j, 1]^T, shape (B, H, 1 + F + F*F, Dv + 1),
    with phi(x) = [1, sqrt(scale) x, scale / sqrt(2) vec(x x^T)] (vec row-major), so that
    phi(q) . phi(k) = 1 + s + s^2 / 2; its last column is the normaliser. ``initial_state``
    (such a tensor) continues from an earlier prefix; ``output_final_state=True`` returns
    ``(o, state)``, the state in float32 (float64 for float64 inputs), ready for based_step or
    the next piece of a long sequence.

    Runs our kernel for CUDA bfloat16/float16 inputs with F = 16 and Dv 64 or 128 on sm_80 or
    newer GPUs (on Hopper the TMA + wgmma one, ``sm90``; ``use_kernel("sm80", op="based")``
    forces the mma.sync one), any N and any B x H, reading strided inputs (e.g. (B, N, H, D) memory viewed as
    (B, H, N, D)) in place when the last dim is contiguous, other strides are multiples of 16
    bytes and the data 16-byte aligned (else one copy). Gradients of q, k, v and initial_state
    (through o and the final state) come from our backward kernels on the same calls (with
    normalize, the normaliser's share by PyTorch ops; no N x N memory anywhere); a second
    backward is not supported there. Other dims and dtypes and CPU tensors run the chunked
    PyTorch reference (memory linear in N), whose autograd gives the gradients.
    thunderkittens.explain_based says which path a call takes (and what computes its
    gradients); thunderkittens.strict makes the reference path an error.
    """
    check_arguments("tk.based", q, k, v, scale, normalize, eps, initial_state, "initial_state")
    if not isinstance(output_final_state, bool):
        raise TypeError(f"tk.based: output_final_state must be a bool, got "
                        f"{type(output_final_state).__name__}")
    scale = _scale_or_default(scale, q.shape[-1])
    if q.shape[2] == 0:  # nothing to compute on any path: the state passes through
        out, state = _reference(q, k, v, scale, normalize, eps, initial_state)
        return (out, state) if output_final_state else out
    family, reason = plan.decide(q, k, v, initial_state)
    if family is None:
        _scaffold.fallback_or_raise(BasedPlan, reason)
        out, state = _reference(q, k, v, scale, normalize, eps, initial_state)
        return (out, state) if output_final_state else out
    state_in = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    out, state = FORWARD[family.name](_scaffold.operand(q), _scaffold.operand(k), _scaffold.operand(v),
                                      scale, normalize, float(eps), state_in, output_final_state)
    return (out, state) if output_final_state else out


def explain_based(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                  normalize: bool = False, eps: float = 1e-6,
                  initial_state: torch.Tensor | None = None,
                  output_final_state: bool = False) -> BasedPlan:
    """Which path ``based`` would take for these arguments, and why; ``str()`` of the result is
    one line, e.g. ``kernel tk.based_fwd_sm90 [sm90 wgmma+tma] bf16 dv=64`` or ``fallback the
    PyTorch reference (chunked): feature dim 32 is not supported by the kernel (16 only)``.
    Raises the same argument errors as ``based``; does not run anything."""
    check_arguments("tk.based", q, k, v, scale, normalize, eps, initial_state, "initial_state")
    copies = tuple(name for name, t in (("q", q), ("k", k), ("v", v)) if not _scaffold.conforms(t))
    return plan.explain(q, k, v, normalize, initial_state, output_final_state, copies)
