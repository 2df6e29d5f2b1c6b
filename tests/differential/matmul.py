"""tk.matmul cases: what the strategies draw, the float64 reference, torch.matmul's yardstick, and
the checks of one case."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

import thunderkittens as tk

from . import layouts
from .environment import Environment, PathCounts, run_on_stream
from .notes import note
from .tolerance import assert_close, untouched

EDGE_SIZES = (1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 1000, 1023, 1024, 2047)


@dataclass(frozen=True)
class MatmulCase:
    a_shape: tuple
    b_shape: tuple
    dtype: torch.dtype
    a_layout: str
    b_layout: str
    grad: tuple             # (a, b) require grad
    stream: str = "default"
    device_index: int = 0
    seed: int = 0

    @property
    def needs_grad(self) -> bool:
        return any(self.grad)

    @property
    def out_shape(self) -> tuple:
        a = torch.empty(self.a_shape, device="meta")
        b = torch.empty(self.b_shape, device="meta")
        return tuple(torch.matmul(a, b).shape)

    def call_text(self) -> str:
        return (f"tk.matmul(a{self.a_shape} [{self.a_layout}], b{self.b_shape} [{self.b_layout}]) "
                f"{str(self.dtype).removeprefix('torch.')}, grad {self.grad}, stream {self.stream}, "
                f"device {self.device_index}")


def _size(limit: int):
    limit = max(1, limit)
    return st.integers(1, limit) | st.sampled_from([n for n in EDGE_SIZES if n <= limit] or [1])


def _operand_layout(draw, rank: int) -> str:
    if rank == 1:
        kind = draw(st.sampled_from(layouts.VECTOR_LAYOUTS))
    else:
        kind = draw(st.sampled_from(["contiguous"] * 3 + ["transposed"] * 3
                                    + list(layouts.MATMUL_LAYOUTS[2:])))
    if "offset" in kind:
        kind = f"{kind}:{draw(st.integers(1, layouts.PAD))}"
    return kind


@st.composite
def matmul_cases(draw, profile, env: Environment):
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.bfloat16, torch.float16,
                                  torch.float32]))
    a_rank = draw(st.sampled_from([2, 3, 2, 3, 4, 1]))
    b_rank = draw(st.sampled_from([2, 3, 2, 3, 4, 1]))
    template = tuple(draw(st.integers(1, 4)) for _ in range(max(a_rank, b_rank, 2) - 2))

    def batch_of(rank):
        dims = template[len(template) - max(0, rank - 2):] if rank > 2 else ()
        return tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in dims)

    a_batch, b_batch = batch_of(a_rank), batch_of(b_rank)
    batch = math.prod(template) if template else 1
    # A few cases large, the others small; a draw that shrinks towards a small case.
    sizes = profile.large if draw(st.integers(0, 99)) >= 100 - profile.large_percent else profile.small
    budget = max(1, sizes.matmul_work // batch)
    k = draw(_size(min(sizes.max_matrix, budget)))
    m = draw(_size(min(sizes.max_matrix, budget // k))) if a_rank > 1 else 1
    n = draw(_size(min(sizes.max_matrix, budget // (k * m)))) if b_rank > 1 else 1
    a_shape = a_batch + (m, k) if a_rank > 1 else (k,)
    b_shape = b_batch + (k, n) if b_rank > 1 else (k,)
    a_layout, b_layout = _operand_layout(draw, a_rank), _operand_layout(draw, b_rank)
    # Half the cases with gradients; listed first, so that hypothesis's simplest cases (which
    # are also the most kernel-friendly) have them too.
    grad = draw(st.sampled_from([(True, True), (False, False), (True, False), (False, False),
                                 (False, True), (False, False)]))
    stream = draw(st.sampled_from(["default", "side"])) if env.side_streams else "default"
    device_index = draw(st.integers(0, min(env.device_count, 2) - 1)) if env.device_count > 1 else 0
    seed = draw(st.integers(0, 2**31 - 1))
    return MatmulCase(a_shape=a_shape, b_shape=b_shape, dtype=dtype, a_layout=a_layout,
                      b_layout=b_layout, grad=grad, stream=stream, device_index=device_index,
                      seed=seed)


def coverage_cases() -> list[MatmulCase]:
    """Cases every run of the property includes (besides the random ones), so that each shard
    reaches the kernel, forward and backward, wherever the GPU runs it."""
    base = MatmulCase(a_shape=(64, 96), b_shape=(96, 40), dtype=torch.bfloat16,
                      a_layout="contiguous", b_layout="transposed", grad=(True, True), seed=1)
    return [base, dataclasses.replace(base, a_shape=(2, 64, 32), b_shape=(32, 48),
                                      dtype=torch.float16, grad=(False, False), seed=2)]


def expected_path(case: MatmulCase, env: Environment) -> str | None:
    """"kernel" or "fallback" where the documented contract decides it alone, else None (the
    operand layout and batch rules decide; tk.explain_matmul is then trusted)."""
    if not env.matmul_kernel_runs() or case.dtype not in (torch.bfloat16, torch.float16):
        return "fallback"
    if len(case.a_shape) == 1 or len(case.b_shape) == 1:
        return "fallback"
    simple = ("contiguous", "transposed")
    m, k = case.a_shape[-2:]
    n = case.b_shape[-1]
    a_batch, b_batch = case.a_shape[:-2], case.b_shape[:-2]
    batches_fit = (a_batch == b_batch or math.prod(a_batch) == 1 or math.prod(b_batch) == 1)
    if (len(case.a_shape) <= 3 and len(case.b_shape) <= 3 and case.a_layout in simple
            and case.b_layout in simple and batches_fit and m % 8 == 0 and n % 8 == 0 and k % 8 == 0):
        return "kernel"
    return None


def make_inputs(case: MatmulCase, device):
    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed)
    (a_base, a_view), (b_base, b_view) = (layouts.matrix_operand(case.a_layout, case.a_shape),
                                          layouts.matrix_operand(case.b_layout, case.b_shape))
    bases = [torch.randn(s, generator=gen, device=device, dtype=case.dtype) for s in (a_base, b_base)]
    for base, flag in zip(bases, case.grad):
        base.requires_grad_(flag)
    grad_out = (torch.randn(case.out_shape, generator=gen, device=device, dtype=case.dtype)
                if case.needs_grad else None)
    return bases, lambda ts: [a_view(ts[0]), b_view(ts[1])], grad_out


def _storage(t):
    return t.untyped_storage().data_ptr()


def check_case(case: MatmulCase, env: Environment, counts: PathCounts, *, call=None,
               stand_in=None) -> None:
    """tk.matmul on the case: path (tk.explain_matmul against the contract, the stand-in's
    calls on the CPU), strict mode, output and gradients against the float64 reference within
    torch.matmul's error."""
    device = env.device(case.device_index)
    note(case.call_text())
    bases, make, grad_out = make_inputs(case, device)
    a, b = make(bases)
    plan = tk.explain_matmul(a, b)
    note(f"tk.explain_matmul: {plan}")
    path = "kernel" if plan.uses_kernel else "fallback"
    expected = expected_path(case, env)
    if expected is not None:
        assert path == expected, f"path {path} ({plan}), but the contract says {expected}"
    counts.add(path + ("+backward" if case.needs_grad else ""))

    compiled = call is not None
    call = call or tk.matmul

    def run():
        if device.type == "cuda":  # any element the op forgets to write reads as NaN
            poison = torch.full(case.out_shape, math.nan, dtype=case.dtype, device=device)
            del poison
        calls_before = len(stand_in.calls) if stand_in is not None else 0
        if compiled:
            out = call(a, b)
        else:
            with tk.strict():
                if plan.uses_kernel:
                    out = call(a, b)
                else:
                    try:
                        call(a, b)
                    except tk.FallbackError:
                        pass
                    else:
                        raise AssertionError("strict mode did not raise FallbackError on a fallback")
            if not plan.uses_kernel:
                out = call(a, b)
            if stand_in is not None:
                made = len(stand_in.calls) - calls_before
                assert made == (1 if plan.uses_kernel else 0), \
                    f"the kernel ran {made} times but tk.explain_matmul said {plan}"
        if grad_out is not None:
            out.backward(grad_out)
        return out

    out = run_on_stream(case.stream, device, run)

    assert tuple(out.shape) == case.out_shape, f"output shape {tuple(out.shape)}, expected {case.out_shape}"
    assert out.dtype == case.dtype and out.device == device, (out.dtype, out.device)
    assert _storage(out) not in {_storage(t) for t in bases}, "the output aliases an input"
    assert out.is_contiguous(), f"output not contiguous (documented): strides {out.stride()}"

    bases64 = [t.detach().double().requires_grad_(t.requires_grad) for t in bases]
    ref = torch.matmul(*make(bases64))
    if grad_out is not None:
        ref.backward(grad_out.double())
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in bases]
    theirs = torch.matmul(*(t.contiguous() for t in make(copies)))
    if grad_out is not None:
        theirs.backward(grad_out)

    assert_close("output", out.detach(), ref.detach(), theirs.detach(), case.dtype)
    for name, base, base64, copy, zero in zip(("a", "b"), bases, bases64, copies, untouched(bases, make)):
        if base.requires_grad:
            assert base.grad is not None, f"no gradient reached {name}"
            assert_close(f"gradient of {name}", base.grad, base64.grad, copy.grad, case.dtype, zero)


