"""tk against its peer run back to back for seconds: time, energy, power and clock per call.

    python3 tools/sustained.py --matmul 4096x4096x4096 4096x14336x4096 [--bt]
    python3 tools/sustained.py --attention 8,16,6144,128 8,16,6144,128,0,16,bwd [--seconds 3]

The benchmarks time calls under 2 ms in bursts after an idle GPU sleep and longer ones for a few
hundred milliseconds per turn (benchmarks/timing.py); this is the steady state of a training
loop held for seconds, where a kernel at the power cap runs at the clock its energy per call
allows. Matmul: MxNxK, bf16, against cuBLAS (torch.matmul). Attention: batch, heads,
len, head_dim[, causal[, kv_heads[, bwd]]] against SDPA's cuDNN backend. Each pair is run in
alternating turns (two rounds by default); per turn it prints microseconds and millijoules per
call, mean watts, the median SM clock and the hottest temperature, then the medians' ratios
(above 1: tk is faster / uses less energy per call).
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderkittens as tk  # noqa: E402
from benchmarks.power import Gpu  # noqa: E402
from benchmarks.timing import sustained  # noqa: E402


def matmul_pair(shape: str, b_transposed: bool):
    m, n, k = (int(x) for x in shape.split("x"))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16).mT if b_transposed
         else torch.randn(k, n, device="cuda", dtype=torch.bfloat16))

    def ours():
        with tk.strict():
            return tk.matmul(a, b)

    return shape + (" b=w.mT" if b_transposed else ""), {"tk": ours, "cublas": lambda: torch.matmul(a, b)}


def attention_pair(spec: str):
    fields = spec.split(",")
    batch, heads, length, dim = (int(x) for x in fields[:4])
    causal = len(fields) > 4 and fields[4] == "1"
    kv_heads = int(fields[5]) if len(fields) > 5 else heads
    backward = len(fields) > 6 and fields[6] == "bwd"
    q, dout = (torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(batch, kv_heads, length, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    if backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    gqa = kv_heads != heads

    def pass_of(attention):
        def run():
            with torch.set_grad_enabled(backward):
                o = attention()
                if backward:
                    o.backward(dout)

        return run

    def ours():
        with tk.strict():
            return tk.attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    name = (f"b{batch} h{heads}" + (f"/{kv_heads}" if gqa else "") + f" n{length} d{dim} "
            + ("causal" if causal else "full") + (" fwdbwd" if backward else " fwd"))
    return name, {"tk": pass_of(ours), "cudnn": pass_of(cudnn)}


def report(name: str, turns: dict):
    for impl, rows in turns.items():
        for i, row in enumerate(rows):
            extra = ""
            if "mj" in row:
                extra = (f"  {row['mj']:9.2f} mJ/call  {row['watts']:5.0f} W  {row['mhz']:5.0f} MHz"
                         f"  {row['max_temp_c']} C")
            print(f"{name}: {impl:6s} turn {i}: {row['us']:10.1f} us/call ({row['calls']} calls){extra}", flush=True)
    ours, peer = turns.values()

    def ratio(key: str) -> float:
        return statistics.median(r[key] for r in peer) / statistics.median(r[key] for r in ours)

    line = f"{name}: time peer/tk {ratio('us'):.3f}"
    if "mj" in ours[0]:
        line += f"  energy peer/tk {ratio('mj'):.3f}"
    print(line, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--matmul", nargs="*", default=[], help="MxNxK shapes")
    parser.add_argument("--bt", action="store_true", help="matmul b = w.mT for a row-major (N, K) w")
    parser.add_argument("--attention", nargs="*", default=[], help="batch,heads,len,head_dim[,causal[,kv_heads[,bwd]]]")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    gpu = Gpu.open()
    if gpu is None:
        print("NVML unavailable: times only", flush=True)
    makers = [lambda s=s: matmul_pair(s, args.bt) for s in args.matmul]
    makers += [lambda s=s: attention_pair(s) for s in args.attention]
    for make in makers:  # one pair's tensors at a time
        name, fns = make()
        report(name, sustained(fns, seconds=args.seconds, rounds=args.rounds, gpu=gpu))
        del fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
