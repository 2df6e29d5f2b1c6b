"""SDPA's causal attention biases (torch.nn.attention.bias.causal_upper_left / causal_lower_right)
as the kernels' causal flag.

The kernels mask top-left aligned (query i sees keys j <= i), which is causal_upper_left, and
also causal_lower_right when Lq == Lk (the two diagonals coincide). causal_lower_right with
Lq != Lk needs a diagonal offset the kernels do not take yet: such calls keep the bias and go
to SDPA. Reads only the bias's variant and lengths, never data.
"""

from __future__ import annotations

import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

from .validate import _WHO


def as_causal_flag(query: torch.Tensor, key: torch.Tensor, attn_mask, is_causal: bool):
    """(attn_mask, is_causal) with a causal bias the kernels compute turned into is_causal=True.
    Raises if the bias was made for other sequence lengths than query's and key's."""
    if not isinstance(attn_mask, CausalBias):
        return attn_mask, is_causal
    len_q, len_kv = query.shape[-2], key.shape[-2]
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (len_q, len_kv):
        raise ValueError(f"{_WHO}: attn_mask is a causal bias for (Lq, Lk) = "
                         f"({attn_mask.seq_len_q}, {attn_mask.seq_len_kv}) but query and key have "
                         f"lengths ({len_q}, {len_kv})")
    if attn_mask.variant == CausalVariant.UPPER_LEFT or len_q == len_kv:
        return None, True
    return attn_mask, is_causal


def unsupported_mask_reason(attn_mask) -> str:
    """Why the kernels cannot take this (non-None) attn_mask."""
    if isinstance(attn_mask, CausalBias):
        return ("attn_mask causal_lower_right with Lq != Lk is not supported by the kernel yet "
                "(causal_upper_left, and causal_lower_right with Lq == Lk, are)")
    return ("attn_mask is not supported by the kernel yet (only the causal biases "
            "causal_upper_left and causal_lower_right are)")
