"""Shared test setup: GPU tests skip cleanly without CUDA, and the tk environment switches are
cleared so the caller's shell cannot change what the tests see.

TK_TEST_PRETEND_ARCHS (e.g. "80", or "80,89"): the tests see a build for those CUDA targets
instead of this one's (tk.BUILT_ARCHS and the path choice), so a CPU machine can check that the
CPU suite passes whatever targets a user built for (test_build_targets_cpu.py does).
"""

import os

import pytest
import torch

TK_ENV_VARS = ("TK_STRICT", "TK_ATTENTION_KERNEL", "TK_BASED_KERNEL", "TK_FFTCONV_KERNEL")


def pytest_configure(config):
    archs = os.environ.get("TK_TEST_PRETEND_ARCHS", "")
    if archs:
        import thunderkittens
        from thunderkittens import _extension
        names = tuple(name for name in archs.split(",") if name)
        _extension.BUILT_ARCHS = thunderkittens.BUILT_ARCHS = names
        _extension._TARGETS = tuple(_extension._parse_target(name) for name in names)
        try:
            from thunderkittens import _build_info
            _build_info.CUDA_ARCHS = names
        except ImportError:
            pass


def pytest_report_header(config):
    archs = os.environ.get("TK_TEST_PRETEND_ARCHS", "")
    return f"TK_TEST_PRETEND_ARCHS={archs}: the tests see a build for these targets" if archs else None


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def clean_tk_environment(monkeypatch):
    for name in TK_ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def pretend_gpu(monkeypatch, capability):
    """Make every op's path choice take the CPU for a GPU of ``capability`` (a trace-time
    constant, like the real device query, so torch.compile tests trace the same code)."""
    from thunderkittens import _scaffold
    monkeypatch.setattr(_scaffold, "KERNEL_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(_scaffold, "device_capability",
                        torch.compiler.assume_constant_result(lambda index: capability))


class AttentionStandIn:
    """A CPU stand-in for the attention kernel, so the CPU suite can exercise the kernel path.

    Registered as the CPU implementation of tk::attention_fwd_sm80 and tk::attention_fwd_sm90
    (the two kernel families' ops), ``.training`` as that of tk::attention_fwd_sm90_train, with
    ``.backward`` (AttentionBackwardStandIn) as that of
    tk::attention_bwd_sm90, while the ``cpu_kernel`` fixture is active, with the path choice
    told that the CPU is an sm_90 GPU and the build has sm_90a code and the attention family,
    whatever this build's targets (so ``auto`` picks sm90; ``use_kernel("sm80")`` sm80).
    Everything else is the real code: argument checks, path choice, operand preparation, the op schema, the fake
    implementation and torch.compile tracing. Calls are recorded so tests can check what the
    kernel would have been given (layouts, head counts, copies, the causal flags).
    """

    def __init__(self, monkeypatch):
        self.calls = []
        self.decode_calls = []
        self._monkeypatch = monkeypatch

    def set_capability(self, capability):
        pretend_gpu(self._monkeypatch, capability)

    def __call__(self, q, k, v, is_causal, scale, lower_right=False):
        # lower_right may be left out: the dispatcher drops arguments equal to their default.
        from reference import causal_offset_of, reference_attention
        check_causal_flags("tk::attention_fwd_sm80", is_causal, lower_right)
        self.calls.append({"q": q, "k": k, "v": v, "is_causal": is_causal, "scale": scale,
                           "lower_right": lower_right})
        out, lse = reference_attention(q, k, v, is_causal, scale,
                                       causal_offset=causal_offset_of(q, k, lower_right))
        return out.to(q.dtype), lse.float()

    def training(self, q, k, v, is_causal, scale, lower_right=False):
        """tk::attention_fwd_sm90_train: also out's rounding residual (exact - out)."""
        from reference import causal_offset_of, reference_attention
        out, lse = self(q, k, v, is_causal, scale, lower_right)
        self.calls[-1]["training"] = True
        exact = reference_attention(q, k, v, is_causal, scale,
                                    causal_offset=causal_offset_of(q, k, lower_right))[0]
        return out, lse, (exact - out.double()).to(q.dtype)

    def decode(self, q, k, v, is_causal, scale, lower_right=False):
        """tk::attention_fwd_decode: the same contract; its calls also go to .decode_calls."""
        result = self(q, k, v, is_causal, scale, lower_right)
        self.decode_calls.append(self.calls[-1])
        return result


