"""tk.fftconv's decision cache (thunderkittens/_fftconv/calls.py) on the CPU: a call of a layout
seen before skips the checks and plan.decide, and everything the decision depends on misses the
cache: shapes, dtypes, devices, the gates given, the kernel choice and the process-wide facts.
A stale hit would be a silent wrong answer (the wrong kernel length, a kernel too large for the
GPU), so each change is checked against a fresh decision."""

import pytest
import torch

import thunderkittens as tk
from thunderkittens._fftconv import calls, plan

from conftest import counting_decisions
from test_fftconv_cpu import by_definition, conforming, cpu_fftconv, make  # noqa: F401 (a fixture)

DECIDE = plan.decide  # uncounted (the ``decides`` fixture counts the cache's calls of it)


@pytest.fixture
def decides(monkeypatch):
    """Counts plan.decide's calls (the cache's misses) from here on, on an empty cache."""
    yield counting_decisions(monkeypatch, calls, plan)
    calls.clear()


def assert_fresh(call, u, k, pre=None, post=None):
    """``call`` is what deciding these arguments afresh gives."""
    assert call == calls._decide(u, k, pre, post)
    assert call.family == DECIDE(u, k, pre, post)[0]


def test_a_layer_loop_decides_once(cpu_fftconv, decides):
    """Layer after layer, step after step: one decision, and every call reaches the op with the
    caller's own u."""
    k = torch.randn(3, 64)
    for _step in range(3):
        u, _, _, _ = make(b=2, h=3, n=1000, dtype=torch.bfloat16, seed=_step)
        for _layer in range(4):
            y = tk.fftconv(u, k)
            assert cpu_fftconv.calls[-1]["u"].data_ptr() == u.data_ptr() and y.shape == u.shape
    assert decides["n"] == 1 and len(cpu_fftconv.calls) == 12


def test_a_parameter_filter_decides_once(cpu_fftconv, decides):
    """A module's filter parameter, in inference and in training."""
    u, k, _, _ = make(b=2, h=3, n=1000, dtype=torch.bfloat16)
    k = torch.nn.Parameter(k.float())
    with torch.no_grad():
        ys = [tk.fftconv(u, k) for _ in range(3)]
    y = tk.fftconv(u, k)
    y.backward(torch.randn_like(y))
    assert decides["n"] == 1 and k.grad is not None and all(torch.equal(y.detach(), other) for other in ys)


def test_the_module_decides_once_and_keeps_its_spectrum(cpu_fftconv, decides):
    module = tk.FFTConv(1000)
    u, k, pre, post = make(b=2, h=3, n=1000, dtype=torch.bfloat16, gates=True)
    outputs = [module(u, k, pre, post) for _ in range(3)]
    assert decides["n"] == 1
    spectra = [call["k_spectrum"] for call in cpu_fftconv.calls]
    assert len(spectra) == 3 and all(s is spectra[0] for s in spectra)
    assert all(torch.equal(y, outputs[0]) for y in outputs)
    torch.testing.assert_close(outputs[0], tk.fftconv(u, k, pre, post))


# Each change of what the decision depends on, made to the base call (u (2, 3, 1000) bf16, k
# (3, 64) fp32, no gates). The cache must miss and give what a fresh decision gives.
CHANGES = {
    "batch": lambda u, k, pre, post: (u[:1], k, None, None),
    "heads": lambda u, k, pre, post: (u[:, :2], k[:2], None, None),
    "length, another kernel": lambda u, k, pre, post: (torch.cat([u, u], -1), k, None, None),
    "length, another padding": lambda u, k, pre, post: (u[..., :997], k, None, None),
    "length, blocks": lambda u, k, pre, post: (u[..., :1].expand(2, 3, 16400), k, None, None),
    "dtype of u": lambda u, k, pre, post: (u.half(), k, None, None),
    "u float32 (torch.fft)": lambda u, k, pre, post: (u.float(), k, None, None),
    "filter length": lambda u, k, pre, post: (u, k[:, :7], None, None),
    "filter dtype": lambda u, k, pre, post: (u, k.bfloat16(), None, None),
    "pregate": lambda u, k, pre, post: (u, k, pre, None),
    "postgate": lambda u, k, pre, post: (u, k, None, post),
    "both gates": lambda u, k, pre, post: (u, k, pre, post),
}


