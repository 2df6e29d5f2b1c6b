"""tk.attention_with_kvcache on the CPU: argument checks, the PyTorch path against a float64
reference (per-sequence lengths, appends in place, rows past the capacity, NaN in unused cache
rows), explain/strict, the ops' fake implementations, and the kernel path's op calls with the
CPU standing in for a GPU (the kernels themselves: test_kvcache_gpu.py)."""

import math

import pytest
import torch

import thunderkittens as tk
from gpu_support import kernel_standins


def reference(q, k_cache, v_cache, lengths, is_causal, scale):
    """float64 attention of q (B, Hq, Lq, D) against the first lengths[b] rows of each cache,
    query i seeing rows up to lengths[b] - Lq + i when causal; rows that see none are 0."""
    batch, heads_q, len_q, _ = q.shape
    ratio = heads_q // k_cache.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(batch):
        n = int(lengths[b])
        if n == 0:
            continue
        k = k_cache[b, :, :n].double().repeat_interleave(ratio, 0)
        v = v_cache[b, :, :n].double().repeat_interleave(ratio, 0)
        scores = q[b].double() @ k.transpose(-1, -2) * scale
        if is_causal:
            visible = torch.ones(len_q, n, dtype=torch.bool).tril(n - len_q)
            scores = scores.masked_fill(~visible, -math.inf)
        empty = torch.isneginf(scores).all(-1, keepdim=True)
        probs = torch.softmax(scores.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
        out[b] = probs @ v
    return out


def caches(batch, heads_kv, capacity, head_dim, dtype, lengths):
    """Random caches with NaN in every row past each sequence's length (a kernel or fallback
    that lets unused rows into its sums shows NaN)."""
    k = torch.randn(batch, heads_kv, capacity, head_dim, dtype=dtype)
    v = torch.randn(batch, heads_kv, capacity, head_dim, dtype=dtype)
    for b, n in enumerate(lengths):
        k[b, :, n:] = math.nan
        v[b, :, n:] = math.nan
    return k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("len_q, ratio", [(1, 1), (3, 4), (5, 2)])
def test_torch_path_appends_and_attends(dtype, is_causal, len_q, ratio):
    torch.manual_seed(len_q * 10 + ratio)
    batch, heads_kv, capacity, head_dim = 4, 2, 40, 32
    lengths = [0, 7, capacity - len_q, 13]
    k_cache, v_cache = caches(batch, heads_kv, capacity, head_dim, dtype, lengths)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    q = torch.randn(batch, heads_kv * ratio, len_q, head_dim, dtype=dtype)
    k_new = torch.randn(batch, heads_kv, len_q, head_dim, dtype=dtype)
    v_new = torch.randn(batch, heads_kv, len_q, head_dim, dtype=dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32)

    out = tk.attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, is_causal=is_causal)
    for b, n in enumerate(lengths):  # the new rows in place, every other row as it was (NaN too)
        assert torch.equal(k_cache[b, :, n:n + len_q], k_new[b]) and torch.equal(v_cache[b, :, n:n + len_q], v_new[b])
        for cache, old in ((k_cache, before_k), (v_cache, before_v)):
            assert torch.equal(cache[b, :, :n].view(torch.uint8 if dtype == torch.float32 else torch.int16),
                               old[b, :, :n].view(torch.uint8 if dtype == torch.float32 else torch.int16))
            assert torch.isnan(cache[b, :, n + len_q:]).all()
    assert torch.equal(seqlens, torch.tensor(lengths, dtype=torch.int32)), "cache_seqlens was changed"
    ref = reference(q, k_cache, v_cache, [n + len_q for n in lengths], is_causal, head_dim ** -0.5)
    assert out.shape == q.shape and out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), ref, atol=tolerance, rtol=tolerance)


def test_torch_path_without_new_rows_and_empty_sequences():
    torch.manual_seed(1)
    lengths = [0, 1, 9, 16]
    k_cache, v_cache = caches(4, 2, 16, 16, torch.float32, lengths)
    q = torch.randn(4, 4, 2, 16)
    for is_causal in (True, False):
        out = tk.attention_with_kvcache(q, k_cache, v_cache, torch.tensor(lengths, dtype=torch.int32),
                                        is_causal=is_causal, scale=0.3)
        ref = reference(q, k_cache, v_cache, lengths, is_causal, 0.3)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
        assert torch.equal(out[0], torch.zeros_like(out[0]))  # no rows: 0
        if is_causal:  # one row, two queries: the first sees nothing
            assert torch.equal(out[1, :, 0], torch.zeros_like(out[1, :, 0]))


