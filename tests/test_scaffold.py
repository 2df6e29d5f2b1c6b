"""The shared op scaffold (thunderkittens/_scaffold.py) on a made-up op with two kernel families:
the family table's arch requirements, the kernel choice (auto, forced, not built), the Plan's
one-line form, strict mode and the operand rule. The real ops' tests check the same code through
tk.attention and tk.matmul; these pin the contract a new op builds on."""

from dataclasses import dataclass

import pytest
import torch

import thunderkittens as tk
from conftest import pretend_gpu
from thunderkittens import _config, _extension, _scaffold

HOPPER = _scaffold.KernelFamily(op="demo", name="sm90", description="sm90 demo", op_name="demo_sm90",
                                min_capability=(9, 0), exact_capability=(9, 0),
                                backward_op_name="demo_bwd_sm90")
AMPERE = _scaffold.KernelFamily(op="demo", name="sm80", description="sm80 demo", op_name="demo_sm80",
                                min_capability=(8, 0))


@pytest.fixture
def demo(monkeypatch):
    """The demo op registered (both families, a use_kernel switch), built for 80 and 90a, with
    the CPU standing in for an sm_90 GPU."""
    monkeypatch.setattr(_scaffold, "_FAMILIES", {})
    monkeypatch.setattr(_scaffold, "_BY_NAME", {})
    monkeypatch.setitem(_config.KNOWN_KERNELS, "demo", ("sm90", "sm80"))
    monkeypatch.setitem(_config._kernel_stack, "demo", [])
    monkeypatch.setattr(_extension, "BUILT_OPS", frozenset({"demo"}))
    monkeypatch.setattr(_extension, "_TARGETS", ((8, 0, "", False), (9, 0, "a", False)))
    _scaffold.register_families(HOPPER, AMPERE)
    pretend_gpu(monkeypatch, (9, 0))
    yield
    torch._dynamo.reset()


def test_unavailable_reasons():
    assert HOPPER.unavailable_reason((8, 9)) == "the sm90 kernels need an sm_90 GPU, this one is sm_89"
    assert AMPERE.unavailable_reason((7, 5)) == "the sm80 kernels need sm_80 or newer, this GPU is sm_75"
    assert AMPERE.has_backward is False and HOPPER.has_backward is True
    special = _scaffold.KernelFamily(op="demo", name="sm90", description="", op_name="demo",
                                     min_capability=(9, 0), exact_capability=(9, 0),
                                     wrong_gpu_reason="not on {gpu}")
    assert special.unavailable_reason((10, 0)) == "not on sm_100"


def test_unavailable_reasons_follow_the_build(monkeypatch):
    monkeypatch.setattr(_extension, "_TARGETS", ((8, 0, "", False), (9, 0, "", True)))  # 80, 90+PTX
    assert HOPPER.unavailable_reason((9, 0)).startswith("this build has no sm_90a code (built for ")
    assert "TK_CUDA_ARCHS=90a" in HOPPER.unavailable_reason((9, 0))
    assert AMPERE.unavailable_reason((8, 6)) is None  # sm_80 code runs on sm_86
    monkeypatch.setattr(_extension, "_TARGETS", ((9, 0, "a", False),))
    assert "this build has no code for sm_86" in AMPERE.unavailable_reason((8, 6))


def test_register_families_checks_the_switch(monkeypatch):
    monkeypatch.setitem(_config.KNOWN_KERNELS, "demo", ("sm90", "sm80", "sm100"))
    with pytest.raises(AssertionError, match="KNOWN_KERNELS"):
        _scaffold.register_families(HOPPER, AMPERE)


def test_choose_family(demo):
    device = torch.device("cpu")
    assert _scaffold.choose_family("demo", device) == (HOPPER, None)
    with tk.use_kernel("sm80", op="demo"):
        assert _scaffold.choose_family("demo", device) == (AMPERE, None)
        assert _scaffold.forced_prefix(AMPERE) == "kernel sm80 was forced but "
    assert _scaffold.forced_prefix(AMPERE) == ""


def test_choose_family_reasons(demo, monkeypatch):
    device = torch.device("cpu")
    pretend_gpu(monkeypatch, (8, 6))
    assert _scaffold.choose_family("demo", device) == (AMPERE, None)
    with tk.use_kernel("sm90", op="demo"):
        assert _scaffold.choose_family("demo", device) == (
            None, "kernel sm90 was forced but the sm90 kernels need an sm_90 GPU, this one is sm_86")
    pretend_gpu(monkeypatch, (7, 0))
    assert _scaffold.choose_family("demo", device) == (
        None, "the sm90 kernels need an sm_90 GPU, this one is sm_70; "
              "the sm80 kernels need sm_80 or newer, this GPU is sm_70")
    monkeypatch.setattr(_extension, "BUILT_OPS", frozenset({"attention"}))
    assert _scaffold.choose_family("demo", device) == (
        None, "the demo op family was not compiled into this build (families built: attention); "
              "rebuild with TK_OPS unset")


