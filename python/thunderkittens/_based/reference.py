"""PyTorch references for Based linear attention.

    s_ij = scale * <q_i, k_j>,  p(s) = 1 + s + s^2 / 2
    o_i  = sum_{j <= i} p(s_ij) v_j          (normalize: divided by sum_{j <= i} p(s_ij) + eps)

Both forms below compute in the dtype of their inputs (pass float64 for a reference):
``quadratic`` materialises the (N x N) matrix (tests only), ``chunked`` carries the state
phi-space state across chunks, so memory grows linearly with N (the fallback path).

The state is sum_j phi(k_j) [v_j, 1]^T, shape (..., 273, Dv + 1), with
phi(x) = [1, sqrt(scale) x, scale / sqrt(2) vec(x x^T)] (vec row-major), so that
phi(q) . phi(k) = p(scale q.k); its last column is the normaliser sum_j phi(k_j).
"""

from __future__ import annotations

import math

import torch

FEATURE_DIM = 16


def state_features(feature_dim: int = FEATURE_DIM) -> int:
    return 1 + feature_dim + feature_dim * feature_dim


def feature_map(x: torch.Tensor, scale: float) -> torch.Tensor:
    """phi(x): (..., F) -> (..., 1 + F + F*F)."""
    outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
    ones = torch.ones_like(x[..., :1])
    return torch.cat([ones, math.sqrt(scale) * x, (scale / math.sqrt(2.0)) * outer], dim=-1)


def _with_ones(v: torch.Tensor) -> torch.Tensor:
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)


def _finish(numerator_and_denominator: torch.Tensor, normalize: bool, eps: float) -> torch.Tensor:
    out, denominator = numerator_and_denominator[..., :-1], numerator_and_denominator[..., -1:]
    return out / (denominator + eps) if normalize else out


def quadratic(q, k, v, scale, normalize=False, eps=1e-6, initial_state=None):
    """(o, final_state) through the N x N matrix of p(s_ij)."""
    s = scale * (q @ k.transpose(-1, -2))
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    weights = torch.where(causal, 1 + s + s * s / 2, torch.zeros((), dtype=s.dtype, device=s.device))
    vo = _with_ones(v)
    total = weights @ vo
    phi_k = feature_map(k, scale)
    state = phi_k.transpose(-1, -2) @ vo
    if initial_state is not None:
        total = total + feature_map(q, scale) @ initial_state.to(total.dtype)
        state = state + initial_state.to(state.dtype)
    return _finish(total, normalize, eps), state


def chunked(q, k, v, scale, normalize=False, eps=1e-6, initial_state=None, chunk=256):
    """(o, final_state) in chunks: within a chunk the masked p(s) matrix, across chunks the state."""
    *batch, n, _ = q.shape
    dv = v.shape[-1]
    vo = _with_ones(v)
    state = (torch.zeros(*batch, state_features(q.shape[-1]), dv + 1, dtype=q.dtype, device=q.device)
             if initial_state is None else initial_state.to(q.dtype).clone())
    outs = []
    mask = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    for start in range(0, n, chunk):
        qc, kc, vc = q[..., start:start + chunk, :], k[..., start:start + chunk, :], vo[..., start:start + chunk, :]
        rows = qc.shape[-2]
        s = scale * (qc @ kc.transpose(-1, -2))
        weights = torch.where(mask[:rows, :rows], 1 + s + s * s / 2, torch.zeros((), dtype=s.dtype, device=s.device))
        outs.append(weights @ vc + feature_map(qc, scale) @ state)
        state = state + feature_map(kc, scale).transpose(-1, -2) @ vc
    total = torch.cat(outs, dim=-2) if outs else vo[..., :0, :] + state[..., :0, :1].sum()
    return _finish(total, normalize, eps), state
