"""References shared by the CPU and GPU tests: float64 attention, and the C++ tk::matmul's
operand rule."""

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
