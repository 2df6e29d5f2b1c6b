"""The differential suite's long profile on the GPU (tests/differential/): thousands of random
tk.attention and tk.matmul calls, on the kernels (every family forced in turn with use_kernel,
and auto) and the fallbacks, forward and backward, over dtypes, head dims, GQA ratios, odd and
unequal lengths, mask kinds, scales, operand layouts (transposed, fused QKV slices, offset and
strided slices, expanded views), side streams and, with two GPUs, the second device; each
against a float64 reference within PyTorch's own error (tests/differential/tolerance.py).

Each property runs in a fresh process (a kernel fault poisons a process's CUDA context), from
a fixed seed; a failure is shrunk to a minimal example, printed with the fresh process's
output. TK_FUZZ_PROFILE=smoke runs a tenth of the cases; TK_FUZZ_IN_PROCESS=1 runs them in the
test process (for a debugger). Each property prints how many cases went to each path and FAILS
(not skips) when a kernel this GPU and this build should run was never reached.
"""

import os
from collections import Counter

import pytest
import torch

from differential import runner
from differential.environment import Environment, PathCounts
from differential.settings import SEED, profile_named

pytestmark = pytest.mark.gpu

PROFILE = profile_named("TK_FUZZ_PROFILE", "gpu")
IN_PROCESS = os.environ.get("TK_FUZZ_IN_PROCESS", "") == "1"


@pytest.fixture(scope="module")
def env():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return Environment.cuda()


@pytest.fixture(scope="module")
def report(request):
    """Lines printed after the module's tests: the per-path case counts of each property."""
    lines = []
    yield lines
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and lines:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            for line in lines:
                reporter.write_line(line)


def run(prop, env, report) -> PathCounts:
    counts = PathCounts(prop)
    if IN_PROCESS:
        try:
            runner.run_property(prop, PROFILE, env, counts)
        finally:
            report.append(counts.line(PROFILE.name, SEED))
        return counts
    result = runner.run_in_fresh_process(prop, PROFILE.name)
    counts.counts.update(Counter(result.get("counts", {})))
    report.append(counts.line(PROFILE.name, SEED) + ("" if result["ok"] else " (FAILED)"))
    if not result["ok"]:
        pytest.fail(f"differential {prop} (profile {PROFILE.name}, seed {SEED}) failed: "
                    f"{result.get('error', '')[-3000:]}\n--- output of its process ---\n"
                    f"{result.get('output', '')[-12000:]}", pytrace=False)
    return counts


def require(condition, what, counts):
    assert condition, f"{what}: {dict(counts.counts)} (the GPU and the build should run it)"


@pytest.mark.parametrize("prop", runner.GPU_PROPERTIES)
def test_differential(prop, env, report):
    counts = run(prop, env, report)
    assert counts.total > 0
    families = env.attention_families()
    if prop == "attention":
        for family in families:
            require(counts.reached(family) > 0, f"no case ran on the {family} kernel", counts)
        if "sm90" in families and env.has_attention_backward:
            require(counts.counts["sm90+backward"] > 0, "no case ran the sm90 backward", counts)
    elif prop in ("attention_misaligned", "attention_no_key_rows") and families:
        require(sum(counts.reached(f) for f in families) > 0, "no case ran on a kernel", counts)
    elif prop == "attention_dropout":
        assert counts.reached("fallback") == counts.total, dict(counts.counts)
    elif prop == "matmul" and env.matmul_kernel_runs():
        require(counts.reached("kernel") > 0, "no case ran on the matmul kernel", counts)
        require(counts.counts["kernel+backward"] > 0, "no gradient ran on the matmul kernel", counts)
