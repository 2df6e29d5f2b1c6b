"""thunderkittens.matmul and thunderkittens.explain_matmul."""

from __future__ import annotations

import torch

from .. import _scaffold
from . import plan
from .ops import OP
from .plan import MatmulPlan


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Matrix product with the contract of torch.matmul (shapes, broadcasting, dtype, autograd).

    Runs our TMA + wgmma kernel (fp32 accumulation, output in the inputs' dtype) for CUDA
    bfloat16/float16 inputs on an sm_90 (Hopper: H100/H200) GPU when both operands are at least
    2-D: 2-D @ 2-D, batched 3-D or N-D @ 3-D/N-D (equal batch dims, or one side's all 1),
    3-D @ 2-D and 2-D @ 3-D. On other GPUs (e.g. A100, RTX 4090) tk.matmul is torch.matmul,
    i.e. cuBLAS. Also computed by torch.matmul: 1-D operands, CPU tensors, other dtypes, empty
    dims, batch dims that only broadcast partially (e.g. (2, 1, ...) with (1, 3, ...)) or that
    cannot be flattened into one without a copy, and builds without the matmul family or
    sm_90a code. See thunderkittens.explain_matmul for which path a call takes, and
    thunderkittens.strict to make a fallback an error.

    The kernel reads each operand in place as a row-major or a column-major matrix, so
    transposed views (``a.mT``, ``b.mT``, e.g. ``x @ w.mT`` as in nn.Linear) cost no copy. TMA
    needs every stride but the contiguous one to be a multiple of 8 elements (16 bytes) and the
    data 16-byte aligned: an operand that meets this only after ``.contiguous()`` is copied once
    (explain_matmul lists the copies); where TMA alignment rules cannot be met, torch.matmul is
    used (e.g. a row-major (M, K) a with K % 8 != 0).

    Gradients flow through both paths; on the kernel path they are computed by this same
    function (grad @ b^T and a^T @ grad, on transposed views). Bad arguments (non-tensors,
    mismatched dtypes or devices, inner dimensions that differ, 0-D inputs, batch dims that do
    not broadcast) raise errors that are both ValueError/TypeError and RuntimeError (what
    torch.matmul raises), on every path alike. The result is a new contiguous tensor.
    """
    call, reason = plan.decide(a, b)
    if call is None:
        _scaffold.fallback_or_raise(MatmulPlan, reason)
        return torch.matmul(a, b)
    problem = call.problem
    a3 = _scaffold.fresh_copy(problem.a) if call.copy_a else problem.a
    b3 = _scaffold.fresh_copy(problem.b) if call.copy_b else problem.b
    return OP(a3, b3).view(problem.out_shape)


def explain_matmul(a: torch.Tensor, b: torch.Tensor) -> MatmulPlan:
    """Which path ``matmul(a, b)`` would take, and why; ``str()`` of the result is one line,
    e.g. ``kernel tk.matmul [sm90 wgmma] bf16 (B=4) 4096x4096x4096 a=row b=col`` or
    ``fallback torch.matmul: inputs are on cpu; the kernel needs a CUDA GPU``. Raises the same
    argument errors as ``matmul``; does not run anything."""
    return plan.explain(a, b)
