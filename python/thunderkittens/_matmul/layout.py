"""What the kernel is handed: torch.matmul's operands as the op's 3-D ones, and how the kernel
reads each (csrc/matmul/matmul_ops.cpp applies the same operand rule; keep them in step).

**Shapes.** The op computes a (Ba, M, K) @ b (Bb, K, N) with Ba, Bb in {1, B}. Only views are
made to get there, never copies:

- a 2-D operand gets a batch of 1 (``unsqueeze``); the kernel broadcasts a batch of 1;
- the broadcast leading dims of an N-D operand are flattened into one batch dim, when the
  operand either carries all of them (its batch shape is the broadcast one) or none (all 1),
  and its strides let the batch dims merge into one (otherwise: fallback, with the reason);
- a batch dim of stride 0 (an expanded tensor: one matrix repeated) is read as a batch of 1
  when the other operand carries the batch;
- when b has a batch of 1 and a's batch sits right above its rows in memory (any contiguous
  a), a's batch is folded into its rows: one (1, B*M, K) @ (1, K, N) product, as torch.matmul
  itself does, which fills the GPU better than B small products.

The kernel's (B, M, N) output is contiguous, so viewing it as torch.matmul's output shape (the
broadcast batch dims, then M, N) is free.

**Layouts.** The kernel loads tiles with TMA, which needs every stride but the contiguous one
to be a multiple of 16 bytes (8 elements of bf16/fp16) and the data 16-byte aligned (see
_scaffold). An operand is read as one of two layouts:

  row-major     cols contiguous: (batch, rows, cols) strides (s0, s1, 1), s0 and s1 % 8 == 0
  column-major  rows contiguous: strides (s0, 1, s2), s0 and s2 % 8 == 0 (e.g. ``x.mT``)

Strides of size-1 dims never matter (the C++ op ignores them), and row-major is preferred when
both hold. These are the C++ op's rules, with one addition: a stride of 0 on a dim of size > 1
(an expanded tensor) is never read in place; such an operand is copied instead of trusting
TMA with a zero stride.

Anything else gets one documented ``.contiguous()`` copy if the copy would be readable (a fresh
allocation is aligned), and falls back to torch.matmul if not (e.g. a row-major (M, K) matrix
with K % 8 != 0 stays unreadable however it is copied).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .._scaffold import ELEMENTS_PER_16_BYTES, is_aligned


# ---- layouts ------------------------------------------------------------------------------

ROW = "row"
COLUMN = "col"


def _stride_ok(size: int, stride: int) -> bool:
    """A non-contiguous dim: TMA needs its byte stride to be a nonzero multiple of 16."""
    return size == 1 or (stride != 0 and stride % ELEMENTS_PER_16_BYTES == 0)


def _contiguous_ok(size: int, stride: int) -> bool:
    return size == 1 or stride == 1


def layout_from(shape, strides) -> str | None:
    """ROW, COLUMN or None for a (batch, rows, cols) operand with these sizes and strides,
    ignoring the data pointer."""
    batch, rows, cols = shape
    if not _stride_ok(batch, strides[0]):
        return None
    if _contiguous_ok(cols, strides[2]) and _stride_ok(rows, strides[1]):
        return ROW
    if _contiguous_ok(rows, strides[1]) and _stride_ok(cols, strides[2]):
        return COLUMN
    return None


def contiguous_strides(shape) -> tuple[int, int, int]:
    """The strides .contiguous() gives a (batch, rows, cols) tensor."""
    _batch, rows, cols = shape
    return (rows * cols, cols, 1)


def layout_of(t: torch.Tensor) -> str | None:
    """ROW or COLUMN if the kernel can read the 3-D tensor ``t`` in place, else None."""
    layout = layout_from(t.shape, t.stride())
    if layout is None or not is_aligned(t):
        return None
    return layout


def layout_after_copy(t: torch.Tensor) -> str | None:
    """The layout a .contiguous() copy of the 3-D tensor ``t`` would be read as, or None."""
    return layout_from(t.shape, contiguous_strides(t.shape))


def unreadable_reason(name: str, t: torch.Tensor, dim_names: tuple[str, str]) -> str:
    """Why the 3-D operand ``t`` cannot be read even after a copy (for the fallback reason)."""
    _batch, rows, cols = t.shape
    rows_name, cols_name = dim_names
    need = f"{rows_name} % 8 == 0" if cols == 1 else f"{cols_name} % 8 == 0"
    return (f"where TMA alignment rules cannot be met, torch.matmul is used: {name} "
            f"({rows_name}={rows}, {cols_name}={cols}, batch {t.shape[0]}) cannot be read as "
            f"row- or column-major, in place or after .contiguous(), since TMA needs every "
            f"stride but the unit one to be a multiple of 8 elements (16 bytes); that needs "
            f"{need}")


# ---- shapes -------------------------------------------------------------------------------


class Problem(NamedTuple):
    a: torch.Tensor              # (Ba, M, K) view of the caller's a
    b: torch.Tensor              # (Bb, K, N) view of the caller's b
    out_shape: tuple[int, ...]   # torch.matmul's output shape
    folded_batch: int            # a's batch folded into M (1: nothing folded)


def _batch_dims_merge(t: torch.Tensor, batch_rank: int) -> bool:
    """Whether t's first ``batch_rank`` dims can be viewed as one dim. Size-1 dims are
    skipped: their strides never matter."""
    live = [(t.shape[d], t.stride(d)) for d in range(batch_rank) if t.shape[d] != 1]
    for (_, outer), (size, inner) in zip(live, live[1:]):  # a loop, not all(...): see _extension
        if outer != inner * size:
            return False
    return True


def _to_3d(name: str, t: torch.Tensor, out_batch: tuple) -> tuple[torch.Tensor | None, str | None]:
    """(t as (Bt, rows, cols) with Bt in {1, prod(out_batch)}, None), or (None, reason)."""
    rows, cols = t.shape[-2], t.shape[-1]
    if t.dim() == 2:
        return t.unsqueeze(0), None
    batch = tuple(t.shape[:-2])
    if math.prod(batch) == 1:
        return t.reshape(1, rows, cols), None  # drops size-1 dims only: always a view
    padded = (1,) * (len(out_batch) - len(batch)) + batch
    if padded != tuple(out_batch):
        return None, (f"the batch dims of {name} {batch} broadcast against the other operand's "
                      f"to {tuple(out_batch)} but are neither all of them nor all 1, so they "
                      "cannot be flattened into one batch dim without a copy")
    if not _batch_dims_merge(t, len(batch)):
        return None, (f"the batch dims of {name} {batch} (strides {tuple(t.stride())[:-2]}) "
                      "cannot be flattened into one batch dim without a copy")
    return t.reshape(math.prod(batch), rows, cols), None


def _drop_repeated_batch(a3: torch.Tensor, b3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Read a stride-0 batch as a batch of 1 when the other operand has a real batch."""
    def repeated(t):
        return t.shape[0] > 1 and t.stride(0) == 0
    if repeated(a3) and not repeated(b3) and b3.shape[0] == a3.shape[0]:
        return a3[:1], b3
    if repeated(b3) and not repeated(a3) and a3.shape[0] == b3.shape[0]:
        return a3, b3[:1]
    return a3, b3


