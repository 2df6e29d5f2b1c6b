"""tk.based and tk.based_step cases: what the strategies draw, the float64 reference, PyTorch's
yardstick, and the checks of one case.

The reference is thunderkittens/_based/reference.py's quadratic form in float64 on the same
inputs (an algorithm apart from the chunked fallback), gradients by float64 autograd. The
yardstick is the rule of the fixed tests (tests/test_based_kernel_gpu.py,
test_based_backward_gpu.py): PyTorch computing the same math in the inputs' dtype (scores,
polynomial and products in bf16/fp16 with fp32 accumulation inside matmuls; the final state from
phi(k) built in the inputs' dtype, accumulated in fp32), and its autograd for the gradients. For
tk.based_step the yardstick is its PyTorch path (test_based_step_gpu.py). tolerance.py's rule
holds ours to twice the yardstick's error.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

import thunderkittens as tk
from thunderkittens._based import reference
from thunderkittens._based import step as step_module

from .environment import Environment, PathCounts, run_on_stream, runs_on
from .notes import note
from .tolerance import assert_close, gradient_floor, untouched

KERNEL_VALUE_DIMS = (64, 128)
FEATURES = 16
EDGE_LENGTHS = (1, 2, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 2047)
# Operand layouts: contiguous, (B, N, H, D) memory viewed as (B, H, N, D) (read in place), a
# start 3 elements off (copied on the kernel path), a strided last dim (copied).
LAYOUTS = ("contiguous", "bnhd", "offset", "strided_dim")


def family_runs(env: Environment, family: str) -> bool:
    """Whether the sm_80 family ``family`` (based, fftconv) runs here: a GPU (or the stand-ins'
    pretended one) of sm_80 or newer and a build with the family and code for it."""
    return (env.kernel_device and env.capability is not None and env.capability >= (8, 0)
            and family in env.built_ops
            and runs_on(env.built_archs, env.capability, arch_specific=False))


def based_family(env: Environment, kernel: str) -> str | None:
    """The Based kernel family that use_kernel(kernel, "based") runs here, or None (fallback):
    sm90 (wgmma) on an sm_90 GPU with sm_90a code, sm80 (mma.sync) on any GPU of sm_80 or newer;
    auto takes the first of them that runs."""
    if not family_runs(env, "based"):
        return None
    hopper = runs_on(env.built_archs, env.capability, arch_specific=True) and env.capability == (9, 0)
    runnable = (["sm90"] if hopper else []) + ["sm80"]
    if kernel == "auto":
        return runnable[0]
    return kernel if kernel in runnable else None


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class BasedCase:
    batch: int
    heads: int
    length: int
    features: int
    value_dim: int
    dtype: torch.dtype
    normalize: bool
    scale: float | None
    initial_state: bool
    final_state: bool
    grad: tuple             # (q, k, v, initial_state) require grad
    layout: tuple           # (q, k, v) operand layouts
    seed: int = 0
    kernel: str = "auto"    # use_kernel(kernel, "based"): "auto", "sm90", "sm80"

    @property
    def needs_grad(self) -> bool:
        return any(self.grad[:3]) or (self.initial_state and self.grad[3])

    def call_text(self) -> str:
        shape = (self.batch, self.heads, self.length)
        return (f"with tk.use_kernel({self.kernel!r}, 'based'): "
                f"tk.based(q{shape + (self.features,)}, k, v{shape + (self.value_dim,)}, "
                f"scale={self.scale}, normalize={self.normalize}, initial_state="
                f"{'<state>' if self.initial_state else None}, output_final_state={self.final_state}) "
                f"{_dtype_name(self.dtype)}, layout {self.layout}, grad {self.grad}, seed {self.seed}")


@dataclass(frozen=True)
class StepCase:
    batch: int
    heads: int
    tokens: int
    features: int
    value_dim: int
    dtype: torch.dtype
    state_dtype: torch.dtype
    normalize: bool
    scale: float | None
    inplace: bool
    state_layout: str       # "contiguous" or "padded" (a view of a wider tensor: copied)
    layout: tuple           # (q, k, v) operand layouts
    seed: int = 0

    def call_text(self) -> str:
        shape = (self.batch, self.heads, self.tokens)
        return (f"tk.based_step(q{shape + (self.features,)}, k, v{shape + (self.value_dim,)}, "
                f"state [{_dtype_name(self.state_dtype)}, {self.state_layout}], scale={self.scale}, "
                f"normalize={self.normalize}, inplace={self.inplace}) {_dtype_name(self.dtype)}, "
                f"layout {self.layout}, seed {self.seed}")


# ---- strategies --------------------------------------------------------------------------------

def _length(max_len: int):
    return st.integers(1, max_len) | st.sampled_from([n for n in EDGE_LENGTHS if n <= max_len] or [1])


def _scale(draw):
    kind = draw(st.sampled_from(["none", "none", "fixed", "any"]))
    if kind == "fixed":
        return draw(st.sampled_from([0.25, 0.125, 0.5, 1.0]))
    return draw(st.floats(0.02, 1.0)) if kind == "any" else None


def _dims(draw, for_kernel: bool):
    if for_kernel:
        return (draw(st.sampled_from([torch.bfloat16, torch.float16])), FEATURES,
                draw(st.sampled_from(KERNEL_VALUE_DIMS)))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    features = draw(st.sampled_from([FEATURES, FEATURES, 8, 4]))
    return dtype, features, draw(st.sampled_from(KERNEL_VALUE_DIMS + (32, 80, 16)))


@st.composite
def based_cases(draw, profile, env: Environment):
    dtype, features, value_dim = _dims(draw, draw(st.sampled_from([True, True, False])))
    sizes = profile.large if draw(st.integers(0, 99)) >= 100 - profile.large_percent else profile.small
    # The float64 quadratic reference costs B * H * N^2 * Dv.
    length = draw(_length(max(1, min(sizes.max_len, math.isqrt(sizes.attention_work // value_dim)))))
    bh_budget = max(1, sizes.attention_work // (length * length * value_dim))
    batch = draw(st.integers(1, max(1, min(3, bh_budget))))
    heads = draw(st.integers(1, max(1, min(4, bh_budget // batch))))
    initial_state = draw(st.booleans())
    grad = (False,) * 4
    if draw(st.sampled_from([False, True])):
        grad = draw(st.sampled_from([(True, True, True, True), (True, False, False, False),
                                     (False, True, True, False), (False, False, True, True),
                                     (False, False, False, True)]))
    layout = tuple(draw(st.sampled_from(["contiguous", "contiguous", "bnhd", "bnhd", "offset",
                                         "strided_dim"])) for _ in range(3))
    return BasedCase(batch=batch, heads=heads, length=length, features=features,
                     value_dim=value_dim, dtype=dtype, normalize=draw(st.booleans()),
                     scale=_scale(draw), initial_state=initial_state,
                     final_state=draw(st.booleans()), grad=grad, layout=layout,
                     seed=draw(st.integers(0, 2**31 - 1)),
                     kernel=draw(st.sampled_from(["auto", "auto", "sm90", "sm80"])))


@st.composite
def step_cases(draw, profile, env: Environment):
    dtype, features, value_dim = _dims(draw, draw(st.sampled_from([True, True, False])))
    state_dtype = draw(st.sampled_from([torch.float32] * 4 + [torch.float64, torch.bfloat16]))
    return StepCase(batch=draw(st.integers(1, 3)), heads=draw(st.integers(1, 4)),
                    tokens=draw(st.sampled_from([1, 1, 2, 3, 4, 5, 9])), features=features,
                    value_dim=value_dim, dtype=dtype, state_dtype=state_dtype,
                    normalize=draw(st.booleans()), scale=_scale(draw), inplace=draw(st.booleans()),
                    state_layout=draw(st.sampled_from(["contiguous", "contiguous", "padded"])),
                    layout=tuple(draw(st.sampled_from(["contiguous", "bnhd", "offset", "strided_dim"]))
                                 for _ in range(3)),
                    seed=draw(st.integers(0, 2**31 - 1)))


def coverage_cases() -> list[BasedCase]:
    """Cases every run of the property includes: the kernel (both value dims and dtypes,
    normalize, both states, odd lengths around the 64-row chunk, (B, N, H, D) views, copies),
    its gradients (q, k, v and the initial state, through o and the final state), and the
    fallback (fp32, feature dim 8, value dim 80)."""
    base = BasedCase(batch=2, heads=3, length=70, features=FEATURES, value_dim=64,
                     dtype=torch.bfloat16, normalize=False, scale=None, initial_state=False,
                     final_state=False, grad=(False,) * 4, layout=("contiguous",) * 3, seed=1)
    replace = dataclasses.replace
    return [
        base,
        replace(base, value_dim=128, dtype=torch.float16, normalize=True, length=1,
                layout=("bnhd", "bnhd", "bnhd"), seed=2),
        replace(base, initial_state=True, final_state=True, length=65, scale=0.4,
                layout=("offset", "contiguous", "strided_dim"), seed=3),
        replace(base, grad=(True, True, True, True), initial_state=True, final_state=True, seed=4),
        replace(base, grad=(True, True, True, False), normalize=True, value_dim=128, length=129,
                layout=("bnhd", "contiguous", "bnhd"), seed=5),
        replace(base, kernel="sm80", normalize=True, initial_state=True, final_state=True,
                grad=(True, True, True, True), seed=7),
        replace(base, kernel="sm90", value_dim=128, length=130, initial_state=True, final_state=True,
                seed=8),
        replace(base, dtype=torch.float32, features=8, value_dim=80, normalize=True,
                initial_state=True, final_state=True, grad=(True, True, True, True), length=33, seed=6),
    ]


def step_coverage_cases() -> list[StepCase]:
    """The step kernel in place and not, both value dims and dtypes, several tokens, a copied
    state; and the PyTorch path (a float64 state, feature dim 8)."""
    base = StepCase(batch=2, heads=3, tokens=1, features=FEATURES, value_dim=64, dtype=torch.bfloat16,
                    state_dtype=torch.float32, normalize=False, scale=None, inplace=True,
                    state_layout="contiguous", layout=("contiguous",) * 3, seed=1)
    replace = dataclasses.replace
    return [base,
            replace(base, tokens=5, inplace=False, value_dim=128, dtype=torch.float16, normalize=True,
                    layout=("bnhd", "offset", "strided_dim"), seed=2),
            replace(base, tokens=3, state_layout="padded", normalize=True, seed=3),
            replace(base, state_dtype=torch.float64, features=8, value_dim=32, seed=4)]


# ---- inputs ------------------------------------------------------------------------------------

def operand(layout: str, shape: tuple):
    """(base shape, view of a base) for a (B, H, N, D) operand in ``layout``."""
    b, h, n, d = shape
    if layout == "bnhd":
        return (b, n, h, d), lambda t: t.transpose(1, 2)
    if layout == "offset":
        size = b * h * n * d
        return (size + 3,), lambda t: t[3:3 + size].view(shape)
    if layout == "strided_dim":
        return shape + (2,), lambda t: t[..., 0]
    return shape, lambda t: t


def make_operands(layout, shapes, dtype, grads, device, gen):
    made = [operand(kind, shape) for kind, shape in zip(layout, shapes)]
    bases = [torch.randn(base_shape, generator=gen, device=device).to(dtype).requires_grad_(flag)
             for (base_shape, _), flag in zip(made, grads)]
    return bases, lambda ts: [view(t) for (_, view), t in zip(made, ts)]


def prefix_state(batch, heads, features, value_dim, scale, device, gen, length=40):
    """A state as a prefix of ``length`` tokens leaves it (its normaliser positive), float64."""
    k = torch.randn(batch, heads, length, features, generator=gen, device=device, dtype=torch.float64)
    v = torch.randn(batch, heads, length, value_dim, generator=gen, device=device, dtype=torch.float64)
    return reference.feature_map(k, scale).transpose(-1, -2) @ torch.cat([v, torch.ones_like(v[..., :1])], -1)


def _scale_of(case) -> float:
    return case.features ** -0.5 if case.scale is None else case.scale


def _compute_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- PyTorch's yardstick -------------------------------------------------------------------------

def in_dtype(q, k, v, scale, normalize, eps, state):
    """(o, final state): the quadratic form computed in q's dtype (the state cast to it), and the
    final state from phi(k) built in q's dtype, accumulated in float32 (float64 for float64)."""
    s = (q @ k.transpose(-1, -2)) * scale
    p = (1 + s + s * s / 2).tril()
    out, denominator = p @ v, p.sum(-1)
    if state is not None:
        phi_q = reference.feature_map(q, scale)
        s0 = state.to(q.dtype)
        out = out + phi_q @ s0[..., :-1]
        denominator = denominator + (phi_q @ s0[..., -1:])[..., 0]
    if normalize:
        out = out / (denominator + eps)[..., None]
    wide = _compute_dtype(q.dtype)
    final = reference.feature_map(k, scale).to(wide).transpose(-1, -2) @ torch.cat(
        [v.to(wide), torch.ones_like(v[..., :1], dtype=wide)], -1)
    if state is not None:
        final = final + state
    return out, final


