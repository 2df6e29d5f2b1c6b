"""Argument checks for thunderkittens.attention: what F.scaled_dot_product_attention would
reject (and a few things it would accept but we do not, such as empty inputs or broadcast batch
dims), raised as ValueError/TypeError naming the argument and the rule; and SDPA's causal biases
turned into the kernels' causal flags.

Shapes follow SDPA: query (..., Hq, L, E), key (..., H, S, E), value (..., H, S, Ev). The dim
-3 is the head dim even for 3-D inputs: (N, L, E) is N independent single-head problems, which
is also what SDPA's enable_gqa does with 3-D inputs. The checks read shapes, dtypes and devices,
never tensor data.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

_WHO = "tk.attention"
_NAMES = ("query", "key", "value")


def _is_real_number(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def check_types(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> None:
    for name, t in zip(_NAMES, (query, key, value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_WHO}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"{_WHO}: attn_mask must be a torch.Tensor or None, got "
                        f"{type(attn_mask).__name__}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"{_WHO}: is_causal must be a bool, got {type(is_causal).__name__}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"{_WHO}: enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    if not _is_real_number(dropout_p):
        raise TypeError(f"{_WHO}: dropout_p must be a float, got {type(dropout_p).__name__}")
    if scale is not None and not _is_real_number(scale):
        raise TypeError(f"{_WHO}: scale must be a float or None, got {type(scale).__name__}")


def check_values(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> None:
    """Everything after the types. Uses shapes, dtypes and devices only, never tensor data."""
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{_WHO}: dropout_p must be in [0, 1], got {dropout_p}")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"{_WHO}: scale must be a finite number, got {scale}")
    if attn_mask is not None and is_causal:
        raise ValueError(f"{_WHO}: attn_mask must be None when is_causal=True "
                         "(as in F.scaled_dot_product_attention)")

    tensors = (query, key, value)
    for name, t in zip(_NAMES, tensors):
        if not t.is_floating_point():
            raise TypeError(f"{_WHO}: {name} must have a floating-point dtype, got {t.dtype}")
    for name, t in zip(_NAMES[1:], tensors[1:]):
        if t.dtype != query.dtype:
            raise TypeError(f"{_WHO}: {name} dtype {t.dtype} differs from query dtype {query.dtype}")
        if t.device != query.device:
            raise ValueError(f"{_WHO}: {name} is on {t.device} but query is on {query.device}")

    q_shape, k_shape, v_shape = query.shape, key.shape, value.shape
    rank = len(q_shape)
    if rank < 3:
        raise ValueError(f"{_WHO}: query must have at least 3 dims (..., heads, length, "
                         f"head_dim), got shape {tuple(q_shape)}")
    for name, shape in (("key", k_shape), ("value", v_shape)):
        if len(shape) != rank:
            raise ValueError(f"{_WHO}: {name} has {len(shape)} dims but query has {rank} "
                             f"({name} {tuple(shape)}, query {tuple(q_shape)})")
    for name, t in zip(_NAMES, tensors):
        if t.numel() == 0:
            raise ValueError(f"{_WHO}: {name} is empty (shape {tuple(t.shape)}); every "
                             "dimension must be at least 1")
    if rank > 3:
        for name, shape in (("key", k_shape), ("value", v_shape)):
            if shape[:-3] != q_shape[:-3]:
                raise ValueError(f"{_WHO}: {name} batch dims {tuple(shape[:-3])} differ from "
                                 f"query batch dims {tuple(q_shape[:-3])} (no broadcasting)")

    heads_q, heads_k, heads_v = q_shape[-3], k_shape[-3], v_shape[-3]
    if heads_k != heads_v:
        raise ValueError(f"{_WHO}: key has {heads_k} heads but value has {heads_v}")
    if heads_q != heads_k:
        if not enable_gqa:
            raise ValueError(f"{_WHO}: query has {heads_q} heads but key has {heads_k}; pass "
                             "enable_gqa=True for grouped-query attention")
        if heads_q % heads_k != 0:
            raise ValueError(f"{_WHO}: with enable_gqa=True, query heads ({heads_q}) must be a "
                             f"multiple of key heads ({heads_k})")
    if k_shape[-1] != q_shape[-1]:
        raise ValueError(f"{_WHO}: key head dim {k_shape[-1]} differs from query head dim "
                         f"{q_shape[-1]}")
    if v_shape[-2] != k_shape[-2]:
        raise ValueError(f"{_WHO}: value length {v_shape[-2]} differs from key length "
                         f"{k_shape[-2]}")


# ---- SDPA's causal biases -----------------------------------------------------------------
# torch.nn.attention.bias.causal_upper_left / causal_lower_right as the kernels' causal flags.
# The kernels mask with a diagonal offset: key j is visible to query i iff j <= i + offset.
# causal_upper_left is offset 0 (SDPA's is_causal: is_causal=True), causal_lower_right is offset
# Lk - Lq (is_causal=True, lower_right=True; with Lq == Lk the two coincide, and it is plain
# is_causal). With Lq > Lk, lower-right query rows i < Lq - Lk see no key: the kernels give them
# out = 0 (and zero gradients), as SDPA's math backend and FlashAttention do.


def as_causal_flag(query: torch.Tensor, key: torch.Tensor, attn_mask, is_causal: bool):
    """(attn_mask, is_causal, lower_right) with a causal bias turned into is_causal=True (and
    lower_right=True for causal_lower_right with Lq != Lk). Raises if the bias was made for
    other sequence lengths than query's and key's. Reads the bias's variant and lengths only."""
    if not isinstance(attn_mask, CausalBias):
        return attn_mask, is_causal, False
    len_q, len_kv = query.shape[-2], key.shape[-2]
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (len_q, len_kv):
        raise ValueError(f"{_WHO}: attn_mask is a causal bias for (Lq, Lk) = "
                         f"({attn_mask.seq_len_q}, {attn_mask.seq_len_kv}) but query and key have "
                         f"lengths ({len_q}, {len_kv})")
    lower_right = attn_mask.variant == CausalVariant.LOWER_RIGHT and len_q != len_kv
    return None, True, lower_right
