"""The matmul op (csrc/matmul/): its handle, fake implementation and autograd formula.

``torch.ops.tk.matmul(Tensor a, Tensor b) -> Tensor``: a (Ba, M, K) @ b (Bb, K, N) with Ba, Bb in
{1, B}, each operand TMA-readable as row- or column-major (see layout.py), bf16/fp16 on an
sm_90 GPU; returns a new contiguous (B, M, N) tensor in a's dtype, accumulated in fp32.

The fake (meta) implementation gives the output's shape, dtype and strides without running
anything, for torch.compile, torch.export, FakeTensorMode and opcheck. The autograd formula is
registered on the op (not a Python autograd.Function around the call) so that torch.compile,
torch.export and opcheck see it. For c = a @ b with a (Ba, M, K), b (Bb, K, N), c (B, M, N):

    grad_a = grad_c @ b^T    grad_b = a^T @ grad_c

Both go through tk.matmul itself, on transposed views (a row-major b is a column-major b^T, so
the kernel reads them in place, no copies; anything the kernel cannot take falls back to
torch.matmul like any call). An operand with batch 1 that was broadcast over B > 1 gets the sum
of its B gradients. Only the gradients that are needed are computed.
"""

from __future__ import annotations

import torch

from .. import _scaffold
from .plan import SM90

NAME = f"tk::{SM90.op_name}"
OP = getattr(torch.ops.tk, SM90.op_name).default


def matmul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    torch._check(a.dim() == 3 and b.dim() == 3,
                 lambda: f"{NAME}: a and b must be 3-D (batch, rows, cols)")
    torch._check(a.dtype in _scaffold.KERNEL_DTYPES and b.dtype == a.dtype,
                 lambda: f"{NAME}: a and b must both be bfloat16 or both float16")
    a_batch, m, k = a.shape
    b_batch, b_k, n = b.shape
    torch._check(b_k == k, lambda: f"{NAME}: a is {m}x{k} but b is {b_k}x{n} (K differs)")
    torch._check(a_batch == b_batch or a_batch == 1 or b_batch == 1,
                 lambda: f"{NAME}: batch sizes {a_batch} and {b_batch} must be equal or 1")
    return a.new_empty((torch.sym_max(a_batch, b_batch), m, n))


def _setup_context(ctx, inputs, output) -> None:
    a, b = inputs
    needs_grad_a, needs_grad_b = ctx.needs_input_grad[:2]
    # grad_a needs only b and grad_b only a: keep nothing the backward will not read.
    ctx.save_for_backward(a if needs_grad_b else None, b if needs_grad_a else None)
    ctx.batches = (a.shape[0], b.shape[0])


def _sum_over_broadcast_batch(grad: torch.Tensor, operand_batch: int) -> torch.Tensor:
    if operand_batch == 1 and grad.shape[0] > 1:
        return grad.sum(0, keepdim=True)
    return grad


def _backward(ctx, grad: torch.Tensor):
    from .api import matmul  # api imports this module (for OP)

    a, b = ctx.saved_tensors
    a_batch, b_batch = ctx.batches
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = _sum_over_broadcast_batch(matmul(grad, b.mT), a_batch)
    if ctx.needs_input_grad[1]:
        grad_b = _sum_over_broadcast_batch(matmul(a.mT, grad), b_batch)
    return grad_a, grad_b


torch.library.register_fake(NAME, matmul_fake)
torch.library.register_autograd(NAME, _backward, setup_context=_setup_context)
