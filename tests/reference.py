"""References shared by the CPU and GPU tests: float64 attention and its gradients, SDPA's own
answer for causal_lower_right (the GPU tests' yardstick), and the C++ tk::matmul's operand
rule."""

import warnings

import torch
import torch.nn.functional as F


def causal_offset_of(q, k, lower_right):
    """The ops' causal diagonal offset (csrc/attention/attention_ops.cpp) for (B, H, Lq, D) q and
    (B, H, Lk, D) k: Lk - Lq for lower_right (SDPA's causal_lower_right), else 0."""
    return k.shape[2] - q.shape[2] if lower_right else 0


def _masked_scores(q64, k64, is_causal, scale, causal_offset):
    """Scaled scores, -inf where key j is hidden from query i (causal: j > i + causal_offset)."""
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    if is_causal:
        visible = torch.ones(q64.shape[2], k64.shape[2], dtype=torch.bool,
                             device=q64.device).tril(causal_offset)
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores


def _probabilities(scores):
    """softmax over keys, with rows that see no key all 0 (torch.softmax of an all -inf row is
    NaN): what FlashAttention and SDPA's math backend give such rows."""
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    return torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)


def reference_attention(q, k, v, is_causal, scale, *, causal_offset=0):
    """(out, lse) in float64 from (B, Hq, Lq, D) / (B, Hkv, Lk, D) inputs.

    GQA by repeating each k/v head Hq/Hkv times (query head h uses kv head h // ratio, as SDPA's
    enable_gqa); causal is the mask tril(diagonal=causal_offset) on the (Lq, Lk) grid: 0 is
    SDPA's is_causal (top-left), Lk - Lq its causal_lower_right. lse is the natural-log
    log-sum-exp of the scaled, masked scores. A row that sees no key (causal_offset < 0) has
    out 0 and lse -inf.
    """
    ratio = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(ratio, dim=1)
    v64 = v.double().repeat_interleave(ratio, dim=1)
    scores = _masked_scores(q.double(), k64, is_causal, scale, causal_offset)
    lse = torch.logsumexp(scores, dim=-1)
    out = _probabilities(scores) @ v64
    return out, lse


def reference_attention_grads(grad_out, q, k, v, is_causal, scale, *, causal_offset=0):
    """(dq, dk, dv) in float64 of reference_attention's out, given grad_out, written out
    explicitly (no autograd, so it also runs where autograd is off, e.g. inside an op's
    implementation). dk/dv are summed over each GQA group's query heads, as the repeated k/v
    heads of reference_attention make autograd do.

    With P = softmax(S), S = scale * q k^T (masked), O = P v:
    dv = P^T dO, dP = dO v^T, dS = P * (dP - rowsum(dO * O)),
    dq = scale * dS k, dk = scale * dS^T q.
    A row that sees no key (causal_offset < 0) has P = 0: dq 0 there, and no share in dk/dv.
    """
    batch, heads_q, len_q, head_dim = q.shape
    heads_kv, len_kv = k.shape[1], k.shape[2]
    ratio = heads_q // heads_kv
    q64, d_out = q.double(), grad_out.double()
    k64 = k.double().repeat_interleave(ratio, dim=1)
    v64 = v.double().repeat_interleave(ratio, dim=1)
    probs = _probabilities(_masked_scores(q64, k64, is_causal, scale, causal_offset))
    out = probs @ v64
    dv = probs.transpose(-1, -2) @ d_out
    d_probs = d_out @ v64.transpose(-1, -2)
    d_scores = probs * (d_probs - (d_out * out).sum(-1, keepdim=True))
    dq = (d_scores @ k64) * scale
    dk = (d_scores.transpose(-1, -2) @ q64) * scale

    def group_sum(t):
        return t.view(batch, heads_kv, ratio, len_kv, head_dim).sum(2)

    return dq, group_sum(dk), group_sum(dv)


def lower_right_bias(len_q, len_kv):
    """torch.nn.attention.bias.causal_lower_right(len_q, len_kv), without its warning that
    Lq > Lk "will produce NaNs" (the rows that see no key: tk gives them 0, and so does SDPA's
    math backend)."""
    from torch.nn.attention.bias import causal_lower_right
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return causal_lower_right(len_q, len_kv)


def sdpa_causal_lower_right(q, k, v, scale):
    """F.scaled_dot_product_attention's own answer for attn_mask=causal_lower_right(Lq, Lk) on
    (B, Hq, Lq, D) / (B, Hkv, Lk, D) inputs, differentiable: the yardstick of PyTorch's error.
    k/v are repeated to q's heads (the bias's fused paths take no enable_gqa). With Lq > Lk
    the first Lq - Lk query rows see no key: they are computed apart as 0 (SDPA's fused
    kernels may give NaN there; the math backend gives 0), the others are plain is_causal
    attention of the last Lk query rows."""
    ratio = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(ratio, dim=1) for t in (k, v))
    len_q, len_kv = q.shape[2], k.shape[2]
    if len_q < len_kv:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=lower_right_bias(len_q, len_kv),
                                              scale=scale)
    hidden = len_q - len_kv
    seen = F.scaled_dot_product_attention(q[:, :, hidden:], k, v, is_causal=True, scale=scale)
    return torch.cat([seen.new_zeros(seen.shape[:2] + (hidden, seen.shape[3])), seen], dim=2)


def tma_layout(t):
    """The C++ tk::matmul's operand rule (csrc/matmul/matmul_ops.cpp), restated on its own so
    tests can hold the Python path choice to it: "row", "col" or None for a 3-D tensor.
    Strides of size-1 dims do not matter; the other strides must be multiples of 8 elements
    (16 bytes) except the contiguous one; the data must be 16-byte aligned."""
    def aligned(dim):
        return t.shape[dim] == 1 or t.stride(dim) % 8 == 0
    if not aligned(0) or t.data_ptr() % 16 != 0:
        return None
    if (t.shape[2] == 1 or t.stride(2) == 1) and aligned(1):
        return "row"
    if (t.shape[1] == 1 or t.stride(1) == 1) and aligned(2):
        return "col"
    return None
