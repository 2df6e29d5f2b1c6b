"""One PNG per op from a results file: TFLOP/s (or GB/s, the record's "metric") of ours and of
each peer over the configs, as grouped horizontal bars (one panel per pass, each in its own
unit), sized to be read at README width. A "copy" column (the device-to-device copy of the same
bytes) is drawn in grey as the bandwidth ceiling, not as a peer.

    python -m benchmarks --plot-only benchmarks/results/h200.json

matplotlib is imported only here, and only when plotting; without it the runner prints a note.
"""

from __future__ import annotations

from pathlib import Path

from .report import UNITS, metric, model_slug

OURS = "tk"
# Not plotted: our other kernel families (tk_sm80 beside tk on Hopper) are not peers, and
# sdpa_default is whichever SDPA backend the dispatcher picks, already a bar of its own.
HIDDEN = ("tk_", "sdpa_default")

LABELS = {
    "tk": "ThunderKittens",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_flash": "SDPA FlashAttention-2",
    "sdpa_efficient": "SDPA memory-efficient",
    "flash_attn": "flash-attn",
    "fa4": "FlashAttention-4",
    "fa4_split": "FlashAttention-4 split-KV",
    "sdpa": "transformers sdpa",
    "cublas": "cuBLAS",
    "fla_parallel": "fla parallel_based",
    "fla_fused_chunk": "fla fused_chunk_based",
    "torch_quadratic": "PyTorch quadratic (fp32)",
    "torch_fft": "torch.fft (fp32)",
    "copy": "device copy (ceiling)",
}
PASS_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward", "step": "decoding step",
               "generate": "greedy generation", "prefill": "prefill"}
OURS_COLOR = "#d62728"
COPY = "copy"
COPY_COLOR = "#c7c7c7"
PEER_COLORS = ["#1f77b4", "#7f7f7f", "#bcbd22", "#17becf", "#9467bd", "#8c564b"]


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_path(results_dir: Path, device_name: str, op: str) -> Path:
    return Path(results_dir) / f"{model_slug(device_name)}_{op}.png"


def _columns(records: list[dict]) -> list[str]:
    """Ours first, then every peer that has a value (in the record's metric) in at least one
    record, in record order."""
    names: list[str] = []
    for record in records:
        for name in record["results"]:
            if name not in names and not name.startswith(HIDDEN):
                names.append(name)
    timed = [n for n in names if any(metric(r) in r["results"].get(n, {}) for r in records)]
    return sorted(timed, key=lambda n: n != OURS)


def _colors(columns: list[str]) -> dict[str, str]:
    peer_colors = iter(PEER_COLORS)
    return {name: OURS_COLOR if name == OURS else COPY_COLOR if name == COPY else next(peer_colors)
            for name in columns}


def _note(record: dict) -> str | None:
    """The text at the end of a group: ours over the best peer, else our share of the copy."""
    if record.get("ratio_vs_best_peer") is not None:
        return f"{record['ratio_vs_best_peer']:.2f}x"
    if record.get("fraction_of_copy") is not None:
        return f"{record['fraction_of_copy']:.0%} of copy"
    return None


def plot_op(op: str, records: list[dict], device_name: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    passes = list(dict.fromkeys(r["pass"] for r in records))
    panels = {p: [r for r in records if r["pass"] == p] for p in passes}
    configs = {p: list(dict.fromkeys(r["config_name"] for r in rs)) for p, rs in panels.items()}
    columns = {p: _columns(rs) for p, rs in panels.items()}
    colors = _colors(sorted(dict.fromkeys(n for cs in columns.values() for n in cs), key=lambda n: n != OURS))
    # Passes over the same configs share the config labels (left); otherwise each panel has its own.
    shared = all(configs[p] == configs[passes[0]] for p in passes)

    rows = max(len(columns[p]) * len(configs[p]) for p in passes)
    height = 1.2 + 0.085 * rows
    width = 5.0 * len(passes) + (2.2 if shared else 2.2 * len(passes))
    fig, axes = plt.subplots(1, len(passes), sharey=shared, squeeze=False, layout="constrained",
                             figsize=(width, height))
    handles = {}
    for ax, pass_name in zip(axes[0], passes):
        by_config = {r["config_name"]: r for r in panels[pass_name]}
        names, rows_here = columns[pass_name], configs[pass_name]
        key = metric(panels[pass_name][0])
        bar = 0.8 / max(1, len(names))
        top = 0.0
        for index, name in enumerate(names):
            values = [by_config[c]["results"].get(name, {}).get(key, 0.0) for c in rows_here]
            top = max(top, *values)
            offsets = [row + (index - (len(names) - 1) / 2) * bar for row in range(len(rows_here))]
            handles[name] = ax.barh(offsets, values, height=bar, color=colors[name], label=LABELS.get(name, name))
        notes = [_note(by_config[config]) for config in rows_here]
        for row, note in enumerate(notes):
            if note is not None:
                ax.text(top * 1.01, row, note, va="center", fontsize=8)
        room = 1.12 if all(len(note or "") <= 6 for note in notes) else 1.25  # "1.16x" or "64% of copy"
        ax.set_xlim(0, top * room if top else 1)
        ax.set_ylim(len(rows_here) - 0.5, -0.5)  # first config on top
        ax.set_title(PASS_TITLES.get(pass_name, pass_name), fontsize=10)
        ax.set_xlabel(UNITS[key], fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
        ax.tick_params(labelsize=9)
        if not shared or ax is axes[0][0]:
            ax.set_yticks(range(len(rows_here)), rows_here)
    legend = [name for name in colors if name in handles]
    fig.legend([handles[n] for n in legend], [LABELS.get(n, n) for n in legend], loc="outside lower center",
               ncol=len(legend), fontsize=9, frameon=False)
    dtype = records[0].get("dtype", "")
    units = " and ".join(dict.fromkeys(UNITS[metric(r)] for r in records))
    fig.suptitle(f"{op}, {dtype}, {device_name}: {units} (right: ThunderKittens / best peer)", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_results(payload: dict, results_dir: Path) -> list[Path]:
    """Writes <model>_<op>.png for every op of a results payload; returns the paths written
    (none, after a printed note, without matplotlib)."""
    if not matplotlib_available():
        print("matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    device = payload.get("device", "unknown")
    return [plot_op(op, records, device, plot_path(results_dir, device, op))
            for op, records in payload["ops"].items() if records]
