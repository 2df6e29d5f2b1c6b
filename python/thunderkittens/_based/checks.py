"""Argument checks for thunderkittens.based and based_step: ValueError/TypeError naming the
argument and the rule. Shapes, dtypes and devices only, never tensor data.

q, k (B, H, N, F) and v (B, H, N, Dv); the state (B, H, 1 + F + F*F, Dv + 1).
"""

from __future__ import annotations

import math
from numbers import Real

import torch

from .reference import state_features


def _is_real_number(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def check_arguments(who: str, q, k, v, scale, normalize, eps, state, state_name: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{who}: {name} must have a floating-point dtype, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{who}: {name} must be 4-D (batch, heads, length, dim), got shape "
                             f"{tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{who}: {name} dtype {t.dtype} differs from q dtype {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{who}: {name} is on {t.device} but q is on {q.device}")
    if k.shape != q.shape:
        raise ValueError(f"{who}: k must have q's shape (batch, heads, length, feature dim), got "
                         f"q {tuple(q.shape)} and k {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"{who}: v must have q's batch, heads and length, got q "
                         f"{tuple(q.shape)} and v {tuple(v.shape)}")
    for name, t in (("q", q), ("v", v)):
        if t.shape[-1] == 0 or t.shape[0] == 0 or t.shape[1] == 0:
            raise ValueError(f"{who}: {name} has an empty batch, head or feature dim (shape "
                             f"{tuple(t.shape)})")
    if not isinstance(normalize, bool):
        raise TypeError(f"{who}: normalize must be a bool, got {type(normalize).__name__}")
    if scale is not None:
        if not _is_real_number(scale):
            raise TypeError(f"{who}: scale must be a float or None, got {type(scale).__name__}")
        if not math.isfinite(scale) or scale <= 0:
            # phi(x) carries sqrt(scale): the feature map is only real for a positive scale.
            raise ValueError(f"{who}: scale must be finite and positive, got {scale}")
    if not _is_real_number(eps) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{who}: eps must be a finite number >= 0, got {eps!r}")
    if state is not None:
        check_state(who, state_name, state, q, v)


def check_state(who: str, name: str, state, q: torch.Tensor, v: torch.Tensor) -> None:
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"{who}: {name} must be a torch.Tensor or None, got {type(state).__name__}")
    if not state.is_floating_point():
        raise TypeError(f"{who}: {name} must have a floating-point dtype, got {state.dtype}")
    if state.device != q.device:
        raise ValueError(f"{who}: {name} is on {state.device} but q is on {q.device}")
    expected = (q.shape[0], q.shape[1], state_features(q.shape[-1]), v.shape[-1] + 1)
    if tuple(state.shape) != expected:
        raise ValueError(f"{who}: {name} must have shape (batch, heads, 1 + F + F*F, Dv + 1) = "
                         f"{expected} for q {tuple(q.shape)} and v {tuple(v.shape)}, got "
                         f"{tuple(state.shape)}")
