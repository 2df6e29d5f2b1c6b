"""CPU unit tests of host-compilable headers: the tile core's index math
(kittens/common/layout_math.cuh), the causal attention kernels' task order
(csrc/attention/task_order.h) and the attention kernels' head dims (csrc/attention/head_dims.h).

The checks live in tests/cpp/*.cpp (plain C++20: the headers compile as host code without
nvcc); each test compiles one with g++ and runs it, so it needs no GPU.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
@pytest.mark.parametrize("name", ["test_layout_math", "test_task_order", "test_head_dims"])
def test_host_index_math(tmp_path: Path, name: str) -> None:
    exe = tmp_path / name
    # -Werror: the headers are meant to be clean host C++; a warning there is a regression.
    build = subprocess.run(
        ["g++", "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{REPO}", f"-I{REPO / 'csrc'}",
         str(REPO / "tests" / "cpp" / f"{name}.cpp"), "-o", str(exe)],
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"compile failed:\n{build.stderr}"

    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    print(run.stdout)
    assert run.returncode == 0, f"{name} checks failed:\n{run.stdout}\n{run.stderr}"
    assert " 0 failures" in run.stdout
