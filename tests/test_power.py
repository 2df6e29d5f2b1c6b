"""benchmarks/power.py (NVML through ctypes) and timing.sustained: the readings tools/sustained.py
reports."""

import ctypes
import importlib
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def benchmarks_module(name: str):
    """benchmarks.<name>, imported from this repository whatever the working directory; inside
    the tests, so that collecting the suite never imports the benchmarks package."""
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module(f"benchmarks.{name}")
    finally:
        sys.path.remove(str(ROOT))


def nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_no_gpu_means_no_readings():
    assert benchmarks_module("power").Gpu.open() is None


@pytest.mark.gpu
def test_energy_counter_grows_with_work():
    if not nvml_loadable():
        pytest.skip("no libnvidia-ml.so.1")
    power = benchmarks_module("power")
    gpu = power.Gpu.open()
    assert gpu is not None, "NVML loads but the current device was not found by its PCI bus id"
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    before = gpu.energy_mj()
    # A second of tensor work: NVML refreshes the counter in steps, and 300 products (~50 ms)
    # once fell inside one step (0 mJ in the full suite on the H200).
    with power.Sampler(gpu, interval_s=0.01) as sampler:
        deadline = time.perf_counter() + 1.0
        while time.perf_counter() < deadline:
            for _ in range(50):
                a @ a
            torch.cuda.synchronize()
    used = gpu.energy_mj() - before
    assert used > 0
    assert sampler.clocks and all(100 <= mhz <= 5000 for mhz in sampler.clocks)
    assert sampler.temperatures and all(0 < c < 120 for c in sampler.temperatures)


@pytest.mark.gpu
def test_sustained_reports_every_turn():
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    fns = {"small": lambda: a @ a, "large": lambda: (a @ a) @ a}
    gpu = benchmarks_module("power").Gpu.open()
    turns = benchmarks_module("timing").sustained(fns, seconds=0.2, warmup_s=0.05, rounds=2, gpu=gpu)
    assert set(turns) == {"small", "large"}
    for rows in turns.values():
        assert len(rows) == 2
        assert all(row["calls"] > 0 and row["us"] > 0 for row in rows)
    # Two products take longer than one: the per-call times are of the right callable.
    assert min(r["us"] for r in turns["large"]) > max(r["us"] for r in turns["small"])
