"""Small attention calls for compute-sanitizer (memcheck / racecheck / synccheck).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python3 tools/sanitize_attention.py

Covers odd lengths (partial tiles), Lq != Lk both ways, both dtypes, both head dims, causal and
not (and causal_lower_right with Lq > Lk and Lq < Lk), GQA, and strided (transposed) inputs;
shapes are small because the sanitizer slows kernels
down by orders of magnitude. The only GPU work is host<->device copies and our kernel: inputs
are made (and laid out) on the CPU and the reference is computed on the CPU, so every report is
about our code. Results are compared with SDPA on the CPU too, so a run that is silent but wrong
still fails. Exits non-zero on any mismatch.
"""

import itertools
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import thunderkittens as tk  # noqa: E402
from thunderkittens._C import attention_head_dims  # noqa: E402  (per family, from the C++ side)
from reference import lower_right_bias  # noqa: E402

# (130, 2100): the sm90 forward at d64 splits its tasks (2 or 4 heads x 1 query block) over the key tiles.
LENGTHS = [(1, 1), (17, 17), (64, 64), (65, 130), (130, 65), (127, 200), (1, 300), (300, 1), (130, 2100)]
DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [64, 96, 128]
HEADS = [(2, 2), (4, 1)]  # (query heads, key/value heads)
# causal_lower_right (key j visible to query i iff j <= i + Lk - Lq): with (300, 65) the first
# 235 rows see no key, a whole query block of each kernel (128 rows; 192 for sm90 at d64).
LOWER_RIGHT_LENGTHS = [(300, 65), (65, 130)]
# Non-causal d128 with both lengths >= 3072 runs the sm90 forward with three consumer warpgroups
# (serial tiles, 192-row tasks, a split last round). With 132 SMs, (3100, 3073) is 34 or 68
# tasks (all split, or one whole task per block); (26000, 3073) is 272 or 544, so blocks run
# two to four whole tasks back to back (the Q buffers change hands between tasks) and then a
# piece of a split task. An even number of query blocks per head (3300: 18, 26000: 136) runs
# in clusters of two blocks sharing K/V (multicast copies, remote arrivals); 3100's 17 does not.
THREE_CONSUMER_LENGTHS = [(3100, 3073), (3300, 3073), (26000, 3073)]
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
    # mask: False (full), True (causal, top-left) or "lower-right" (the causal_lower_right bias)
    cases = list(itertools.product(kernels, LENGTHS, DTYPES, HEAD_DIMS, (False, True), HEADS))
    cases += list(itertools.product(kernels, LOWER_RIGHT_LENGTHS, DTYPES, HEAD_DIMS,
                                    ("lower-right",), HEADS))
    cases += list(itertools.product([k for k in kernels if k == "sm90"], THREE_CONSUMER_LENGTHS, DTYPES,
                                    [128], (False,), HEADS))
    # Only the head dims each family is built for (the sm80 family has no d96).
    cases = [case for case in cases if case[3] in attention_head_dims[case[0]]]
    for kernel, (len_q, len_kv), dtype, head_dim, mask, (heads_q, heads_kv) in cases:
        q = torch.randn(1, heads_q, len_q, head_dim, dtype=dtype)
        k = torch.randn(1, heads_kv, len_kv, head_dim, dtype=dtype)
        v = torch.randn(1, heads_kv, len_kv, head_dim, dtype=dtype)
        transposed = calls % 4 == 3
        gqa = heads_q != heads_kv
        if mask == "lower-right":
            flags = {"attn_mask": lower_right_bias(len_q, len_kv)}
        else:
            flags = {"is_causal": mask}
        with tk.use_kernel(kernel), tk.strict():
            out = tk.attention(to_gpu(q, transposed), to_gpu(k, transposed), v.cuda(),
                               enable_gqa=gqa, **flags).cpu()
        # The CPU (math backend) gives rows that see no key 0, as our kernels do.
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=gqa,
                                                  **flags)
        error = (out.float() - expected).abs().max().item()
        calls += 1
        if not math.isfinite(error) or error > TOLERANCE:
            failures += 1
            print(f"MISMATCH {kernel} lq={len_q} lk={len_kv} {dtype} d={head_dim} causal={mask} "
                  f"hq={heads_q} hkv={heads_kv} transposed={transposed}: max abs error {error:.3e}")
    torch.cuda.synchronize()
    print(f"sanitize_attention: {calls} calls ({', '.join(kernels)}), {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
