"""The operand rule of the matmul path choice (thunderkittens/_matmul/layout.py) agrees with the
C++ op's (restated in reference.tma_layout), on tensors with fabricated strides: what Python
sends to the kernel in place the op accepts, and Python never falls back or copies where the
op would have taken the operand as it is. CPU only: strides and pointers, no data."""

import itertools

import pytest
import torch

from reference import tma_layout
from thunderkittens._matmul import layout


def strided(shape, strides, offset=0, dtype=torch.bfloat16):
    extent = offset + 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))
    return torch.as_strided(torch.empty(extent + 64, dtype=dtype), shape, strides, offset)


SIZES = (1, 2, 8, 17)
STRIDES = (1, 2, 8, 16, 17, 24, 136)


def test_layout_matches_the_op_rule_on_every_small_shape_and_stride():
    checked = 0
    for shape in itertools.product(SIZES, repeat=3):
        for strides in itertools.product(STRIDES, repeat=3):
            t = strided(shape, strides)
            assert layout.layout_of(t) == tma_layout(t), (shape, strides)
            checked += 1
    assert checked == len(SIZES) ** 3 * len(STRIDES) ** 3


@pytest.mark.parametrize("shape, strides, expected", [
    ((1, 64, 32), (0, 32, 1), "row"),          # contiguous
    ((1, 64, 32), (0, 1, 64), "col"),          # x.mT of a contiguous (32, 64)
    ((4, 64, 32), (2048, 1, 64), "col"),       # batched x.mT
    ((1, 64, 32), (0, 40, 1), "row"),          # sliced columns, row stride 40 = 5 * 8
    ((1, 64, 17), (0, 17, 1), None),           # K = 17: row stride 17 is not a multiple of 8
    ((1, 17, 64), (0, 1, 17), None),           # the transpose of that
    ((3, 64, 32), (2052, 32, 1), None),        # batch stride 2052 is not a multiple of 8
    ((1, 64, 32), (5, 32, 1), "row"),          # stride of a size-1 batch does not matter
    ((1, 1, 17), (3, 5, 1), "row"),            # a single row: only the contiguous dim matters
    ((1, 64, 1), (0, 1, 1), "col"),            # a single column (N = 1)
    ((1, 64, 32), (0, 64, 2), None),           # every other column: nothing contiguous
])
def test_layout_of_examples(shape, strides, expected):
    assert layout.layout_of(strided(shape, strides)) == expected


def test_row_major_is_preferred_when_both_hold():
    # Both rules hold only for 1x1 matrices (a dim cannot be contiguous and a multiple of 8).
    assert layout.layout_of(strided((1, 1, 1), (7, 3, 5))) == "row"
    assert layout.layout_of(strided((4, 1, 1), (8, 3, 5))) == "row"


def test_zero_strides_are_never_read_in_place():
    # An expanded tensor: the C++ rule would let 0 % 8 == 0 pass; Python copies instead.
    base = torch.empty(1, 32, dtype=torch.bfloat16)
    expanded = base.expand(64, 32).unsqueeze(0)
    assert expanded.stride() == (0, 0, 1)
    assert layout.layout_of(expanded) is None
    assert layout.layout_after_copy(expanded) == "row"


def test_misaligned_pointer_is_not_readable_in_place():
    t = strided((1, 8, 32), (256, 32, 1), offset=3)
    assert t.data_ptr() % 16 != 0
    assert layout.layout_of(t) is None
    assert layout.layout_after_copy(t) == "row"


@pytest.mark.parametrize("shape, expected", [
    ((1, 64, 32), "row"), ((4, 64, 32), "row"), ((1, 64, 17), None), ((4, 1, 17), None),
    ((1, 1, 17), "row"), ((1, 64, 1), "col"), ((3, 64, 1), "col"), ((3, 17, 1), None),
])
def test_layout_after_copy(shape, expected):
    t = strided(shape, (1, 1, 1))  # strides irrelevant: the copy is contiguous
    assert layout.layout_after_copy(t) == expected
    assert tma_layout(torch.empty(shape, dtype=torch.bfloat16)) == expected
