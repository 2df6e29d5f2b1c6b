"""tk.matmul against cuBLAS (torch.matmul) on given shapes, timed in alternating rounds.

    python3 scripts/compare_matmul.py 8192x8192x2048 4096x14336x4096 [--bt] [--reps 1]

MxNxK, bf16, B row-major (K, N), or with --bt the nn.Linear layout (w.mT of a row-major
(N, K) w). Prints per shape the median time and TFLOP/s of each and the ratio. --reps 1 runs
each once, untimed (for ncu). A K sweep at fixed M, N separates a per-task fixed cost (the
epilogue, the pipeline fill) from the per-K-step cost: time = fixed + K * per_step.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderkittens as tk  # noqa: E402
from benchmarks.timing import interleaved_median_ms  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("shapes", nargs="+", help="MxNxK")
    parser.add_argument("--bt", action="store_true", help="b = w.mT for a row-major (N, K) w")
    parser.add_argument("--reps", type=int, default=0, help="1: run each once, untimed (ncu)")
    args = parser.parse_args()
    for shape in args.shapes:
        m, n, k = (int(x) for x in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16).mT if args.bt
             else torch.randn(k, n, device="cuda", dtype=torch.bfloat16))

        def ours():
            with tk.strict():
                return tk.matmul(a, b)

        fns = {"tk": ours, "cublas": lambda: torch.matmul(a, b)}
        if args.reps == 1:
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            print(f"{shape}: ran once")
            continue
        times = interleaved_median_ms(fns)
        for ms in times.values():
            if isinstance(ms, Exception):
                raise ms
        flops = 2 * m * n * k
        print(f"{shape}{' b=w.mT' if args.bt else ''}: tk {times['tk'] * 1e3:8.1f} us "
              f"({flops / times['tk'] / 1e9:4.0f} TFLOP/s)  cublas {times['cublas'] * 1e3:8.1f} us "
              f"({flops / times['cublas'] / 1e9:4.0f} TFLOP/s)  tk/cublas {times['cublas'] / times['tk']:.3f}",
              flush=True)


if __name__ == "__main__":
    main()
