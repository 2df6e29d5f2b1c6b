"""python -m benchmarks [--ops attention,matmul] [--quick] [--json PATH] [--kernel sm80]

Runs each op against its peers in the same process and prints one table per op (TFLOP/s, and
our ratio to the reference peer (FlashAttention-2 for attention, cuBLAS for matmul) and to the
best peer); --json also writes every measurement. Our kernels run in strict mode (attention
with the chosen kernel family; --kernel applies to attention only), so a silent fallback to
PyTorch can never be timed as ours: it shows as '-' with the reason in the log and the JSON.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from . import attention, matmul
from .report import format_table, write_json

OPS = {"attention": attention, "matmul": matmul}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(OPS),
                        help=f"comma list of ops to run (default: all = {','.join(OPS)})")
    parser.add_argument("--quick", action="store_true", help="a few configs, fewer repetitions")
    parser.add_argument("--json", metavar="PATH", help="also write all results to this JSON file")
    parser.add_argument("--kernel", default="auto",
                        help="kernel family forced for attention: auto (default) or e.g. sm80")
    args = parser.parse_args(argv)
    args.ops = [name.strip() for name in args.ops.split(",") if name.strip()]
    unknown = [name for name in args.ops if name not in OPS]
    if unknown:
        parser.error(f"unknown ops {unknown}; available: {list(OPS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks need a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    import thunderkittens as tk

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
        module = OPS[name]
        records, impl_names = module.run(kernel=args.kernel, quick=args.quick)
        payload["ops"][name] = records
        tables.append(f"{name} ({records[0]['dtype'] if records else ''}, TFLOP/s)\n" +
                      format_table(records, impl_names, module.REFERENCE, module.OURS))
    payload["seconds"] = round(time.time() - started, 1)
    if args.json:
        write_json(args.json, payload)
    print()
    print("\n\n".join(tables))
    print(f"\n({payload['seconds']} s{'; JSON: ' + args.json if args.json else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
