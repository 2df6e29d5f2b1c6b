"""tools/gpu_check.sh refuses a step it does not know, before it runs or writes anything."""

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.sh"


@pytest.mark.parametrize("steps", ["build,tset", "test_fixed", "bench,,sanitize,all"])
def test_unknown_step_is_refused(steps, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "TK_CHECK_STEPS": steps, "OUT": str(out)})
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    bad = [s for s in steps.split(",") if s and s not in
           ("build", "test", "test-fixed", "test-differential", "sanitize", "bench")][0]
    assert f"TK_CHECK_STEPS: unknown step '{bad}'" in result.stderr
    assert not out.exists()
