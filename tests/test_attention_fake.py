"""The fake (meta) implementations of the attention ops give the shapes, dtypes and strides of
the real ops, without a GPU."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import thunderkittens  # noqa: F401  (registers the op and its fake impl)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shapes", [
    ((2, 8, 33, 128), (2, 2, 40, 128)),
    ((1, 4, 1, 64), (1, 4, 4097, 64)),
    ((3, 1, 1000, 64), (3, 1, 17, 64)),
])
def test_fake_tensor_mode_cuda(dtype, shapes):
    q_shape, kv_shape = shapes
    with FakeTensorMode():
        q = torch.empty(q_shape, device="cuda", dtype=dtype)
        k = torch.empty(kv_shape, device="cuda", dtype=dtype)
        out, lse = torch.ops.tk.attention_fwd_sm80(q, k, k, True, 0.125)
    assert out.shape == q_shape and out.dtype == dtype and out.device.type == "cuda"
    assert out.is_contiguous()
    assert lse.shape == q_shape[:3] and lse.dtype == torch.float32 and lse.is_contiguous()


def test_fake_output_is_contiguous_for_strided_input():
    with FakeTensorMode():
        q = torch.empty(2, 16, 4, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        out, lse = torch.ops.tk.attention_fwd_sm80(q, q, q, False, 0.125)
    assert not q.is_contiguous()
    assert out.shape == (2, 4, 16, 64) and out.is_contiguous()
    assert lse.shape == (2, 4, 16)


def test_meta_tensors():
    q = torch.empty(2, 8, 33, 128, device="meta", dtype=torch.float16)
    k = torch.empty(2, 4, 9, 128, device="meta", dtype=torch.float16)
    out, lse = torch.ops.tk.attention_fwd_sm80(q, k, k, False, 1.0)
    assert out.shape == q.shape and out.dtype == torch.float16 and out.device.type == "meta"
    assert lse.shape == (2, 8, 33) and lse.dtype == torch.float32


@pytest.mark.parametrize("k_shape, k_dtype, message", [
    ((2, 8, 9, 128), torch.float32, "must all be bfloat16 or all float16"),
    ((2, 8, 9, 64), torch.float16, "same head_dim"),
    ((2, 3, 9, 128), torch.float16, "multiple of k/v heads"),
    ((8, 9, 128), torch.float16, "must be 4-D"),
])
def test_fake_rejects_what_the_op_rejects(k_shape, k_dtype, message):
    q = torch.empty(2, 8, 33, 128, device="meta", dtype=torch.float16)
    k = torch.empty(k_shape, device="meta", dtype=k_dtype)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.tk.attention_fwd_sm80(q, k, k, False, 1.0)


@pytest.mark.parametrize("op", ["attention_fwd_sm80", "attention_fwd_sm90"])
def test_fake_lower_right(op):
    q = torch.empty(2, 8, 33, 128, device="meta", dtype=torch.float16)
    k = torch.empty(2, 4, 9, 128, device="meta", dtype=torch.float16)
    out, lse = getattr(torch.ops.tk, op)(q, k, k, True, 0.125, True)
    assert out.shape == q.shape and lse.shape == (2, 8, 33)
    out, lse = getattr(torch.ops.tk, op)(q, k, k, True, 0.125, lower_right=True)
    assert out.shape == q.shape
    # lower_right moves the causal diagonal: without is_causal there is none, which the ops reject.
    with pytest.raises(RuntimeError, match="lower_right=True needs is_causal=True"):
        getattr(torch.ops.tk, op)(q, k, k, False, 0.125, True)


def test_fake_backward_rejects_lower_right_without_is_causal():
    q = torch.empty(2, 8, 33, 128, device="meta", dtype=torch.float16)
    k = torch.empty(2, 4, 9, 128, device="meta", dtype=torch.float16)
    lse = torch.empty(2, 8, 33, device="meta", dtype=torch.float32)
    dq, dk, dv = torch.ops.tk.attention_bwd_sm90(q, q, k, k, q, lse, True, 0.125, True)
    assert dq.shape == q.shape and dk.shape == k.shape
    with pytest.raises(RuntimeError, match="lower_right=True needs is_causal=True"):
        torch.ops.tk.attention_bwd_sm90(q, q, k, k, q, lse, False, 0.125, True)
