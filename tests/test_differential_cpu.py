"""The differential suite's short profile, on the CPU (tests/differential/: random calls against
float64 references within PyTorch's own error).

Covers what needs no GPU: the SDPA and torch.matmul fallbacks over every argument, mask kind
and operand layout; the kernel paths through the CPU stand-ins of the ops (the ``cpu_kernel``
and ``cpu_matmul`` fixtures: argument checks, path choice, operand preparation, autograd
formulas and op schemas are the real code); the fake implementations under FakeTensorMode;
torch.compile(fullgraph=True); and argument validation. Each property runs a fixed number of
cases from a fixed seed (TK_FUZZ_CPU_PROFILE and TK_FUZZ_SEED change them), prints how many
went to each path, and fails if a kernel path the stand-ins make available was never taken.
"""

import torch
import pytest

from differential import runner, standins
from differential.attention import AttentionCase, check_case
from differential.environment import Environment, PathCounts
from differential.settings import SEED, profile_named

PROFILE = profile_named("TK_FUZZ_CPU_PROFILE", "cpu")


@pytest.fixture
def report(record_property):
    """Adds a property's per-path case counts to the end of pytest's output (conftest.py)."""
    def add(counts, label):
        record_property("tk_summary", {"kind": "differential", "property": label,
                                       "profile": PROFILE.name, "shard": 0, "shards": 1,
                                       "base_seed": SEED, "counts": dict(counts.counts),
                                       "ok": True})
    return add


def run(name, env, report, *, label=None, examples=None, **stand_ins):
    counts = PathCounts(label or name)
    try:
        runner.run_property(name, PROFILE, env, counts, max_examples=examples, **stand_ins)
    finally:
        report(counts, label or name)
    return counts


def require_attention_kernels(counts, env, *, backward=True):
    """Fails (not skips) when a kernel family the stand-ins make available was never reached."""
    for family in env.attention_families():
        assert counts.reached(family) > 0, f"no case ran on the {family} kernel: {dict(counts.counts)}"
    if backward and "sm90" in env.attention_families() and env.has_attention_backward:
        assert counts.counts["sm90+backward"] > 0, f"no case ran the sm90 backward: {dict(counts.counts)}"


def only_fallback(counts):
    paths = {path.split("+")[0].removeprefix("fake ") for path in counts.counts}
    assert paths <= {"fallback"}, f"CPU tensors reached a kernel path: {dict(counts.counts)}"


# ---- attention ---------------------------------------------------------------------------------

