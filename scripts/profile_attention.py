"""Run one attention config a few times, for ncu or a quick look at one kernel.

    ncu --clock-control none -k regex:backward_kernel -s 2 -c 1 --section WarpStateStats \
        python3 scripts/profile_attention.py --len 1536 --dim 128 --backward

Prints the median time and TFLOP/s of tk.attention (the kernel family forced, strict) next to
SDPA's cuDNN backend on the same inputs; with --backward, forward + backward (3.5x the
forward's flops, as the benchmarks count them).
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
from benchmarks.timing import median_ms  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--len", type=int, default=1536)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--kernel", default="sm90", choices=("sm80", "sm90"))
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    args = parser.parse_args()
    shape = (args.batch, args.heads, args.len, args.dim)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    if args.backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    flops = 4 * args.batch * args.heads * args.len * args.len * args.dim / (2 if args.causal else 1)
    flops *= 3.5 if args.backward else 1

    def call(attention):
        out = attention(q, k, v, is_causal=args.causal)
        if args.backward:
            out.backward(dout)

    with tk.use_kernel(args.kernel), tk.strict():
        ours = median_ms(lambda: call(tk.attention))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        cudnn = median_ms(lambda: call(F.scaled_dot_product_attention))
    print(f"{shape} causal={args.causal} backward={args.backward}: tk {ours:.3f} ms "
          f"({flops / ours / 1e9:.0f} TFLOP/s), cudnn {cudnn:.3f} ms ({flops / cudnn / 1e9:.0f} TFLOP/s), "
          f"tk/cudnn {cudnn / ours:.2f}")


if __name__ == "__main__":
    main()
