"""Fake (meta) implementations of the attention ops: output shapes, dtypes and strides without
running anything, for torch.compile, torch.export, FakeTensorMode and opcheck. They mirror the
C++ ops:

- tk::attention_fwd and tk::attention_fwd_sm90 (same contract): out is a new contiguous
  (B, Hq, Lq, D) tensor in q's dtype, lse a new contiguous (B, Hq, Lq) float32 tensor.
- tk::attention_bwd_sm90: dq a new contiguous tensor shaped like q, dk/dv new contiguous
  tensors shaped like k/v (already summed over each GQA group), all in q's dtype.

All three reject lower_right=True without is_causal, as the C++ ops do.
"""

from __future__ import annotations

import torch


def _check_lower_right(who: str, is_causal: bool, lower_right: bool) -> None:
    torch._check(is_causal or not lower_right,
                 lambda: f"{who}: lower_right=True needs is_causal=True (it moves the causal "
                         "diagonal to the bottom-right corner; without is_causal there is no "
                         "diagonal)")


def attention_fwd_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                       scale: float,
                       lower_right: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    _check_lower_right("tk::attention_fwd", is_causal, lower_right)
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


def attention_bwd_fake(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, is_causal: bool, scale: float,
                       lower_right: bool = False, deterministic: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    who = "tk::attention_bwd_sm90"
    _check_lower_right(who, is_causal, lower_right)
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                 lambda: f"{who}: q, k and v must be 4-D (batch, heads, length, head_dim)")
    torch._check(q.dtype in (torch.bfloat16, torch.float16) and k.dtype == q.dtype
                 and v.dtype == q.dtype and out.dtype == q.dtype and grad_out.dtype == q.dtype,
                 lambda: f"{who}: grad_out, q, k, v and out must all be bfloat16 or all float16")
    torch._check(out.shape == q.shape and grad_out.shape == q.shape,
                 lambda: f"{who}: out and grad_out must have q's shape")
    torch._check(k.shape == v.shape and k.shape[0] == q.shape[0] and k.shape[-1] == q.shape[-1],
                 lambda: f"{who}: k and v must be (batch, heads_kv, len_kv, head_dim) like q")
    torch._check(q.shape[1] % k.shape[1] == 0,
                 lambda: f"{who}: q heads must be a multiple of k/v heads")
    torch._check(lse.dtype == torch.float32 and lse.shape == q.shape[:3],
                 lambda: f"{who}: lse must be the forward's float32 (batch, heads_q, len_q) tensor")
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape))


for _op in ("tk::attention_fwd", "tk::attention_fwd_sm90"):
    torch.library.register_fake(_op)(attention_fwd_fake)

if hasattr(torch.ops.tk, "attention_bwd_sm90"):  # absent from extensions built before it existed
    torch.library.register_fake("tk::attention_bwd_sm90")(attention_bwd_fake)
