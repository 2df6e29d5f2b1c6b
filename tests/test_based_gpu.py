"""tk.based and tk.based_step on a GPU, called as users call them, once per forward family that runs
on the GPU (sm90 on Hopper, picked by ``auto``; sm80, forced there with use_kernel): the kernel
path (explain says ``kernel tk.based_fwd_sm90`` or ``_sm80``, and strict mode turns any fallback
into an error) against a float64
reference for both dtypes, value dims 64 and 128, normalize on and off, odd lengths (1, 17, 63,
1000, 4097), initial and final state, (B, N, H, D) memory read in place as (B, H, N, D), views the
kernel cannot read (copied, and still right), a prefix then based_step token by token equal to
the whole sequence, gradients (the backward kernels) against float64 autograd, torch.compile,
CUDA-graph capture of tk.based and of an in-place based_step, a non-default stream, and fp32
refused in strict mode.

On a GPU of sm_80 or newer with the based family built (for this GPU), a call these tests expect
on the kernel that would not take it FAILS (the explain check, and tk.strict()); the module
skips only without such a GPU or build.

Tolerance (the rule of tests/test_based_kernel_gpu.py, where the kernel's rounding points are
listed). The reference is the float64 quadratic form on the same 16-bit inputs; the yardstick is
PyTorch computing the same math in the input dtype (fp32 accumulation inside matmuls):

    max |o - ref|   <= 2 * max |o_torch - ref| + 1e-6 * max |ref|
    relL2(o, ref)   <= 2 * relL2(o_torch, ref) + 1e-6

The final state (fp32) is held to 2x the relative L2 error of phi(k) built in the input dtype
and accumulated in fp32, plus 1e-6. Gradients (the backward kernels,
tests/test_based_backward_gpu.py) are held to 2x PyTorch's autograd of the same math in the input
dtype, plus the same slack.
"""

import math
import re

import pytest
import torch

import thunderkittens as tk
from thunderkittens import _extension
from gpu_support import (BASED_FEATURES as FEATURES, BASED_SCALE as DEFAULT_SCALE, BASED_STATE_ROWS as STATE_ROWS,
                         assert_within_torch_error, based_batch_heads_for as batch_heads_for, based_in_dtype,
                         based_reference as reference, based_state_from_prefix as state_from_prefix,
                         based_state_in_dtype as state_in_dtype, max_error, rel_l2_error, require_family_gpu,
                         seeded)

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
DTYPE_IDS = ["bf16", "fp16"]
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
VALUE_DIMS = [64, 128]
LENGTHS = [1, 17, 63, 1000, 4097]
ERROR_FACTOR = 2.0
SLACK = 1e-6  # relative to max |ref|: fp32 accumulation noise
STATE_SLACK = 1e-6
KERNEL_TEXT = {"sm90": "kernel tk.based_fwd_sm90 [sm90 wgmma+tma]", "sm80": "kernel tk.based_fwd_sm80 [sm80 mma.sync]"}
# The family the module's tests run on now (the fixture below sets it).
family = {"name": "sm80"}


@pytest.fixture(scope="module", autouse=True, params=["sm90", "sm80"])
def gpu_with_the_based_kernel(request):
    """Every test once per forward family this GPU runs: sm90 (Hopper only, what ``auto`` picks
    there), then sm80 (forced on Hopper)."""
    require_family_gpu("based")
    if request.param == "sm90" and not (torch.cuda.get_device_capability() == (9, 0)
                                        and _extension.has_arch_specific_code_for((9, 0))):
        pytest.skip("the sm90 Based kernel needs an sm_90 GPU and a 90a build")
    on_hopper = torch.cuda.get_device_capability() == (9, 0)
    family["name"] = request.param
    with tk.use_kernel("sm80" if request.param == "sm80" and on_hopper else "auto", op="based"):
        yield request.param


def make_inputs(batch, heads, length, value_dim, dtype, requires_grad=False):
    q, k, v = (torch.randn(batch, heads, length, dim, device="cuda").to(dtype).requires_grad_(requires_grad)
               for dim in (FEATURES, FEATURES, value_dim))
    return q, k, v


# ---- the kernel path -------------------------------------------------------------------------


def kernel_plan_text(dtype, value_dim, normalize=False, initial_state=False, final_state=False, copies=()):
    parts = [KERNEL_TEXT[family["name"]], DTYPE_NAMES[dtype], f"dv={value_dim}"]
    if normalize:
        parts.append("normalized")
    if initial_state:
        parts.append("+ initial state")
    if final_state:
        parts.append("-> final state")
    if copies:
        parts.append(f"(copies {', '.join(copies)} with .contiguous())")
    return " ".join(parts)


