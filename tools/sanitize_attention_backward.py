"""Small tk::attention_bwd_sm90 calls for compute-sanitizer (memcheck / racecheck / synccheck),
checked against float64 gradients computed on the CPU.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python3 tools/sanitize_attention_backward.py

Calls the sm90 forward and backward ops directly (no fallback can hide a kernel problem) on
partial tiles, Lq != Lk both ways, both dtypes and head dims, causal and not (and lower-right
causal with Lq > Lk and Lq < Lk), and GQA; some also in the deterministic mode (ordered dq
reduce-adds between blocks, spinning on global turn counters). Needs an sm_90 GPU; exits
non-zero on any mismatch.
"""

import itertools
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import thunderkittens  # noqa: E402,F401  (registers torch.ops.tk.*)
from reference import causal_offset_of, reference_attention  # noqa: E402

LENGTHS = [(1, 1), (17, 17), (65, 130), (130, 65), (200, 200)]
DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [64, 96, 128]
HEADS = [(2, 2), (4, 1)]
# lower-right causal (key j visible to query i iff j <= i + Lk - Lq): with (200, 65) the first
# 135 rows, two whole 64-row blocks, see no key.
LOWER_RIGHT_LENGTHS = [(200, 65), (65, 130)]
# Also run with deterministic=True (several key blocks per query block: turns are taken).
DETERMINISTIC_LENGTHS = [(65, 130), (200, 300)]
TOLERANCE = 5e-2  # relative to the largest gradient; tests/ check accuracy properly


def main() -> int:
    torch.manual_seed(0)
    failures = calls = 0
    # (causal, lower_right): full, causal (top-left), and causal lower-right
    masks = ((False, False), (True, False))
    cases = list(itertools.product(LENGTHS, DTYPES, HEAD_DIMS, masks, HEADS, (False,)))
    cases += list(itertools.product(LOWER_RIGHT_LENGTHS, DTYPES, HEAD_DIMS, ((True, True),), HEADS,
                                    (False,)))
    cases += list(itertools.product(DETERMINISTIC_LENGTHS, DTYPES, HEAD_DIMS,
                                    masks + ((True, True),), HEADS, (True,)))
    for (len_q, len_kv), dtype, head_dim, (causal, lower_right), (heads_q, heads_kv), deterministic \
            in cases:
        scale = 1 / math.sqrt(head_dim)
        q = torch.randn(1, heads_q, len_q, head_dim, dtype=dtype)
        k = torch.randn(1, heads_kv, len_kv, head_dim, dtype=dtype)
        v = torch.randn(1, heads_kv, len_kv, head_dim, dtype=dtype)
        dout = torch.randn(1, heads_q, len_q, head_dim, dtype=dtype)
        qg, kg, vg, dg = (t.cuda() for t in (q, k, v, dout))
        out, lse = torch.ops.tk.attention_fwd_sm90(qg, kg, vg, causal, scale, lower_right)
        grads = torch.ops.tk.attention_bwd_sm90(dg, qg, kg, vg, out, lse, causal, scale,
                                                lower_right, deterministic)

        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        ref_out, _ = reference_attention(*leaves, causal, scale,
                                         causal_offset=causal_offset_of(q, k, lower_right))
        ref_out.backward(dout.double())
        calls += 1
        for name, got, leaf in zip(("dq", "dk", "dv"), grads, leaves):
            ref = leaf.grad
            error = (got.cpu().double() - ref).abs().max().item()
            if not math.isfinite(error) or error > TOLERANCE * max(1.0, ref.abs().max().item()):
                failures += 1
                print(f"MISMATCH {name} lq={len_q} lk={len_kv} {dtype} d={head_dim} causal={causal} "
                      f"lower_right={lower_right} deterministic={deterministic} "
                      f"hq={heads_q} hkv={heads_kv}: max abs error {error:.3e} (max |ref| "
                      f"{ref.abs().max().item():.3e})")
    torch.cuda.synchronize()
    print(f"sanitize_attention_backward: {calls} calls, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
