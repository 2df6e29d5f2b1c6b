"""tk.attention_with_kvcache on a GPU: the append and the decode kernel against the float64
reference within PyTorch's own error, with per-sequence lengths (0, the capacity, others),
NaN in every unused cache row, GQA 1/4/8, query lengths 1 .. 64, causal lower-right and full,
both dtypes, caches viewed from (B, S, H, D) buffers; a CUDA-graph-captured decoding step
replayed with changing lengths (kernel and PyTorch paths: neither syncs with the host); the
PyTorch path on the GPU.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import thunderkittens as tk
from differential.tolerance import assert_close
from gpu_support import seeded
from kernel_required import require_kernel, skip_unless_gpu_for
from reference import lower_right_bias

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def kvcache_kernel_runs_here():
    skip_unless_gpu_for("attention", "decode")
    q = torch.randn(1, 4, 1, 128, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(1, 1, 64, 128, device="cuda", dtype=torch.bfloat16)
    plan = tk.explain_kvcache(q, cache, cache, torch.zeros(1, dtype=torch.int32, device="cuda"))
    require_kernel(plan, "attention", "decode")


def make_caches(batch, heads_kv, capacity, head_dim, dtype, lengths, layout_bshd=False):
    """Random caches, NaN in every row at or past each sequence's length."""
    shape = (batch, capacity, heads_kv, head_dim) if layout_bshd else (batch, heads_kv, capacity, head_dim)
    k = torch.randn(shape, device="cuda", dtype=dtype)
    v = torch.randn(shape, device="cuda", dtype=dtype)
    if layout_bshd:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    for b, n in enumerate(lengths):
        k[b, :, n:] = math.nan
        v[b, :, n:] = math.nan
    return k, v


def expected(q, k_cache, v_cache, lengths, causal, scale):
    """(float64 reference, SDPA's answer in the dtype) per sequence over its first lengths[b]
    rows; a sequence with none gives 0 in both."""
    ratio = q.shape[1] // k_cache.shape[1]
    ref = torch.zeros(q.shape, dtype=torch.float64, device="cuda")
    theirs = torch.zeros_like(q)
    len_q = q.shape[2]
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        qb = q[b:b + 1]
        k = k_cache[b:b + 1, :, :n].repeat_interleave(ratio, 1)
        v = v_cache[b:b + 1, :, :n].repeat_interleave(ratio, 1)
        scores = qb.double() @ k.double().transpose(-1, -2) * scale
        if causal:
            visible = torch.ones(len_q, n, dtype=torch.bool, device="cuda").tril(n - len_q)
            scores = scores.masked_fill(~visible, -math.inf)
        empty = torch.isneginf(scores).all(-1, keepdim=True)
        probs = torch.softmax(scores.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
        ref[b] = (probs @ v.double())[0]
        if causal and len_q > n:  # rows that see no key: 0 (SDPA's fused kernels give NaN)
            seen = F.scaled_dot_product_attention(qb[:, :, len_q - n:], k.contiguous(), v.contiguous(),
                                                  is_causal=True, scale=scale)
            theirs[b, :, len_q - n:] = seen[0]
        else:
            mask = lower_right_bias(len_q, n) if causal and len_q != n else None
            theirs[b] = F.scaled_dot_product_attention(qb, k.contiguous(), v.contiguous(), attn_mask=mask,
                                                       is_causal=causal and len_q == n, scale=scale)[0]
    return ref, theirs


def cases():
    out, index = [], 0
    for len_q in (1, 2, 7, 64):
        for ratio in (1, 4, 8):
            for causal in (True, False):
                for append in (True, False):
                    dtype = (torch.bfloat16, torch.float16)[index % 2]
                    capacity = (8191, 65536, 100)[index % 3]
                    index += 1
                    out.append(pytest.param(len_q, ratio, causal, append, dtype, capacity,
                                            id=f"lq{len_q}-gqa{ratio}-{'causal' if causal else 'full'}-"
                                               f"{'append' if append else 'read'}-"
                                               f"{str(dtype).removeprefix('torch.')}-s{capacity}"))
    return out


@pytest.mark.parametrize("len_q, ratio, causal, append, dtype, capacity", cases())
def test_matches_reference(len_q, ratio, causal, append, dtype, capacity):
    seeded(len_q, ratio, causal, append, dtype, capacity)
    heads_kv, head_dim = 2, 128
    full = capacity - len_q if append else capacity  # a sequence that ends at the capacity
    lengths = [0, full, int(torch.randint(0, full + 1, ()).item()), min(full, 5)]
    batch = len(lengths)
    k_cache, v_cache = make_caches(batch, heads_kv, capacity, head_dim, dtype, lengths, layout_bshd=append)
    q = torch.randn(batch, heads_kv * ratio, len_q, head_dim, device="cuda", dtype=dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    k_new = v_new = None
    if append:
        k_new = torch.randn(batch, heads_kv, len_q, head_dim, device="cuda", dtype=dtype)
        v_new = torch.randn(batch, heads_kv, len_q, head_dim, device="cuda", dtype=dtype)
    before = (k_cache.clone(), v_cache.clone())
    plan = tk.explain_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, is_causal=causal)
    assert plan.uses_kernel and not plan.copies, str(plan)
    with tk.strict():
        out = tk.attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, is_causal=causal)
    torch.cuda.synchronize()
    added = len_q if append else 0
    for b, n in enumerate(lengths):  # written rows, untouched rows (bits, NaN included)
        for cache, old, new in ((k_cache, before[0], k_new), (v_cache, before[1], v_new)):
            if append:
                assert torch.equal(cache[b, :, n:n + len_q], new[b])
            assert torch.equal(cache[b, :, :n].view(torch.int16), old[b, :, :n].view(torch.int16))
            assert torch.equal(cache[b, :, n + added:].view(torch.int16), old[b, :, n + added:].view(torch.int16))
    assert seqlens.tolist() == lengths
    ref, theirs = expected(q, k_cache, v_cache, [n + added for n in lengths], causal, 1 / math.sqrt(head_dim))
    zero = torch.zeros(q.shape, dtype=torch.bool, device="cuda")
    zero[0] = not append  # sequence 0 has no rows without an append
    assert_close("output", out, ref, theirs, exact_zero=zero)


