"""thunderkittens.attention and thunderkittens.explain_attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import _scaffold
from . import calls, plan
from .ops import forward_op
from .plan import AttentionPlan


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
    rows are 0 and their gradients 0, on every path (as with FlashAttention; the SDPA fallback
    runs SDPA on the other rows only, where SDPA's fused backends would give NaN). So do the
    rows a boolean or additive attn_mask leaves no key (all False or all -inf; on a GPU SDPA
    gets them seeing every key, and they are set to 0 after). With enable_gqa, key/value are
    used with their own head count (no repeated copies).

    Inputs whose layout the kernel cannot read directly (last dim not contiguous, other strides
    not multiples of 16 bytes, data not 16-byte aligned) are copied once with .contiguous().
    On the SDPA fallback on a GPU, such inputs (and attn_mask) are copied once too where the
    copy is aligned, since SDPA's fused kernels misread some of them; gradients flow back
    through the copies. The result is a new tensor: contiguous from the kernels, strided as
    SDPA makes it on the fallback.
    """
    call = calls.prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return run_prepared(call, query, key, value, dropout_p, scale, enable_gqa)


def run_prepared(call: calls.Call, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 dropout_p: float, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    """tk.attention once calls.prepare has made ``call`` of the same arguments: for callers that
    also need the decision (the transformers integration counts the paths), so that a call
    decides once. ``call.op`` takes the caller's tensors as they are when their data is 16-byte
    aligned (the rest of its layout is in the key the call was prepared under)."""
    op = call.op
    if op is not None and not (query.data_ptr() | key.data_ptr() | value.data_ptr()) & 15:
        return op(query, key, value, call.is_causal, call.scale, call.lower_right)[0]
    return run_decided(call.decision, query, key, value, dropout_p, scale, enable_gqa)


def run_decided(decision, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                dropout_p: float, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    """tk.attention once plan.decide has made ``decision`` on the same arguments."""
    family, reason, attn_mask, is_causal, lower_right = decision
    if family is None:
        _scaffold.fallback_or_raise(AttentionPlan, reason)
        return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    head_dim = query.shape[-1]
    softmax_scale = plan.softmax_scale(head_dim, scale)
    operands = (plan.kernel_operand(query), plan.kernel_operand(key), plan.kernel_operand(value))
    out = forward_op(family, query, key, value)(*operands, is_causal, softmax_scale, lower_right)[0]
    if query.dim() == 4:
        return out  # already (B, Hq, Lq, E)
    return out.view(tuple(query.shape[:-1]) + (head_dim,))


def _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The fallback: F.scaled_dot_product_attention, as plan.fallback_call says (copies of
    operands SDPA's fused kernels may misread; lower-right rows that see no key as zeros; no flash
    backend where it may split the keys). For a scale <= 0 it is pinned to the math backend on
    every device: the fused backends take the running max of unscaled scores, which is only right
    for a positive scale (on an H200 with torch 2.11 they returned NaN for scale=-0.125, and so
    does the CPU's flash backend)."""
    call = plan.fallback_call(query, key, value, attn_mask, dropout_p, is_causal)
    hidden = call.hidden_rows
    operands = {"query": query[..., hidden:, :] if hidden else query, "key": key, "value": value,
                "attn_mask": call.attn_mask}
    for name in call.copies:
        operands[name] = _scaffold.fresh_copy(operands[name])
    seen = None
    if call.guard_mask_rows:
        operands["attn_mask"], seen = _guard_mask_rows(operands["attn_mask"])
    run = lambda: F.scaled_dot_product_attention(  # noqa: E731
        operands["query"], operands["key"], operands["value"], attn_mask=operands["attn_mask"],
        dropout_p=dropout_p, is_causal=call.is_causal, scale=scale, enable_gqa=enable_gqa)
    if scale is not None and scale <= 0:
        with sdpa_kernel(SDPBackend.MATH):
            out = run()
    elif call.without_flash:
        with sdpa_kernel(plan.SDPA_BACKENDS_WITHOUT_FLASH):
            out = run()
    else:
        out = run()
    if seen is not None:
        out = torch.where(seen, out, 0.0)
    if hidden:
        out = torch.cat([out.new_zeros(out.shape[:-2] + (hidden, out.shape[-1])), out], dim=-2)
    return out


def _guard_mask_rows(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask for SDPA, seen): the mask with every query row that sees no key (all False, or all
    -inf) made to see every key, and ``seen`` (mask's leading shape, Lq, 1), False for those rows
    (their output is set to 0). Leading dims the mask was expanded over (stride 0) stay size 1,
    so the new mask is no larger than the memory the caller's took."""
    index = tuple(slice(0, 1) if mask.stride(dim) == 0 and mask.shape[dim] > 1 else slice(None)
                  for dim in range(mask.dim() - 2))
    mask = mask[index]
    if mask.dtype == torch.bool:
        seen = mask.any(dim=-1, keepdim=True)
        return mask | ~seen, seen
    seen = (mask != float("-inf")).any(dim=-1, keepdim=True)
    return mask.masked_fill(~seen, 0.0), seen


def explain_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                      is_causal: bool = False, scale: float | None = None,
                      enable_gqa: bool = False) -> AttentionPlan:
    """Which path ``attention`` would take for these arguments, and why; ``str()`` of the result
    is one line, e.g. ``kernel tk.attention_fwd_sm80 [sm80 mma.sync] bf16 d=128 causal gqa=4``
    (``causal lower-right`` for causal_lower_right with Lq != Lk) or
    ``fallback torch SDPA: dropout_p > 0 is not supported by the kernel yet``. Raises the same
    argument errors as ``attention``; does not run the kernel."""
    return plan.explain(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
