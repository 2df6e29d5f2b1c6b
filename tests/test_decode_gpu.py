"""The decode kernel (tk::attention_fwd_decode, csrc/attention/decode.cu) on a GPU: against the
float64 reference within PyTorch's own error (tests/differential/tolerance.py) over query
lengths 1 .. 64, key lengths 1 .. 65536 (one piece and many split pieces), GQA 1/4/8, head dims
64/96/128, causal lower-right and full, both dtypes, with outputs in NaN-poisoned memory; auto's
choice of it, strided inputs, CUDA graphs.

Skips without a GPU or on one older than sm_80; where the decode kernel should run, explain
naming no kernel fails the module.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import thunderkittens as tk
from differential.tolerance import assert_close
from gpu_support import seeded
from kernel_required import require_kernel, skip_unless_gpu_for
from reference import reference_attention, sdpa_causal_lower_right

pytestmark = pytest.mark.gpu

OP = torch.ops.tk.attention_fwd_decode
LSE_ATOL = 5e-5  # as test_attention_gpu.py


@pytest.fixture(scope="module", autouse=True)
def decode_kernel_runs_here():
    skip_unless_gpu_for("attention", "decode")
    q = torch.randn(1, 4, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, 512, 128, device="cuda", dtype=torch.bfloat16)
    with tk.use_kernel("decode"):
        require_kernel(tk.explain(q, k, k, enable_gqa=True), "attention", "decode")


def randn(*shape, dtype):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def call_on_poisoned_memory(q, k, v, causal, scale, lower_right):
    """The op with its outputs in blocks just filled with NaN (see test_attention_gpu.py's
    helper of the same kind): an element the kernel does not write stays NaN."""
    batch, heads_q, len_q, head_dim = q.shape
    poison_out = torch.full((batch, heads_q, len_q, head_dim), math.nan, dtype=q.dtype, device="cuda")
    poison_lse = torch.full((batch, heads_q, len_q), math.nan, dtype=torch.float32, device="cuda")
    addresses = (poison_out.data_ptr(), poison_lse.data_ptr())
    del poison_out, poison_lse
    out, lse = OP(q, k, v, causal, scale, lower_right)
    assert (out.data_ptr(), lse.data_ptr()) == addresses, "outputs did not reuse the NaN blocks"
    return out, lse


def assert_matches_reference(out, lse, q, k, v, causal, scale):
    """out/lse against float64 with SDPA's error as the yardstick; causal is lower-right (rows
    i < Lq - Lk see no key: out exactly 0, lse -inf)."""
    len_q, len_kv = q.shape[2], k.shape[2]
    offset = len_kv - len_q
    ref_out, ref_lse = reference_attention(q, k, v, causal, scale, causal_offset=offset if causal else 0)
    qc, kc, vc = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    if causal:
        theirs = sdpa_causal_lower_right(qc, kc, vc, scale)
    else:
        theirs = F.scaled_dot_product_attention(qc, kc, vc, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    hidden = max(0, -offset) if causal else 0
    zero = torch.zeros(out.shape, dtype=torch.bool, device="cuda")
    zero[:, :, :hidden] = True
    assert_close("output", out, ref_out, theirs, exact_zero=zero)
    assert torch.isneginf(lse[:, :, :hidden]).all(), "lse of rows that see no key is not -inf"
    assert torch.isfinite(lse[:, :, hidden:]).all(), "lse has NaN/inf"
    err = (lse[:, :, hidden:].double() - ref_lse[:, :, hidden:]).abs().max().item() if hidden < len_q else 0.0
    assert err <= LSE_ATOL, f"lse max abs error {err:.3e} > {LSE_ATOL:g}"


LENGTHS_Q = [1, 2, 7, 64]
LENGTHS_KV = [1, 100, 8191, 65536]
RATIOS = [1, 4, 8]
HEAD_DIMS = [64, 96, 128]
DTYPES = [torch.bfloat16, torch.float16]


def cases():
    out, index = [], 0
    for len_q in LENGTHS_Q:
        for len_kv in LENGTHS_KV:
            for ratio in RATIOS:
                for causal in (False, True):
                    dtype = DTYPES[index % 2]
                    head_dim = HEAD_DIMS[index % 3]
                    index += 1
                    out.append(pytest.param(len_q, len_kv, ratio, causal, dtype, head_dim,
                                            id=f"lq{len_q}-lk{len_kv}-gqa{ratio}-{'causal' if causal else 'full'}-"
                                               f"{str(dtype).removeprefix('torch.')}-d{head_dim}"))
    return out


@pytest.mark.parametrize("len_q, len_kv, ratio, causal, dtype, head_dim", cases())
def test_matches_reference(len_q, len_kv, ratio, causal, dtype, head_dim):
    seeded(len_q, len_kv, ratio, causal, dtype, head_dim)
    batch, heads_kv = (2, 2) if len_kv <= 8191 else (1, 2)
    q = randn(batch, heads_kv * ratio, len_q, head_dim, dtype=dtype)
    k = randn(batch, heads_kv, len_kv, head_dim, dtype=dtype)
    v = randn(batch, heads_kv, len_kv, head_dim, dtype=dtype)
    scale = 1 / math.sqrt(head_dim)
    out, lse = call_on_poisoned_memory(q, k, v, causal, scale, causal)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert_matches_reference(out, lse, q, k, v, causal, scale)


@pytest.mark.parametrize("batch, heads_q, heads_kv", [(1, 32, 8), (64, 32, 8), (3, 32, 32), (1, 8, 1)])
def test_auto_runs_decode_and_matches_forced(batch, heads_q, heads_kv):
    seeded("auto", batch, heads_q, heads_kv)
    q = randn(batch, heads_q, 1, 128, dtype=torch.bfloat16)
    k = randn(batch, heads_kv, 3000, 128, dtype=torch.bfloat16)
    v = randn(batch, heads_kv, 3000, 128, dtype=torch.bfloat16)
    gqa = heads_q != heads_kv
    assert tk.explain(q, k, v, enable_gqa=gqa).kernel == "decode"
    with tk.strict():
        out = tk.attention(q, k, v, enable_gqa=gqa)
    op_out, lse = OP(q, k, v, False, 1 / math.sqrt(128))
    assert torch.equal(out, op_out)
    assert_matches_reference(op_out, lse, q, k, v, False, 1 / math.sqrt(128))


def test_strided_inputs_are_read_in_place():
    # (B, L, H, D) tensors viewed as (B, H, L, D), as models hand them over.
    seeded("strided")
    q = randn(2, 1, 16, 128, dtype=torch.bfloat16).transpose(1, 2)
    k = randn(2, 5000, 4, 128, dtype=torch.bfloat16).transpose(1, 2)
    v = randn(2, 5000, 4, 128, dtype=torch.bfloat16).transpose(1, 2)
    plan = tk.explain(q, k, v, enable_gqa=True)
    assert plan.kernel == "decode" and not plan.copies, str(plan)
    out, lse = OP(q, k, v, False, 0.1)
    assert_matches_reference(out, lse, q, k, v, False, 0.1)


def test_cuda_graph_replay():
    seeded("graph")
    q = randn(4, 32, 1, 128, dtype=torch.bfloat16)
    k = randn(4, 8, 9000, 128, dtype=torch.bfloat16)
    v = randn(4, 8, 9000, 128, dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tk.attention(q, k, v, enable_gqa=True)  # warm-up off the default stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tk.attention(q, k, v, enable_gqa=True)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, tk.attention(q, k, v, enable_gqa=True))


def test_bad_input_is_named():
    q = randn(1, 4, 65, 128, dtype=torch.bfloat16)
    k = randn(1, 1, 100, 128, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="q length must be at most 64"):
        OP(q, k, k, False, 0.1)
    with pytest.raises(RuntimeError, match="head_dim must be 64, 96 or 128"):
        OP(q[..., :1, :80].contiguous(), k[..., :80].contiguous(), k[..., :80].contiguous(), False, 0.1)
    with pytest.raises(RuntimeError, match="lower_right=True needs is_causal=True"):
        OP(q[:, :, :1], k, k, False, 0.1, True)