# The op takes every dim as a 32-bit int.
MAX_DIM = 2**31 - 1


def _fold_batch_into_rows(a3: torch.Tensor, b3: torch.Tensor) -> tuple[torch.Tensor, int]:
    batch, rows, cols = a3.shape
    if (b3.shape[0] == 1 and batch > 1 and a3.stride(0) == rows * a3.stride(1)
            and batch * rows <= MAX_DIM):
        return a3.reshape(1, batch * rows, cols), batch
    return a3, 1


def kernel_problem(a: torch.Tensor, b: torch.Tensor,
                   out_shape: tuple) -> tuple[Problem | None, str | None]:
    """(Problem, None) when (a, b) map onto the op with views only, else (None, reason).

    ``a`` and ``b`` have passed validation and are at least 2-D; ``out_shape`` is
    torch.matmul's output shape for them.
    """
    out_batch = tuple(out_shape[:-2])
    a3, reason = _to_3d("a", a, out_batch)
    if a3 is None:
        return None, reason
    b3, reason = _to_3d("b", b, out_batch)
    if b3 is None:
        return None, reason
    for name, t in (("a", a3), ("b", b3)):
        if max(t.shape) > MAX_DIM:
            return None, (f"{name} flattened to {tuple(t.shape)} has a dim beyond 2^31 - 1, "
                          "which the kernel does not take")
    a3, b3 = _drop_repeated_batch(a3, b3)
    a3, folded = _fold_batch_into_rows(a3, b3)
    return Problem(a3, b3, tuple(out_shape), folded), None
