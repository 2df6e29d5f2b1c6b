"""Matmul: tk.matmul against cuBLAS (torch.matmul) on square and LLM-layer GEMM shapes.

TFLOP/s count 2 * M * N * K. Both run on the same bf16 tensors in the same process; tk runs in
strict mode, so a fallback to torch.matmul raises (and shows as '-') instead of timing cuBLAS
under our name. Each config also records how far tk's answer is from cuBLAS's (relative L2),
so a fast wrong kernel cannot pass unnoticed, and the path tk.explain_matmul reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import thunderkittens as tk

from .timing import HEAD_TO_HEAD_MS, interleaved_median_ms

OURS = "tk"
REFERENCE = "cublas"

# tk and cuBLAS agree to bf16 rounding (both accumulate in fp32); anything beyond this is a bug.
MAX_RELATIVE_DIFFERENCE = 1e-2


@dataclass(frozen=True)
class Config:
    m: int
    n: int
    k: int
    b_transposed: bool = False  # b = w.mT for a row-major (N, K) w: nn.Linear's x @ w.T

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}x{self.k}" + (" b=w.mT" if self.b_transposed else "")

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


SQUARE_CONFIGS = [Config(n, n, n) for n in (512, 1024, 2048, 4096, 8192, 16384)]
# LLM layer shapes (a 4096-wide model with a 14336-wide MLP; a 2048-token batch at 8192 wide).
LLM_CONFIGS = [Config(8192, 8192, 2048), Config(4096, 14336, 4096), Config(16384, 4096, 4096)]
# The nn.Linear layout: weight (N, K) row-major, read transposed in place.
TRANSPOSED_CONFIGS = [Config(4096, 14336, 4096, b_transposed=True)]
# Few output tiles: decode-size projections (16 tokens, nn.Linear layout; skinny tiles, split-K)
# and a weight-gradient-like product (K = tokens; split-K).
SKINNY_CONFIGS = [Config(16, 4096, 4096, b_transposed=True), Config(16, 4096, 14336, b_transposed=True),
                  Config(1024, 1024, 8192)]
# Between the two: 128 wide tiles, one round on 132 SMs (narrow tiles would take two).
ONE_ROUND_CONFIGS = [Config(2048, 2048, 8192)]

QUICK_CONFIGS = [Config(4096, 4096, 4096), Config(8192, 8192, 8192), Config(8192, 8192, 2048)]


# ---- implementations -----------------------------------------------------------------------

Impl = Callable[[torch.Tensor, torch.Tensor], Callable[[], torch.Tensor]]


def _ours(a: torch.Tensor, b: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: tk.matmul(a, b)  # run() holds strict mode on: a fallback raises


def _cublas(a: torch.Tensor, b: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: torch.matmul(a, b)


IMPLEMENTATIONS: dict[str, Impl] = {OURS: _ours, REFERENCE: _cublas}


# ---- running -------------------------------------------------------------------------------


def _inputs(cfg: Config, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(cfg.m, cfg.k, device="cuda", dtype=dtype)
    if cfg.b_transposed:
        b = torch.randn(cfg.n, cfg.k, device="cuda", dtype=dtype).mT
    else:
        b = torch.randn(cfg.k, cfg.n, device="cuda", dtype=dtype)
    return a, b


def _measure_all(fns: dict[str, Callable[[], torch.Tensor]], cfg: Config, quick: bool) -> dict:
    """tk and cuBLAS timed in alternating rounds (a tk fallback, which strict mode turns into an
    error, is reported, not fatal)."""
    times = interleaved_median_ms(fns, measure_ms=60 if quick else HEAD_TO_HEAD_MS, min_reps=5 if quick else 10)
    results = {}
    for name, ms in times.items():
        if isinstance(ms, Exception):
            results[name] = {"error": f"{type(ms).__name__}: {str(ms).splitlines()[0][:200]}"}
        else:
            results[name] = {"ms": ms, "tflops": cfg.flops / (ms * 1e-3) / 1e12}
    return results


def _relative_difference(fns: dict[str, Callable[[], torch.Tensor]]) -> float | None:
    try:
        ours = fns[OURS]().float()
    except Exception:
        return None
    reference = fns[REFERENCE]().float()
    return ((ours - reference).norm() / reference.norm()).item()


def run(kernel: str = "auto", quick: bool = False, dtype: torch.dtype = torch.bfloat16,
        log=print) -> tuple[list[dict], list[str]]:
    """Measure every config; returns (records, implementation names in column order).
    ``kernel`` is accepted for the runner's sake: matmul has one kernel (sm90)."""
    configs = QUICK_CONFIGS if quick else SQUARE_CONFIGS + LLM_CONFIGS + TRANSPOSED_CONFIGS + SKINNY_CONFIGS + ONE_ROUND_CONFIGS
    records = []
    for cfg in configs:
        torch.manual_seed(0)
        a, b = _inputs(cfg, dtype)
        fns = {name: make(a, b) for name, make in IMPLEMENTATIONS.items()}
        with tk.strict():  # a tk fallback raises (shown as '-'), never times torch.matmul
            path = str(tk.explain_matmul(a, b))
            results = _measure_all(fns, cfg, quick)
            difference = _relative_difference(fns)
        del a, b, fns
        torch.cuda.empty_cache()
        records.append(_record(cfg, dtype, results, path, difference))
        log(_progress_line(records[-1]))
    return records, list(IMPLEMENTATIONS)


def _record(cfg: Config, dtype: torch.dtype, results: dict, path: str,
            difference: float | None) -> dict:
    ours = results[OURS].get("tflops")
    reference = results[REFERENCE].get("tflops")
    ratio = ours / reference if ours and reference else None
    return {
        "op": "matmul", "pass": "fwd", "config_name": cfg.name, "config": asdict(cfg),
        "dtype": str(dtype).removeprefix("torch."), "flops": cfg.flops, "results": results,
        "tk_path": path, "relative_difference_vs_cublas": difference,
        "best_peer": REFERENCE if reference else None,
        "ratio_vs_reference": ratio, "ratio_vs_best_peer": ratio,
    }


def _progress_line(record: dict) -> str:
    cells = [f"{name}={r['tflops']:.0f}" if "tflops" in r else f"{name}=-"
             for name, r in record["results"].items()]
    line = f"  {record['config_name']}: " + " ".join(cells)
    if record["ratio_vs_reference"] is not None:
        line += f"  ({record['ratio_vs_reference']:.2f}x cuBLAS)"
    if "error" in record["results"][OURS]:
        line += f"  [{OURS} failed: {record['results'][OURS]['error']}]"
    difference = record["relative_difference_vs_cublas"]
    if difference is not None and difference > MAX_RELATIVE_DIFFERENCE:
        line += f"  [WRONG: relative difference to cuBLAS {difference:.2e}]"
    return line
