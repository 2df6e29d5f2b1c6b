"""Attention: tk.attention against SDPA's backends (cuDNN, FlashAttention-2, memory-efficient,
default choice) and any peer package installed (FlashAttention-2's flash-attn as "flash_attn",
FlashAttention-4's flash-attn-4 as "fa4"), on the usual FlashAttention benchmark shapes and on
shapes users hand to plain SDPA. FlashAttention-4 compiles each variant at its first call, which
the untimed first call of every measurement absorbs.

TFLOP/s use the usual convention: 4 * B * Hq * Lq * Lk * D for the forward pass, halved when
causal; a fwd+bwd pass ("fwdbwd": out = attention(q, k, v); out.backward(grad)) counts 3.5x the
forward (the backward is 2.5x). Our implementations run in strict mode, so where one has no
backward (the sm80 family: "tk_sm80") its fwdbwd cell is '-' (the reason is in the JSON), never
a timing of SDPA's backward.

Each config is first swept: every implementation timed one after the other. Then ours and the
sweep's fastest peer are timed again head to head, in alternating rounds
(timing.interleaved_median_ms), and those two numbers are the ones recorded (the sweep's stay in
"sweep_ms"): a clock drift during the sweep falls on one implementation alone (cuDNN once timed
1029 and 909 us in two columns of one config).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import thunderkittens as tk

from .timing import HEAD_TO_HEAD_MS, interleaved_median_ms, median_ms

OURS = "tk"
REFERENCE = "sdpa_flash"  # FlashAttention-2, the ratio published attention kernels quote

# Flop multiplier of each pass relative to the forward (see _pass_callable).
PASSES = {"fwd": 1.0, "fwdbwd": 3.5}


@dataclass(frozen=True)
class Config:
    batch: int
    heads_q: int
    heads_kv: int
    len_q: int
    len_kv: int
    head_dim: int
    causal: bool

    @property
    def name(self) -> str:
        lengths = f"n{self.len_q}" if self.len_q == self.len_kv else f"lq{self.len_q} lk{self.len_kv}"
        return (f"b{self.batch} {heads_label(self.heads_q, self.heads_kv)} {lengths} d{self.head_dim} "
                f"{'causal' if self.causal else 'full'}")

    @property
    def forward_flops(self) -> float:
        flops = unmasked_flops(self)
        return flops / 2 if self.causal else flops


# Shared with the decoding benchmark (decode.py), whose configs have the same shape fields.


def heads_label(heads_q: int, heads_kv: int) -> str:
    """A config name's heads: "h32" when every query head has its own key/value head, else
    "hq32 hkv8"."""
    return f"h{heads_q}" if heads_q == heads_kv else f"hq{heads_q} hkv{heads_kv}"


def unmasked_flops(cfg) -> float:
    """4 * B * Hq * Lq * Lk * D: the forward's two products over every query-key pair."""
    return 4.0 * cfg.batch * cfg.heads_q * cfg.len_q * cfg.len_kv * cfg.head_dim


def qkv_inputs(cfg, dtype: torch.dtype):
    """q, k, v of ``cfg``'s shapes, (B, H, L, D) from torch.randn on the GPU."""
    def randn(heads, length):
        return torch.randn(cfg.batch, heads, length, cfg.head_dim, device="cuda", dtype=dtype)
    return randn(cfg.heads_q, cfg.len_q), randn(cfg.heads_kv, cfg.len_kv), randn(cfg.heads_kv, cfg.len_kv)


def _square(batch: int, n: int, head_dim: int, causal: bool) -> Config:
    return Config(batch, 16, 16, n, n, head_dim, causal)


# The FlashAttention benchmark shapes (16k tokens per batch): h16; d64/d128; full/causal.
FLASH_CONFIGS = [_square(b, n, d, causal)
                  for d in (64, 128) for causal in (False, True)
                  for b, n in ((16, 768), (16, 1536), (16, 3072), (8, 6144), (4, 12288))]

# What users hand to plain SDPA: unaligned lengths, GQA, Lq != Lk; and head dim 96 (Phi-3-mini's
# 32 heads of 96 at 4096 tokens).
SDPA_DEFAULT_CONFIGS = [
    Config(16, 16, 16, 1000, 1000, 128, False),
    Config(4, 16, 16, 4097, 4097, 128, True),
    Config(2, 16, 16, 8191, 8191, 128, False),
    Config(4, 32, 8, 4096, 4096, 128, True),
    Config(8, 32, 8, 2048, 2048, 128, False),
    Config(1, 32, 8, 16384, 16384, 128, True),
    Config(16, 16, 16, 2048, 2048, 64, True),
    Config(8, 16, 16, 512, 8192, 128, False),
    Config(4, 32, 32, 4096, 4096, 96, False),
    Config(4, 32, 32, 4096, 4096, 96, True),
]

