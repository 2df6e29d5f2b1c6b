"""Benchmark output: a fixed-width table on stdout, a JSON file, and where results are kept.

Results file (JSON): {"device", "torch", "torch_cuda", "thunderkittens", "build", "kernel",
"quick", "seconds", "ops": {op: [record, ...]}}, one record per (pass, config) as the op's
module writes it: "pass", "config_name", "results" {implementation: {"ms", "tflops"} (and/or
"gbps", "tokens_per_s") or {"error"} or {"skipped"}}, "metric" (the key shown: "tflops" when
absent, "gbps" for the memory-bound ones, "tokens_per_s" end to end), "best_peer",
"ratio_vs_reference", "ratio_vs_best_peer", ...
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# One current results file per GPU model, overwritten by `python -m benchmarks --save`.
RESULTS_DIR = Path(__file__).resolve().parent / "results"

UNITS = {"tflops": "TFLOP/s", "gbps": "GB/s", "tokens_per_s": "tokens/s"}


def metric(record: dict) -> str:
    """The result key a record is shown in: "tflops" (the default) or "gbps"."""
    return record.get("metric", "tflops")


def table_units(records: list[dict]) -> str:
    """The unit of an op's table, for its title (when its rows differ, the unit column says)."""
    units = list(dict.fromkeys(UNITS[metric(r)] for r in records)) or [UNITS["tflops"]]
    return units[0] if len(units) == 1 else f"{' or '.join(units)}: see the unit column"


def format_table(records: list[dict], impl_names: list[str], reference: str, ours: str) -> str:
    """One row per (pass, config): TFLOP/s (or the record's metric) of every implementation
    ('-' where it failed or was not run), then ours / reference and ours / best peer; a unit
    column when the rows' metrics differ."""
    mixed = len({metric(r) for r in records}) > 1
    header = ["pass", "config"] + (["unit"] if mixed else []) + impl_names + [f"{ours}/{reference}", f"{ours}/best"]
    rows = [header]
    for record in records:
        shown = metric(record)
        row = [record["pass"], record["config_name"]] + ([UNITS[shown]] if mixed else [])
        for name in impl_names:
            result = record["results"].get(name, {})
            row.append(f"{result[shown]:.0f}" if shown in result else "-")
        for key in ("ratio_vs_reference", "ratio_vs_best_peer"):
            row.append(f"{record[key]:.2f}" if record.get(key) is not None else "-")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    left = 3 if mixed else 2  # pass, config (and unit) left-aligned, numbers right-aligned
    lines = ["  ".join(cell.ljust(width) if i < left else cell.rjust(width)
                       for i, (cell, width) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def write_json(path: str | Path, payload: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")


def read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def model_slug(device_name: str) -> str:
    """The GPU model a results file is named after, from torch.cuda.get_device_name():
    'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA A100-SXM4-80GB' ->
    'a100', 'NVIDIA H100 PCIe' -> 'h100_pcie' (a slower part than the SXM one), anything else a
    lowercase slug ('NVIDIA GeForce RTX 4090' -> 'geforce_rtx_4090')."""
    name = device_name.strip().lower()
    name = re.sub(r"^nvidia\s+", "", name)
    tokens = [t for t in re.split(r"[^a-z0-9]+", name) if t]
    if not tokens:
        return "unknown"
    if re.fullmatch(r"[a-z]{1,2}\d{2,3}[a-z]?", tokens[0]):  # h100, h200, a100, l40s, gh200, b200
        variant = [t for t in tokens[1:] if t in ("pcie", "nvl")]
        return "_".join(tokens[:1] + variant[:1])
    return "_".join(tokens)


def results_path(device_name: str) -> Path:
    return RESULTS_DIR / f"{model_slug(device_name)}.json"


def relative_difference(got, want) -> float:
    """The largest relative L2 difference of ``got`` from ``want`` (tensors or tuples of them)."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    return max(((g.float() - w).norm() / w.norm().clamp_min(1e-30)).item() for g, w in zip(got, want))


def error_record(error: Exception) -> dict:
    """A result cell for an implementation that raised: its error's type and first line."""
    return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"}
