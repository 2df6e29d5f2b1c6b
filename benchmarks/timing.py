"""GPU time of a callable: CUDA events around each call, warm-up first, median of many reps.

The reps are queued behind a short GPU sleep so the CPU enqueues them faster than the GPU runs
them: each event pair then measures GPU execution only, not Python launch overhead (which is
the same for any caller and would otherwise dominate the small configs).

`interleaved_median_ms` compares two callables (ours and one peer): it times them in
alternating rounds instead of one after the other, so that a drift of the GPU's clock (power
and temperature: cuBLAS on one shape moved 675-777 TFLOP/s between runs) falls on both alike.
With more callables a rotating order still puts each one after the same neighbour every
round, which biased one column by up to 9% (attention.py times its six one after the other).
Its turns of calls of STEADY_FROM_MS or more skip the sleep (such a call never waits for the
CPU) and run at steady state instead.

A sleep too short for the host's time to queue the reps would let the GPU wait for the CPU and
time the host instead: a forward + backward that queues in about 0.8 ms once read 0.90 ms per call
behind 1 ms per rep, its GPU time being 0.23 ms. So `_timed_reps` checks that the sleep was still
running when the last rep was queued, and otherwise times the reps again behind a longer sleep.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping

import torch

# More than one call's CPU cost, so the GPU never waits for the CPU (a 100 us sleep per rep was
# too short for a small forward + backward; docs/performance.md).
SLEEP_CYCLES_PER_REP = 2_000_000  # ~1 ms at ~2 GHz
MAX_SLEEP_CYCLES = 400_000_000    # ~200 ms

# The timed milliseconds per callable of a head-to-head (interleaved_median_ms), a quarter per
# round. Turns are capped at max_reps / rounds = 25 calls, so this changes only calls longer than
# 2 ms, which 200 ms gave as few as 3 calls per turn, each turn right after its idle sleep, when
# the clock has not yet settled at the power cap. It narrows the spread of the ratio between runs,
# it does not remove it (docs/performance.md).
HEAD_TO_HEAD_MS = 800.0

# Head-to-head turns of calls at least this long run at steady state: STEADY_WARMUP_MS back to back
# first, then the timed reps back to back, with no idle sleep (such a call never waits for the
# CPU). After the sleep, a turn of at most 25 such calls ran mostly while the clock was still
# settling at the power cap, and the ratio moved with that (docs/performance.md). Steady state is
# where a training loop runs (tools/sustained.py holds it for seconds).
STEADY_FROM_MS = 2.0
STEADY_WARMUP_MS = 300.0


def _estimate_ms(fn: Callable[[], object]) -> float:
    """Milliseconds per call from three timed calls after one untimed (which may compile)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    return max(start.elapsed_time(end) / 3, 1e-3)


def _timed_reps(fn: Callable[[], object], reps: int, *, sleep: bool = True) -> list[float]:
    """Milliseconds of each of `reps` calls, queued behind a GPU sleep (see the module doc), or
    without it (sleep=False: right behind whatever the GPU is running)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    cycles = SLEEP_CYCLES_PER_REP * reps
    while True:
        if sleep:
            torch.cuda.synchronize()
            torch.cuda._sleep(min(MAX_SLEEP_CYCLES, cycles))
            slept = torch.cuda.Event()
            slept.record()
        for before, after in events:
            before.record()
            fn()
            after.record()
        # The sleep over before the last rep was queued: the GPU may have waited for the host.
        outran = sleep and slept.query()
        torch.cuda.synchronize()
        if not outran or cycles >= MAX_SLEEP_CYCLES:
            return [before.elapsed_time(after) for before, after in events]
        cycles *= 4


def _turn_order(names: list[str], round_index: int) -> list[str]:
    """The names rotated by the round's index, so that each goes first in turn."""
    shift = round_index % len(names) if names else 0
    return names[shift:] + names[:shift]


def median_ms(fn: Callable[[], object], *, warmup_ms: float = 25.0, measure_ms: float = 200.0,
              min_reps: int = 10, max_reps: int = 100) -> float:
    """Median milliseconds of GPU time per call of ``fn`` (on the current stream)."""
    estimate = _estimate_ms(fn)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    reps = max(min_reps, min(max_reps, int(measure_ms / estimate)))
    return statistics.median(_timed_reps(fn, reps))


