"""Small attention calls for compute-sanitizer (memcheck / racecheck / synccheck).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python3 scripts/sanitize_attention.py

Covers odd lengths (partial tiles), Lq != Lk both ways, both dtypes, both head dims, causal and
not, GQA, and strided (transposed) inputs; shapes are small because the sanitizer slows kernels
down by orders of magnitude. The only GPU work is host<->device copies and our kernel: inputs
are made (and laid out) on the CPU and the reference is computed on the CPU, so every report is
about our code. Results are compared with SDPA on the CPU too, so a run that is silent but wrong
still fails. Exits non-zero on any mismatch.
"""

import itertools
import math
import sys

import torch
import torch.nn.functional as F

import thunderkittens as tk

LENGTHS = [(1, 1), (17, 17), (64, 64), (65, 130), (130, 65), (127, 200), (1, 300), (300, 1)]
DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [64, 128]
HEADS = [(2, 2), (4, 1)]  # (query heads, key/value heads)
TOLERANCE = 3e-2  # loose: this is a sanitizer run, tests/test_attention_gpu.py checks accuracy


def to_gpu(cpu_tensor: torch.Tensor, transposed: bool) -> torch.Tensor:
    if transposed:  # (B, L, H, D) memory seen as (B, H, L, D), laid out on the CPU
        return cpu_tensor.transpose(1, 2).contiguous().cuda().transpose(1, 2)
    return cpu_tensor.cuda()


def main() -> int:
    torch.manual_seed(0)
    failures = calls = 0
    probe = torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.bfloat16)
    kernels = []
    for kernel in ("sm80", "sm90"):
        with tk.use_kernel(kernel):
            if tk.explain(probe, probe, probe).uses_kernel:
                kernels.append(kernel)
    for kernel, (len_q, len_kv), dtype, head_dim, causal, (heads_q, heads_kv) in itertools.product(
            kernels, LENGTHS, DTYPES, HEAD_DIMS, (False, True), HEADS):
        q = torch.randn(1, heads_q, len_q, head_dim, dtype=dtype)
        k = torch.randn(1, heads_kv, len_kv, head_dim, dtype=dtype)
        v = torch.randn(1, heads_kv, len_kv, head_dim, dtype=dtype)
        transposed = calls % 4 == 3
        gqa = heads_q != heads_kv
        with tk.use_kernel(kernel), tk.strict():
            out = tk.attention(to_gpu(q, transposed), to_gpu(k, transposed), v.cuda(),
                               is_causal=causal, enable_gqa=gqa).cpu()
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                  is_causal=causal, enable_gqa=gqa)
        error = (out.float() - expected).abs().max().item()
        calls += 1
        if not math.isfinite(error) or error > TOLERANCE:
            failures += 1
            print(f"MISMATCH {kernel} lq={len_q} lk={len_kv} {dtype} d={head_dim} causal={causal} "
                  f"hq={heads_q} hkv={heads_kv} transposed={transposed}: max abs error {error:.3e}")
    torch.cuda.synchronize()
    print(f"sanitize_attention: {calls} calls ({', '.join(kernels)}), {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
