"""Bring query/key/value into the layout the kernels accept, copying only when needed.

The kernels take (batch, heads, length, head_dim) tensors with any strides, provided the last
dim is contiguous, every other stride is a multiple of 8 elements (16 bytes: one vector load)
and the data pointer is 16-byte aligned. Anything else gets one documented contiguous copy
(a fresh allocation, so it is aligned too). Strides of size-1 dims never matter (the C++ side
replaces them with well-formed values).

Under torch.compile the data pointer is unknown while tracing (and dynamo cannot trace
storage_offset()), so only the strides are checked there (and for traced tensors without a
data pointer, such as the gradient a traced backward gets); a view starting at an address that
is not 16-byte aligned (e.g. ``x[..., 3:67]``) then makes the op raise instead of being copied.
"""

from __future__ import annotations

import torch


def to_4d(t: torch.Tensor) -> torch.Tensor:
    """(..., H, L, E) -> (B, H, L, E): a 3-D input gets B=1, leading dims of higher ranks are
    flattened into B (a view whenever torch can make one)."""
    if t.dim() == 4:
        return t
    return t.reshape((-1,) + tuple(t.shape[-3:]))


def _is_aligned(t: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        return True  # see the module docstring; the C++ op checks the real pointer
    try:
        return t.data_ptr() % 16 == 0
    except RuntimeError:
        # A tensor with no data pointer yet (FakeTensor / FunctionalTensor while AOTAutograd or
        # opcheck traces the backward): as under torch.compile, the C++ op checks the real one.
        return True


def conforms(t: torch.Tensor) -> bool:
    """Whether the kernel can read the 4-D tensor ``t`` in place."""
    stride, shape = t.stride(), t.shape
    if stride[3] != 1:
        return False
    for dim in range(3):
        if shape[dim] != 1 and stride[dim] % 8 != 0:
            return False
    return _is_aligned(t)


def kernel_operand(t: torch.Tensor) -> torch.Tensor:
    t4 = to_4d(t)
    if conforms(t4):
        return t4
    # clone, not .contiguous(): a contiguous view at a misaligned address must be copied too.
    return t4.clone(memory_format=torch.contiguous_format)
