"""Operands in the memory layouts models hand to attention and matmul.

A layout is a recipe: the shape of a freshly allocated base tensor (the leaf that autograd
differentiates) and the view ops that make the operand from it. The reference and the yardstick
apply the same view ops to float64 and to cloned copies of the same base, so outputs and the
base's gradients compare one to one (an expanded base's gradient is summed, a sliced base's is
0 outside the slice).

Attention operands, logical shape (*batch, H, L, D):
  contiguous            a plain tensor
  transposed            (*batch, L, H, D) memory viewed as (*batch, H, L, D)
  offset:N              (*batch, H, L, D + 8)[..., N:N + D]: starts N elements in (N * itemsize
                        bytes: 8 for N = 4 in bf16, the alignment SDPA mishandles)
  projection:N          a slice of a wider projection output (*batch, L, H * D + 8), starting N
                        elements in, split into heads and transposed
  strided_length        every other row of (*batch, H, 2L, D)
  strided_dim           every other column of (*batch, H, L, 2D) (last dim not contiguous)
  expand_heads          (*batch, 1, L, D) expanded over the heads (stride 0)
  expand_batch          (1, .., H, L, D) expanded over the batch dims
and for the three together, fused:N, slices of one fused QKV projection output
(*batch, L, (Hq + 2 Hkv) * D + N) starting N elements in (needs Lq == Lk and D == Dv).

Matmul operands, logical shape (*batch, R, C) or (C,):
  contiguous, transposed (.mT of (*batch, C, R)), offset:N ((*batch, R, C + 8)[..., N:N + C]),
  transposed_offset:N (.mT of (*batch, C, R + 8)[..., N:N + R]), strided_rows, strided_cols,
  expand_batch; 1-D: contiguous, strided, offset:N.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

PAD = 8

ATTENTION_LAYOUTS = ("contiguous", "transposed", "offset", "projection", "strided_length",
                     "strided_dim", "expand_heads", "expand_batch")
MATMUL_LAYOUTS = ("contiguous", "transposed", "offset", "transposed_offset", "strided_rows",
                  "strided_cols", "expand_batch")
VECTOR_LAYOUTS = ("contiguous", "strided", "offset")


def offset_of(layout: str) -> int:
    kind, _, arg = layout.partition(":")
    return int(arg) if arg else 0


def misaligned(layout: str, dtype: torch.dtype) -> bool:
    """Whether the layout puts the operand's start off a 16-byte boundary."""
    return (offset_of(layout) * torch.empty((), dtype=dtype).element_size()) % 16 != 0


def aligned_offsets(dtype: torch.dtype) -> tuple[int, ...]:
    """Element offsets (at most PAD) that keep a 16-byte start."""
    size = torch.empty((), dtype=dtype).element_size()
    return tuple(n for n in range(1, PAD + 1) if n * size % 16 == 0)


def misaligned_offsets(dtype: torch.dtype) -> tuple[int, ...]:
    """Element offsets that start 8 bytes (SDPA's bad case) or fewer off a 16-byte boundary."""
    size = torch.empty((), dtype=dtype).element_size()
    return tuple(n for n in (4, 2, 1) if n * size % 16 != 0 and n <= PAD)


Recipe = tuple[list[tuple[int, ...]], Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]]


def _attention_operand(layout: str, batch: tuple, heads: int, length: int, dim: int):
    shape = batch + (heads, length, dim)
    kind, n = layout.partition(":")[0], offset_of(layout)
    if kind == "contiguous":
        return shape, lambda t: t
    if kind == "transposed":
        return batch + (length, heads, dim), lambda t: t.transpose(-3, -2)
    if kind == "offset":
        return batch + (heads, length, dim + PAD), lambda t: t[..., n:n + dim]
    if kind == "projection":
        return (batch + (length, heads * dim + PAD),
                lambda t: t[..., n:n + heads * dim].unflatten(-1, (heads, dim)).transpose(-3, -2))
    if kind == "strided_length":
        return batch + (heads, 2 * length, dim), lambda t: t[..., ::2, :]
    if kind == "strided_dim":
        return batch + (heads, length, 2 * dim), lambda t: t[..., ::2]
    if kind == "expand_heads":
        return batch + (1, length, dim), lambda t: t.expand(shape)
    if kind == "expand_batch":
        return (1,) * len(batch) + (heads, length, dim), lambda t: t.expand(shape)
    raise ValueError(f"unknown attention layout {layout!r}")


def attention_recipe(layout, batch: tuple, heads_q: int, heads_kv: int, len_q: int, len_kv: int,
                     head_dim: int, head_dim_v: int) -> Recipe:
    """(base shapes, make): make(bases) -> [q, k, v]. ``layout`` is a (q, k, v) tuple of
    operand layouts or one "fused:N" string."""
    if isinstance(layout, str):
        assert layout.startswith("fused") and len_q == len_kv and head_dim == head_dim_v
        n = offset_of(layout)
        widths = [heads_q * head_dim, heads_kv * head_dim, heads_kv * head_dim]
        base = batch + (len_q, sum(widths) + n)

        def make_fused(bases):
            (t,) = bases
            parts, start = [], n
            for heads, width in zip((heads_q, heads_kv, heads_kv), widths):
                parts.append(t[..., start:start + width].unflatten(-1, (heads, head_dim))
                             .transpose(-3, -2))
                start += width
            return parts

        return [base], make_fused
    specs = [_attention_operand(layout[0], batch, heads_q, len_q, head_dim),
             _attention_operand(layout[1], batch, heads_kv, len_kv, head_dim),
             _attention_operand(layout[2], batch, heads_kv, len_kv, head_dim_v)]
    return [s for s, _ in specs], lambda bases: [fn(t) for (_, fn), t in zip(specs, bases)]


def matrix_operand(layout: str, shape: tuple):
    """(base shape, view fn) for a matmul operand of logical ``shape``."""
    kind, n = layout.partition(":")[0], offset_of(layout)
    if len(shape) == 1:
        (c,) = shape
        if kind == "contiguous":
            return shape, lambda t: t
        if kind == "strided":
            return (2 * c,), lambda t: t[::2]
        if kind == "offset":
            return (c + PAD,), lambda t: t[n:n + c]
        raise ValueError(f"unknown vector layout {layout!r}")
    *batch, r, c = shape
    batch = tuple(batch)
    if kind == "contiguous":
        return shape, lambda t: t
    if kind == "transposed":
        return batch + (c, r), lambda t: t.mT
    if kind == "offset":
        return batch + (r, c + PAD), lambda t: t[..., n:n + c]
    if kind == "transposed_offset":
        return batch + (c, r + PAD), lambda t: t[..., n:n + r].mT
    if kind == "strided_rows":
        return batch + (2 * r, c), lambda t: t[..., ::2, :]
    if kind == "strided_cols":
        return batch + (r, 2 * c), lambda t: t[..., ::2]
    if kind == "expand_batch":
        return (1,) * len(batch) + (r, c), lambda t: t.expand(shape)
    raise ValueError(f"unknown matrix layout {layout!r}")
