"""setup.py's build knobs (TK_CUDA_ARCHS, TORCH_CUDA_ARCH_LIST, TK_OPS) are parsed and
validated before anything is compiled. Runs `setup.py --name`, which builds nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parent.parent / "setup.py"
pytestmark = pytest.mark.skipif(not SETUP.exists(), reason="needs the source tree")


def run_setup(**env):
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("TK_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST", "TK_OPS")}
    environment.update(env)
    return subprocess.run([sys.executable, str(SETUP), "--name"], cwd=SETUP.parent,
                          env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("env, expected", [
    ({}, "CUDA targets ['80', '89', '90a']"),
    ({"TK_CUDA_ARCHS": "90a"}, "CUDA targets ['90a']"),
    ({"TK_CUDA_ARCHS": "8.0; sm_89,9.0a 80"}, "CUDA targets ['80', '89', '90a']"),
    ({"TK_CUDA_ARCHS": "80+PTX"}, "CUDA targets ['80+PTX']"),
    ({"TORCH_CUDA_ARCH_LIST": "8.6;9.0a"}, "CUDA targets ['86', '90a']"),
    ({"TORCH_CUDA_ARCH_LIST": "8.6", "TK_CUDA_ARCHS": "89"}, "CUDA targets ['89']"),
    ({"TK_OPS": "attention"}, "op families ['attention']"),
    ({"TK_OPS": "none"}, "op families []"),
])
def test_good_settings(env, expected):
    result = run_setup(**env)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout


@pytest.mark.parametrize("env, message", [
    ({"TK_CUDA_ARCHS": "75"}, "older than sm_80"),
    ({"TK_CUDA_ARCHS": "Ampere"}, "cannot read GPU target 'Ampere'"),
    ({"TK_CUDA_ARCHS": "90a+PTX"}, "+PTX is not allowed on an arch-specific target"),
    ({"TORCH_CUDA_ARCH_LIST": "7.0"}, "TORCH_CUDA_ARCH_LIST: '7.0' is older than sm_80"),
    ({"TK_OPS": "attention,nosuchop"}, "TK_OPS: unknown op families ['nosuchop']"),
])
def test_bad_settings(env, message):
    result = run_setup(**env)
    assert result.returncode != 0
    assert message in result.stderr + result.stdout