def on_kernel(q, k, v, copies=(), **kwargs):
    """tk.based(q, k, v, **kwargs), which must take the kernel: explain says so (with exactly the
    inputs ``copies`` copied), and strict mode makes a fallback an error."""
    plan = tk.explain_based(q, k, v, **kwargs)
    assert plan.uses_kernel, f"tk.based does not take the kernel on this GPU: {plan}"
    assert str(plan) == kernel_plan_text(q.dtype, v.shape[-1], kwargs.get("normalize", False),
                                         kwargs.get("initial_state") is not None,
                                         kwargs.get("output_final_state", False), copies)
    assert plan.copies == tuple(copies), str(plan)
    with tk.strict():
        return tk.based(q, k, v, **kwargs)


# ---- checks ----------------------------------------------------------------------------------


def assert_output_close(out, q, k, v, scale=DEFAULT_SCALE, normalize=False, eps=1e-6, initial_state=None,
                        rows=slice(None)):
    """out (the rows ``rows`` of the sequence) against the float64 reference of the whole call."""
    assert out.dtype == q.dtype, out.dtype
    ref, _ = reference(q, k, v, scale, normalize, eps, initial_state, want_state=False)
    base = based_in_dtype(q, k, v, scale, normalize, eps, initial_state)
    assert_within_torch_error(out, base[..., rows, :], ref[..., rows, :], "output", ERROR_FACTOR, SLACK)


def assert_state_close(state, q, k, v, scale=DEFAULT_SCALE, initial_state=None):
    """The final state against float64, to 2x the relative L2 error of PyTorch's (state_in_dtype)."""
    _, expected = reference(q, k, v, scale, initial_state=initial_state)
    base = state_in_dtype(k, v, scale, initial_state)
    assert state.dtype == torch.float32 and state.shape == expected.shape, (state.dtype, state.shape)
    assert torch.isfinite(state).all(), "non-finite state"
    mine, theirs = rel_l2_error(state, expected), rel_l2_error(base, expected)
    assert mine <= ERROR_FACTOR * theirs + STATE_SLACK, (
        f"state relative L2 error {mine:.3e} > {ERROR_FACTOR} x PyTorch's {theirs:.3e}")


# ---- which path ------------------------------------------------------------------------------


@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_explain_names_the_kernel(dtype, value_dim):
    q, k, v = make_inputs(2, 3, 100, value_dim, dtype)
    expected = kernel_plan_text(dtype, value_dim)
    assert str(tk.explain_based(q, k, v)) == expected
    with tk.use_kernel(family["name"], op="based"):
        assert str(tk.explain_based(q, k, v)) == expected
    # Inputs that require grad but under no_grad (inference) take the kernel too.
    q.requires_grad_()
    with torch.no_grad():
        assert str(tk.explain_based(q, k, v)) == expected


@pytest.mark.parametrize("make, reason", [
    (lambda: make_inputs(1, 2, 40, 64, torch.float32),
     "dtype torch.float32 is not supported by the kernel (bfloat16 and float16 only)"),
    (lambda: (torch.randn(1, 2, 40, 8, device="cuda", dtype=torch.bfloat16),) * 2
     + (torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.bfloat16),),
     "feature dim 8 is not supported by the kernel (16 only)"),
    (lambda: make_inputs(1, 2, 40, 32, torch.float16),
     "value dim 32 is not supported by the kernel (64 or 128 only)"),
], ids=["fp32", "feature-dim-8", "value-dim-32"])
def test_what_the_kernel_does_not_take_goes_to_the_reference(make, reason):
    """fp32 and other dims: the reference path, named by explain, refused in strict mode, right."""
    seeded("fallback", reason)
    q, k, v = make()
    plan = tk.explain_based(q, k, v)
    assert not plan.uses_kernel and str(plan) == f"fallback the PyTorch reference (chunked): {reason}"
    message = f"tk.based would fall back to the PyTorch reference (chunked): {reason}"
    with tk.strict(), pytest.raises(tk.FallbackError, match=re.escape(message)):
        tk.based(q, k, v)
    out, state = tk.based(q, k, v, normalize=True, output_final_state=True)
    assert out.dtype == q.dtype and state.dtype == torch.float32
    scale = q.shape[-1] ** -0.5
    ref, ref_state = reference(q, k, v, scale, normalize=True)
    tol = 1e-5 if q.dtype == torch.float32 else torch.finfo(q.dtype).eps  # the reference path computes in fp32
    assert rel_l2_error(out, ref) <= tol and max_error(out, ref) <= 2 * tol * ref.abs().max().item()
    assert rel_l2_error(state, ref_state) <= 1e-5


