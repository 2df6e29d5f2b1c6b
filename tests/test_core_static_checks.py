"""Layout and shape misuse of the tile core is a compile error, not a wrong answer: each snippet
below misuses one op and must fail to compile with that op's message; a control snippet using
the same ops correctly must compile. Needs nvcc (no GPU)."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")

PRELUDE = """
#include "kittens/kittens.cuh"
using namespace kittens;
__global__ void probe(float* out) {
    rt_bf<16, 16> a_row, b_row;
    rt_bf<16, 16, col_l> a_col, b_col;
    rt_fl<16, 16> acc;
    zero(acc);
    zero(a_row); zero(b_row); zero(a_col); zero(b_col);
"""
EPILOGUE = """
    out[threadIdx.x] = acc.tiles[0][0].data[0].x;
}
"""

CONTROL = """
    mma_AB(acc, a_row, b_col, acc);
    mma_ABt(acc, a_row, b_row, acc);
    mma_AtB(acc, a_col, b_col, acc);
    mma_AtBt(acc, a_col, b_row, acc);
    rt_bf<16, 16, col_l> swapped; swap_layout(swapped, a_row);
    rt_fl<16, 16> converted; copy(converted, a_row);
"""

MISUSES = {
    "mma_AB with a row-layout b": ("mma_AB(acc, a_row, b_row, acc);", "mma_AB: b must be a col-layout tile"),
    "mma_ABt with a col-layout b": ("mma_ABt(acc, a_row, b_col, acc);", "mma_ABt: b must be a row-layout tile"),
    "mma_AtB with a row-layout a": ("mma_AtB(acc, a_row, b_col, acc);", "mma_AtB: a must be a col-layout tile"),
    "mma into a bf16 accumulator": ("mma_AB(a_row, a_row, b_col, a_row);", "mma: d and c must be float tiles"),
    "mma shape mismatch": ("rt_bf<16, 32, col_l> wide; mma_AB(acc, a_row, wide, acc);", "mma_AB: shapes"),
    "copy across layouts": ("rt_fl<16, 16, col_l> c; copy(c, a_row);", "copy: tiles must have the same layout"),
    "swap_layout of a float tile": ("rt_fl<16, 16, col_l> c; swap_layout(c, acc);", "swap_layout: 16-bit tiles"),
    "load of a mismatched shared tile": (
        "__shared__ st_bf<32, 16> s; load(a_row, s);", "load: register and shared tile shapes differ"),
}


def compile_snippet(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    source = tmp_path / "probe.cu"
    source.write_text(PRELUDE + body + EPILOGUE)
    return subprocess.run(
        [NVCC, "-std=c++20", "--expt-relaxed-constexpr", "-gencode=arch=compute_80,code=sm_80",
         f"-I{REPO}", "-c", str(source), "-o", str(tmp_path / "probe.o")],
        capture_output=True, text=True, timeout=300)


def test_correct_use_compiles(tmp_path):
    result = compile_snippet(CONTROL, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("case", MISUSES, ids=list(MISUSES))
def test_misuse_is_a_compile_error(case, tmp_path):
    body, message = MISUSES[case]
    result = compile_snippet(body, tmp_path)
    assert result.returncode != 0, f"{case} compiled"
    assert message in result.stderr, result.stderr[-3000:]