# ---- one case: tk.based --------------------------------------------------------------------------

def expected_path(case: BasedCase, env: Environment) -> str:
    """The kernel family or "fallback" by the documented contract (the GPU's shared memory for
    the backward kernels aside: check_case trusts explain's reason for that)."""
    family = based_family(env, case.kernel)
    if (family is not None and case.dtype in (torch.bfloat16, torch.float16)
            and case.features == FEATURES and case.value_dim in KERNEL_VALUE_DIMS):
        return family
    return "fallback"


def _losses(out, final, grad_out, grad_final):
    loss = (out.to(grad_out.dtype) * grad_out).sum()
    if grad_final is not None:
        loss = loss + (final.to(grad_final.dtype) * grad_final).sum()
    return loss


def check_case(case: BasedCase, env: Environment, counts: PathCounts, *, stand_in=None) -> None:
    """tk.based on the case: the path (explain against the contract, strict mode, the stand-in's
    calls on the CPU), the output, the final state and the gradients of q, k, v and the initial
    state against the float64 reference within PyTorch's error."""
    device = env.device()
    note(case.call_text())
    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed)
    scale = _scale_of(case)
    shape = (case.batch, case.heads, case.length)
    bases, make = make_operands(case.layout, [shape + (case.features,)] * 2 + [shape + (case.value_dim,)],
                                case.dtype, case.grad[:3], device, gen)
    state = None
    if case.initial_state:
        state = prefix_state(case.batch, case.heads, case.features, case.value_dim, scale, device, gen)
        state = state.to(_compute_dtype(case.dtype)).requires_grad_(case.grad[3])
    grad_out = torch.randn(shape + (case.value_dim,), generator=gen, device=device).to(case.dtype)
    grad_final = None
    if case.final_state:
        grad_final = torch.randn(case.batch, case.heads, reference.state_features(case.features),
                                 case.value_dim + 1, generator=gen, device=device,
                                 dtype=_compute_dtype(case.dtype)) / 10
    q, k, v = make(bases)
    kwargs = dict(scale=case.scale, normalize=case.normalize, initial_state=state,
                  output_final_state=case.final_state)

    with tk.use_kernel(case.kernel, "based"):
        plan = tk.explain_based(q, k, v, **kwargs)
    note(f"tk.explain_based: {plan}")
    path = plan.kernel if plan.uses_kernel else "fallback"
    expected = expected_path(case, env)
    if not (expected != "fallback" and not plan.uses_kernel and case.needs_grad
            and "shared memory" in (plan.reason or "")):
        assert path == expected, f"path {path} ({plan}), but the contract says {expected}"
    counts.add(path + ("+backward" if case.needs_grad else ""))

    def run():
        calls_before = len(stand_in.calls) if stand_in is not None else 0
        with tk.strict():
            if plan.uses_kernel:
                result = tk.based(q, k, v, **kwargs)
            else:
                try:
                    tk.based(q, k, v, **kwargs)
                except tk.FallbackError:
                    pass
                else:
                    raise AssertionError("strict mode did not raise FallbackError on a fallback")
        if not plan.uses_kernel:
            result = tk.based(q, k, v, **kwargs)
        if stand_in is not None:
            made = len(stand_in.calls) - calls_before
            assert made == (1 if plan.uses_kernel else 0), \
                f"the kernel ran {made} times but tk.explain_based said {plan}"
        out, final = result if case.final_state else (result, None)
        if case.needs_grad:
            _losses(out, final, grad_out, grad_final).backward()
        return out, final

    def run_forced():
        with tk.use_kernel(case.kernel, "based"):
            return run()

    out, final = run_on_stream("default", device, run_forced)
    assert out.shape == shape + (case.value_dim,) and out.dtype == case.dtype and out.device == device, \
        (out.shape, out.dtype, out.device)
    if case.final_state:
        assert final.dtype == _compute_dtype(case.dtype), final.dtype

    leaves = bases + ([state] if state is not None else [])
    wanted = [t for t in leaves if t.requires_grad]

    def evaluate(ts, compute):
        qkv = make(ts[:3])
        s0 = ts[3] if state is not None else None
        if compute == "reference":
            o, f = reference.quadratic(*qkv, scale, case.normalize, 1e-6, s0)
        else:
            o, f = in_dtype(*qkv, scale, case.normalize, 1e-6, s0)
        return o, f

    ref64 = [t.detach().double().requires_grad_(t.requires_grad) for t in leaves]
    ref_out, ref_final = evaluate(ref64, "reference")
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
    their_out, their_final = evaluate(copies, "in_dtype")
    if wanted:
        _losses(ref_out, ref_final if case.final_state else None, grad_out.double(),
                None if grad_final is None else grad_final.double()).backward()
        _losses(their_out, their_final if case.final_state else None,
                grad_out.to(_compute_dtype(case.dtype)), grad_final).backward()

    assert_close("output", out.detach(), ref_out.detach(), their_out.detach(), case.dtype)
    if case.final_state:
        # Each element sums a product over every row, as a key's gradient in attention does:
        # float32 noise grows as the square root of the rows (gradient_floor).
        assert_close("final state", final.detach(), ref_final.detach(), their_final.detach(),
                     final.dtype, floor=gradient_floor(case.length))
    names = ("q", "k", "v", "initial_state")
    zeros = untouched(bases, make) + ([None] if state is not None else [])
    for name, leaf, leaf64, copy, zero in zip(names, leaves, ref64, copies, zeros):
        if leaf.requires_grad:
            assert leaf.grad is not None, f"no gradient reached {name}"
            assert_close(f"gradient of {name}", leaf.grad, leaf64.grad, copy.grad, leaf.dtype, zero)