# ---- outputs and final state -----------------------------------------------------------------


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_output_and_final_state_match_reference(dtype, value_dim, normalize, length):
    seeded("output", dtype, value_dim, normalize, length)
    batch, heads = batch_heads_for(length)
    q, k, v = make_inputs(batch, heads, length, value_dim, dtype)
    out, state = on_kernel(q, k, v, normalize=normalize, output_final_state=True)
    assert out.shape == v.shape and state.shape == (batch, heads, STATE_ROWS, value_dim + 1)
    assert_output_close(out, q, k, v, normalize=normalize)
    assert_state_close(state, q, k, v)
    alone = on_kernel(q, k, v, normalize=normalize)
    assert isinstance(alone, torch.Tensor) and torch.equal(alone, out)


@pytest.mark.parametrize("scale, eps", [(0.05, 1e-6), (1.0, 1e-3)])
def test_explicit_scale_and_eps(scale, eps):
    seeded("scale", scale)
    q, k, v = make_inputs(2, 2, 300, 64, torch.bfloat16)
    out = on_kernel(q, k, v, scale=scale, normalize=True, eps=eps)
    assert_output_close(out, q, k, v, scale, True, eps)


@pytest.mark.parametrize("length", [17, 1000])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_initial_state_in_and_final_state_out(dtype, value_dim, normalize, length):
    seeded("initial", dtype, value_dim, normalize, length)
    q, k, v = make_inputs(2, 3, length, value_dim, dtype)
    s0 = state_from_prefix(2, 3, value_dim)
    before = s0.clone()
    out, state = on_kernel(q, k, v, normalize=normalize, initial_state=s0, output_final_state=True)
    assert torch.equal(s0, before), "the initial state was modified"
    assert_output_close(out, q, k, v, normalize=normalize, initial_state=s0)
    assert_state_close(state, q, k, v, initial_state=s0)
    alone = on_kernel(q, k, v, normalize=normalize, initial_state=s0)
    assert torch.equal(alone, out)


def test_initial_state_of_another_dtype_or_layout():
    """A float64 or non-contiguous initial state is the same state: the same answer."""
    seeded("initial-layout")
    q, k, v = make_inputs(2, 3, 200, 64, torch.float16)
    s0 = state_from_prefix(2, 3, 64)
    out, state = on_kernel(q, k, v, normalize=True, initial_state=s0, output_final_state=True)
    strided = s0.transpose(0, 1).contiguous().transpose(0, 1)
    assert not strided.is_contiguous()
    for other in (s0.double(), strided):
        again, again_state = on_kernel(q, k, v, normalize=True, initial_state=other, output_final_state=True)
        assert torch.equal(again, out) and torch.equal(again_state, state)


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
def test_prefix_then_rest_from_its_state(normalize):
    """A long document in pieces: each piece starts from the previous one's final state."""
    seeded("pieces", normalize)
    q, k, v = make_inputs(2, 2, 1000, 128, torch.bfloat16)
    outs, state = [], None
    for start, stop in ((0, 63), (63, 64), (64, 500), (500, 1000)):
        piece = slice(start, stop)
        out, state = on_kernel(q[:, :, piece], k[:, :, piece], v[:, :, piece], normalize=normalize,
                               initial_state=state, output_final_state=True)
        outs.append(out)
    assert_output_close(torch.cat(outs, 2), q, k, v, normalize=normalize)
    assert_state_close(state, q, k, v)


# ---- decoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("inplace", [False, True], ids=["new-state", "inplace"])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("dtype, value_dim", [(torch.bfloat16, 64), (torch.float16, 128)],
                         ids=["bf16-dv64", "fp16-dv128"])
