"""Float64 reference attention, shared by the CPU and GPU tests."""

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
