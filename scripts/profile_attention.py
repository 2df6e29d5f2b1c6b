"""tk.attention against SDPA's cuDNN backend on a few configs, for ncu or a quick A/B.

    python3 scripts/profile_attention.py --config 16,16,1536,128 --config 16,16,768,64,1 [--backward]
    python3 scripts/profile_attention.py --config 8,32,2048,128,0,8 --default   (GQA: 32 q, 8 kv heads)
    ncu --clock-control none -k regex:backward_kernel_sm90 -c 1 --section WarpStateStats \\
        python3 scripts/profile_attention.py --config 16,16,1536,128 --backward --reps 1

A config is batch,heads,len,head_dim[,causal[,kv_heads]]. Prints per config the median time and
TFLOP/s of tk.attention (the kernel family forced, strict) and of SDPA's cuDNN backend on the same
inputs, timed in alternating rounds (benchmarks/timing.py), and their ratio; with --default, also
SDPA with no backend chosen (for GQA it can beat the forced cuDNN backend); with --backward,
forward + backward (3.5x the forward's flops, as the benchmarks count them). --reps 1 runs each
once, untimed (for ncu).
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# `python3 scripts/profile_attention.py` puts scripts/ on the path, not the repository root
# where `benchmarks` lives (as in time_attention_backward.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderkittens as tk  # noqa: E402
from benchmarks.timing import interleaved_median_ms  # noqa: E402


def measure(batch, heads, length, dim, causal, kv_heads, args):
    q, dout = (torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(batch, kv_heads, length, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gqa = kv_heads != heads
    if args.backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    flops = 4 * batch * heads * length * length * dim / (2 if causal else 1)
    flops *= 3.5 if args.backward else 1

    def call(attention):
        with torch.enable_grad() if args.backward else torch.no_grad():
            out = attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            if args.backward:
                out.backward(dout)

    def ours():
        with tk.use_kernel(args.kernel), tk.strict():
            call(tk.attention)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            call(F.scaled_dot_product_attention)

    def default():
        call(F.scaled_dot_product_attention)

    heads_text = f"h{heads}" if not gqa else f"hq{heads} hkv{kv_heads}"
    name = f"b{batch} {heads_text} n{length} d{dim} {'causal' if causal else 'full'}"
    if args.reps == 1:
        ours(), cudnn()
        torch.cuda.synchronize()
        print(f"{name}: ran once")
        return
    times = interleaved_median_ms({"tk": ours, "cudnn": cudnn, **({"default": default} if args.default else {})})
    for impl, ms in times.items():
        if isinstance(ms, Exception):
            raise ms
    tk_ms, cudnn_ms = times["tk"], times["cudnn"]
    print(f"{name}{' fwd+bwd' if args.backward else ' fwd'}: tk {tk_ms * 1e3:8.1f} us "
          f"({flops / tk_ms / 1e9:4.0f} TFLOP/s)  cudnn {cudnn_ms * 1e3:8.1f} us "
          f"({flops / cudnn_ms / 1e9:4.0f} TFLOP/s)  tk/cudnn {cudnn_ms / tk_ms:.3f}"
          + (f"  default {times['default'] * 1e3:8.1f} us  tk/default {times['default'] / tk_ms:.3f}"
             if args.default else ""), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", action="append", required=True,
                        help="batch,heads,len,head_dim[,causal[,kv_heads]]")
    parser.add_argument("--default", action="store_true", help="also time SDPA with no backend chosen")
    parser.add_argument("--kernel", default="sm90", choices=("sm80", "sm90"))
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    parser.add_argument("--reps", type=int, default=0, help="1: run each once, untimed (ncu)")
    args = parser.parse_args()
    for text in args.config:
        fields = [int(x) for x in text.split(",")]
        causal = bool(fields[4]) if len(fields) > 4 else False
        measure(*fields[:4], causal, fields[5] if len(fields) > 5 else fields[1], args)


if __name__ == "__main__":
    main()