QUICK_CONFIGS = [_square(16, 1536, 128, False), _square(16, 1536, 128, True),
                 _square(16, 3072, 64, True), Config(16, 16, 16, 1000, 1000, 128, False),
                 Config(4, 32, 8, 4096, 4096, 128, True)]


# ---- implementations -----------------------------------------------------------------------
# Each is (context factory, call(q, k, v, cfg) -> out); the context (backend choice, forcing)
# stays active for the whole measurement.

Impl = tuple[Callable[[], contextlib.AbstractContextManager], Callable]


def _sdpa_call(q, k, v, cfg: Config):
    return F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal,
                                          enable_gqa=cfg.heads_q != cfg.heads_kv)


def _sdpa(backend: SDPBackend | None) -> Impl:
    context = (lambda: sdpa_kernel(backend)) if backend is not None else contextlib.nullcontext
    return context, _sdpa_call


def _ours(kernel: str) -> Impl:
    @contextlib.contextmanager
    def context():
        # Forced family + strict: a fallback raises (and shows as '-'), never times SDPA.
        with tk.use_kernel(kernel), tk.strict():
            yield

    def call(q, k, v, cfg: Config):
        return tk.attention(q, k, v, is_causal=cfg.causal, enable_gqa=cfg.heads_q != cfg.heads_kv)

    return context, call


# Peer packages that take (B, L, H, D) inputs and return (B, L, H, D) outputs.
BLHD_PEERS = ("flash_attn", "fa4", "fa4_split")


def blhd_inputs(q, k, v) -> tuple:
    """(B, H, L, D) q, k, v as contiguous (B, L, H, D) copies, for BLHD_PEERS."""
    return tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))


def fa4_attention(log=print) -> Callable | None:
    """FlashAttention-4 (flash-attn-4: flash_attn.cute.flash_attn_func) returning the output
    alone, or None where it is not installed; an installed one that fails to import (its CuTe
    DSL runtime) is logged and left out: it is a peer, never required."""
    try:
        from flash_attn.cute import flash_attn_func
    except ModuleNotFoundError as error:
        if error.name in ("flash_attn", "flash_attn.cute"):
            return None
        log(f"  fa4 not measured: {type(error).__name__}: {error}")
        return None
    except Exception as error:  # noqa: BLE001 - see the docstring
        log(f"  fa4 not measured: {type(error).__name__}: {error}")
        return None

    def attention(q, k, v, **kwargs):
        out = flash_attn_func(q, k, v, **kwargs)
        return out[0] if isinstance(out, tuple) else out  # (out, lse) in current versions

    return attention


def _optional_peers() -> dict[str, Impl]:
    """Peer packages measured when installed (BLHD_PEERS)."""
    peers: dict[str, Impl] = {}
    try:
        from flash_attn import flash_attn_func
    except ImportError:  # not installed, or only flash-attn-4 (no FlashAttention-2 at the top)
        pass
    else:
        peers["flash_attn"] = (contextlib.nullcontext,
                               lambda q, k, v, cfg: flash_attn_func(q, k, v, causal=cfg.causal))
    fa4 = fa4_attention()
    if fa4 is not None:
        peers["fa4"] = (contextlib.nullcontext, lambda q, k, v, cfg: fa4(q, k, v, causal=cfg.causal))
    return peers


def implementations(kernel: str) -> dict[str, Impl]:
    impls = {
        OURS: _ours(kernel),
        # With auto (sm90 on Hopper) the portable mma.sync kernel is timed too, for comparison.
        **({"tk_sm80": _ours("sm80")} if kernel == "auto" else {}),
        "sdpa_cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa_flash": _sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa_efficient": _sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa_default": _sdpa(None),
    }
    impls.update(_optional_peers())
    return impls


# ---- running -------------------------------------------------------------------------------


def _pass_callable(pass_name: str, call, q, k, v, cfg: Config):
    if pass_name == "fwd":
        return lambda: call(q, k, v, cfg)
    if pass_name == "fwdbwd":
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        with torch.no_grad():
            grad = torch.randn_like(call(*leaves, cfg))

        def forward_backward():
            for t in leaves:
                t.grad = None  # fresh gradients each call: no accumulation kernels timed
            call(*leaves, cfg).backward(grad)

        return forward_backward
    raise ValueError(f"unknown pass {pass_name!r}")


def _best_peer(results: dict) -> str | None:
    """The fastest of the peers that ran (everyone else's implementations, not our other kernel
    family's column)."""
    peers = {name: r["tflops"] for name, r in results.items() if not name.startswith(OURS) and "tflops" in r}
    return max(peers, key=peers.get) if peers else None


