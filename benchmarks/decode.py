"""Decoding: tk.attention on short queries against long key/value caches (the decode kernel)
against SDPA, in GB/s of K/V read, with the device-to-device copy bandwidth as the ceiling.

Pass "decode": one query token (Lq = 1), batch 1 / 8 / 64 x Lk 2k .. 128k, GQA 32/8 and MHA
32/32, d64 and d128, bf16, (B, H, L, D) inputs from torch.randn; configs whose K and V exceed
MAX_CACHE_BYTES are left out. "tk" is tk.attention(q, k, v, enable_gqa=...) in strict mode (auto
picks the decode kernel); "sdpa_default" is F.scaled_dot_product_attention's own choice,
"sdpa_flash" its FlashAttention-2 backend (enable_gqa where the heads differ); where
flash-attn-4 is installed, "fa4" is FlashAttention-4 as called by default (one split of the
cache) and "fa4_split" with its own split heuristic (num_splits=0, its decoding mode), on
(B, L, H, D) copies of the inputs, warmed up (compiled) by the untimed first call. Ours and the
fastest peer of a first sweep are then timed again in alternating rounds
(timing.interleaved_median_ms), and those two times are recorded. GB/s = the bytes of K and V
(2 * B * Hkv * Lk * D * 2) over the time: what a decoding step must read at least once.
"copy_fraction" is ours over the copy bandwidth (bytes read + written by a large
device-to-device copy, measured once per run).

Pass "crossover": where the decode kernel stops paying, for the auto rule of
thunderkittens/_attention/decode.py: Lq 1 .. 64 against Lk 512 .. 8192, b1 and b8, GQA 32/8 d128,
the decode kernel ("tk_decode") against the forward kernel the GPU would run otherwise
("tk_forward": sm90 on Hopper, sm80 elsewhere), both forced, in TFLOP/s (4 B Hq Lq Lk D).

Every implementation's output is compared with ours (relative L2, "relative_difference"), so a
fast wrong kernel shows.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import thunderkittens as tk

from .attention import BLHD_PEERS, blhd_inputs, fa4_attention, heads_label, qkv_inputs, unmasked_flops
from .report import error_record, relative_difference
from .timing import HEAD_TO_HEAD_MS, interleaved_median_ms, median_ms

OURS = "tk"
REFERENCE = "sdpa_default"
MAX_CACHE_BYTES = 24 << 30
COPY_BYTES = 2 << 30


@dataclass(frozen=True)
class Config:
    batch: int
    heads_q: int
    heads_kv: int
    len_q: int
    len_kv: int
    head_dim: int

    @property
    def name(self) -> str:
        heads = heads_label(self.heads_q, self.heads_kv)
        return f"b{self.batch} {heads} lq{self.len_q} lk{self.len_kv} d{self.head_dim}"

    @property
    def cache_bytes(self) -> int:
        return 2 * self.batch * self.heads_kv * self.len_kv * self.head_dim * 2

    @property
    def flops(self) -> float:
        return unmasked_flops(self)


DECODE_CONFIGS = [Config(b, 32, kv, 1, n, d) for d in (128, 64) for kv in (8, 32) for b in (1, 8, 64)
                  for n in (2048, 8192, 32768, 131072)
                  if Config(b, 32, kv, 1, n, d).cache_bytes <= MAX_CACHE_BYTES]
QUICK_DECODE = [Config(8, 32, 8, 1, 8192, 128), Config(1, 32, 8, 1, 32768, 128), Config(64, 32, 8, 1, 2048, 128)]
CROSSOVER_CONFIGS = [Config(b, 32, 8, lq, n, 128) for b in (1, 8) for n in (512, 2048, 8192)
                     for lq in (1, 4, 16, 32, 64)]


def _sdpa(backend):
    def call(q, k, v, cfg):
        context = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
        with context:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=cfg.heads_q != cfg.heads_kv)
    return call


def _tk(kernel):
    def call(q, k, v, cfg):
        with tk.use_kernel(kernel), tk.strict():
            return tk.attention(q, k, v, enable_gqa=cfg.heads_q != cfg.heads_kv)
    return call


def _fa4(attention, num_splits: int):
    def call(q, k, v, cfg):  # (B, L, H, D) in; the output viewed as (B, H, L, D) for the comparison
        return attention(q, k, v, num_splits=num_splits).transpose(1, 2)
    return call


def _fa4_impls(log) -> dict:
    attention = fa4_attention(log)
    return {} if attention is None else {"fa4": _fa4(attention, 1), "fa4_split": _fa4(attention, 0)}


def _forward_family() -> str:
    return "sm90" if torch.cuda.get_device_capability() == (9, 0) else "sm80"


def copy_gbps() -> float:
    """Device-to-device copy bandwidth, bytes read + written."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e9


