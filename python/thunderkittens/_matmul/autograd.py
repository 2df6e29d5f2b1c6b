"""Autograd formula of tk::matmul, registered on the op so that torch.compile, torch.export and
opcheck see it (not a Python autograd.Function around the call).

For c = a @ b with a (Ba, M, K), b (Bb, K, N), c (B, M, N):

    grad_a = grad_c @ b^T    grad_b = a^T @ grad_c

Both go through tk.matmul itself, on transposed views (a row-major b is a column-major b^T, so
the kernel reads them in place, no copies; anything the kernel cannot take falls back to
torch.matmul like any call). An operand with batch 1 that was broadcast over B > 1 gets the sum
of its B gradients. Only the gradients that are needed are computed.
"""

from __future__ import annotations

import torch

from . import op as _op
from .api import matmul


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
    a, b = ctx.saved_tensors
    a_batch, b_batch = ctx.batches
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = _sum_over_broadcast_batch(matmul(grad, b.mT), a_batch)
    if ctx.needs_input_grad[1]:
        grad_b = _sum_over_broadcast_batch(matmul(a.mT, grad), b_batch)
    return grad_a, grad_b


if _op.OP is not None:  # an extension built before tk::matmul existed has no op to register on
    torch.library.register_autograd(_op.NAME, _backward, setup_context=_setup_context)
