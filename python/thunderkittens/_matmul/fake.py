"""Fake (meta) implementation of tk::matmul: the output's shape, dtype and strides without
running anything, for torch.compile, torch.export, FakeTensorMode and opcheck. It mirrors the
C++ op: a (Ba, M, K) @ b (Bb, K, N) with Ba, Bb in {1, B} gives a new contiguous (B, M, N)
tensor in a's dtype."""

from __future__ import annotations

import torch

from . import op as _op


def matmul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    torch._check(a.dim() == 3 and b.dim() == 3,
                 lambda: "tk::matmul: a and b must be 3-D (batch, rows, cols)")
    torch._check(a.dtype in (torch.bfloat16, torch.float16) and b.dtype == a.dtype,
                 lambda: "tk::matmul: a and b must both be bfloat16 or both float16")
    a_batch, m, k = a.shape
    b_batch, b_k, n = b.shape
    torch._check(b_k == k, lambda: f"tk::matmul: a is {m}x{k} but b is {b_k}x{n} (K differs)")
    torch._check(a_batch == b_batch or a_batch == 1 or b_batch == 1,
                 lambda: f"tk::matmul: batch sizes {a_batch} and {b_batch} must be equal or 1")
    return a.new_empty((torch.sym_max(a_batch, b_batch), m, n))


if _op.OP is not None:  # an extension built before tk::matmul existed has no op to describe
    torch.library.register_fake(_op.NAME, matmul_fake)
