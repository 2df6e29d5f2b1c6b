"""GPU time of a callable: CUDA events around each call, warm-up first, median of many reps.

The reps are queued behind a short GPU sleep so the CPU enqueues them faster than the GPU runs
them: each event pair then measures GPU execution only, not Python launch overhead (which is
the same for any caller and would otherwise dominate the small configs).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

SLEEP_CYCLES_PER_REP = 200_000   # ~100 us at ~2 GHz: more than one launch's CPU cost
MAX_SLEEP_CYCLES = 100_000_000   # ~50 ms


def median_ms(fn: Callable[[], object], *, warmup_ms: float = 25.0, measure_ms: float = 200.0,
              min_reps: int = 10, max_reps: int = 100) -> float:
    """Median milliseconds of GPU time per call of ``fn`` (on the current stream)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 3, 1e-3)

    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    reps = max(min_reps, min(max_reps, int(measure_ms / estimate)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    torch.cuda.synchronize()
    torch.cuda._sleep(min(MAX_SLEEP_CYCLES, SLEEP_CYCLES_PER_REP * reps))
    for before, after in events:
        before.record()
        fn()
        after.record()
    torch.cuda.synchronize()
    return statistics.median(before.elapsed_time(after) for before, after in events)
