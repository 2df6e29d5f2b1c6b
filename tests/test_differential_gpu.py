"""The differential suite's long profile on the GPU (tests/differential/): thousands of random
tk.attention, tk.matmul, tk.based, tk.based_step and tk.fftconv calls, on the kernels (every
attention family forced in turn with use_kernel, and auto) and the fallbacks, forward and backward, over dtypes, head dims, GQA ratios, odd and
unequal lengths, mask kinds, scales, operand layouts (transposed, fused QKV slices, offset and
strided slices, expanded views), side streams and, with two GPUs, the second device; each
against a float64 reference within PyTorch's own error (tests/differential/tolerance.py).

Each property is split into shards (settings.py: the ``gpu`` profile's 4,560 cases in 42
shards, most cases small), each a test of its own, so the test workers run them in parallel;
shard i draws its cases from seed TK_FUZZ_SEED + i * 1000003. A shard runs in the test worker's
case server (differential/worker.py: a kernel fault poisons a process's CUDA context, so it
costs that shard and a new server runs the next). A failure is shrunk to a minimal example,
printed with the server's output. TK_FUZZ_PROFILE=smoke runs a tenth of the cases;
TK_FUZZ_IN_PROCESS=1 runs them in the test process (for a debugger). The end of pytest's output
adds up how many cases went to each path, with the seed; a shard FAILS (not skips) when a
kernel this GPU and this build should run was never reached.
"""

import os
from collections import Counter

import pytest
import torch

import thunderkittens as tk
from differential import runner
from differential.based import based_family, family_runs
from differential.environment import Environment, PathCounts
from differential.settings import SEED, profile_named, shard_seed
from kernel_required import gpu_is_for

pytestmark = pytest.mark.gpu

PROFILE = profile_named("TK_FUZZ_PROFILE", "gpu")
IN_PROCESS = os.environ.get("TK_FUZZ_IN_PROCESS", "") == "1"
SHARD_TIMEOUT_S = 400  # a shard of the gpu profile takes well under a minute

SHARDS = [(prop, shard) for prop in runner.GPU_PROPERTIES for shard in range(PROFILE.shards_for(prop))]


@pytest.fixture(scope="module")
def env():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = Environment.cuda()
    # A family this GPU is for must be runnable with this build (else a build without code for
    # the GPU would quietly move every case to the fallback).
    for op, family in (("attention", "sm90"), ("attention", "sm80"), ("matmul", "sm90")):
        runs = env.matmul_kernel_runs() if op == "matmul" else env.attention_family_runs(family)
        if gpu_is_for(op, family) and not runs:
            pytest.fail(f"this GPU should run the {op} {family} kernels, but this build cannot "
                        f"({tk.build_summary()})", pytrace=False)
    return env


def run(prop, shard, record_property, request) -> PathCounts:
    counts = PathCounts(prop)
    summary = {"kind": "differential", "property": prop, "profile": PROFILE.name, "shard": shard,
               "shards": PROFILE.shards_for(prop), "base_seed": SEED, "counts": {}, "ok": False}
    if IN_PROCESS:
        try:
            runner.run_property(prop, PROFILE, Environment.cuda(), counts, shard=shard)
            summary["ok"] = True
        finally:
            summary["counts"] = dict(counts.counts)
            record_property("tk_summary", summary)
        return counts
    worker = request.getfixturevalue("case_worker")
    answer = worker.run({"kind": "property", "property": prop, "profile": PROFILE.name,
                         "shard": shard}, timeout=SHARD_TIMEOUT_S)
    counts.counts.update(Counter(answer.get("counts", {})))
    summary.update(counts=dict(counts.counts), ok=answer["status"] == "ok")
    record_property("tk_summary", summary)
    if answer["status"] != "ok":
        pytest.fail(f"differential {prop} shard {shard} (profile {PROFILE.name}, seed "
                    f"{shard_seed(shard)}) failed: {answer.get('message', '')[-4000:]}\n"
                    f"--- output of the case server ---\n{answer.get('output', '')[-12000:]}",
                    pytrace=False)
    return counts


def require(condition, what, counts):
    assert condition, f"{what}: {dict(counts.counts)} (the GPU and the build should run it)"


@pytest.mark.parametrize("prop, shard", SHARDS, ids=[f"{prop}-{shard}" for prop, shard in SHARDS])
def test_differential(prop, shard, env, record_property, request):
    counts = run(prop, shard, record_property, request)
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
    elif prop == "based" and family_runs(env, "based"):
        kernels = [k for k in ("sm90", "sm80") if based_family(env, k) is not None]
        for kernel in kernels:
            require(counts.reached(kernel) > 0, f"no case ran on the Based {kernel} kernel", counts)
        require(sum(counts.counts[f"{k}+backward"] for k in kernels) > 0,
                "no gradient ran on the Based kernels", counts)
    elif prop in ("based_step", "fftconv") and family_runs(env, prop.split("_")[0]):
        require(counts.reached("kernel") > 0, f"no case ran on the {prop} kernel", counts)
        if prop != "based_step":
            require(counts.counts["kernel+backward"] > 0, f"no gradient ran on the {prop} kernels", counts)
    elif prop == "matmul" and env.matmul_kernel_runs():
        require(counts.reached("kernel") > 0, "no case ran on the matmul kernel", counts)
        require(counts.counts["kernel+backward"] > 0, "no gradient ran on the matmul kernel", counts)