def test_attention_fallback(report):
    counts = run("attention", Environment.cpu(), report, label="attention (SDPA)",
                 examples=PROFILE.examples_for("attention") // 2)
    only_fallback(counts)


def test_attention_kernel_stand_ins(cpu_kernel, report):
    env = Environment.cpu(stand_ins=True)
    counts = run("attention", env, report, label="attention (stand-in kernels)", stand_in=cpu_kernel)
    require_attention_kernels(counts, env)


def test_attention_misaligned_views(cpu_kernel, report):
    env = Environment.cpu(stand_ins=True)
    counts = run("attention_misaligned", env, report, stand_in=cpu_kernel)
    if env.attention_families():  # views the kernels cannot read in place reached one (copied)
        assert sum(counts.reached(family) for family in env.attention_families()) > 0, \
            f"no case ran on a kernel: {dict(counts.counts)}"


def test_attention_no_key_rows_fallback(report):
    counts = run("attention_no_key_rows", Environment.cpu(), report,
                 label="attention_no_key_rows (SDPA)")
    only_fallback(counts)


def test_attention_no_key_rows_kernel_stand_ins(cpu_kernel, report):
    env = Environment.cpu(stand_ins=True)
    run("attention_no_key_rows", env, report, label="attention_no_key_rows (stand-in kernels)",
        stand_in=cpu_kernel)


def test_attention_dropout(cpu_kernel, report):
    counts = run("attention_dropout", Environment.cpu(stand_ins=True), report, stand_in=cpu_kernel)
    only_fallback(counts)


def test_attention_validation(report):
    run("attention_validation", Environment.cpu(), report)


def test_attention_fake_tensors(cpu_kernel, report):
    env = Environment.cpu(stand_ins=True)
    counts = run("attention_fake", env, report)
    assert counts.reached("fake sm90") + counts.reached("fake sm80") > 0 or not env.attention_families()


def test_attention_compile(cpu_kernel, report):
    run("attention_compile", Environment.cpu(stand_ins=True), report)


def test_issue_repro_shape_on_cpu(cpu_kernel):
    """The issue's fallback repro (head dim 80: SDPA) in small, with its layouts: a transposed
    q, a value view 8 bytes off a 16-byte boundary, causal_lower_right, scale 0.3, GQA."""
    case = AttentionCase(batch=(1,), heads_kv=8, gqa=2, enable_gqa=True, len_q=100, len_kv=205,
                         head_dim=80, head_dim_v=80, dtype=torch.bfloat16, mask="lower_right",
                         mask_shape="2d", empty_rows=False, scale=0.3, grad=(True, True, True),
                         layout=("transposed", "contiguous", "offset:4"), kernel="auto")
    check_case(case, Environment.cpu(stand_ins=True), PathCounts("repro"), stand_in=cpu_kernel)


# ---- matmul ------------------------------------------------------------------------------------

def test_matmul_fallback(report):
    counts = run("matmul", Environment.cpu(), report, label="matmul (torch.matmul)",
                 examples=PROFILE.examples_for("matmul") // 2)
    only_fallback(counts)


def test_matmul_kernel_stand_in(cpu_matmul, report):
    env = Environment.cpu(matmul_stand_in=True)
    counts = run("matmul", env, report, label="matmul (stand-in kernel)", matmul_stand_in=cpu_matmul)
    assert counts.reached("kernel") > 0, f"no case ran on the matmul kernel: {dict(counts.counts)}"
    assert counts.counts["kernel+backward"] > 0, f"no gradient ran on the kernel: {dict(counts.counts)}"


def test_matmul_validation(report):
    run("matmul_validation", Environment.cpu(), report)


def test_matmul_fake_tensors(cpu_matmul, report):
    counts = run("matmul_fake", Environment.cpu(matmul_stand_in=True), report)
    assert counts.reached("fake kernel") > 0, dict(counts.counts)


def test_matmul_compile(cpu_matmul, report):
    run("matmul_compile", Environment.cpu(matmul_stand_in=True), report)


# ---- Based and FFT conv ----------------------------------------------------------------------------

@pytest.mark.parametrize("prop", ["based", "based_step", "fftconv"])
def test_based_fftconv_fallback(prop, report):
    counts = run(prop, Environment.cpu(), report, label=f"{prop} (PyTorch)",
                 examples=PROFILE.examples_for(prop) // 2)
    only_fallback(counts)


@pytest.mark.parametrize("prop", ["based", "based_step", "fftconv"])
def test_based_fftconv_kernel_stand_ins(prop, monkeypatch, report):
    family = "fftconv" if prop == "fftconv" else "based"
    with standins.kernel_stand_ins(monkeypatch, family) as stand_in:
        counts = run(prop, standins.environment(family), report, label=f"{prop} (stand-in kernels)",
                     op_stand_in=stand_in)
    kernels = ("sm90", "sm80") if prop == "based" else ("kernel",)  # Based: each family forced
    for kernel in kernels:
        assert counts.reached(kernel) > 0, f"no case ran on the {prop} {kernel} kernel: {dict(counts.counts)}"
    assert counts.reached("fallback") > 0, f"no case ran on the {prop} fallback: {dict(counts.counts)}"
    if prop != "based_step":
        assert sum(counts.counts[f"{kernel}+backward"] for kernel in kernels) > 0, \
            f"no gradient ran on the kernels: {dict(counts.counts)}"
        assert stand_in.backward_calls, "the kernel path's gradients never reached a backward op"
