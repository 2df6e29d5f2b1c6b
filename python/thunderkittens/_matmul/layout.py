"""Whether the kernel can read a 3-D operand (batch, rows, cols) in place, and as what.
(csrc/matmul/matmul_ops.cpp applies the same rule; keep them in step.)

The kernel loads tiles with TMA, which needs every stride but the contiguous one to be a
multiple of 16 bytes (8 elements of bf16/fp16) and the data 16-byte aligned. An operand is
read as one of two layouts:

  row-major     cols contiguous: (batch, rows, cols) strides (s0, s1, 1), s0 and s1 % 8 == 0
  column-major  rows contiguous: strides (s0, 1, s2), s0 and s2 % 8 == 0 (e.g. ``x.mT``)

Strides of size-1 dims never matter (the C++ op ignores them), and row-major is preferred when
both hold. These are the C++ op's rules, with one addition: a stride of 0 on a dim of size > 1
(an expanded tensor) is never read in place; such an operand is copied instead of trusting
TMA with a zero stride.

Anything else gets one documented ``.contiguous()`` copy if the copy would be readable (a fresh
allocation is aligned), and falls back to torch.matmul if not (e.g. a row-major (M, K) matrix
with K % 8 != 0 stays unreadable however it is copied).

Under torch.compile the data pointer is unknown while tracing (dynamo cannot trace
storage_offset()), so only strides are checked there; a view starting at an address that is not
16-byte aligned then makes the op raise instead of being copied.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

ROW = "row"
COLUMN = "col"

_ELEMENTS_PER_16_BYTES = 8  # bf16 / fp16


def _stride_ok(size: int, stride: int) -> bool:
    """A non-contiguous dim: TMA needs its byte stride to be a nonzero multiple of 16."""
    return size == 1 or (stride != 0 and stride % _ELEMENTS_PER_16_BYTES == 0)


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


def is_aligned(t: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        return True  # see the module docstring; the C++ op checks the real pointer
    if isinstance(t, (FakeTensor, FunctionalTensor)) or t.device.type == "meta":
        # No data to align: e.g. AOT autograd tracing the backward formula with fake tensors.
        return True
    return t.data_ptr() % 16 == 0


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
