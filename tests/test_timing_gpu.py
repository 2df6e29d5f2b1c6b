"""benchmarks/timing.py: a burst's reps are timed on the GPU, not on the host that queues them."""

import time

import pytest
import torch

from test_power import benchmarks_module


@pytest.mark.gpu
def test_a_call_slower_to_queue_than_the_sleep_is_timed_on_the_gpu():
    timing = benchmarks_module("timing")
    x = torch.zeros(1024, device="cuda")
    host_ms = 3 * timing.SLEEP_CYCLES_PER_REP / 2e6  # three times the sleep per rep at ~2 GHz

    def slow_to_queue():
        time.sleep(host_ms / 1e3)
        x.add_(1)  # a few microseconds of GPU time

    ms = timing.median_ms(slow_to_queue, warmup_ms=5, measure_ms=60, min_reps=10, max_reps=10)
    # Behind a sleep shorter than the host's time to queue the reps, each rep reads ~host_ms.
    assert ms < host_ms / 10, f"{ms:.3f} ms per call: the host's time, not the GPU's"
