"""Host (CPU) time per call of tk.attention on a transformers decoding step, against
F.scaled_dot_product_attention on the same call, in one process.

    python tools/host_time.py              # on a GPU: the real ops, SDPA beside them
    python tools/host_time.py --standin    # without a GPU: tk's ops are CPU stand-ins
    python tools/host_time.py --profile    # + cProfile of tk.attention's calls

The call as transformers' Llama makes it while generating (benchmarks/generate.py's model):
q (B, Hq, 1, D) a transposed view of the projection, k/v the cache (B, Hkv, L, D), a fresh
contiguous tensor each step (DynamicCache's torch.cat: the calls rotate over caches of L .. L+3
rows), enable_gqa, no mask, is_causal False (one query token), the scale given. Rows:
tk.attention; its op alone (torch.ops.tk.attention_fwd_decode); SDPA (on a GPU); the
transformers integration's attention function and, on a GPU, transformers' own SDPA function.

Each row is timed two ways, the best of five interleaved rounds of each: "per call", the median
of calls timed one at a time after a synchronisation (the GPU queue empty, so a call returns as
soon as its launches are issued: its host time); "back to back", the mean of calls issued
without synchronising (a decoding loop's view, as long as the GPU keeps up).

With --standin the ops are Python CPU stand-ins that allocate the two outputs: the op row then
says nothing about the real op, and SDPA (which computes on the CPU) is timed on a (1, 1, 1, 8)
call as an approximation of its overhead. The tk.attention row minus the op row is the Python
layer's own cost, comparable between machines.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import thunderkittens as tk
from thunderkittens import _extension, _scaffold


def standins() -> torch.library.Library:
    """The CPU as an sm_90 GPU, the attention ops as CPU stand-ins (as the CPU suite's
    cpu_kernel fixture, without its reference computation)."""
    _scaffold.KERNEL_DEVICE_TYPE = "cpu"
    _scaffold.device_capability = torch.compiler.assume_constant_result(lambda index: (9, 0))
    _extension.BUILT_OPS = _extension.BUILT_OPS | {"attention"}
    if not _extension.has_arch_specific_code_for((9, 0)):
        _extension._TARGETS = _extension._TARGETS + ((9, 0, "a", False),)
    library = torch.library.Library("tk", "IMPL")

    def standin(q, k, v, is_causal, scale, lower_right=False):
        return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)
    for name in ("attention_fwd_decode", "attention_fwd_sm90", "attention_fwd_sm80"):
        library.impl(name, standin, "CPU")
    return library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--standin", action="store_true", help="no GPU: CPU stand-ins of the ops")
    parser.add_argument("--profile", action="store_true", help="cProfile tk.attention's calls")
    parser.add_argument("--shape", default="8,16,4,2048,128", help="B,Hq,Hkv,L,D")
    parser.add_argument("--calls", type=int, default=2000, help="calls per row and round")
    args = parser.parse_args()
    cuda = not args.standin
    if cuda and not torch.cuda.is_available():
        parser.error("no CUDA GPU: pass --standin")
    library = None if cuda else standins()  # noqa: F841 (kept alive while timing)
    batch, heads_q, heads_kv, length, head_dim = (int(x) for x in args.shape.split(","))
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    torch.manual_seed(0)
    projection = torch.randn(batch, 1, heads_q * head_dim, dtype=torch.bfloat16, device=device)
    q = projection.view(batch, 1, heads_q, head_dim).transpose(1, 2)
    caches = [(torch.randn(batch, heads_kv, length + i, head_dim, dtype=torch.bfloat16, device=device),
               torch.randn(batch, heads_kv, length + i, head_dim, dtype=torch.bfloat16, device=device))
              for i in range(4)]
    scale = head_dim ** -0.5
    print(tk.explain(q, *caches[0], scale=scale, enable_gqa=True))
    print(f"device: {torch.cuda.get_device_name() if cuda else 'cpu (stand-ins)'}, torch {torch.__version__}")

    def per_call_us(fn, n):
        times = []
        for i in range(n + n // 10):
            k, v = caches[i % len(caches)]
            sync()
            start = time.perf_counter()
            fn(k, v)
            times.append(time.perf_counter() - start)
        return statistics.median(times[n // 10:]) * 1e6

    def back_to_back_us(fn, n):
        for i in range(n // 10):
            fn(*caches[i % len(caches)])
        sync()
        start = time.perf_counter()
        for i in range(n):
            fn(*caches[i % len(caches)])
        elapsed = time.perf_counter() - start
        sync()
        return elapsed / n * 1e6

    op = torch.ops.tk.attention_fwd_decode.default
    rows = {
        "tk.attention": lambda k, v: tk.attention(q, k, v, scale=scale, enable_gqa=True),
        "tk op alone": lambda k, v: op(q, k, v, False, scale),
    }
    if cuda:
        rows["F.sdpa"] = lambda k, v: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    else:
        tiny = torch.randn(1, 1, 1, 8)
        rows["F.sdpa cpu (1,1,1,8)"] = lambda k, v: F.scaled_dot_product_attention(
            tiny, tiny, tiny, scale=scale, enable_gqa=True)
    integration = None
    try:
        import thunderkittens.integrations.transformers as integration
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError as error:
        print(f"(transformers rows left out: {error})")
    if integration is not None:
        module = torch.nn.Module()
        module.is_causal, module.num_key_value_groups = True, heads_q // heads_kv
        rows["tk integration"] = lambda k, v: integration.attention_forward(
            module, q, k, v, None, dropout=0.0, scaling=scale)
        if cuda:
            rows["transformers sdpa"] = lambda k, v: sdpa_attention_forward(
                module, q, k, v, None, dropout=0.0, scaling=scale)

    results = {name: [] for name in rows}
    for _ in range(5):
        for name, fn in rows.items():
            results[name].append((per_call_us(fn, args.calls), back_to_back_us(fn, args.calls)))
    for name, got in results.items():
        print(f"{name:22s} per call {min(g[0] for g in got):7.1f} us   back to back "
              f"{min(g[1] for g in got):7.1f} us")
    if integration is not None:
        print(integration.report())

    if args.profile:
        import cProfile
        import pstats
        profile = cProfile.Profile()
        profile.enable()
        for i in range(args.calls):
            rows["tk.attention"](*caches[i % len(caches)])
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
