"""The fake (meta) implementation of tk::matmul gives the shape, dtype and strides of the real
op's output, without a GPU."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import thunderkittens  # noqa: F401  (registers the op and its fake impl)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("a_shape, b_shape, out_shape", [
    ((1, 128, 64), (1, 64, 256), (1, 128, 256)),
    ((4, 17, 1000), (4, 1000, 33), (4, 17, 33)),
    ((1, 17, 1000), (6, 1000, 33), (6, 17, 33)),   # a broadcast over the batch
    ((6, 1, 8), (1, 8, 1), (6, 1, 1)),             # b broadcast, M = N = 1
])
def test_fake_tensor_mode_cuda(dtype, a_shape, b_shape, out_shape):
    with FakeTensorMode():
        a = torch.empty(a_shape, device="cuda", dtype=dtype)
        b = torch.empty(b_shape, device="cuda", dtype=dtype)
        out = torch.ops.tk.matmul(a, b)
    assert out.shape == out_shape and out.dtype == dtype and out.device.type == "cuda"
    assert out.is_contiguous()


def test_fake_output_is_contiguous_for_transposed_inputs():
    with FakeTensorMode():
        a = torch.empty(2, 64, 32, device="cuda", dtype=torch.bfloat16).mT
        b = torch.empty(2, 48, 64, device="cuda", dtype=torch.bfloat16).mT
        out = torch.ops.tk.matmul(a, b)
    assert out.shape == (2, 32, 48) and out.is_contiguous()


def test_meta_tensors():
    a = torch.empty(3, 40, 24, device="meta", dtype=torch.float16)
    b = torch.empty(1, 24, 8, device="meta", dtype=torch.float16)
    out = torch.ops.tk.matmul(a, b)
    assert out.shape == (3, 40, 8) and out.dtype == torch.float16 and out.device.type == "meta"


@pytest.mark.parametrize("a_shape, b_shape, dtype, message", [
    ((2, 8, 16), (2, 16, 8), torch.float32, "must both be bfloat16 or both float16"),
    ((2, 8, 16), (2, 24, 8), torch.float16, "K differs"),
    ((2, 8, 16), (3, 16, 8), torch.float16, "batch sizes 2 and 3 must be equal or 1"),
    ((8, 16), (16, 8), torch.float16, "must be 3-D"),
])
def test_fake_rejects_what_the_op_rejects(a_shape, b_shape, dtype, message):
    a = torch.empty(a_shape, device="meta", dtype=dtype)
    b = torch.empty(b_shape, device="meta", dtype=dtype)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.tk.matmul(a, b)
