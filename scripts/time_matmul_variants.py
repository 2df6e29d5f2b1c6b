"""Development timing of torch.ops.tk.matmul against cuBLAS on the anchor shapes, for comparing
kernel design variants in one GPU call (each variant is a separate process, since the kernel
reads TK_MATMUL_DEV_VARIANT once):

    for v in default lag0 regstore; do TK_MATMUL_DEV_VARIANT=$v python3 scripts/time_matmul_variants.py; done

The user-facing benchmark is `python -m benchmarks` (benchmarks/matmul.py).
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderkittens  # noqa: E402,F401  (registers torch.ops.tk.*)
from benchmarks.timing import median_ms  # noqa: E402

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 2048), (4096, 14336, 4096),
          (16384, 4096, 4096), (2048, 2048, 2048)]


def main() -> None:
    variant = os.environ.get("TK_MATMUL_DEV_VARIANT") or "default"
    torch.manual_seed(0)
    for m, n, k in SHAPES:
        for layout in (("row", "row"), ("row", "col"), ("col", "row")) if (m, n, k) == (4096, 4096, 4096) else (("row", "row"),):
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            if layout[0] == "col":
                a = a.T.contiguous().T
            if layout[1] == "col":
                b = b.T.contiguous().T
            a3, b3 = a.unsqueeze(0), b.unsqueeze(0)
            ours = torch.ops.tk.matmul(a3, b3)[0]
            ref = a @ b
            rel = ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
            t_ours = median_ms(lambda: torch.ops.tk.matmul(a3, b3))
            t_ref = median_ms(lambda: a @ b)
            flops = 2 * m * n * k
            print(f"{variant:9s} {m}x{n}x{k} a={layout[0]} b={layout[1]}: tk {flops / t_ours / 1e9:5.0f} "
                  f"cuBLAS {flops / t_ref / 1e9:5.0f} TFLOP/s  ratio {t_ref / t_ours:.3f}  rel err {rel:.1e}",
                  flush=True)
            del a, b, a3, b3, ours, ref


if __name__ == "__main__":
    main()
