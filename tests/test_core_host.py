"""CPU unit tests of the tile core's index math (kittens/common/layout_math.cuh).

The checks live in tests/cpp/test_layout_math.cpp (plain C++20: layout_math.cuh compiles as
host code without nvcc); this test compiles it with g++ and runs it, so it needs no GPU.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "cpp" / "test_layout_math.cpp"


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_layout_math(tmp_path: Path) -> None:
    exe = tmp_path / "test_layout_math"
    # -Werror: the header is meant to be clean host C++; a warning there is a regression.
    build = subprocess.run(
        ["g++", "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{REPO}", str(SOURCE), "-o", str(exe)],
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"compile failed:\n{build.stderr}"

    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    print(run.stdout)
    assert run.returncode == 0, f"layout_math checks failed:\n{run.stdout}\n{run.stderr}"
    assert " 0 failures" in run.stdout
