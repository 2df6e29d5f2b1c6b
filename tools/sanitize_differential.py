"""A sample of the differential suite's GPU cases for compute-sanitizer (memcheck / racecheck):

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python3 tools/sanitize_differential.py

The ``sanitize`` profile of tests/differential/settings.py (random tk.attention, tk.matmul,
tk.based, tk.based_step and tk.fftconv calls with small sizes: kernels and fallbacks, forward
and backward, views of every layout, odd lengths, masks), each against its float64 reference as
in the GPU suite, so a run that is silent but wrong still fails. Exits non-zero on any failure.

Arguments name properties to run (default: all of the profile's), to split a slow sanitizer run
over several commands, e.g. ``python3 tools/sanitize_differential.py matmul fftconv``; or one of
the two groups racecheck needs apart (tools/gpu_check.sh):

  --group attention   the attention properties. Their yardsticks and fallbacks run PyTorch's
                      attention kernels, whose memory-efficient backward shows thousands of
                      racecheck hazards of its own: run them with racecheck's kernel filter
                      (--kernel-name kns=2tk, our kernels only).
  --group others      the rest. Their yardsticks run cuBLAS half-precision GEMMs, and with the
                      kernel filter racecheck stops in them ("Internal Sanitizer Error: The
                      Sanitizer failed to handle a hardware exception", then an illegal address),
                      even in a process that only calls torch.matmul on fp16 (2, 64, 32) x
                      (32, 48); unfiltered it runs them clean: run this group unfiltered.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from differential.environment import Environment, PathCounts  # noqa: E402
from differential.runner import run_property  # noqa: E402
from differential.settings import PROFILES  # noqa: E402

PROFILE = PROFILES["sanitize"]
GROUPS = {"attention": [p for p in PROFILE.examples if p.startswith("attention")],
          "others": [p for p in PROFILE.examples if not p.startswith("attention")]}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--group"]:
        if len(argv) != 2 or argv[1] not in GROUPS:
            print(f"sanitize_differential: --group takes one of {sorted(GROUPS)}")
            return 2
        argv = GROUPS[argv[1]]
    unknown = sorted(set(argv) - set(PROFILE.examples))
    if unknown:
        print(f"sanitize_differential: unknown properties {unknown}; known: {sorted(PROFILE.examples)}")
        return 2
    env = Environment.cuda()
    failed = []
    for prop in argv or list(PROFILE.examples):
        counts = PathCounts(prop)
        try:
            run_property(prop, PROFILE, env, counts)
        except BaseException as exc:  # noqa: BLE001  (reported below)
            failed.append(prop)
            print(f"{prop}: FAILED {exc!r}"[:2000], flush=True)
        print(f"sanitize_differential: {prop} {dict(counts.counts)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
