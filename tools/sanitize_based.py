"""Small Based calls for compute-sanitizer (memcheck / racecheck / synccheck).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python3 tools/sanitize_based.py

Calls torch.ops.tk.based_fwd_sm80 directly (no fallback can hide a kernel problem) on lengths
around the 64-row chunk, both value dims and dtypes, normalize on and off, with and without an
initial and a final state, and a strided (B, N, H, D) layout. Inputs and the float64 reference
are made on the CPU, so the only GPU work is copies and our kernel. Exits non-zero on any
mismatch.
"""

import itertools
import math
import sys

import torch

import thunderkittens  # noqa: F401  (registers torch.ops.tk.*)
from thunderkittens._based import reference

LENGTHS = [1, 63, 65, 130]
VALUE_DIMS = [64, 128]
DTYPES = [torch.bfloat16, torch.float16]


def main() -> int:
    torch.manual_seed(0)
    failures = runs = 0
    scale = 0.25
    for n, dv, dtype, normalize, states in itertools.product(LENGTHS, VALUE_DIMS, DTYPES, (False, True), (False, True)):
        b, h = 2, 3
        q = torch.randn(b, n, h, 16).to(dtype)
        k = torch.randn(b, n, h, 16).to(dtype)
        v = torch.randn(b, h, n, dv).to(dtype)
        state0 = (reference.feature_map(torch.randn(b, h, 40, 16, dtype=torch.float64), scale).transpose(-1, -2)
                  @ torch.cat([torch.randn(b, h, 40, dv, dtype=torch.float64), torch.ones(b, h, 40, 1, dtype=torch.float64)], -1)).float() if states else None
        out, final = torch.ops.tk.based_fwd_sm80(q.cuda().transpose(1, 2), k.cuda().transpose(1, 2), v.cuda(), scale,
                                                 normalize, 1e-6, state0.cuda() if states else None, states)
        ref, ref_state = reference.quadratic(q.transpose(1, 2).double(), k.transpose(1, 2).double(), v.double(), scale,
                                             normalize, 1e-6, state0.double() if states else None)
        err = (out.cpu().double() - ref).abs().max().item()
        bad = not err <= 3e-2 * max(1.0, ref.abs().max().item())
        if states:
            state_err = (final.cpu().double() - ref_state).norm().item() / ref_state.norm().item()
            bad = bad or not state_err <= 1e-2
        runs += 1
        if bad or not math.isfinite(err):
            failures += 1
            print(f"MISMATCH n={n} dv={dv} {dtype} normalize={normalize} states={states}: max err {err:.3e}")
    torch.cuda.synchronize()
    print(f"sanitize_based: {runs} calls, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
