"""The decode family of tk.attention on the CPU: when auto picks it, what forcing it does, its
fallback reasons, its fake implementation, and the call it makes (the CPU standing in for a GPU
with a float64 stand-in of tk::attention_fwd_decode; the kernel itself: test_decode_gpu.py)."""

import pytest
import torch

import thunderkittens as tk
from thunderkittens._attention import decode
from reference import reference_attention


def bf16(*shape, requires_grad=False):
    return torch.randn(*shape, dtype=torch.bfloat16, requires_grad=requires_grad)


def qkv(len_q, len_kv, head_dim=128, heads_q=8, heads_kv=2, batch=2):
    return bf16(batch, heads_q, len_q, head_dim), bf16(batch, heads_kv, len_kv, head_dim), \
        bf16(batch, heads_kv, len_kv, head_dim)


DECODE_PLAN = "kernel tk.attention_fwd_decode [decode mma.sync split-kv]"


@pytest.mark.parametrize("len_q, len_kv, head_dim", [(1, 2048, 128), (1, 4096, 64), (16, 3000, 96),
                                                     (7, 10000, 128)])
def test_auto_picks_decode_for_short_queries_against_long_keys(cpu_kernel, len_q, len_kv, head_dim):
    q, k, v = qkv(len_q, len_kv, head_dim)
    assert str(tk.explain(q, k, v, enable_gqa=True)) == f"{DECODE_PLAN} bf16 d={head_dim} full gqa=4"
    bias = torch.nn.attention.bias.causal_lower_right(len_q, len_kv)
    assert str(tk.explain(q, k, v, attn_mask=bias, enable_gqa=True)).startswith(DECODE_PLAN)
    out = tk.attention(q, k, v, attn_mask=bias, enable_gqa=True)
    call = cpu_kernel.decode_calls[-1]
    assert call["is_causal"] is True and call["lower_right"] is (len_q != len_kv)
    assert call["k"].shape == k.shape  # the kv heads as they are: no repeated copies
    ref, _ = reference_attention(q, k, v, True, head_dim ** -0.5, causal_offset=len_kv - len_q)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("len_q, len_kv", [(17, 4096), (1, 2047), (1, 512), (64, 64), (300, 333)])
def test_auto_keeps_the_forward_kernel_elsewhere(cpu_kernel, len_q, len_kv):
    q, k, v = qkv(len_q, len_kv)
    assert str(tk.explain(q, k, v, enable_gqa=True)).startswith("kernel tk.attention_fwd_sm90 ")
    assert len_q > decode.AUTO_MAX_LEN_Q or len_kv < decode.AUTO_MIN_LEN_KV


def test_calls_that_need_gradients_keep_the_family_with_a_backward(cpu_kernel):
    q, k, v = qkv(1, 4096)
    q.requires_grad_()
    plan = tk.explain(q, k, v, enable_gqa=True)
    assert str(plan).startswith("kernel tk.attention_fwd_sm90 ") and plan.backward_op == "tk.attention_bwd_sm90"
    with torch.no_grad():
        assert str(tk.explain(q, k, v, enable_gqa=True)).startswith(DECODE_PLAN)
    with tk.use_kernel("decode"):
        reason = tk.explain(q, k, v, enable_gqa=True).reason
    assert reason.startswith("kernel decode was forced but query requires grad and the decode kernels have "
                             "no backward")


def test_forced_decode_takes_up_to_64_query_rows(cpu_kernel):
    with tk.use_kernel("decode"):
        q, k, v = qkv(64, 64)
        assert str(tk.explain(q, k, v, is_causal=True, enable_gqa=True)) == \
            f"{DECODE_PLAN} bf16 d=128 causal gqa=4"
        tk.attention(q, k, v, is_causal=True, enable_gqa=True)
        assert cpu_kernel.decode_calls[-1]["is_causal"] is True
        q, k, v = qkv(65, 4096)
        plan = tk.explain(q, k, v, enable_gqa=True)
        assert not plan.uses_kernel
        assert plan.reason == ("kernel decode was forced but query length 65 > 64 (the decode kernels "
                               "take up to 64 query rows)")
        with tk.strict(), pytest.raises(tk.FallbackError, match="query length 65 > 64"):
            tk.attention(q, k, v, enable_gqa=True)


def test_head_dims_outside_the_kernels_fall_back(cpu_kernel):
    q, k, v = qkv(1, 4096, head_dim=80)
    assert tk.explain(q, k, v, enable_gqa=True).reason.startswith("head dim 80 is not supported")
    with tk.use_kernel("decode"):
        assert not tk.explain(q, k, v, enable_gqa=True).uses_kernel


def test_auto_needs_decode_code_for_this_gpu(cpu_kernel, monkeypatch):
    # A GPU older than sm_80 has no decode code: auto keeps whatever family runs (none here).
    cpu_kernel.set_capability((7, 5))
    q, k, v = qkv(1, 4096)
    assert not tk.explain(q, k, v, enable_gqa=True).uses_kernel


def test_fake_implementation_gives_the_forward_contract():
    q = torch.empty(2, 8, 3, 128, dtype=torch.float16, device="meta")
    k = torch.empty(2, 2, 5000, 128, dtype=torch.float16, device="meta")
    out, lse = torch.ops.tk.attention_fwd_decode(q, k, k, True, 0.1, True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 8, 3) and lse.dtype == torch.float32


def test_compiled_call_runs_the_decode_op(cpu_kernel):
    q, k, v = qkv(1, decode.AUTO_MIN_LEN_KV)
    compiled = torch.compile(lambda q, k, v: tk.attention(q, k, v, enable_gqa=True), fullgraph=True,
                             backend="aot_eager")
    out = compiled(q, k, v)
    assert len(cpu_kernel.decode_calls) == 1
    assert torch.equal(out, tk.attention(q, k, v, enable_gqa=True))
