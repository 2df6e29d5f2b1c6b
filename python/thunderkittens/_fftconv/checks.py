"""Argument checks for thunderkittens.fftconv: ValueError/TypeError naming the argument and the
rule. Shapes, dtypes and devices only, never tensor data."""

from __future__ import annotations

import torch

_WHO = "tk.fftconv"


def check_arguments(u, k, pregate, postgate) -> None:
    for name, t in (("u", u), ("k", k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_WHO}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{_WHO}: {name} must have a floating-point dtype, got {t.dtype}")
    if u.dim() != 3:
        raise ValueError(f"{_WHO}: u must be 3-D (batch, heads, length), got shape {tuple(u.shape)}")
    if k.dim() != 2:
        raise ValueError(f"{_WHO}: k must be 2-D (heads, filter length), got shape {tuple(k.shape)}")
    if u.numel() == 0:
        raise ValueError(f"{_WHO}: u is empty (shape {tuple(u.shape)}); every dimension must be at least 1")
    if k.device != u.device:
        raise ValueError(f"{_WHO}: k is on {k.device} but u is on {u.device}")
    if k.shape[0] != u.shape[1]:
        raise ValueError(f"{_WHO}: k has {k.shape[0]} heads but u has {u.shape[1]}")
    if not 1 <= k.shape[1] <= u.shape[2]:
        raise ValueError(f"{_WHO}: k's length must be 1 .. u's length {u.shape[2]}, got {k.shape[1]}")
    for name, gate in (("pregate", pregate), ("postgate", postgate)):
        if gate is None:
            continue
        if not isinstance(gate, torch.Tensor):
            raise TypeError(f"{_WHO}: {name} must be a torch.Tensor or None, got {type(gate).__name__}")
        if gate.dtype != u.dtype:
            raise TypeError(f"{_WHO}: {name} dtype {gate.dtype} differs from u dtype {u.dtype}")
        if gate.device != u.device:
            raise ValueError(f"{_WHO}: {name} is on {gate.device} but u is on {u.device}")
        if gate.shape != u.shape:
            raise ValueError(f"{_WHO}: {name} must have u's shape {tuple(u.shape)}, got {tuple(gate.shape)}")