class AttentionBackwardStandIn:
    """A CPU stand-in for tk::attention_bwd_sm90 (see AttentionStandIn): the float64 reference
    gradients (reference_attention_grads, dk/dv summed over each GQA group), returned contiguous
    in the inputs' dtype as the C++ op does. It
    enforces the op's layout contract on what it is given (what the kernel reads in place) and
    records each call."""

    def __init__(self):
        self.calls = []

    def __call__(self, grad_out, q, k, v, out, lse, is_causal, scale, lower_right=False,
                 deterministic=False, out_residual=None):
        from reference import causal_offset_of, reference_attention_grads
        check_causal_flags("tk::attention_bwd_sm90", is_causal, lower_right)
        for name, t in (("grad_out", grad_out), ("q", q), ("k", k), ("v", v), ("out", out)):
            assert t.dim() == 4 and t.dtype == q.dtype, (name, t.shape, t.dtype)
            if not kernel_readable(t):
                raise RuntimeError(f"tk::attention_bwd_sm90 stand-in: {name} not readable by the "
                                   f"kernel: shape {tuple(t.shape)} strides {t.stride()}")
        assert grad_out.shape == q.shape and out.shape == q.shape, (grad_out.shape, q.shape)
        assert lse.dtype == torch.float32 and lse.shape == q.shape[:3], (lse.dtype, lse.shape)
        assert out_residual is None or (out_residual.shape == q.shape and out_residual.dtype == q.dtype
                                        and out_residual.is_contiguous()), out_residual
        self.calls.append({"grad_out": grad_out, "q": q, "k": k, "v": v, "out": out, "lse": lse,
                           "is_causal": is_causal, "scale": scale, "lower_right": lower_right,
                           "deterministic": deterministic, "out_residual": out_residual})
        grads = reference_attention_grads(grad_out, q, k, v, is_causal, scale,
                                          causal_offset=causal_offset_of(q, k, lower_right))
        return tuple(g.to(q.dtype).contiguous() for g in grads)


def check_causal_flags(op, is_causal, lower_right):
    """The C++ ops' rule: lower_right only together with is_causal."""
    if lower_right and not is_causal:
        raise RuntimeError(f"{op}: lower_right=True needs is_causal=True")


def kernel_readable(t):
    """The attention ops' operand rule (csrc/attention/attention_ops.cpp check_layout): last
    dim contiguous, other strides of non-size-1 dims multiples of 8 elements, 16-byte aligned."""
    if t.stride(3) != 1 or t.data_ptr() % 16 != 0:
        return False
    return all(t.shape[dim] == 1 or t.stride(dim) % 8 == 0 for dim in range(3))


@pytest.fixture
def deterministic():
    """Turns torch's deterministic mode on for the test: deterministic(warn_only=...)."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()

    def turn_on(warn_only=False):
        torch.use_deterministic_algorithms(True, warn_only=warn_only)

    yield turn_on
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def pretend_sm90_build(monkeypatch, op):
    """Make the path choice see a build with sm_90a code and the ``op`` family, whatever this
    build's targets (an A100 user's TK_CUDA_ARCHS=80 build runs the CPU suite too)."""
    from thunderkittens import _extension
    monkeypatch.setattr(_extension, "BUILT_OPS", _extension.BUILT_OPS | {op})
    if not _extension.has_arch_specific_code_for((9, 0)):
        monkeypatch.setattr(_extension, "_TARGETS", _extension._TARGETS + ((9, 0, "a", False),))


def counting_decisions(monkeypatch, calls, plan):
    """Empties an op's decision cache (its ``calls`` module) and counts its ``plan.decide``'s
    calls (the cache's misses) from here on; returns the counter, {"n": count}."""
    calls.clear()
    counter = {"n": 0}
    real = plan.decide

    def counting(*args):
        counter["n"] += 1
        return real(*args)
    monkeypatch.setattr(plan, "decide", counting)
    return counter


@pytest.fixture
def cpu_kernel(monkeypatch):
    standin = AttentionStandIn(monkeypatch)
    standin.backward = AttentionBackwardStandIn()
    library = torch.library.Library("tk", "IMPL")
    library.impl("attention_fwd_sm80", standin, "CPU")
    library.impl("attention_fwd_sm90", standin, "CPU")
    library.impl("attention_fwd_decode", standin.decode, "CPU")
    library.impl("attention_fwd_sm90_train", standin.training, "CPU")
    library.impl("attention_bwd_sm90", standin.backward, "CPU")
    pretend_sm90_build(monkeypatch, "attention")
    standin.set_capability((9, 0))
    try:
        yield standin
    finally:
        library._destroy()
        torch._dynamo.reset()


class MatmulStandIn:
    """A CPU stand-in for the tk::matmul kernel, as AttentionStandIn is for attention.

    Registered as the CPU implementation of tk::matmul while the ``cpu_matmul`` fixture is
    active, with the path choice told that the CPU is an sm_90 GPU and the build has the matmul
    family and sm_90a code. It enforces the op's contract (3-D operands, batches equal or 1,
    TMA-readable layouts) and records each call's operands, so tests can check the views,
    layouts and copies the kernel would get.
    """

    def __init__(self, monkeypatch):
        self.calls = []
        self._monkeypatch = monkeypatch

    def set_capability(self, capability):
        pretend_gpu(self._monkeypatch, capability)

    def __call__(self, a, b):
        from reference import tma_layout
        assert a.dim() == 3 and b.dim() == 3, (a.shape, b.shape)
        assert a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16)
        assert a.shape[2] == b.shape[1] and min(a.shape + b.shape) >= 1
        batch = max(a.shape[0], b.shape[0])
        assert a.shape[0] in (1, batch) and b.shape[0] in (1, batch)
        layouts = tma_layout(a), tma_layout(b)
        if None in layouts:
            raise RuntimeError(f"tk::matmul stand-in: operand not TMA-readable: a {a.shape} "
                               f"{a.stride()}, b {b.shape} {b.stride()}")
        self.calls.append({"a": a, "b": b, "layouts": layouts})
        return torch.matmul(a.double(), b.double()).to(a.dtype)


