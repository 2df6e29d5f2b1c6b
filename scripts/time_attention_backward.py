"""Development timing of the sm90 attention backward op against SDPA's cuDNN and flash backward
(forward + backward, TFLOP/s with the anchors' 3.5x-forward flop count). The user-facing
benchmark is `python -m benchmarks` (fwdbwd pass)."""

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderkittens  # noqa: E402,F401
from benchmarks.timing import median_ms  # noqa: E402

CONFIGS = [(16, 16, 1536, 128, False), (16, 16, 1536, 128, True), (8, 16, 6144, 128, False),
           (16, 16, 3072, 64, False), (16, 16, 3072, 64, True)]

for b, h, n, d, causal in CONFIGS:
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = 1 / math.sqrt(d)

    def ours():
        out, lse = torch.ops.tk.attention_fwd_sm90(q, k, v, causal, scale)
        return torch.ops.tk.attention_bwd_sm90(do, q, k, v, out, lse, causal, scale)

    def sdpa(backend):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))

        def run():
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            out.backward(do)
        return run

    flops = 4 * b * h * n * n * d * (0.5 if causal else 1) * 3.5
    row = [f"b{b} h{h} n{n} d{d} {'causal' if causal else 'full'}"]
    for name, fn in (("tk", ours), ("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION)), ("flash", sdpa(SDPBackend.FLASH_ATTENTION))):
        try:
            row.append(f"{name} {flops / median_ms(fn) / 1e9:4.0f}")
        except Exception as error:  # noqa: BLE001
            row.append(f"{name} error {type(error).__name__}")
    print("  ".join(row), flush=True)