def test_cuda_graph_step_with_changing_lengths():
    """A decoding step captured once and replayed with other lengths and tokens, on both the
    kernel path and the PyTorch path (head dim 80): a host sync would break the capture."""
    for head_dim in (128, 80):
        seeded("graph", head_dim)
        batch, heads_kv, capacity = 3, 4, 4096
        k_cache = torch.randn(batch, heads_kv, capacity, head_dim, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        q = torch.randn(batch, 16, 1, head_dim, device="cuda", dtype=torch.bfloat16)
        k_new, v_new = torch.randn(batch, heads_kv, 1, head_dim, device="cuda", dtype=torch.bfloat16), \
            torch.randn(batch, heads_kv, 1, head_dim, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.tensor([10, 0, 300], dtype=torch.int32, device="cuda")
        assert tk.explain_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new).uses_kernel == (head_dim == 128)
        step = lambda: tk.attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new)  # noqa: E731
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for lengths in ([11, 1, 301], [4000, 7, 0], [capacity - 1, 2048, 17]):
            seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
            for t in (q, k_new, v_new):
                t.copy_(torch.randn_like(t))
            k_eager, v_eager = k_cache.clone(), v_cache.clone()
            graph.replay()
            want = tk.attention_with_kvcache(q, k_eager, v_eager, seqlens, k_new, v_new)
            torch.cuda.synchronize()
            assert torch.equal(out, want), lengths
            assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager), lengths
            ref, theirs = expected(q, k_cache, v_cache, [n + 1 for n in lengths], True, head_dim ** -0.5)
            assert_close("output", out, ref, theirs)


def test_torch_path_on_the_gpu():
    seeded("torch path")
    lengths = [0, 33, 64]
    k_cache, v_cache = make_caches(3, 2, 64, 80, torch.bfloat16, lengths)
    q = torch.randn(3, 4, 2, 80, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    plan = tk.explain_kvcache(q, k_cache, v_cache, seqlens)
    assert plan.reason == "head dim 80 is not supported by the decode kernel (64, 96, 128 only)"
    out = tk.attention_with_kvcache(q, k_cache, v_cache, seqlens, is_causal=True)
    ref, theirs = expected(q, k_cache, v_cache, lengths, True, 80 ** -0.5)
    zero = torch.zeros(q.shape, dtype=torch.bool, device="cuda")
    zero[0] = True
    assert_close("output", out, ref, theirs, exact_zero=zero)
