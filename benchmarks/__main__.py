"""python -m benchmarks [--ops attention,matmul,based,fftconv,decode,generate] [--quick] [--save]
                     [--json PATH] [--kernel sm80]
python -m benchmarks --plot-only benchmarks/results/h200.json

Runs each op against its peers in the same process and prints one table per op: TFLOP/s (GB/s
where the op is bound by memory: fftconv, Based's decoding step), our ratio to the reference peer
(FlashAttention-2 for attention, cuBLAS for matmul, flash-linear-attention's parallel_based for
Based, torch.fft for fftconv; for generate, tokens/s of a small Llama's greedy generation with
transformers, attn_implementation="thunderkittens" against "sdpa": needs transformers, else it is
skipped) and to the best peer. --save writes the results to
benchmarks/results/<model>.json (one current file per GPU model, overwritten) with one plot per
op, benchmarks/results/<model>_<op>.png (needs matplotlib); --json also writes every measurement
to PATH; --plot-only redraws the plots of a results file, no GPU needed. Our kernels run in strict
mode (attention and fftconv with the chosen kernel family, --kernel: e.g. sm80 for attention,
sm90 for fftconv's wgmma kernels; it applies to the ops that have that family), so a silent
fallback to PyTorch can never be timed as ours: it shows as '-' with the reason in the log and
the JSON. (One exception, named in its rows: Based's forward + backward runs tk.based as
training calls it, the PyTorch reference while the Based kernels have no backward.)

Run it from the repository root, or from anywhere as `python /path/to/repo/benchmarks ...` (or
`python -m benchmarks` with the repository root on PYTHONPATH); thunderkittens must be
importable (installed, or built in place with python/ on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not __package__:
    # Run as `python path/to/benchmarks`: import the package by name from its parent folder,
    # and keep the folder itself off the path (its module names would shadow top-level ones).
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))

from benchmarks.report import (RESULTS_DIR, format_table, read_json, results_path,  # noqa: E402
                               table_units, write_json)

OPS = ("attention", "matmul", "based", "fftconv", "decode", "generate")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(OPS),
                        help=f"comma list of ops to run (default: all = {','.join(OPS)})")
    parser.add_argument("--quick", action="store_true", help="a few configs, fewer repetitions")
    parser.add_argument("--save", action="store_true",
                        help=f"write the results to {RESULTS_DIR.name}/<model>.json and plot them")
    parser.add_argument("--json", metavar="PATH", help="also write all results to this JSON file")
    parser.add_argument("--plot-only", metavar="PATH",
                        help="plot an existing results file (PNGs beside it) and exit")
    parser.add_argument("--kernel", default="auto",
                        help="kernel family forced for attention and fftconv where it is one of theirs: "
                             "auto (default), e.g. sm80 (attention) or sm90 (fftconv)")
    args = parser.parse_args(argv)
    args.ops = [name.strip() for name in args.ops.split(",") if name.strip()]
    unknown = [name for name in args.ops if name not in OPS]
    if unknown:
        parser.error(f"unknown ops {unknown}; available: {list(OPS)}")
    if args.save and (args.quick or args.kernel != "auto"):
        parser.error("--save keeps the full default run per GPU model: not with --quick or --kernel")
    return args


def plot(payload: dict, results_dir: Path) -> None:
    from benchmarks.plot import plot_results

    for path in plot_results(payload, results_dir):
        print(f"plot: {path}")


def save(payload: dict) -> Path:
    """Writes the per-model results file; ops not run this time are kept from the file there."""
    path = results_path(payload["device"])
    if path.exists():
        previous = read_json(path)
        kept = {op: records for op, records in previous.get("ops", {}).items() if op not in payload["ops"]}
        if kept:
            print(f"{path.name}: kept {', '.join(kept)} from the previous file")
            ops = {**payload["ops"], **kept}
            order = [op for op in OPS if op in ops] + [op for op in ops if op not in OPS]
            payload = {**payload, "ops": {op: ops[op] for op in order}}
    write_json(path, payload)
    print(f"results: {path}")
    plot(payload, path.parent)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot_only:
        path = Path(args.plot_only)
        plot(read_json(path), path.parent)
        return 0

    import torch

    if not torch.cuda.is_available():
        print("benchmarks need a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    import importlib

    import thunderkittens as tk

    modules = {name: importlib.import_module(f"benchmarks.{name}") for name in args.ops}
    device = torch.cuda.get_device_name()
    print(f"{device}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"thunderkittens {tk.__version__}; {tk.build_summary()}")
    payload = {"device": device, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
               "thunderkittens": tk.__version__, "build": tk.build_summary(),
               "kernel": args.kernel, "quick": args.quick, "ops": {}}
    tables = []
    started = time.time()
    for name in args.ops:
        print(f"{name}:")
        module = modules[name]
        records, impl_names = module.run(kernel=args.kernel, quick=args.quick)
        payload["ops"][name] = records
        if not records:  # skipped (its log says why)
            continue
        tables.append(f"{name} ({records[0]['dtype'] if records else ''}, {table_units(records)})\n" +
                      format_table(records, impl_names, module.REFERENCE, module.OURS))
    payload["seconds"] = round(time.time() - started, 1)
    if args.json:
        write_json(args.json, payload)
    print()
    print("\n\n".join(tables))
    print(f"\n({payload['seconds']} s{'; JSON: ' + args.json if args.json else ''})")
    if args.save:
        save(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
