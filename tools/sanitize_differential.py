"""A sample of the differential suite's GPU cases for compute-sanitizer (memcheck / racecheck):

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python3 tools/sanitize_differential.py

The ``sanitize`` profile of tests/differential/settings.py (random tk.attention and tk.matmul
calls with small sizes: kernels and fallbacks, forward and backward, views of every layout, odd
lengths, masks), each against its float64 reference as in the GPU suite, so a run that is
silent but wrong still fails. Exits non-zero on any failure.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from differential.environment import Environment, PathCounts  # noqa: E402
from differential.runner import run_property  # noqa: E402
from differential.settings import PROFILES  # noqa: E402

PROFILE = PROFILES["sanitize"]


def main() -> int:
    env = Environment.cuda()
    failed = []
    for prop in PROFILE.examples:
        counts = PathCounts(prop)
        try:
            run_property(prop, PROFILE, env, counts)
        except BaseException as exc:  # noqa: BLE001  (reported below)
            failed.append(prop)
            print(f"{prop}: FAILED {exc!r}"[:2000], flush=True)
        print(f"sanitize_differential: {prop} {dict(counts.counts)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
