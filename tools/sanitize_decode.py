"""Small decoding calls for compute-sanitizer (memcheck / racecheck / synccheck).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 tools/sanitize_decode.py

Calls the decode ops directly (no fallback can hide a kernel problem): torch.ops.tk.attention_fwd_decode
on shapes that take one piece, several pieces and their merge (a dependent launch on sm_90),
and pieces on a GPU half-filled by batch x kv heads; GQA groups of 1 to 8 heads, 1 to 64 query
rows (one to four row tiles), causal lower-right and plain, d64 and d128, both dtypes; then
tk.kvcache_append and torch.ops.tk.attention_decode_kvcache on per-sequence lengths 0 .. capacity.
Inputs and the float64 references are made on the CPU, so the only GPU work is copies and our
kernels. Exits non-zero on any mismatch.
"""

import itertools
import math

import torch

import thunderkittens  # noqa: F401  (registers torch.ops.tk.*)

DTYPES = [torch.bfloat16, torch.float16]
# (batch, heads_q, heads_kv, len_q, len_kv, head_dim)
SHAPES = [
    (1, 8, 2, 1, 1000, 128),   # batch 1: several pieces, merged
    (2, 4, 4, 3, 300, 64),     # one piece, MHA
    (1, 16, 2, 7, 2100, 64),   # 56 packed rows: one 64-row tile, pieces
    (1, 8, 2, 64, 700, 128),   # 256 packed rows: four row tiles
    (32, 2, 2, 1, 8192, 64),   # 64 (batch, kv head) units: the half-filled rule's pieces
]


def reference(q, k, v, scale, keys, causal_offset):
    """float64 attention of q (B, Hq, Lq, D) against the first keys[b] rows of k, v (B, Hkv, S, D);
    causal: key j visible to row i iff j <= i + causal_offset[b]. Rows that see no key are 0."""
    b, hq, lq, _ = q.shape
    group = hq // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(b):
        n = keys[i]
        scores = q[i].double() @ k[i, :, :n].transpose(-1, -2) * scale
        if causal_offset is not None:
            visible = torch.arange(n)[None, :] <= torch.arange(lq)[:, None] + causal_offset[i]
            scores = scores.masked_fill(~visible, float("-inf"))
        weights = torch.softmax(scores, -1).nan_to_num(0.0)
        out[i] = weights @ v[i, :, :n]
    return out


def mismatch(out, ref) -> float | None:
    err = (out.cpu().double() - ref).abs().max().item()
    return None if math.isfinite(err) and err <= 3e-2 * max(1.0, ref.abs().max().item()) else err


def forward_calls() -> tuple[int, int]:
    runs = failures = 0
    for (b, hq, hkv, lq, lk, d), dtype, causal in itertools.product(SHAPES, DTYPES, (False, True)):
        q, k, v = (torch.randn(b, h, n, d).to(dtype) for h, n in ((hq, lq), (hkv, lk), (hkv, lk)))
        scale = d ** -0.5
        out, _lse = torch.ops.tk.attention_fwd_decode(q.cuda(), k.cuda(), v.cuda(), causal, scale, causal)
        offset = [lk - lq] * b if causal else None
        err = mismatch(out, reference(q, k, v, scale, [lk] * b, offset))
        runs += 1
        if err is not None:
            failures += 1
            print(f"MISMATCH decode b{b} hq{hq} hkv{hkv} lq{lq} lk{lk} d{d} {dtype} causal={causal}: {err:.3e}")
    return runs, failures


def kvcache_calls() -> tuple[int, int]:
    runs = failures = 0
    b, hq, hkv, capacity, d, new = 4, 8, 2, 600, 128, 2
    for dtype in DTYPES:
        k_cache, v_cache = (torch.randn(b, hkv, capacity, d).to(dtype) for _ in range(2))
        seqlens = torch.tensor([0, 17, 400, capacity - new], dtype=torch.int32)
        q = torch.randn(b, hq, new, d).to(dtype)
        k_new, v_new = (torch.randn(b, hkv, new, d).to(dtype) for _ in range(2))
        kc, vc, lens = k_cache.cuda(), v_cache.cuda(), seqlens.cuda()
        torch.ops.tk.kvcache_append(kc, vc, lens, k_new.cuda(), v_new.cuda())
        out, _lse = torch.ops.tk.attention_decode_kvcache(q.cuda(), kc, vc, lens, new, True, d ** -0.5)
        for i, n in enumerate(seqlens.tolist()):
            k_cache[i, :, n:n + new], v_cache[i, :, n:n + new] = k_new[i], v_new[i]
        keys = [n + new for n in seqlens.tolist()]
        ref = reference(q, k_cache, v_cache, d ** -0.5, keys, [n - new for n in keys])
        cache_err = max((kc.cpu() != k_cache).sum().item(), (vc.cpu() != v_cache).sum().item())
        err = mismatch(out, ref)
        runs += 1
        if err is not None or cache_err:
            failures += 1
            print(f"MISMATCH kvcache {dtype}: out err {err}, {cache_err} cache elements differ")
    return runs, failures


def main() -> int:
    torch.manual_seed(0)
    runs, failures = forward_calls()
    more_runs, more_failures = kvcache_calls()
    torch.cuda.synchronize()
    print(f"sanitize_decode: {runs + more_runs} calls, {failures + more_failures} mismatches")
    return 1 if failures + more_failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
