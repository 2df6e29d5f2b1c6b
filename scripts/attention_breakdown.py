"""Where the time of one attention forward + backward goes, kernel by kernel (torch.profiler's
CUDA times, averaged over the timed iterations), for tk's sm90 ops and SDPA's cuDNN backend on
the same inputs. A development tool: the user-facing numbers come from `python -m benchmarks`.

    python3 scripts/attention_breakdown.py --config 16,16,768,768,64 --config 8,16,512,8192,128
    (batch, heads, len_q, len_kv, head_dim[, causal[, kv_heads]]); --deterministic adds tk's
    backward in its deterministic mode (tk-det) where the built op has that argument (an A/B
    against an older build runs the same command).
"""

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import thunderkittens  # noqa: E402,F401

ITERATIONS = 10


def kernel_times(fn) -> dict[str, float]:
    """Mean microseconds per call of each CUDA kernel (and memset) fn launches."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERATIONS):
            fn()
        torch.cuda.synchronize()
    totals = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:90]] += event.device_time / ITERATIONS
    return dict(totals)


def show(title: str, times: dict[str, float]) -> None:
    total = sum(times.values())
    print(f"  {title}: {total:8.1f} us in kernels")
    for name, us in sorted(times.items(), key=lambda item: -item[1]):
        print(f"    {us:8.1f} us {100 * us / total:5.1f}%  {name}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", action="append", required=True,
                        help="batch,heads,len_q,len_kv,head_dim[,causal[,kv_heads]]")
    parser.add_argument("--deterministic", action="store_true",
                        help="also time the deterministic backward (tk-det)")
    args = parser.parse_args()
    has_deterministic = "deterministic" in str(torch.ops.tk.attention_bwd_sm90.default._schema)
    for text in args.config:
        fields = [int(x) for x in text.split(",")]
        b, h, lq, lk, d = fields[:5]
        causal = bool(fields[5]) if len(fields) > 5 else False
        h_kv = fields[6] if len(fields) > 6 else h
        q, dout = (torch.randn(b, h, lq, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(b, h_kv, lk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        scale = 1 / math.sqrt(d)

        def ours(deterministic=False):
            out, lse = torch.ops.tk.attention_fwd_sm90(q, k, v, causal, scale)
            extra = (deterministic,) if has_deterministic else ()
            torch.ops.tk.attention_bwd_sm90(dout, q, k, v, out, lse, causal, scale, False, *extra)

        # cuDNN gets GQA's k and v expanded to every query head (its own GQA support varies).
        kk, vv = (t.repeat_interleave(h // h_kv, dim=1) for t in (k, v))
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, kk, vv))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            out.backward(dout)

        heads = f"{h}/{h_kv}" if h_kv != h else f"{h}"
        print(f"b{b} h{heads} lq{lq} lk{lk} d{d} {'causal' if causal else 'full'}", flush=True)
        show("tk", kernel_times(ours))
        if args.deterministic and has_deterministic:
            show("tk-det", kernel_times(lambda: ours(deterministic=True)))
        show("cudnn", kernel_times(cudnn))


if __name__ == "__main__":
    main()
