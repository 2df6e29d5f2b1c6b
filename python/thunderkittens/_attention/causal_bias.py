"""SDPA's causal attention biases (torch.nn.attention.bias.causal_upper_left / causal_lower_right)
as the kernels' causal flags.

The kernels mask with a diagonal offset: key j is visible to query i iff j <= i + offset.
causal_upper_left is offset 0 (SDPA's is_causal: is_causal=True), causal_lower_right is offset
Lk - Lq (is_causal=True, lower_right=True; with Lq == Lk the two coincide, and it is plain
is_causal). With Lq > Lk, lower-right query rows i < Lq - Lk see no key: the kernels give them
out = 0 (and zero gradients), as SDPA's math backend and FlashAttention do. Reads only the
bias's variant and lengths, never data.
"""

from __future__ import annotations

import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

from .validate import _WHO


def as_causal_flag(query: torch.Tensor, key: torch.Tensor, attn_mask, is_causal: bool):
    """(attn_mask, is_causal, lower_right) with a causal bias turned into is_causal=True (and
    lower_right=True for causal_lower_right with Lq != Lk). Raises if the bias was made for
    other sequence lengths than query's and key's."""
    if not isinstance(attn_mask, CausalBias):
        return attn_mask, is_causal, False
    len_q, len_kv = query.shape[-2], key.shape[-2]
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (len_q, len_kv):
        raise ValueError(f"{_WHO}: attn_mask is a causal bias for (Lq, Lk) = "
                         f"({attn_mask.seq_len_q}, {attn_mask.seq_len_kv}) but query and key have "
                         f"lengths ({len_q}, {len_kv})")
    lower_right = attn_mask.variant == CausalVariant.LOWER_RIGHT and len_q != len_kv
    return None, True, lower_right


def unsupported_mask_reason(attn_mask) -> str:
    """Why the kernels cannot take this (non-None) attn_mask (causal biases never get here:
    as_causal_flag turns them into flags first)."""
    return ("attn_mask is not supported by the kernel yet (only the causal biases "
            "causal_upper_left and causal_lower_right are)")