@pytest.fixture
def cpu_matmul(monkeypatch):
    standin = MatmulStandIn(monkeypatch)
    library = torch.library.Library("tk", "IMPL")
    library.impl("matmul", standin, "CPU")
    pretend_sm90_build(monkeypatch, "matmul")
    standin.set_capability((9, 0))
    try:
        yield standin
    finally:
        library._destroy()
        torch._dynamo.reset()


@pytest.fixture(scope="session")
def case_worker():
    """The test worker's case server (tests/differential/worker.py): GPU jobs that may fault or
    hang run there, a new server after each one that ended the last."""
    from differential.worker import Worker
    worker = Worker()
    yield worker
    worker.close()


# ---- lines for the end of the test output ------------------------------------------------------
# A test adds a line with record_property("tk_summary", {...}) (a dict: JSON-able); the reports
# carry it to the pytest process that prints the summary (also from pytest-xdist's workers).

_SUMMARIES = []


def pytest_runtest_logreport(report):
    if report.when == "call":
        _SUMMARIES.extend(value for name, value in report.user_properties if name == "tk_summary")


def _summary_lines():
    """Differential shards added up per property; other entries as their "line"."""
    lines, properties = [], {}
    for entry in _SUMMARIES:
        if entry.get("kind") != "differential":
            lines.append(entry["line"])
            continue
        key = (entry["property"], entry["profile"])
        total = properties.setdefault(key, {"counts": {}, "shards": set(), "failed": 0,
                                            "seed": entry["base_seed"], "of": entry["shards"]})
        for path, n in entry["counts"].items():
            total["counts"][path] = total["counts"].get(path, 0) + n
        total["shards"].add(entry["shard"])
        total["failed"] += 0 if entry["ok"] else 1
    differential = []
    for (prop, profile), total in sorted(properties.items()):
        cases = sum(total["counts"].values())
        paths = ", ".join(f"{path} {n}" for path, n in sorted(total["counts"].items()))
        shards = (f", {len(total['shards'])} of {total['of']} shards" if total["of"] > 1 else "")
        failed = f", {total['failed']} FAILED" if total["failed"] else ""
        differential.append(f"differential {prop} [profile {profile}, seed {total['seed']}"
                            f"{shards}{failed}]: {cases} cases" + (f": {paths}" if paths else ""))
    return differential + lines


def pytest_terminal_summary(terminalreporter):
    if _SUMMARIES:
        terminalreporter.section("cases run (tk_summary)")
        for line in _summary_lines():
            terminalreporter.write_line(line)
    _tolerance_summary(terminalreporter)


def _tolerance_summary(terminalreporter):
    """With TK_TOLERANCE_LOG (tests/differential/tolerance.py): the worst margins, per quantity."""
    import json
    path = os.environ.get("TK_TOLERANCE_LOG")
    if not path or not os.path.exists(path):
        return
    worst = {}
    with open(path) as log:
        for line in log:
            entry = json.loads(line)
            key = (entry["what"].split(" of ")[0], entry.get("dtype"))
            ratio = entry["err"] / entry["bound"] if entry["bound"] else 0.0
            if entry.get("rel_bound"):
                ratio = max(ratio, entry["rel"] / entry["rel_bound"])
            if key not in worst or ratio > worst[key][0]:
                worst[key] = (ratio, entry)
    terminalreporter.section("tolerance margins (error / bound, worst per quantity)")
    for (what, dtype), (ratio, entry) in sorted(worst.items(), key=lambda item: -item[1][0]):
        terminalreporter.write_line(
            f"{ratio:6.3f}  {what} {dtype or ''}: max abs {entry['err']:.3e} (bound "
            f"{entry['bound']:.3e}), rel L2 {entry['rel'] or 0:.3e} (bound "
            f"{entry['rel_bound'] or 0:.3e})  {entry['test']}")
