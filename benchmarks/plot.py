"""One PNG per op from a results file: TFLOP/s of ours and of each peer over the configs, as
grouped horizontal bars (one panel per pass), sized to be read at README width.

    python -m benchmarks --plot-only benchmarks/results/h200.json

matplotlib is imported only here, and only when plotting; without it the runner prints a note.
"""

from __future__ import annotations

from pathlib import Path

from .report import model_slug

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
    "cublas": "cuBLAS",
}
PASS_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward"}
OURS_COLOR = "#d62728"
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
    """Ours first, then every peer that has a timing in at least one record (in record order)."""
    names: list[str] = []
    for record in records:
        for name in record["results"]:
            if name not in names and not name.startswith(HIDDEN):
                names.append(name)
    timed = [n for n in names if any("tflops" in r["results"].get(n, {}) for r in records)]
    return sorted(timed, key=lambda n: n != OURS)


def plot_op(op: str, records: list[dict], device_name: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    passes = list(dict.fromkeys(r["pass"] for r in records))
    configs = list(dict.fromkeys(r["config_name"] for r in records))
    columns = _columns(records)
    by_key = {(r["pass"], r["config_name"]): r for r in records}

    bar = 0.8 / len(columns)
    height = 1.2 + 0.085 * len(columns) * len(configs)
    fig, axes = plt.subplots(1, len(passes), sharey=True, squeeze=False, layout="constrained",
                             figsize=(5.0 * len(passes) + 2.2, height))
    peer_colors = iter(PEER_COLORS)
    colors = {name: OURS_COLOR if name == OURS else next(peer_colors) for name in columns}
    for ax, pass_name in zip(axes[0], passes):
        top = 0.0
        for index, name in enumerate(columns):
            values = [by_key.get((pass_name, c), {}).get("results", {}).get(name, {}).get("tflops", 0.0)
                      for c in configs]
            top = max(top, *values)
            offsets = [row + (index - (len(columns) - 1) / 2) * bar for row in range(len(configs))]
            ax.barh(offsets, values, height=bar, color=colors[name], label=LABELS.get(name, name))
        # Ours over the best peer, at the end of each group.
        for row, config in enumerate(configs):
            ratio = by_key.get((pass_name, config), {}).get("ratio_vs_best_peer")
            if ratio is not None:
                ax.text(top * 1.01, row, f"{ratio:.2f}x", va="center", fontsize=8)
        ax.set_xlim(0, top * 1.12)
        ax.set_ylim(len(configs) - 0.5, -0.5)  # first config on top
        ax.set_title(PASS_TITLES.get(pass_name, pass_name), fontsize=10)
        ax.set_xlabel("TFLOP/s", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
        ax.tick_params(labelsize=9)
    axes[0][0].set_yticks(range(len(configs)), configs)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(columns), fontsize=9, frameon=False)
    dtype = records[0].get("dtype", "")
    fig.suptitle(f"{op}, {dtype}, {device_name}: TFLOP/s (right: ThunderKittens / best peer)", fontsize=11)
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
