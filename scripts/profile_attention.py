"""Run one attention config a few times, for ncu or a quick look at one kernel.

    ncu --clock-control none -k regex:forward_kernel -s 2 -c 1 --set detailed \
        python3 scripts/profile_attention.py --batch 16 --heads 16 --len 1536 --dim 128

Prints the median time and TFLOP/s of tk.attention (forced sm80 kernel, strict) next to
SDPA's flash backend on the same inputs.
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import thunderkittens as tk
from benchmarks.timing import median_ms  # run from the repository root


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--len", type=int, default=1536)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    shape = (args.batch, args.heads, args.len, args.dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * args.batch * args.heads * args.len * args.len * args.dim / (2 if args.causal else 1)
    with tk.use_kernel("sm80"), tk.strict():
        ours = median_ms(lambda: tk.attention(q, k, v, is_causal=args.causal))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=args.causal))
    print(f"{shape} causal={args.causal}: tk {ours:.3f} ms ({flops / ours / 1e9:.0f} TFLOP/s), "
          f"flash {flash:.3f} ms ({flops / flash / 1e9:.0f} TFLOP/s), ratio {flash / ours:.2f}")


if __name__ == "__main__":
    main()