def _inputs(cfg: Config):
    torch.manual_seed(0)
    return qkv_inputs(cfg, torch.bfloat16)


def _measure(impls: dict, cfg: Config, quick: bool, metric: str) -> dict:
    q, k, v = _inputs(cfg)
    blhd = blhd_inputs(q, k, v) if any(name in BLHD_PEERS for name in impls) else None
    fns = {name: (lambda call=call, args=blhd if name in BLHD_PEERS else (q, k, v): call(*args, cfg))
           for name, call in impls.items()}
    results, outputs = {}, {}
    with torch.no_grad():
        for name, fn in fns.items():
            try:
                outputs[name] = fn()
                results[name] = {"ms": median_ms(fn, measure_ms=60 if quick else 100)}
            except Exception as error:  # noqa: BLE001 - a peer that cannot run this config
                torch.cuda.synchronize()
                results[name] = error_record(error)
        ours = next(iter(impls))
        peers = {n: r["ms"] for n, r in results.items() if n != ours and "ms" in r}
        if "ms" in results[ours] and peers:
            best = min(peers, key=peers.get)
            times = interleaved_median_ms({ours: fns[ours], best: fns[best]},
                                          measure_ms=100 if quick else HEAD_TO_HEAD_MS / 2)
            for name, ms in times.items():
                if not isinstance(ms, Exception):
                    results[name] = {"ms": ms, "sweep_ms": results[name]["ms"]}
    for name, r in results.items():
        if "ms" not in r:
            continue
        r["gbps"] = cfg.cache_bytes / (r["ms"] * 1e-3) / 1e9
        r["tflops"] = cfg.flops / (r["ms"] * 1e-3) / 1e12
        if name in outputs and ours in outputs:
            r["relative_difference"] = relative_difference(outputs[name], outputs[ours].float())
    del q, k, v, blhd, outputs
    return results


def _record(pass_name: str, cfg: Config, results: dict, ours: str, metric: str, copy: float | None) -> dict:
    peers = {n: r[metric] for n, r in results.items() if n != ours and metric in r}
    best = max(peers, key=peers.get) if peers else None
    mine = results[ours].get(metric)
    record = {"op": "decode", "pass": pass_name, "config_name": cfg.name, "config": asdict(cfg),
              "dtype": "bfloat16", "metric": metric, "cache_bytes": cfg.cache_bytes, "results": results,
              "best_peer": best,
              "ratio_vs_reference": mine / results[REFERENCE][metric]
              if mine and metric in results.get(REFERENCE, {}) else None,
              "ratio_vs_best_peer": mine / peers[best] if mine and best else None}
    if copy and mine and metric == "gbps":
        record["copy_gbps"] = copy
        record["copy_fraction"] = mine / copy
    return record


def run(kernel: str = "auto", quick: bool = False, log=print) -> tuple[list[dict], list[str]]:
    copy = copy_gbps()
    log(f"  copy bandwidth: {copy:.0f} GB/s (read + written)")
    decode_impls = {OURS: _tk(kernel), "sdpa_default": _sdpa(None), "sdpa_flash": _sdpa(SDPBackend.FLASH_ATTENTION),
                    **_fa4_impls(log)}
    records = []
    for cfg in QUICK_DECODE if quick else DECODE_CONFIGS:
        records.append(_record("decode", cfg, _measure(decode_impls, cfg, quick, "gbps"), OURS, "gbps", copy))
        r = records[-1]
        log(f"  decode {cfg.name}: " + " ".join(
            f"{n}={x['ms'] * 1e3:.1f}us/{x['gbps']:.0f}GB/s" if "gbps" in x else f"{n}=-"
            for n, x in r["results"].items()) + f"  copy {r.get('copy_fraction', 0):.2f}")
    crossover_impls = {"tk_decode": _tk("decode"), "tk_forward": _tk(_forward_family())}
    for cfg in CROSSOVER_CONFIGS[:4] if quick else CROSSOVER_CONFIGS:
        records.append(_record("crossover", cfg, _measure(crossover_impls, cfg, quick, "tflops"), "tk_decode",
                               "tflops", None))
        r = records[-1]
        log(f"  crossover {cfg.name}: " + " ".join(
            f"{n}={x['ms'] * 1e3:.1f}us" if "ms" in x else f"{n}=-" for n, x in r["results"].items()))
    return records, [OURS, "sdpa_default", "sdpa_flash", *(n for n in decode_impls if n.startswith("fa4")),
                     "tk_decode", "tk_forward"]
