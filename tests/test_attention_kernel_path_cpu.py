"""The kernel path of tk.attention, run on the CPU against a stand-in of the op (see the
``cpu_kernel`` fixture in conftest.py): operand layouts handed to the op, reshapes, scale,
GQA without copies, torch.compile(fullgraph=True) tracing, and opcheck of the schema and fake
implementation against a real implementation."""

import math

import pytest
import torch
import torch.nn.functional as F

import thunderkittens as tk


def bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def assert_matches_sdpa(out, q, k, v, **kwargs):
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)
    assert out.shape == expected.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)


def test_kernel_path_calls_the_op(cpu_kernel):
    q, k, v = bf16(2, 4, 17, 64), bf16(2, 4, 23, 64), bf16(2, 4, 23, 64)
    out = tk.attention(q, k, v, is_causal=True)
    assert len(cpu_kernel.calls) == 1
    call = cpu_kernel.calls[0]
    assert call["is_causal"] is True
    assert call["scale"] == pytest.approx(1 / math.sqrt(64))
    assert call["q"].data_ptr() == q.data_ptr()  # no copy of a contiguous input
    assert_matches_sdpa(out, q, k, v, is_causal=True)


def test_explicit_scale_is_passed(cpu_kernel):
    q = bf16(1, 2, 8, 128)
    tk.attention(q, q, q, scale=0.25)
    assert cpu_kernel.calls[0]["scale"] == 0.25


@pytest.mark.parametrize("scale", [-0.25, 0.0])
def test_non_positive_scale_falls_back(cpu_kernel, scale):
    q, k, v = bf16(1, 2, 8, 64), bf16(1, 2, 8, 64), bf16(1, 2, 8, 64)
    assert "scale" in str(tk.explain(q, k, v, scale=scale))
    out = tk.attention(q, k, v, scale=scale)
    assert not cpu_kernel.calls
    assert_matches_sdpa(out, q, k, v, scale=scale)


def test_gqa_passes_kv_with_their_own_heads(cpu_kernel):
    q, k, v = bf16(2, 8, 16, 128), bf16(2, 2, 16, 128), bf16(2, 2, 16, 128)
    out = tk.attention(q, k, v, enable_gqa=True, is_causal=True)
    call = cpu_kernel.calls[0]
    assert call["k"].shape == (2, 2, 16, 128) and call["k"].data_ptr() == k.data_ptr()
    assert_matches_sdpa(out, q, k, v, enable_gqa=True, is_causal=True)


def test_rank3_is_one_batch_of_heads(cpu_kernel):
    q, k, v = bf16(3, 10, 64), bf16(3, 12, 64), bf16(3, 12, 64)
    out = tk.attention(q, k, v)
    assert cpu_kernel.calls[0]["q"].shape == (1, 3, 10, 64)
    assert out.shape == (3, 10, 64)
    assert_matches_sdpa(out, q, k, v)


def test_rank5_flattens_leading_dims(cpu_kernel):
    q, k, v = bf16(2, 3, 4, 9, 64), bf16(2, 3, 2, 9, 64), bf16(2, 3, 2, 9, 64)
    out = tk.attention(q, k, v, enable_gqa=True)
    assert cpu_kernel.calls[0]["q"].shape == (6, 4, 9, 64)
    assert cpu_kernel.calls[0]["k"].shape == (6, 2, 9, 64)
    assert out.shape == (2, 3, 4, 9, 64)
    assert_matches_sdpa(out, q, k, v, enable_gqa=True)


def test_transposed_view_is_passed_without_copy(cpu_kernel):
    # (B, L, H, D) memory viewed as (B, H, L, D): strides (L*H*D, D, H*D, 1) are all fine.
    q = bf16(2, 19, 4, 64).transpose(1, 2)
    out = tk.attention(q, q, q)
    call = cpu_kernel.calls[0]
    assert call["q"].data_ptr() == q.data_ptr() and call["q"].stride() == q.stride()
    assert "copies" not in str(tk.explain(q, q, q))
    assert_matches_sdpa(out, q, q, q)


def test_sliced_head_dim_with_aligned_row_stride_is_not_copied(cpu_kernel):
    q = bf16(2, 4, 9, 72)[..., :64]  # row stride 72 = 9 * 8
    tk.attention(q, q, q)
    assert cpu_kernel.calls[0]["q"].stride() == q.stride()