def test_rows_past_the_capacity_are_dropped():
    k_cache, v_cache = torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16)
    k_new, v_new = torch.ones(1, 1, 3, 16), torch.full((1, 1, 3, 16), 2.0)
    q = torch.randn(1, 1, 3, 16)
    tk.attention_with_kvcache(q, k_cache, v_cache, torch.tensor([6], dtype=torch.int32), k_new, v_new)
    assert torch.equal(k_cache[0, 0, 6:], torch.ones(2, 16)) and torch.equal(k_cache[0, 0, :6], torch.zeros(6, 16))
    assert torch.equal(v_cache[0, 0, 6:], torch.full((2, 16), 2.0))


def test_cache_views_are_written_in_place():
    # (B, S, H, D) buffers viewed as (B, H, S, D), as serving frameworks keep them.
    k_buffer, v_buffer = torch.zeros(2, 10, 3, 16), torch.zeros(2, 10, 3, 16)
    k_new = torch.randn(2, 3, 1, 16)
    tk.attention_with_kvcache(torch.randn(2, 6, 1, 16), k_buffer.transpose(1, 2), v_buffer.transpose(1, 2),
                              torch.tensor([4, 0], dtype=torch.int32), k_new, k_new)
    assert torch.equal(k_buffer[0, 4], k_new[0, :, 0]) and torch.equal(k_buffer[1, 0], k_new[1, :, 0])


def test_explain_and_strict_on_the_cpu():
    q, k = torch.randn(1, 2, 1, 64, dtype=torch.bfloat16), torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    seqlens = torch.tensor([3], dtype=torch.int32)
    plan = tk.explain_kvcache(q, k, k, seqlens)
    assert str(plan) == ("fallback PyTorch (cache update by index, SDPA with a length mask): inputs are on "
                         "cpu; the kernels need a CUDA GPU")
    with tk.strict(), pytest.raises(tk.FallbackError, match="tk.attention_with_kvcache would fall back"):
        tk.attention_with_kvcache(q, k, k, seqlens)


@pytest.mark.parametrize("change, error, message", [
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), TypeError, "cache_seqlens must be int32"),
    (lambda a: a.update(cache_seqlens=torch.zeros(3, dtype=torch.int32)), ValueError, r"shape \(batch,\)"),
    (lambda a: a.update(k_new=None), ValueError, "both k_new and v_new"),
    (lambda a: a.update(k_new=torch.zeros(2, 2, 2, 16), v_new=torch.zeros(2, 2, 2, 16)), ValueError,
     r"k_new must have shape \(batch, heads_kv, len_q, head_dim\)"),
    (lambda a: a.update(q=torch.zeros(2, 3, 1, 16)), ValueError, r"q heads \(3\) must be a multiple"),
    (lambda a: a.update(v_cache=torch.zeros(2, 2, 9, 16)), ValueError, "must have the same shape"),
    (lambda a: a.update(q=torch.zeros(2, 4, 1, 16, dtype=torch.float64)), TypeError, "dtype"),
    (lambda a: a.update(q=torch.zeros(4, 1, 16)), ValueError, "must be 4-D"),
    (lambda a: a.update(is_causal=1), TypeError, "is_causal must be a bool"),
    (lambda a: a.update(scale=math.inf), ValueError, "scale must be a finite number"),
    (lambda a: a.update(q=torch.zeros(2, 4, 1, 16, requires_grad=True)), ValueError, "is for inference"),
])
def test_bad_arguments_are_named(change, error, message):
    args = {"q": torch.zeros(2, 4, 1, 16), "k_cache": torch.zeros(2, 2, 8, 16), "v_cache": torch.zeros(2, 2, 8, 16),
            "cache_seqlens": torch.zeros(2, dtype=torch.int32), "k_new": torch.zeros(2, 2, 1, 16),
            "v_new": torch.zeros(2, 2, 1, 16)}
    change(args)
    with pytest.raises(error, match=message):
        tk.attention_with_kvcache(**args)