def test_prefix_then_based_step_equals_the_whole_sequence(dtype, value_dim, normalize, inplace):
    """tk.based over a prefix, then tk.based_step one token at a time (and a last step of four):
    the outputs and the final state are those of the whole sequence."""
    seeded("step", dtype, value_dim, normalize, inplace)
    prefix, total = 100, 124
    q, k, v = make_inputs(2, 3, total, value_dim, dtype)
    whole, whole_state = on_kernel(q, k, v, normalize=normalize, output_final_state=True)
    head, state = on_kernel(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], normalize=normalize,
                            output_final_state=True)
    outs = [head]
    steps = [(t, t + 1) for t in range(prefix, total - 4)] + [(total - 4, total)]
    for start, stop in steps:
        piece = slice(start, stop)
        before = state.clone()
        out, new_state = tk.based_step(q[:, :, piece], k[:, :, piece], v[:, :, piece], state,
                                       normalize=normalize, inplace=inplace)
        assert out.shape == (2, 3, stop - start, value_dim) and out.dtype == dtype
        assert new_state.dtype == torch.float32 and new_state.shape == state.shape
        if inplace:
            assert new_state is state
        else:
            assert new_state is not state and torch.equal(state, before), "inplace=False changed the state"
        state = new_state
        outs.append(out)
    stepped = torch.cat(outs, 2)
    assert_output_close(stepped[:, :, prefix:], q, k, v, normalize=normalize, rows=slice(prefix, None))
    assert_output_close(stepped, q, k, v, normalize=normalize)
    assert_output_close(whole, q, k, v, normalize=normalize)
    assert_state_close(state, q, k, v)
    assert_state_close(whole_state, q, k, v)


# ---- layouts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bnhd_memory_viewed_as_bhnd_is_read_in_place(dtype, value_dim):
    seeded("bnhd", dtype, value_dim)
    batch, length, heads = 2, 333, 3
    q, k = (torch.randn(batch, length, heads, FEATURES, device="cuda").to(dtype).transpose(1, 2) for _ in range(2))
    v = torch.randn(batch, length, heads, value_dim, device="cuda").to(dtype).transpose(1, 2)
    assert not q.is_contiguous() and not v.is_contiguous()
    out, state = on_kernel(q, k, v, normalize=True, output_final_state=True)  # no copies
    assert_output_close(out, q, k, v, normalize=True)
    assert_state_close(state, q, k, v)
    dense, dense_state = on_kernel(q.contiguous(), k.contiguous(), v.contiguous(), normalize=True,
                                   output_final_state=True)
    assert torch.equal(out, dense) and torch.equal(state, dense_state)


def test_views_the_kernel_cannot_read_are_copied():
    """q 6 bytes off a 16-byte boundary, k with 40-byte rows, v with a strided last dim: each is
    copied (explain names them), and the answer is that of the contiguous inputs."""
    seeded("misaligned")
    shape = (2, 3, 200, FEATURES)
    flat = torch.randn(math.prod(shape) + 3, device="cuda").to(torch.bfloat16)
    q = flat[3:].view(shape)
    assert q.data_ptr() % 16 != 0
    k = torch.randn(2, 3, 200, FEATURES + 4, device="cuda").to(torch.bfloat16)[..., :FEATURES]
    v = torch.randn(2, 3, 200, 128, device="cuda").to(torch.bfloat16)[..., ::2]
    out = on_kernel(q, k, v, copies=("q", "k", "v"), normalize=True)
    assert_output_close(out, q, k, v, normalize=True)
    assert torch.equal(out, on_kernel(q.clone(), k.contiguous(), v.contiguous(), normalize=True))


# ---- gradients (the backward kernels) ---------------------------------------------------------


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gradients_match_float64_autograd(dtype, normalize):
    """Inputs that require grad take the kernel path with the backward kernels (explain says so);
    dq, dk, dv and the initial state's gradient, through the output and the final state, against
    float64 autograd."""
    seeded("grad", dtype, normalize)
    q, k, v = make_inputs(1, 2, 300, 64, dtype, requires_grad=True)
    s0 = state_from_prefix(1, 2, 64).requires_grad_()
    kwargs = {"normalize": normalize, "initial_state": s0, "output_final_state": True}
    plan = tk.explain_based(q, k, v, **kwargs)
    assert plan.uses_kernel and plan.backward is not None, str(plan)
    out, state = tk.based(q, k, v, **kwargs)
    grad_out = torch.randn_like(out)
    grad_state = torch.randn_like(state) / 100
    leaves = (q, k, v, s0)
    ours = torch.autograd.grad((out.float() * grad_out).sum() + (state * grad_state).sum(), leaves)

    fp64 = [t.detach().double().requires_grad_() for t in leaves]
    ref_out, ref_state = reference(*fp64[:3], normalize=normalize, initial_state=fp64[3])
    expected = torch.autograd.grad((ref_out * grad_out.double()).sum() + (ref_state * grad_state.double()).sum(), fp64)

    in_dtype = [t.detach().requires_grad_() for t in leaves]
    base_out = based_in_dtype(*in_dtype[:3], normalize=normalize, initial_state=in_dtype[3])
    base_state = state_in_dtype(in_dtype[1], in_dtype[2], initial_state=in_dtype[3])
    yardstick = torch.autograd.grad((base_out.float() * grad_out).sum() + (base_state * grad_state).sum(), in_dtype)

    for name, leaf, got, want, theirs in zip(("q", "k", "v", "initial_state"), leaves, ours, expected, yardstick):
        assert got.dtype == leaf.dtype, (name, got.dtype)
        assert_within_torch_error(got, theirs, want, f"grad of {name}", ERROR_FACTOR, SLACK)


