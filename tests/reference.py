"""References shared by the CPU and GPU tests: float64 attention and its gradients, and the C++
tk::matmul's operand rule."""

import torch


def reference_attention(q, k, v, is_causal, scale):
    """(out, lse) in float64 from (B, Hq, Lq, D) / (B, Hkv, Lk, D) inputs.

    GQA by repeating each k/v head Hq/Hkv times (query head h uses kv head h // ratio, as SDPA's
    enable_gqa); causal is the top-left aligned mask tril(diagonal=0) on the (Lq, Lk) grid.
    lse is the natural-log log-sum-exp of the scaled, masked scores.
    """
    ratio = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(ratio, dim=1)
    v64 = v.double().repeat_interleave(ratio, dim=1)
    scores = (q.double() @ k64.transpose(-1, -2)) * scale
    if is_causal:
        visible = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(0)
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v64
    return out, lse


def reference_attention_grads(grad_out, q, k, v, is_causal, scale):
    """(dq, dk, dv) in float64 of reference_attention's out, given grad_out, written out
    explicitly (no autograd, so it also runs where autograd is off, e.g. inside an op's
    implementation). dk/dv are summed over each GQA group's query heads, as the repeated k/v
    heads of reference_attention make autograd do.

    With P = softmax(S), S = scale * q k^T (masked), O = P v:
    dv = P^T dO, dP = dO v^T, dS = P * (dP - rowsum(dO * O)),
    dq = scale * dS k, dk = scale * dS^T q.
    """
    batch, heads_q, len_q, head_dim = q.shape
    heads_kv, len_kv = k.shape[1], k.shape[2]
    ratio = heads_q // heads_kv
    q64, d_out = q.double(), grad_out.double()
    k64 = k.double().repeat_interleave(ratio, dim=1)
    v64 = v.double().repeat_interleave(ratio, dim=1)
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    if is_causal:
        visible = torch.ones(len_q, len_kv, dtype=torch.bool, device=q.device).tril(0)
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = probs @ v64
    dv = probs.transpose(-1, -2) @ d_out
    d_probs = d_out @ v64.transpose(-1, -2)
    d_scores = probs * (d_probs - (d_out * out).sum(-1, keepdim=True))
    dq = (d_scores @ k64) * scale
    dk = (d_scores.transpose(-1, -2) @ q64) * scale

    def group_sum(t):
        return t.view(batch, heads_kv, ratio, len_kv, head_dim).sum(2)

    return dq, group_sum(dk), group_sum(dv)


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
