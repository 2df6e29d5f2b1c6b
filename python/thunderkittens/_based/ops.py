"""The Based ops (csrc/based/): their handles and fake implementations.

``tk::based_fwd_sm80(q, k, v, scale, normalize, eps, initial_state, output_final_state)
-> (o, final_state)``: q, k (B, H, N, 16), v (B, H, N, Dv) with Dv 64 or 128, bf16/fp16, each
readable in place (see _scaffold.conforms); initial_state None or a contiguous float32
(B, H, 273, Dv + 1) tensor. o is a new contiguous (B, H, N, Dv) tensor in q's dtype;
final_state a new contiguous float32 (B, H, 273, Dv + 1) tensor when output_final_state, else
an empty one.

The fake (meta) implementation gives the outputs' shapes, dtypes and strides without running
anything, for torch.compile, torch.export, FakeTensorMode and opcheck.
"""

from __future__ import annotations

import torch

from .. import _scaffold
from .plan import FAMILIES
from .reference import state_features

#: The forward op of each family, by family name (torch.ops lookups are not free).
FORWARD = {family.name: getattr(torch.ops.tk, family.op_name).default for family in FAMILIES}


def _forward_fake(who: str):
    def fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, normalize: bool,
             eps: float, initial_state: torch.Tensor | None,
             output_final_state: bool) -> tuple[torch.Tensor, torch.Tensor]:
        torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                     lambda: f"{who}: q, k and v must be 4-D (batch, heads, length, dim)")
        torch._check(q.dtype in _scaffold.KERNEL_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype,
                     lambda: f"{who}: q, k and v must all be bfloat16 or all float16")
        torch._check(k.shape == q.shape and v.shape[:3] == q.shape[:3],
                     lambda: f"{who}: k must have q's shape and v q's batch, heads and length")
        batch, heads, _, features = q.shape
        state_shape = (batch, heads, state_features(features), v.shape[-1] + 1)
        if initial_state is not None:
            torch._check(initial_state.dtype == torch.float32 and initial_state.shape == state_shape,
                         lambda: f"{who}: initial_state must be a float32 {state_shape} tensor")
        out = v.new_empty(v.shape)
        final = q.new_empty(state_shape if output_final_state else (0,), dtype=torch.float32)
        return out, final
    return fake


for _family in FAMILIES:
    torch.library.register_fake(f"tk::{_family.op_name}", _forward_fake(f"tk::{_family.op_name}"))
