"""The CPU suite passes whatever CUDA targets the extension was built for.

The CPU stand-in tests (conftest's cpu_kernel and cpu_matmul fixtures) make the path choice see
an sm_90 GPU and a build with sm_90a code; they must not depend on this build's own targets.
Here the test files that use the stand-ins run again in a new pytest process that sees a build
for sm_80 only (TK_TEST_PRETEND_ARCHS=80, what an A100 user's TK_CUDA_ARCHS=80 build reports).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import thunderkittens as tk

TESTS = Path(__file__).resolve().parent
# The files that use the stand-ins (Based's are tested with its own fixture).
STAND_IN_FILES = sorted(
    path.name for path in TESTS.glob("test_*.py")
    if path.name != Path(__file__).name and not path.name.startswith("test_based")
    and ("cpu_kernel" in path.read_text() or "cpu_matmul" in path.read_text()))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU suite runs these on the real build")
@pytest.mark.parametrize("archs", ["80"])
def test_stand_in_tests_pass_on_another_build(archs):
    assert "test_attention_kernel_path_cpu.py" in STAND_IN_FILES, STAND_IN_FILES
    package_root = str(Path(tk.__file__).resolve().parents[1])
    env = {**os.environ, "TK_TEST_PRETEND_ARCHS": archs,
           "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-p", "no:cacheprovider",
                           *STAND_IN_FILES], cwd=TESTS, env=env, capture_output=True, text=True,
                          timeout=600)
    assert f"TK_TEST_PRETEND_ARCHS={archs}" in done.stdout, done.stdout[-3000:]
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
