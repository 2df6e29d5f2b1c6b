"""Time the load/compute/finish template's GEMM (tests/core_kernels/hopper_gemm.cu, a core
test kernel, not yet tk.matmul) against torch.matmul (cuBLAS) in the same process, to track the
Hopper template's speed. Run from the repository root on an sm_90 GPU (the test extension is built on first use)."""

import sys

import torch

sys.path.insert(0, "tests")
from benchmarks.timing import median_ms  # noqa: E402
from test_core_gpu import CODES, gl  # noqa: E402
from test_core_hopper_gpu import build_hopper_extension  # noqa: E402


def main():
    hopper = build_hopper_extension()
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 2048), (4096, 14336, 4096)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        stream = torch.cuda.current_stream().cuda_stream
        ours = median_ms(lambda: hopper.gemm(CODES[torch.bfloat16], gl(a), gl(b), gl(c), stream))
        cublas = median_ms(lambda: torch.matmul(a, b))
        flops = 2 * m * n * k
        print(f"{m}x{n}x{k}: template gemm {flops / ours / 1e9:.0f} TFLOP/s, cuBLAS {flops / cublas / 1e9:.0f} "
              f"TFLOP/s, ratio {cublas / ours:.2f}")


if __name__ == "__main__":
    main()
