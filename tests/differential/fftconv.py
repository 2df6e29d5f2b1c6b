"""tk.fftconv (and tk.FFTConv in inference) cases: what the strategies draw, the float64
reference, PyTorch's yardstick, and the checks of one case.

The reference is the causal convolution by torch.fft in float64 on the same inputs (gates
multiplied exactly), gradients by float64 autograd. Tolerances:

  * the fallback (torch.fft in float32, float64 for float64, rounded to u's dtype: the documented
    computation) is held by tolerance.py's rule to twice the error of PyTorch's own torch.fft in
    float32 rounded to u's dtype (the yardstick), gradients to twice its autograd's;
  * the kernels (bf16/fp16 u) are held to the rule the fixed tests document
    (tests/test_fftconv_gpu.py, test_fftconv_kernel_gpu.py), with eps = 2^-8 (bf16) or 2^-11
    (fp16): y relative L2 error <= 2 eps and max error <= 4 eps * max|ref|; the gradients of u
    and the gates 4 eps and 8 eps; the filter's 3 eps and 4 eps. The kernels multiply 16-bit
    DFT matrices and round four intermediates (their model puts y at 0.8 .. 1.3 eps of relative
    L2 error), where one rounding of the result, the yardstick's whole error, is 0.42 eps: twice
    the yardstick would ask for less than the kernels' documented design. The relative L2
    bounds average many elements' roundings: on fewer than 64 elements the max bound holds for
    both.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

import thunderkittens as tk
from thunderkittens._fftconv import plan as fftconv_plan

from .based import family_runs
from .environment import Environment, PathCounts, run_on_stream
from .notes import note
from .tolerance import assert_close, assert_nonfinite_match, record, untouched

EDGE_LENGTHS = (1, 2, 7, 8, 9, 255, 256, 257, 1000, 1024, 4095, 4096, 4097, 8191, 8192, 8200,
                12288, 16383, 16384, 16400, 32768, 32800, 65536, 65537)
EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# (relative L2, max relative to max|ref|) in units of eps, from the fixed tests' docstrings.
KERNEL_BOUNDS = {"output": (2.0, 4.0), "gate": (4.0, 8.0), "filter": (3.0, 4.0)}
# The relative L2 bounds are averages of the roundings over many elements; a handful of elements
# (N = 1: y = u k, every rounding on the one value) is held to the max bound instead.
MIN_AVERAGED = 64
# Operand layouts of u and the gates: contiguous, every other head of a wider tensor (read in
# place), a start 3 elements off, (B, N, H) memory viewed as (B, H, N) (both copied).
LAYOUTS = ("contiguous", "heads_strided", "offset", "bnh")
GATES = ("none", "pre", "post", "both")


@dataclass(frozen=True)
class FFTConvCase:
    batch: int
    heads: int
    length: int
    filter_length: int
    dtype: torch.dtype
    filter_dtype: torch.dtype
    gates: str               # none, pre, post, both
    grad: tuple              # (u, k, pregate, postgate) require grad
    layout: str              # of u and the gates
    filter_layout: str       # contiguous or offset
    module: bool = False     # tk.FFTConv(length) (inference: called twice, the cached spectrum)
    seed: int = 0

    @property
    def needs_grad(self) -> bool:
        flags = self.grad[:2] + ((self.grad[2],) if self.gates in ("pre", "both") else ()) \
            + ((self.grad[3],) if self.gates in ("post", "both") else ())
        return any(flags)

    def call_text(self) -> str:
        name = f"tk.FFTConv({self.length})" if self.module else "tk.fftconv"
        return (f"{name}(u{(self.batch, self.heads, self.length)} [{self.layout}], "
                f"k{(self.heads, self.filter_length)} [{str(self.filter_dtype).removeprefix('torch.')}, "
                f"{self.filter_layout}], gates {self.gates}) {str(self.dtype).removeprefix('torch.')}, "
                f"grad {self.grad}, seed {self.seed}")


@st.composite
def fftconv_cases(draw, profile, env: Environment):
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.bfloat16, torch.float16,
                                  torch.float32]))
    sizes = profile.large if draw(st.integers(0, 99)) >= 100 - profile.large_percent else profile.small
    max_len = sizes.max_len * 8
    length = draw(st.integers(1, max_len) | st.sampled_from([n for n in EDGE_LENGTHS if n <= max_len]))
    budget = max(1, sizes.attention_work // (16 * length))
    batch = draw(st.integers(1, max(1, min(3, budget))))
    heads = draw(st.integers(1, max(1, min(6, budget // batch))))
    filter_length = length if draw(st.booleans()) else draw(st.integers(1, length))
    gates = draw(st.sampled_from(GATES))
    grad = (False,) * 4
    if draw(st.booleans()):
        grad = draw(st.sampled_from([(True, True, True, True), (True, False, False, False),
                                     (False, True, False, False), (True, False, True, True),
                                     (False, False, True, True)]))
    module = not any(grad) and draw(st.integers(0, 4)) == 0
    return FFTConvCase(batch=batch, heads=heads, length=length, filter_length=filter_length,
                       dtype=dtype, filter_dtype=draw(st.sampled_from([torch.float32, dtype])),
                       gates=gates, grad=grad,
                       layout=draw(st.sampled_from(["contiguous", "contiguous"] + list(LAYOUTS[1:]))),
                       filter_layout=draw(st.sampled_from(["contiguous", "contiguous", "offset"])),
                       module=module, seed=draw(st.integers(0, 2**31 - 1)))


def coverage_cases() -> list[FFTConvCase]:
    """Cases every run of the property includes: the kernel at an odd length (padded), a short
    filter in u's dtype, every gate, strided and copied views, the module's cached spectrum,
    gradients of u, k and both gates, the longest kernel (N = 16384, with gradients), blocks of it
    (N = 32800: three, N = 65536: four), and torch.fft past the longest (N = 65537) and for
    float32."""
    base = FFTConvCase(batch=2, heads=3, length=300, filter_length=300, dtype=torch.bfloat16,
                       filter_dtype=torch.float32, gates="none", grad=(False,) * 4,
                       layout="contiguous", filter_layout="contiguous", seed=1)
    replace = dataclasses.replace
    return [
        base,
        replace(base, length=77, filter_length=20, dtype=torch.float16, filter_dtype=torch.float16,
                gates="both", layout="heads_strided", filter_layout="offset", seed=2),
        replace(base, gates="pre", layout="bnh", module=True, seed=3),
        replace(base, gates="both", grad=(True, True, True, True), length=129, filter_length=50,
                layout="offset", seed=4),
        replace(base, batch=3, heads=2, length=16384, filter_length=16384, gates="both",
                grad=(True, True, True, True), seed=9),
        replace(base, batch=1, heads=1, length=32800, filter_length=20000, gates="post",
                grad=(True, True, False, True), seed=5),
        replace(base, batch=1, heads=2, length=65536, filter_length=65536, dtype=torch.float16, seed=6),
        replace(base, batch=1, heads=1, length=65537, filter_length=3, seed=7),
        replace(base, dtype=torch.float32, gates="pre", grad=(True, True, True, False), seed=8),
    ]


# ---- inputs ------------------------------------------------------------------------------------

def _view(layout: str, shape: tuple):
    b, h, n = shape
    if layout == "heads_strided":
        return (b, 2 * h, n), lambda t: t[:, ::2]
    if layout == "offset":
        return (b, h, n + 8), lambda t: t[..., 3:3 + n]
    if layout == "bnh":
        return (b, n, h), lambda t: t.transpose(1, 2)
    return shape, lambda t: t


def make_inputs(case: FFTConvCase, device):
    """(bases, make, grad_out): the leaves (u, k, then the gates there are), the view recipe
    (bases -> the call's u, k, pregate, postgate) and the output's gradient."""
    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed)
    shape = (case.batch, case.heads, case.length)
    base_shape, view = _view(case.layout, shape)
    nk = case.filter_length
    k_shape = (case.heads, nk + 5) if case.filter_layout == "offset" else (case.heads, nk)
    k_view = (lambda t: t[:, 2:2 + nk]) if case.filter_layout == "offset" else (lambda t: t)
    decay = torch.exp(-torch.arange(k_shape[1], device=device) / max(1.0, nk / 8))
    u = torch.randn(base_shape, generator=gen, device=device).to(case.dtype).requires_grad_(case.grad[0])
    k = (torch.randn(k_shape, generator=gen, device=device) * decay).to(case.filter_dtype)
    bases = [u, k.requires_grad_(case.grad[1])]
    has_pre, has_post = case.gates in ("pre", "both"), case.gates in ("post", "both")
    for present, flag in ((has_pre, case.grad[2]), (has_post, case.grad[3])):
        if present:
            bases.append(torch.randn(base_shape, generator=gen, device=device).to(case.dtype)
                         .requires_grad_(flag))

    def make(ts):
        made = [view(ts[0]), k_view(ts[1]), None, None]
        rest = iter(ts[2:])
        if has_pre:
            made[2] = view(next(rest))
        if has_post:
            made[3] = view(next(rest))
        return made

    grad_out = torch.randn(shape, generator=gen, device=device).to(case.dtype) if case.needs_grad else None
    return bases, make, grad_out


def base_names(case: FFTConvCase) -> list[str]:
    return ["u", "k"] + (["pregate"] if case.gates in ("pre", "both") else []) \
        + (["postgate"] if case.gates in ("post", "both") else [])


def causal_conv(u, k, pregate, postgate, dtype):
    """The causal convolution by torch.fft of length 2N in ``dtype`` (differentiable)."""
    n = u.shape[-1]
    w = u.to(dtype) if pregate is None else u.to(dtype) * pregate.to(dtype)
    y = torch.fft.irfft(torch.fft.rfft(w, n=2 * n) * torch.fft.rfft(k.to(dtype), n=2 * n), n=2 * n)[..., :n]
    return y if postgate is None else y * postgate.to(dtype)


# ---- checks ------------------------------------------------------------------------------------

def assert_within_eps(what: str, out, ref, dtype, rel_factor: float, max_factor: float) -> None:
    """The kernels' rule (module docstring): relative L2 <= rel_factor eps and max error <=
    max_factor eps * max|ref|, eps of the 16-bit ``dtype``; non-finite exactly where ref is.
    On fewer than MIN_AVERAGED elements the relative L2 bound is max_factor eps too."""
    out64 = out.detach().double()
    assert_nonfinite_match(what, out64, ref)
    eps = EPS[dtype]
    if out64.numel() < MIN_AVERAGED:
        rel_factor = max_factor
    diff = out64 - ref
    ref_norm, ref_max = ref.norm().item(), ref.abs().max().item()
    rel = diff.norm().item() / ref_norm if ref_norm > 0 else diff.norm().item()
    worst = diff.abs().max().item()
    record(what, worst, max_factor * eps * ref_max, rel, rel_factor * eps, dtype)
    assert rel <= rel_factor * eps, f"{what}: relative L2 error {rel:.3e} > {rel_factor:g} eps ({rel_factor * eps:.3e})"
    assert worst <= max_factor * eps * ref_max, \
        f"{what}: max error {worst:.3e} > {max_factor:g} eps * max|ref| ({max_factor * eps * ref_max:.3e})"


def expected_path(case: FFTConvCase, env: Environment) -> str:
    """By the documented contract (the GPU's shared memory aside: check_case trusts explain's
    reason for that)."""
    if (family_runs(env, "fftconv") and case.dtype in EPS and fftconv_plan.KERNEL_LENGTHS
            and case.length <= fftconv_plan.MAX_LENGTH):
        return "kernel"
    return "fallback"


def check_case(case: FFTConvCase, env: Environment, counts: PathCounts, *, stand_in=None) -> None:
    """tk.fftconv (or tk.FFTConv) on the case: the path (explain, strict mode, the stand-in's
    calls on the CPU), the output and the gradients of u, k and the gates against the float64
    reference."""
    device = env.device()
    note(case.call_text())
    bases, make, grad_out = make_inputs(case, device)
    args = make(bases)
    plan = tk.explain_fftconv(*args)
    note(f"tk.explain_fftconv: {plan}")
    path = "kernel" if plan.uses_kernel else "fallback"
    expected = expected_path(case, env)
    if not (expected == "kernel" and not plan.uses_kernel and "shared memory" in (plan.reason or "")):
        assert path == expected, f"path {path} ({plan}), but the contract says {expected}"
    if plan.uses_kernel and case.length > fftconv_plan.KERNEL_LENGTHS[-1]:
        assert plan.blocks == -(-case.length // fftconv_plan.KERNEL_LENGTHS[-1]), str(plan)
    counts.add(path + ("+backward" if case.needs_grad else ""))
    call = tk.FFTConv(case.length) if case.module else tk.fftconv

    def run():
        if device.type == "cuda":  # any element the op forgets to write reads as NaN
            poison = torch.full((case.batch, case.heads, case.length), math.nan, dtype=case.dtype,
                                device=device)
            del poison
        calls_before = len(stand_in.calls) if stand_in is not None else 0
        with tk.strict():
            if plan.uses_kernel:
                out = call(*args)
            else:
                try:
                    call(*args)
                except tk.FallbackError:
                    pass
                else:
                    raise AssertionError("strict mode did not raise FallbackError on a fallback")
        if not plan.uses_kernel:
            out = call(*args)
        if stand_in is not None:
            made = len(stand_in.calls) - calls_before
            assert (made > 0) == plan.uses_kernel, f"the kernel ran {made} times but explain said {plan}"
        if case.module:
            again = call(*args)  # the cached spectrum
            assert torch.equal(again, out), "tk.FFTConv's second call (cached spectrum) differs"
        if grad_out is not None:
            out.backward(grad_out)
        return out

    out = run_on_stream("default", device, run)
    shape = (case.batch, case.heads, case.length)
    assert tuple(out.shape) == shape and out.dtype == case.dtype and out.device == device, \
        (out.shape, out.dtype, out.device)

    bases64 = [t.detach().double().requires_grad_(t.requires_grad) for t in bases]
    ref = causal_conv(*make(bases64), torch.float64)
    if grad_out is not None:
        ref.backward(grad_out.double())
    wide = torch.float64 if case.dtype == torch.float64 else torch.float32
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in bases]
    theirs = causal_conv(*make(copies), wide).to(case.dtype)
    if grad_out is not None:
        theirs.backward(grad_out)

    on_kernel = plan.uses_kernel and case.dtype in EPS
    if on_kernel:
        assert_within_eps("output", out, ref.detach(), case.dtype, *KERNEL_BOUNDS["output"])
    else:
        assert_close("output", out.detach(), ref.detach(), theirs.detach(), case.dtype)
    for name, base, base64, copy, zero in zip(base_names(case), bases, bases64, copies,
                                              untouched(bases, make_views_only(make))):
        if not base.requires_grad:
            continue
        assert base.grad is not None, f"no gradient reached {name}"
        assert base.grad.dtype == base.dtype, (name, base.grad.dtype)
        if on_kernel:
            exact = base.grad.detach().double()
            assert torch.all(exact[zero] == 0), f"gradient of {name}: not 0 outside the view"
            bounds = KERNEL_BOUNDS["filter" if name == "k" else "gate"]
            assert_within_eps(f"gradient of {name}", base.grad[~zero], base64.grad[~zero],
                              case.dtype, *bounds)
        else:
            assert_close(f"gradient of {name}", base.grad, base64.grad, copy.grad, base.dtype, zero)


def make_views_only(make):
    """``make`` without the Nones (tolerance.untouched sums the views it gets)."""
    return lambda ts: [t for t in make(ts) if t is not None]