@pytest.mark.parametrize("change", CHANGES)
def test_every_change_misses_the_cache(cpu_fftconv, decides, change):
    u, k, pre, post = make(b=2, h=3, n=1000, dtype=torch.bfloat16, gates=True)
    k = k[:, :64].float()
    base = calls.prepare(u, k, None, None)
    assert calls.prepare(u, k, None, None) is base and decides["n"] == 1
    args = CHANGES[change](u, k, pre, post)
    changed = calls.prepare(*args)
    assert decides["n"] == 2
    assert_fresh(changed, *args)
    y = tk.fftconv(*args)
    expected = by_definition(*args)
    torch.testing.assert_close(y.double(), expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


def test_the_kernel_choice_misses_the_cache(cpu_fftconv, decides, monkeypatch):
    u, k, _, _ = make(b=2, h=3, n=2048, dtype=torch.bfloat16)
    assert calls.prepare(u, k, None, None).family is plan.SM80
    with tk.use_kernel("sm90", op="fftconv"):
        assert calls.prepare(u, k, None, None).family is plan.SM90
        tk.fftconv(u, k)
    assert cpu_fftconv.calls[-1]["op"] == "fftconv_fwd_sm90"
    monkeypatch.setenv("TK_FFTCONV_KERNEL", "sm90")
    assert calls.prepare(u, k, None, None).family is plan.SM90
    monkeypatch.setenv("TK_FFTCONV_KERNEL", "bogus")
    with pytest.raises(ValueError, match="TK_FFTCONV_KERNEL"):
        tk.fftconv(u, k)
    monkeypatch.delenv("TK_FFTCONV_KERNEL")
    assert calls.prepare(u, k, None, None).family is plan.SM80
    # auto, the forced block (whose key the variable's sm90 shares), the variable's invalid value
    assert decides["n"] == 3


def test_the_gpus_shared_memory_empties_the_cache(cpu_fftconv, decides, monkeypatch):
    """A GPU whose blocks hold less shared memory runs N = 4096 on blocks of a shorter kernel: a
    decision kept from the larger GPU would launch a kernel that does not fit."""
    u, k, _, _ = make(b=1, h=2, n=4096, dtype=torch.bfloat16)
    assert calls.prepare(u, k, None, None).lengths is None
    available = 64 * 1024
    monkeypatch.setattr(plan, "_shared_memory_optin", torch.compiler.assume_constant_result(lambda index: available))
    call = calls.prepare(u, k, None, None)
    assert call.lengths is not None and call.fft_size < 8192
    assert_fresh(call, u, k)


def test_strides_are_read_on_every_call(cpu_fftconv, decides):
    """Strides are not in the key: a view of the cached shape that the kernels cannot read in
    place is copied (and one they can is read in place), call by call."""
    u, k, _, _ = make(b=2, h=3, n=1000, dtype=torch.bfloat16)
    wide = torch.randn(2, 3, 1004, dtype=torch.bfloat16)[..., :1000]  # rows 2008 bytes apart
    assert not conforming(wide)
    for x in (u, wide, u):
        tk.fftconv(x, k)
        seen = cpu_fftconv.calls[-1]["u"]
        assert conforming(seen) and (seen.data_ptr() == x.data_ptr()) == conforming(x)
        assert torch.equal(seen, x)
    assert decides["n"] == 1


@pytest.mark.parametrize("change", ["k heads", "k on meta", "gate dtype", "gate shape", "u integer", "k length"])
def test_bad_calls_of_a_cached_layout_still_raise(cpu_fftconv, decides, change):
    u, k, pre, _ = make(b=2, h=3, n=1000, dtype=torch.bfloat16, gates=True)
    tk.fftconv(u, k, pre)
    args = {"k heads": (u, k[:2], pre), "k on meta": (u, k.to("meta"), pre), "gate dtype": (u, k, pre.half()),
            "gate shape": (u, k, pre[:1]), "u integer": (u.short(), k, None),
            "k length": (u, torch.cat([k, k], -1), pre)}[change]
    with pytest.raises((ValueError, TypeError)):
        tk.fftconv(*args)
    with pytest.raises((ValueError, TypeError)):
        tk.fftconv(*args)  # and again: a failed check is never kept


def test_strict_mode_is_read_on_every_call(decides):
    """A kept torch.fft decision still raises in strict mode (CPU tensors: the fallback)."""
    u, k, _, _ = make(dtype=torch.float32)
    tk.fftconv(u, k)
    with tk.strict(), pytest.raises(tk.FallbackError, match="tk.fftconv would fall back to torch.fft"):
        tk.fftconv(u, k)
    assert decides["n"] == 1


def test_calls_that_are_not_plain_tensors_are_decided_afresh(cpu_fftconv, decides):
    u, k, _, _ = make(b=2, h=3, n=64, dtype=torch.bfloat16)
    assert calls.cache_key(u, k, None, None) is not None
    assert calls.cache_key(u, torch.nn.Parameter(k), None, torch.nn.Parameter(u)) is not None
    assert calls.cache_key(u, k, "gate", None) is None
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        assert calls.cache_key(mode.from_tensor(u), mode.from_tensor(k), None, None) is None


def test_compiled_calls_are_traced_not_cached(cpu_fftconv, decides):
    u, k, _, _ = make(b=2, h=3, n=64, dtype=torch.bfloat16)

    @torch.compile(fullgraph=True, backend="eager")
    def conv(u, k):
        return tk.fftconv(u, k)

    y = conv(u, k)
    assert len(calls._cache) == 0
    torch.testing.assert_close(y, tk.fftconv(u, k))


def test_the_cache_is_bounded(cpu_fftconv, decides, monkeypatch):
    monkeypatch.setattr(calls._cache, "max_entries", 4)
    for n in range(8, 80, 8):
        u, k, _, _ = make(b=1, h=2, n=n, dtype=torch.bfloat16)
        calls.prepare(u, k, None, None)
        assert len(calls._cache) <= 4