def interleaved_median_ms(fns: Mapping[str, Callable[[], object]], *, rounds: int = 4,
                          warmup_ms: float = 25.0, measure_ms: float = 200.0, min_reps: int = 10,
                          max_reps: int = 100) -> dict[str, float | Exception]:
    """Median milliseconds per call of each callable, timed in `rounds` alternating rounds
    (each callable gets about measure_ms / rounds per round, a short warm-up before each of its
    turns, and its median is over the reps of all rounds). Calls of STEADY_FROM_MS or more are
    timed at steady state (see there). A callable that raises is reported as that exception and
    left out of the rounds."""
    results: dict[str, float | Exception] = {}
    estimates: dict[str, float] = {}
    for name, fn in fns.items():
        try:
            estimates[name] = _estimate_ms(fn)
            for _ in range(max(1, int(warmup_ms / estimates[name]))):
                fn()
        except Exception as error:  # noqa: BLE001 - reported to the caller, not fatal
            torch.cuda.synchronize()
            results[name] = error
    times: dict[str, list[float]] = {name: [] for name in estimates}
    order = list(estimates)
    for round_index in range(rounds):
        for name in _turn_order(order, round_index):
            fn, estimate = fns[name], estimates[name]
            steady = estimate >= STEADY_FROM_MS
            turn_warmup_ms = STEADY_WARMUP_MS if steady else warmup_ms / rounds
            for _ in range(max(1, int(turn_warmup_ms / estimate))):
                fn()
            reps = max(-(-min_reps // rounds), min(max_reps // rounds, int(measure_ms / rounds / estimate)))
            times[name] += _timed_reps(fn, reps, sleep=not steady)
    for name in order:
        results[name] = statistics.median(times[name])
    return {name: results[name] for name in fns}


def sustained(fns: Mapping[str, Callable[[], object]], *, seconds: float = 3.0, warmup_s: float = 1.0,
              rounds: int = 2, gpu=None) -> dict[str, list[dict]]:
    """Each callable run back to back for `seconds` (no sleeps: the GPU never idles), in
    alternating turns, `rounds` times; per turn the microseconds per call (CUDA events over the
    whole turn) and, with `gpu` (benchmarks.power.Gpu), the millijoules per call, the mean power
    and the median SM clock. This is a training loop's steady state at the power cap, held for
    seconds, where the interleaved medians above take a few hundred milliseconds per turn (and
    time calls under STEADY_FROM_MS in short bursts after an idle sleep)."""
    from .power import Sampler  # only here: NVML is not needed for the timings above

    turns: dict[str, list[dict]] = {name: [] for name in fns}
    for round_index in range(rounds):
        for name in _turn_order(list(fns), round_index):
            fn = fns[name]
            deadline = time.perf_counter() + warmup_s
            while time.perf_counter() < deadline:
                fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            sampler = Sampler(gpu) if gpu is not None else contextlib.nullcontext()
            with sampler:
                energy = gpu.energy_mj() if gpu is not None else 0
                start.record()
                calls, deadline = 0, time.perf_counter() + seconds
                while time.perf_counter() < deadline:
                    fn()
                    calls += 1
                end.record()
                torch.cuda.synchronize()
                energy = gpu.energy_mj() - energy if gpu is not None else 0
            ms = start.elapsed_time(end)
            turn = {"us": ms * 1e3 / calls, "calls": calls}
            if gpu is not None:
                turn.update(mj=energy / calls, watts=energy / ms,
                            mhz=statistics.median(sampler.clocks) if sampler.clocks else None,
                            max_temp_c=max(sampler.temperatures, default=None))
            turns[name].append(turn)
    return turns


def interleaved_wall_ms(fns: Mapping[str, Callable[[], object]], *, rounds: int) -> dict[str, float]:
    """Median milliseconds per call of each callable, every call timed whole by the host clock
    between two CUDA synchronisations, in `rounds` alternating rounds (each name first in turn).
    For calls that wait for the GPU themselves (a generate loop reads its stopping rule every
    step): they cannot be queued behind a sleep, and their time as the user sees it is the point."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_index in range(rounds):
        for name in _turn_order(list(fns), round_index):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fns[name]()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(ms) for name, ms in times.items()}