def test_fake_implementations():
    q = torch.empty(2, 8, 3, 128, dtype=torch.bfloat16, device="meta")
    cache = torch.empty(2, 2, 1000, 128, dtype=torch.bfloat16, device="meta")
    seqlens = torch.empty(2, dtype=torch.int32, device="meta")
    out, lse = torch.ops.tk.attention_decode_kvcache(q, cache, cache, seqlens, 3, True, 0.1)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, 8, 3) and lse.dtype == torch.float32
    new = torch.empty(2, 2, 3, 128, dtype=torch.bfloat16, device="meta")
    assert torch.ops.tk.kvcache_append(cache, cache.clone(), seqlens, new, new) is None


# ---- the kernel path's op calls, the CPU standing in for a GPU ------------------------------


@pytest.fixture
def kvcache_kernel(monkeypatch):
    """CPU stand-ins for tk::kvcache_append and tk::attention_decode_kvcache (the semantics of
    the C++ ops, written with loops), with the path choice told the CPU is an sm_90 GPU."""
    calls = []

    def append(k_cache, v_cache, seqlens, k_new, v_new):
        calls.append(("append", seqlens.clone(), k_new.shape))
        for b in range(k_cache.shape[0]):
            for i in range(k_new.shape[2]):
                row = int(seqlens[b]) + i
                if 0 <= row < k_cache.shape[2]:
                    k_cache[b, :, row] = k_new[b, :, i]
                    v_cache[b, :, row] = v_new[b, :, i]

    def attend(q, k_cache, v_cache, seqlens, seqlen_add, is_causal, scale):
        calls.append(("attend", seqlen_add, is_causal, scale))
        lengths = [min(max(int(n) + seqlen_add, 0), k_cache.shape[2]) for n in seqlens]
        out = reference(q, k_cache, v_cache, lengths, is_causal, scale).to(q.dtype)
        return out, torch.zeros(q.shape[:3])

    with kernel_standins(monkeypatch, "attention", {"kvcache_append": append, "attention_decode_kvcache": attend}):
        yield calls


def test_kernel_path_appends_then_attends(kvcache_kernel):
    torch.manual_seed(3)
    lengths = [5, 0]
    k_cache, v_cache = caches(2, 2, 12, 64, torch.bfloat16, lengths)
    q = torch.randn(2, 8, 2, 64, dtype=torch.bfloat16)
    k_new, v_new = torch.randn(2, 2, 2, 64, dtype=torch.bfloat16), torch.randn(2, 2, 2, 64, dtype=torch.bfloat16)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    assert str(tk.explain_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new)) == (
        "kernel tk.attention_decode_kvcache [decode mma.sync split-kv] bf16 d=64 causal lower-right gqa=4 "
        "+ append tk.kvcache_append")
    out = tk.attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new, v_new, scale=0.2)
    assert [c[0] for c in kvcache_kernel] == ["append", "attend"]
    assert kvcache_kernel[1][1:] == (2, True, 0.2)
    ref = reference(q, k_cache, v_cache, [7, 2], True, 0.2)
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)
    assert torch.equal(k_cache[0, :, 5:7], k_new[0])

    tk.attention_with_kvcache(q, k_cache, v_cache, seqlens, is_causal=False)
    assert kvcache_kernel[-1][:3] == ("attend", 0, False)


@pytest.mark.parametrize("q_shape, reason", [
    ((1, 2, 65, 64), "query length 65 > 64"),
    ((1, 2, 1, 80), "head dim 80 is not supported by the decode kernel"),
])
def test_kernel_path_limits(kvcache_kernel, q_shape, reason):
    q = torch.zeros(q_shape, dtype=torch.bfloat16)
    cache = torch.zeros(1, 2, 100, q_shape[-1], dtype=torch.bfloat16)
    plan = tk.explain_kvcache(q, cache, cache, torch.zeros(1, dtype=torch.int32))
    assert not plan.uses_kernel and plan.reason.startswith(reason)


def test_caches_the_kernel_cannot_write_fall_back(kvcache_kernel):
    q = torch.zeros(1, 2, 1, 64, dtype=torch.bfloat16)
    cache = torch.zeros(1, 2, 100, 128, dtype=torch.bfloat16)[..., ::2]  # last dim strided
    plan = tk.explain_kvcache(q, cache, cache, torch.zeros(1, dtype=torch.int32))
    assert plan.reason.startswith("k_cache has a layout the kernels cannot write in place")