# ---- one case: tk.based_step ----------------------------------------------------------------------

def expected_step_path(case: StepCase, env: Environment) -> str:
    if (family_runs(env, "based") and case.dtype in (torch.bfloat16, torch.float16)
            and case.features == FEATURES and case.value_dim in KERNEL_VALUE_DIMS
            and case.state_dtype == torch.float32):
        return "kernel"
    return "fallback"


def check_step(case: StepCase, env: Environment, counts: PathCounts, *, stand_in=None) -> None:
    """tk.based_step on a random state and tokens: the path (explain, strict mode, which op the
    stand-ins saw), in place or not (the state given is updated, or left alone), the output and
    the new state against the float64 step within its PyTorch path's error."""
    device = env.device()
    note(case.call_text())
    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed)
    scale = _scale_of(case)
    shape = (case.batch, case.heads, case.tokens)
    bases, make = make_operands(case.layout, [shape + (case.features,)] * 2 + [shape + (case.value_dim,)],
                                case.dtype, (False,) * 3, device, gen)
    q, k, v = make(bases)
    state64 = prefix_state(case.batch, case.heads, case.features, case.value_dim, scale, device, gen)
    wide = None
    if case.state_layout == "padded":
        wide = torch.full(state64.shape[:-1] + (state64.shape[-1] + 7,), math.nan,
                          dtype=case.state_dtype, device=device)
        state = wide[..., :state64.shape[-1]]
        state.copy_(state64)
    else:
        state = state64.to(case.state_dtype)
    before = state.clone()
    kwargs = dict(scale=case.scale, normalize=case.normalize, inplace=case.inplace)

    plan = tk.explain_based_step(q, k, v, state, **kwargs)
    note(f"tk.explain_based_step: {plan}")
    path = "kernel" if plan.uses_kernel else "fallback"
    expected = expected_step_path(case, env)
    assert path == expected, f"path {path} ({plan}), but the contract says {expected}"
    if plan.uses_kernel:
        op = ("based_step_inplace_sm80" if case.inplace and case.state_layout == "contiguous"
              else "based_step_sm80")
        assert plan.op == f"tk.{op}", str(plan)
        assert plan.copies == (("state",) if case.state_layout == "padded" else ()), str(plan)
    counts.add(path)

    calls_before = len(stand_in.calls) if stand_in is not None else 0
    with tk.strict():
        if plan.uses_kernel:
            out, new_state = tk.based_step(q, k, v, state, **kwargs)
        else:
            try:
                tk.based_step(q, k, v, state, **kwargs)
            except tk.FallbackError:
                pass
            else:
                raise AssertionError("strict mode did not raise FallbackError on a fallback")
    if not plan.uses_kernel:
        out, new_state = tk.based_step(q, k, v, state, **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if stand_in is not None:
        made = [call[0] for call in stand_in.calls[calls_before:]]
        assert made == ([plan.op.removeprefix("tk.")] if plan.uses_kernel else []), (made, str(plan))

    if case.inplace:
        assert new_state is state, "inplace=True must return the state it was given"
    else:
        assert new_state is not state and torch.equal(state, before), \
            "inplace=False changed the state it was given"
    assert new_state.dtype == case.state_dtype and new_state.shape == state.shape
    if wide is not None:
        assert torch.isnan(wide[..., state.shape[-1]:]).all(), "the step wrote past the state's view"
    assert out.shape == shape + (case.value_dim,) and out.dtype == case.dtype, (out.shape, out.dtype)

    ref_out, ref_state = reference.chunked(q.double(), k.double(), v.double(), scale, case.normalize,
                                           1e-6, before.double())
    their_out, their_state = step_module.reference_step(q, k, v, before.clone(), scale, case.normalize,
                                                        1e-6, False)
    assert_close("output", out, ref_out, their_out, case.dtype)
    assert_close("new state", new_state, ref_state, their_state, case.state_dtype)