# ---- compile, graphs, streams ----------------------------------------------------------------


def test_torch_compile_fullgraph_under_no_grad():
    torch._dynamo.reset()
    seeded("compile")
    batch, length, heads = 2, 1000, 4
    q, k = (torch.randn(batch, length, heads, FEATURES, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            .requires_grad_() for _ in range(2))
    v = torch.randn(batch, length, heads, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    s0 = state_from_prefix(batch, heads, 128)

    def f(q, k, v, s0):
        out, state = tk.based(q, k, v, normalize=True, initial_state=s0, output_final_state=True)
        return out * 2, state

    with torch.no_grad():
        plan = tk.explain_based(q, k, v, normalize=True, initial_state=s0, output_final_state=True)
        assert str(plan) == kernel_plan_text(torch.bfloat16, 128, True, True, True), str(plan)
        with tk.strict():
            eager = f(q, k, v, s0)
            compiled = torch.compile(f, fullgraph=True)(q, k, v, s0)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    assert_output_close(eager[0] / 2, q.detach(), k.detach(), v.detach(), normalize=True, initial_state=s0)


def test_cuda_graph_capture_of_based():
    seeded("graph")
    q, k, v = make_inputs(2, 4, 777, 64, torch.float16)
    s0 = state_from_prefix(2, 4, 64)

    def call():
        return tk.based(q, k, v, normalize=True, initial_state=s0, output_final_state=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), tk.strict():
        call()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), tk.strict():
        static_out, static_state = call()
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        s0.copy_(state_from_prefix(2, 4, 64))
        graph.replay()
        with tk.strict():
            eager_out, eager_state = call()
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager_out) and torch.equal(static_state, eager_state)
    assert_output_close(static_out, q, k, v, normalize=True, initial_state=s0)


def test_cuda_graph_capture_of_an_in_place_based_step():
    """Decoding with a static state: one captured based_step(inplace=True), replayed per token,
    gives what eager steps give."""
    seeded("graph-step")
    batch, heads, prefix, value_dim = 2, 3, 50, 64
    q, k, v = make_inputs(batch, heads, prefix + 4, value_dim, torch.bfloat16)
    _, state = on_kernel(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], normalize=True,
                         output_final_state=True)
    q_t, k_t, v_t = (t[:, :, prefix:prefix + 1].clone() for t in (q, k, v))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tk.based_step(q_t, k_t, v_t, state.clone(), normalize=True, inplace=True)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, returned = tk.based_step(q_t, k_t, v_t, state, normalize=True, inplace=True)
    assert returned is state
    for t in range(prefix, prefix + 4):
        for static, source in ((q_t, q), (k_t, k), (v_t, v)):
            static.copy_(source[:, :, t:t + 1])
        expected_out, expected_state = tk.based_step(q_t, k_t, v_t, state.clone(), normalize=True)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(static_out, expected_out)
        torch.testing.assert_close(state, expected_state)
    assert_state_close(state, q, k, v)


def test_runs_on_the_current_stream():
    seeded("stream")
    q, k, v = make_inputs(2, 4, 1000, 64, torch.bfloat16)
    q_new = torch.randn_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # The side stream is busy for a while before q is overwritten; a kernel launched on any
        # other stream would read the old q.
        torch.cuda._sleep(100_000_000)
        q.copy_(q_new)
        out, state = on_kernel(q, k, v, normalize=True, output_final_state=True)
    torch.cuda.current_stream().wait_stream(side)
    assert_output_close(out, q_new, k, v, normalize=True)
    assert_state_close(state, q_new, k, v)