def _timing_budget(quick: bool, head_to_head: bool = False) -> dict:
    if quick:
        return {"measure_ms": 60, "min_reps": 5}
    return {"measure_ms": HEAD_TO_HEAD_MS if head_to_head else 200, "min_reps": 10}


def _autograd(pass_name: str) -> contextlib.AbstractContextManager:
    # The forward alone is timed without autograd (inference); fwdbwd needs it.
    return torch.no_grad() if pass_name == "fwd" else contextlib.nullcontext()


def _timing(ms: float, pass_name: str, cfg: Config) -> dict:
    return {"ms": ms, "tflops": cfg.forward_flops * PASSES[pass_name] / (ms * 1e-3) / 1e12}


def _measure(impl: Impl, pass_name: str, inputs, cfg: Config, quick: bool) -> dict:
    context, call = impl
    try:
        with context(), _autograd(pass_name):
            fn = _pass_callable(pass_name, call, *inputs, cfg)
            ms = median_ms(fn, **_timing_budget(quick))
    except Exception as error:  # a peer that cannot run this config: reported, not fatal
        torch.cuda.synchronize()
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    return _timing(ms, pass_name, cfg)


def _in_context(impl: Impl, pass_name: str, inputs, cfg: Config) -> Callable[[], object]:
    """The pass as one callable that enters the implementation's context at every call, so that
    two implementations can be timed in alternating rounds."""
    context, call = impl
    with context(), _autograd(pass_name):
        fn = _pass_callable(pass_name, call, *inputs, cfg)

    def run():
        with context(), _autograd(pass_name):
            return fn()

    return run


def _head_to_head(results: dict, impls: dict[str, Impl], inputs_of: dict, pass_name: str, cfg: Config,
                  quick: bool) -> None:
    """Times ours and the sweep's fastest peer again, in alternating rounds, and records those
    two times (the sweep's kept as "sweep_ms"; see the module doc)."""
    best_peer = _best_peer(results)
    if "tflops" not in results[OURS] or best_peer is None:
        return
    fns = {name: _in_context(impls[name], pass_name, inputs_of[name], cfg) for name in (OURS, best_peer)}
    times = interleaved_median_ms(fns, **_timing_budget(quick, head_to_head=True))
    for name, ms in times.items():
        if isinstance(ms, Exception):  # ran in the sweep, so not expected; keep the sweep's time
            continue
        results[name] = {**_timing(ms, pass_name, cfg), "sweep_ms": results[name]["ms"]}


def run(kernel: str = "auto", quick: bool = False, dtype: torch.dtype = torch.bfloat16,
        log=print) -> tuple[list[dict], list[str]]:
    """Measure every config; returns (records, implementation names in column order)."""
    impls = implementations(kernel)
    configs = QUICK_CONFIGS if quick else FLASH_CONFIGS + SDPA_DEFAULT_CONFIGS
    records = []
    for pass_name in PASSES:
        for cfg in configs:
            torch.manual_seed(0)
            bhld = qkv_inputs(cfg, dtype)
            blhd = None
            results, inputs_of = {}, {}
            for name, impl in impls.items():
                if name in BLHD_PEERS:
                    blhd = blhd or blhd_inputs(*bhld)
                    inputs_of[name] = blhd
                else:
                    inputs_of[name] = bhld
                results[name] = _measure(impl, pass_name, inputs_of[name], cfg, quick)
            _head_to_head(results, impls, inputs_of, pass_name, cfg, quick)
            del bhld, blhd, inputs_of
            records.append(_record(pass_name, cfg, dtype, results))
            log(_progress_line(records[-1]))
    return records, list(impls)


def _record(pass_name: str, cfg: Config, dtype: torch.dtype, results: dict) -> dict:
    ours = results[OURS].get("tflops")
    best_peer = _best_peer(results)
    reference = results.get(REFERENCE, {}).get("tflops")
    return {
        "op": "attention", "pass": pass_name, "config_name": cfg.name, "config": asdict(cfg),
        "dtype": str(dtype).removeprefix("torch."),
        "flops": cfg.forward_flops * PASSES[pass_name], "results": results,
        "best_peer": best_peer,
        "ratio_vs_reference": ours / reference if ours and reference else None,
        "ratio_vs_best_peer": ours / results[best_peer]["tflops"] if ours and best_peer else None,
    }


def _progress_line(record: dict) -> str:
    cells = [f"{name}={r['tflops']:.0f}" if "tflops" in r else f"{name}=-"
             for name, r in record["results"].items()]
    line = f"  {record['pass']} {record['config_name']}: " + " ".join(cells)
    if "error" in record["results"][OURS]:
        line += f"  [{OURS} failed: {record['results'][OURS]['error']}]"
    return line
