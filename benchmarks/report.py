"""Benchmark output: a fixed-width table on stdout and a JSON file."""

from __future__ import annotations

import json
from pathlib import Path


def format_table(records: list[dict], impl_names: list[str], reference: str, ours: str) -> str:
    """One row per (pass, config): TFLOP/s of every implementation ('-' where it failed), then
    ours / reference and ours / best peer."""
    header = ["pass", "config"] + impl_names + [f"{ours}/{reference}", f"{ours}/best"]
    rows = [header]
    for record in records:
        row = [record["pass"], record["config_name"]]
        for name in impl_names:
            result = record["results"].get(name, {})
            row.append(f"{result['tflops']:.0f}" if "tflops" in result else "-")
        for key in ("ratio_vs_reference", "ratio_vs_best_peer"):
            row.append(f"{record[key]:.2f}" if record.get(key) is not None else "-")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if i < 2 else cell.rjust(width)
                       for i, (cell, width) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def write_json(path: str, payload: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")