def check_fake(case: MatmulCase, env: Environment, counts: PathCounts) -> None:
    """Under FakeTensorMode tk.matmul gives the real call's shape, dtype, device (and, on the
    kernel path, strides), and gradients of the operands' shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    device = env.device(case.device_index)
    bases, make, grad_out = make_inputs(case, device)
    plan = tk.explain_matmul(*make(bases))
    real = tk.matmul(*make(bases))
    counts.add(("fake " + ("kernel" if plan.uses_kernel else "fallback"))
               + ("+backward" if case.needs_grad else ""))
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in bases]
        fake = tk.matmul(*make(fakes))
        if case.needs_grad:
            fake.backward(mode.from_tensor(grad_out))
    assert fake.shape == real.shape and fake.dtype == real.dtype and fake.device == real.device, \
        (fake.shape, fake.dtype, fake.device, real.shape, real.dtype, real.device)
    if plan.uses_kernel:
        assert fake.stride() == real.stride(), (fake.stride(), real.stride())
    for base, fake_base in zip(bases, fakes):
        if base.requires_grad:
            assert fake_base.grad is not None and fake_base.grad.shape == base.shape


def compiled_matmul():
    torch._dynamo.reset()
    return torch.compile(lambda a, b: tk.matmul(a, b), backend="aot_eager", fullgraph=True)
