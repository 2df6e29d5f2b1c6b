"""thunderkittens.attention and thunderkittens.explain_attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import _config
from ..errors import FallbackError
from .causal_bias import as_causal_flag
from .explanation import AttentionPlan
from .families import FAMILIES
from .operands import conforms, kernel_operand, to_4d
from .plan import decide, needs_grad
from .validate import check_types, check_values

# The op behind each kernel family, resolved once (torch.ops lookups are not free).
_OPS = {family.name: getattr(torch.ops.tk, family.op_name).default for family in FAMILIES}


def _nested_reason(query, key, value) -> str | None:
    if query.is_nested or key.is_nested or value.is_nested:
        return "nested tensors are not supported by the kernel"
    return None


def _decide(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """(family or None, fallback reason or None, attn_mask, is_causal, lower_right): the
    arguments come back with a causal bias turned into the kernels' flags (is_causal=True, and
    lower_right=True for causal_lower_right with Lq != Lk). A fallback gets the caller's
    lower-right bias back: SDPA has no lower-right flag (for the other biases is_causal=True
    gives SDPA's same answer)."""
    check_types(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    reason = _nested_reason(query, key, value)
    if reason is not None:  # SDPA validates nested inputs itself
        return None, reason, attn_mask, is_causal, False
    check_values(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    given_mask, given_causal = attn_mask, is_causal
    attn_mask, is_causal, lower_right = as_causal_flag(query, key, attn_mask, is_causal)
    family, reason = decide(query, key, value, attn_mask, dropout_p, scale)
    if family is None and lower_right:
        return None, reason, given_mask, given_causal, False
    return family, reason, attn_mask, is_causal, lower_right


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False) -> torch.Tensor:
    """Scaled dot-product attention with the contract of F.scaled_dot_product_attention.

    query (..., Hq, L, E), key (..., H, S, E), value (..., H, S, Ev) -> (..., Hq, L, Ev).
    Runs our kernel for CUDA bf16/fp16 inputs with E == Ev in {64, 128} (and 96 on Hopper), no
    mask and no dropout (sm_80 or newer GPU); when query/key/value require grad, only on Hopper (sm_90),
    whose kernel family has a backward: out.backward() then runs tk::attention_bwd_sm90 (other
    GPUs compute such calls with SDPA). Everything else is computed by
    F.scaled_dot_product_attention (see thunderkittens.explain for which path a call takes, and
    thunderkittens.strict to make a fallback an error). ``is_causal`` masks top-left aligned
    (query i sees keys j <= i), as SDPA does; ``attn_mask`` may be SDPA's causal bias
    ``torch.nn.attention.bias.causal_upper_left(Lq, Lk)`` (the same mask) or
    ``causal_lower_right(Lq, Lk)`` (query i sees keys j <= i + Lk - Lq), both on the kernel for
    any lengths. With Lq > Lk, lower-right query rows i < Lq - Lk see no key: their output
    rows (and gradients) are 0, as with SDPA's math backend and FlashAttention. With
    enable_gqa, key/value are used with their own head count (no repeated copies).

    Inputs whose layout the kernel cannot read directly (last dim not contiguous, other strides
    not multiples of 8 elements, data not 16-byte aligned) are copied once with .contiguous().
    The result is a new contiguous tensor.
    """
    family, reason, attn_mask, is_causal, lower_right = _decide(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if family is None:
        if _config.strict_enabled():
            raise FallbackError(f"tk.attention would fall back to torch SDPA: {reason}")
        return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    head_dim = query.shape[-1]
    softmax_scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out, _lse = _OPS[family.name](kernel_operand(query), kernel_operand(key),
                                  kernel_operand(value), is_causal, softmax_scale, lower_right)
    return out.view(tuple(query.shape[:-1]) + (head_dim,))


def _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The fallback: F.scaled_dot_product_attention. For a scale <= 0 it is pinned to the math
    backend: the fused backends take the running max of unscaled scores, which is only right
    for a positive scale (on an H200 with torch 2.11 they returned NaN for scale=-0.125)."""
    call = lambda: F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,  # noqa: E731
                                                  dropout_p=dropout_p, is_causal=is_causal,
                                                  scale=scale, enable_gqa=enable_gqa)
    if scale is not None and scale <= 0 and query.device.type == "cuda":
        with sdpa_kernel(SDPBackend.MATH):
            return call()
    return call()


def explain_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                      is_causal: bool = False, scale: float | None = None,
                      enable_gqa: bool = False) -> AttentionPlan:
    """Which path ``attention`` would take for these arguments, and why; ``str()`` of the result
    is one line, e.g. ``kernel tk.attention_fwd [sm80 mma.sync] bf16 d=128 causal gqa=4`` (``causal
    lower-right`` for causal_lower_right with Lq != Lk) or
    ``fallback torch SDPA: dropout_p > 0 is not supported by the kernel yet``. Raises the same
    argument errors as ``attention``; does not run the kernel."""
    family, reason, attn_mask, is_causal, lower_right = _decide(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    copies = ()
    if family is not None:
        copies = tuple(name for name, t in (("query", query), ("key", key), ("value", value))
                       if not _is_view_that_conforms(t))
    nested = query.is_nested or key.is_nested or value.is_nested
    gqa = 1 if nested else max(1, query.shape[-3] // key.shape[-3])
    backward_op = (f"tk.{family.backward_op_name}"
                   if family is not None and needs_grad(query, key, value) else None)
    return AttentionPlan(
        uses_kernel=family is not None, reason=reason,
        kernel=family.name if family else None,
        kernel_description=family.description if family else None,
        op=f"tk.{family.op_name}" if family else None,
        dtype=query.dtype, head_dim=int(query.shape[-1]),
        causal=is_causal, lower_right=lower_right, gqa_ratio=gqa, copies=copies,
        strict=_config.strict_enabled(),
        backward_op=backward_op,
        deterministic_backward=backward_op is not None and torch.are_deterministic_algorithms_enabled())


def _is_view_that_conforms(t: torch.Tensor) -> bool:
    t4 = to_4d(t)
    if t4.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
        return False  # flattening the batch dims already had to copy
    return conforms(t4)
