"""How often repeated tk::attention_bwd_sm90 calls give dq with other bits than the first call,
in arrival order and in the deterministic mode: the first should differ on configs where many
key blocks add into each dq block, the second never.

    python3 scripts/check_determinism.py [--runs 10]
"""

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderkittens  # noqa: E402,F401  (registers torch.ops.tk.*)

# (batch, heads_q, heads_kv, length, head_dim, causal)
CONFIGS = [(2, 16, 16, 2048, 64, True), (2, 8, 2, 1000, 128, False), (4, 32, 4, 1024, 128, True)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    failures = 0
    for batch, heads_q, heads_kv, length, head_dim, causal in CONFIGS:
        q = torch.randn(batch, heads_q, length, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, heads_kv, length, head_dim, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        grad_out = torch.randn_like(q)
        scale = 1 / math.sqrt(head_dim)
        out, lse = torch.ops.tk.attention_fwd_sm90(q, k, v, causal, scale)
        for deterministic in (False, True):
            def dq():
                return torch.ops.tk.attention_bwd_sm90(grad_out, q, k, v, out, lse, causal, scale,
                                                       False, deterministic)[0]
            first = dq()
            differ = sum(not torch.equal(first, dq()) for _ in range(args.runs))
            failures += deterministic and differ > 0
            print(f"b{batch} h{heads_q}/{heads_kv} n{length} d{head_dim} "
                  f"{'causal' if causal else 'full'} deterministic={deterministic}: "
                  f"dq differs from the first run in {differ}/{args.runs} runs", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
