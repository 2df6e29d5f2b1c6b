"""Fake (meta) implementation of tk::attention_fwd and tk::attention_fwd_sm90 (same contract): output shapes, dtypes and strides without
running anything, for torch.compile, torch.export, FakeTensorMode and opcheck. It mirrors the
C++ op: out is a new contiguous (B, Hq, Lq, D) tensor in q's dtype, lse a new contiguous
(B, Hq, Lq) float32 tensor."""

from __future__ import annotations

import torch


def attention_fwd_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                 lambda: "tk::attention_fwd: q, k and v must be 4-D (batch, heads, length, head_dim)")
    torch._check(q.dtype in (torch.bfloat16, torch.float16) and k.dtype == q.dtype
                 and v.dtype == q.dtype,
                 lambda: "tk::attention_fwd: q, k and v must all be bfloat16 or all float16")
    batch, heads_q, len_q, head_dim = q.shape
    torch._check(k.shape[-1] == head_dim and v.shape[-1] == head_dim,
                 lambda: "tk::attention_fwd: q, k and v must have the same head_dim")
    torch._check(heads_q % k.shape[1] == 0,
                 lambda: "tk::attention_fwd: q heads must be a multiple of k/v heads")
    out = q.new_empty((batch, heads_q, len_q, head_dim))
    lse = q.new_empty((batch, heads_q, len_q), dtype=torch.float32)
    return out, lse


for _op in ("tk::attention_fwd", "tk::attention_fwd_sm90"):
    torch.library.register_fake(_op)(attention_fwd_fake)