def test_unsupported_input_reason(demo):
    assert _scaffold.unsupported_input_reason("demo", torch.ones(2, dtype=torch.bfloat16)) is None
    assert _scaffold.unsupported_input_reason("demo", torch.ones(2)) == \
        "dtype torch.float32 is not supported by the kernel (bfloat16 and float16 only)"
    meta = torch.ones(2, dtype=torch.bfloat16, device="meta")
    assert _scaffold.unsupported_input_reason("demo", meta) == \
        "inputs are on meta; the kernels need a CUDA GPU"  # "kernels": demo has two families


@dataclass(frozen=True, kw_only=True)
class DemoPlan(_scaffold.Plan):
    function = "tk.demo"
    fallback = "torch.demo"

    length: int

    def details(self):
        return [f"n={self.length}"]


def test_plan_is_one_line():
    kernel = DemoPlan(uses_kernel=True, reason=None, kernel="sm90", kernel_description="sm90 demo",
                      op="tk.demo_sm90", dtype=torch.float16, copies=("x",), strict=False, length=7)
    assert str(kernel) == "kernel tk.demo_sm90 [sm90 demo] fp16 n=7 (copies x with .contiguous())"
    fallback = DemoPlan(uses_kernel=False, reason="why not", kernel=None, kernel_description=None,
                        op=None, dtype=torch.float32, strict=True, length=7)
    assert str(fallback) == "fallback torch.demo: why not (strict mode: tk.demo raises FallbackError)"


def test_fallback_or_raise():
    _scaffold.fallback_or_raise(DemoPlan, "why not")  # not strict: returns
    with tk.strict(), pytest.raises(tk.FallbackError,
                                    match="^tk.demo would fall back to torch.demo: why not$"):
        _scaffold.fallback_or_raise(DemoPlan, "why not")


def strided(shape, strides, offset=0):
    extent = offset + 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))
    return torch.as_strided(torch.randn(extent + 64, dtype=torch.bfloat16), shape, strides, offset)


@pytest.mark.parametrize("shape, strides, offset, expected", [
    ((4, 9, 64), (576, 64, 1), 0, True),       # contiguous
    ((4, 9, 64), (720, 72, 1), 0, True),       # rows padded to 72 = 9 * 8
    ((4, 9, 64), (603, 67, 1), 0, False),      # row stride 67
    ((4, 64, 16), (1024, 1, 64), 0, False),    # last dim not contiguous
    ((4, 9, 64), (576, 64, 1), 3, False),      # misaligned data pointer
    ((1, 1, 64), (5, 3, 1), 0, True),          # strides of size-1 dims do not matter
    ((2, 3, 4, 64), (768, 256, 64, 1), 0, True),  # any rank
])
def test_conforms_and_operand(shape, strides, offset, expected):
    t = strided(shape, strides, offset)
    assert _scaffold.conforms(t) is expected
    given = _scaffold.operand(t)
    assert (given is t) is expected
    assert _scaffold.conforms(given) and torch.equal(given, t)


@pytest.mark.parametrize("shape, strides, offset, dtype, expected", [
    ((4, 9, 64), (576, 64, 1), 0, torch.bfloat16, False),    # conforms
    ((4, 9, 64), (576, 64, 1), 3, torch.bfloat16, True),     # misaligned start
    ((4, 9, 64), (603, 67, 1), 0, torch.bfloat16, True),     # row stride 67: a copy fixes it
    ((4, 64, 16), (1024, 1, 64), 0, torch.bfloat16, True),   # last dim not contiguous
    ((4, 9, 36), (360, 40, 1), 0, torch.bfloat16, False),    # rows of 40: fine
    ((4, 9, 36), (333, 37, 1), 0, torch.bfloat16, False),    # rows of 37, but a copy's are 36
    ((4, 9, 36), (324, 36, 1), 2, torch.bfloat16, True),     # ... a misaligned start is copied
    ((4, 9, 64), (576, 64, 1), 2, torch.float32, True),      # float32: 8 bytes off
    ((4, 9, 64), (576, 64, 1), 4, torch.float32, False),     # float32: 16 bytes off
    ((4, 9, 64), (612, 68, 1), 0, torch.float32, False),     # float32 rows of 68: 272 bytes
])
def test_peer_needs_copy(monkeypatch, shape, strides, offset, dtype, expected):
    extent = offset + 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))
    t = torch.as_strided(torch.randn(extent + 64, dtype=dtype), shape, strides, offset)
    assert not _scaffold.peer_needs_copy(t)  # the CPU is not the kernels' device
    monkeypatch.setattr(_scaffold, "KERNEL_DEVICE_TYPE", "cpu")
    assert _scaffold.peer_needs_copy(t) is expected
    if expected:
        assert not _scaffold.peer_needs_copy(_scaffold.fresh_copy(t))
