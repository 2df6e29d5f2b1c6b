"""Small tk.matmul calls for compute-sanitizer (memcheck / racecheck / synccheck).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python3 tools/sanitize_matmul.py

Calls torch.ops.tk.matmul directly (no fallback can hide a kernel problem) on partial tiles in
every dim, every operand layout (row-major, and column-major views like x.mT), broadcast
batches, output widths that TMA cannot store (N % 8 != 0, the register-store epilogue), and
shapes whose K is split over the blocks of a cluster (split-K: partials exchanged through
distributed shared memory).
Inputs are made on the CPU, and the reference is computed there, so the only GPU work is
copies and our kernel. Exits non-zero on any mismatch.
"""

import itertools
import sys

import torch

import thunderkittens  # noqa: F401  (registers torch.ops.tk.*)

# (batch_a, batch_b, M, N, K); K is a multiple of 8, so A row-major and B column-major are always readable.
# A side of at most 64 takes skinny tiles (M <= 64 swapped, C stored transposed; at most 16 with
# a K-major operand, 32 for 17..32: thin tiles). The last six split K over the blocks of a
# cluster (split-K: few output tiles, long K): skinny / thin-32 swapped by layout (17 x 264, 8
# shares: the cap), thin swapped (9 x 264), natural (300 x 16, 4 shares), narrow (2 and several
# shares), and 64-row tiles (9 x 264 x 32768: 5 tiles in 8 shares of 64 steps, where 128-row
# tiles would be 3 x 8).
SHAPES = [(1, 1, 1, 8, 8), (1, 1, 17, 40, 24), (1, 1, 130, 264, 72), (2, 2, 65, 300, 136),
          (3, 1, 33, 16, 64), (1, 3, 33, 16, 64), (1, 1, 20, 13, 16),
          (1, 1, 17, 264, 6144), (1, 1, 9, 264, 4104), (1, 1, 300, 16, 2048), (2, 2, 65, 300, 8192), (1, 1, 130, 264, 16384),
          (1, 1, 9, 264, 32768)]
DTYPES = [torch.bfloat16, torch.float16]


def operand(batch, rows, cols, dtype, column_major):
    """A (batch, rows, cols) CUDA tensor, row-major or as the .mT view of a row-major one."""
    if column_major:
        cpu = torch.randn(batch, cols, rows).to(dtype)
        return cpu, cpu.cuda().mT
    cpu = torch.randn(batch, rows, cols).to(dtype)
    return cpu, cpu.cuda()


def main() -> int:
    torch.manual_seed(0)
    failures = runs = 0
    for (ba, bb, m, n, k), dtype, a_t, b_t in itertools.product(SHAPES, DTYPES, (False, True), (False, True)):
        if (n % 8 and not b_t) or (m % 8 and a_t):
            continue  # rows of N (row-major B) or M (column-major A) elements are not 16-byte strides: refused
        a_cpu, a = operand(ba, m, k, dtype, a_t)
        b_cpu, b = operand(bb, k, n, dtype, b_t)
        if a_t:
            a_cpu = a_cpu.mT
        if b_t:
            b_cpu = b_cpu.mT
        out = torch.ops.tk.matmul(a, b).cpu().double()
        ref = a_cpu.double() @ b_cpu.double()
        err = (out - ref).abs().max().item()
        runs += 1
        if not err <= 2e-2 * max(1.0, ref.abs().max().item()):
            failures += 1
            print(f"MISMATCH {ba}x{bb} {m}x{n}x{k} {dtype} a_t={a_t} b_t={b_t}: max err {err:.3e}")
    torch.cuda.synchronize()
    print(f"sanitize_matmul: {runs} calls, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
