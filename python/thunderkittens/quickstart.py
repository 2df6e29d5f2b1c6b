"""python -m thunderkittens.quickstart: one attention call, checked and timed.

Runs tk.attention on random inputs (causal, grouped-query), says which path it took, checks the
answer against a float64 reference next to PyTorch's own F.scaled_dot_product_attention, and
times both (median of REPS calls after WARMUP). Without a GPU the call falls back to PyTorch on
the CPU, which it says; the answer is still checked, and the two timings are of the same PyTorch
call. Exits non-zero if the answer is wrong.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

import thunderkittens as tk

WARMUP = 5  # the first calls pay for one-time setup (allocations, kernel loading)
REPS = 30


def _time_ms(fn, reps: int = REPS) -> float:
    for _ in range(WARMUP):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> int:
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    batch, heads_q, heads_kv, length, head_dim = (4, 16, 4, 2048, 128) if on_gpu else (1, 8, 2, 256, 64)
    torch.manual_seed(0)
    q = torch.randn(batch, heads_q, length, head_dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(batch, heads_kv, length, head_dim, device=device, dtype=torch.bfloat16)
    v = torch.randn(batch, heads_kv, length, head_dim, device=device, dtype=torch.bfloat16)
    kwargs = {"is_causal": True, "enable_gqa": True}

    print(f"thunderkittens {tk.__version__} | torch {torch.__version__} | {tk.build_summary()}")
    print(f"device: {torch.cuda.get_device_name() if on_gpu else 'cpu (no CUDA GPU visible)'}")
    print(f"q {tuple(q.shape)}, k/v {tuple(k.shape)}, bf16, causal, GQA")
    plan = tk.explain(q, k, v, **kwargs)
    print(f"path: {plan}")
    if not on_gpu:
        print("no GPU: tk.attention falls back to torch SDPA here; checking that answer on the CPU")

    out = tk.attention(q, k, v, **kwargs)
    torch_out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    ratio = heads_q // heads_kv
    reference = F.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(ratio, 1), v.double().repeat_interleave(ratio, 1),
        is_causal=True)
    error = (out.double() - reference).abs().max().item()
    torch_error = (torch_out.double() - reference).abs().max().item()
    print(f"max abs error vs float64 reference: tk.attention {error:.2e}, "
          f"torch SDPA {torch_error:.2e}")
    correct = error <= 2 * torch_error + 1e-3
    print("answer: OK" if correct else "answer: WRONG")

    ours_ms = _time_ms(lambda: tk.attention(q, k, v, **kwargs))
    torch_ms = _time_ms(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs))
    flops = 4 * batch * heads_q * length * length * head_dim / 2  # causal: half the work
    print(f"time (median of {REPS} calls):")
    for name, ms in (("tk.attention", ours_ms), ("torch SDPA", torch_ms)):
        speed = f"  {flops / (ms * 1e-3) / 1e12:7.1f} TFLOP/s" if on_gpu else ""
        print(f"{name:>13}: {ms:8.3f} ms{speed}")
    if not on_gpu:
        print("(on the CPU both are the same PyTorch call: tk's kernels need a CUDA GPU)")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