@pytest.mark.parametrize("make, why", [
    (lambda: bf16(2, 4, 9, 67)[..., :64], "row stride 67"),
    (lambda: bf16(2, 4, 64, 9).transpose(-1, -2), "head dim not contiguous"),
    (lambda: bf16(2 * 4 * 9 * 64 + 3)[3:].view(2, 4, 9, 64), "misaligned data pointer"),
])
def test_nonconforming_input_is_copied(cpu_kernel, make, why):
    q = make()
    k = bf16(2, 4, 9, 64)
    explanation = str(tk.explain(q, k, k))
    assert "(copies query with .contiguous())" in explanation, why
    out = tk.attention(q, k, k)
    passed = cpu_kernel.calls[0]["q"]
    assert passed.is_contiguous() and passed.data_ptr() % 16 == 0, why
    assert_matches_sdpa(out, q, k, k)


def test_size_one_dims_do_not_force_copies(cpu_kernel):
    # Lq == 1 and B == 1: strides of those dims are irrelevant to the kernel.
    q = torch.as_strided(bf16(5 * 64), (1, 4, 1, 64), (3, 64, 5, 1))
    k = bf16(1, 4, 9, 64)
    assert "copies" not in str(tk.explain(q, k, k))
    assert_matches_sdpa(tk.attention(q, k, k), q, k, k)


def test_compile_fullgraph_matches_eager(cpu_kernel):
    from torch._dynamo.testing import CompileCounterWithBackend

    def f(q, k, v):
        return tk.attention(q, k, v, is_causal=True, enable_gqa=True) * 2

    q, k, v = bf16(2, 8, 33, 64), bf16(2, 2, 40, 64), bf16(2, 2, 40, 64)
    eager = f(q, k, v)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    assert torch.equal(compiled(q, k, v), eager)
    assert counter.frame_count == 1
    targets = [str(node.target) for node in counter.graphs[0].graph.nodes
               if node.op == "call_function"]
    assert targets.count("tk.attention_fwd_sm90.default") == 1  # the path decision left no trace


def test_compile_fallback_path_matches_eager(cpu_kernel):
    mask = torch.rand(16, 16) > 0.5

    def f(q):
        return tk.attention(q, q, q, attn_mask=mask)

    q = bf16(1, 2, 16, 64)
    assert torch.equal(torch.compile(f, backend="aot_eager", fullgraph=True)(q), f(q))
    assert not cpu_kernel.calls


def test_opcheck(cpu_kernel):
    q, k = bf16(2, 8, 33, 128), bf16(2, 2, 40, 128)
    torch.library.opcheck(torch.ops.tk.attention_fwd_sm80.default, (q, k, k, True, 0.125))
    torch.library.opcheck(torch.ops.tk.attention_fwd_sm80.default, (q, k, k, True, 0.125, True))
    q2, k2 = bf16(2, 8, 40, 128), bf16(2, 2, 33, 128)  # lower-right with Lq > Lk
    torch.library.opcheck(torch.ops.tk.attention_fwd_sm80.default, (q2, k2, k2, True, 0.125, True))
    torch.library.opcheck(torch.ops.tk.attention_fwd_sm80.default,
                          (bf16(1, 2, 17, 64).transpose(1, 2), bf16(1, 17, 2, 64),
                           bf16(1, 17, 2, 64), False, 1.0))


@pytest.mark.parametrize("len_q, len_kv", [(33, 40), (40, 33)])
def test_compile_fullgraph_lower_right(cpu_kernel, len_q, len_kv):
    from reference import lower_right_bias
    from torch._dynamo.testing import CompileCounterWithBackend
    # Made outside the compiled function (torch 2.15's dynamo cannot construct a CausalBias).
    bias = lower_right_bias(len_q, len_kv)

    def f(q, k, v):
        return tk.attention(q, k, v, attn_mask=bias, enable_gqa=True) * 2

    q, k, v = bf16(2, 8, len_q, 64), bf16(2, 2, len_kv, 64), bf16(2, 2, len_kv, 64)
    eager = f(q, k, v)
    counter = CompileCounterWithBackend("aot_eager")
    assert torch.equal(torch.compile(f, backend=counter, fullgraph=True)(q, k, v), eager)
    assert cpu_kernel.calls[-1]["lower_right"] is True
    nodes = [node for node in counter.graphs[0].graph.nodes
             if node.op == "call_function" and str(node.target) == "tk.attention_fwd_sm90.default"]
    assert len(nodes) == 1 and nodes[0].args[3:] == (True, 0.125, True)


def test_compile_dynamic_shapes(cpu_kernel):
    def f(q, k, v):
        return tk.attention(q, k, v, is_causal=True, enable_gqa=True)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=True)
    for length in (33, 47, 100):
        q, k = bf16(2, 8, length, 64), bf16(2, 2, length + 5, 64)
        assert torch.equal(compiled(q, k, k), f(q, k, k))
