"""tk::based_bwd_sm80 (the mma.sync Based backward) and tk::based_bwd_sm90 (the TMA + wgmma
kernels) on a GPU, each module pass with one of them, called as the op and through
tk.based's autograd (its family forced), against float64 autograd of the quadratic form: both
dtypes, value dims 64 and 128, lengths around the 64-row chunk (1, 17, 63, 64, 65, 1000, 4097), with and without an
initial state and a final state's gradient, normalize on and off (through tk.based; short sequences, where q's gradient cancels, under the
differential suite's rule), the block-local denominators' gradient (grad_denominator), strided
(B, N, H, D) inputs read in place, outputs that must be fully written, batch * heads beyond
65535, repeatability, opcheck, and the op's checks.

Tolerance. As for the forward (tests/test_based_kernel_gpu.py): each gradient is held to what
PyTorch's autograd makes of the same math in the input dtype (scores, polynomial, products and
the gradients' products rounded to bf16/fp16 as torch's ops round them, fp32 accumulation inside
matmuls) against the float64 gradient:

    max |g - ref| <= 2 * max |g_torch - ref| + SLACK * max |ref|     (and the same for the
    relative L2 error).

The kernels' rounding points: the state's 16-bit copy (scaled), the products q_a q_b / k_a k_b,
the chunk's polynomial scores (dv's mma operand), the Jacobian's rotated term G * x (once), the
outputs; the chunk's ds = dP * p'(s) goes to the tensor cores as a 16-bit high part plus its
16-bit remainder; everything else accumulates in fp32. Run on a CPU emulation of the mma.sync
instruction set (not part of the suite), the kernels' errors were 0.3 .. 1.45x PyTorch's over
N = 1 .. 1000, both dtypes and value dims (the largest: dv at N = 1, where the chunk's scores'
rounding is all there is). The initial state's gradient (fp32) sums phi(q_i) do_i^T with
16-bit q_a q_b, as PyTorch does when it builds phi(q) in the input dtype and multiplies in
fp32: its relative (Frobenius) error is held to 2x that computation's plus 1e-6.
"""

import math

import pytest
import torch

import thunderkittens as tk
from differential.tolerance import assert_close
from gpu_support import (BASED_FEATURES as FEATURES, BASED_SCALE as SCALE, BASED_STATE_ROWS as STATE_ROWS,
                         assert_within_torch_error, based_batch_heads_for as batch_heads_for, based_in_dtype,
                         based_reference as reference, based_state_from_prefix as state_from_prefix,
                         feature_map, rel_l2_error, require_kernel_op, seeded, with_ones)

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
VALUE_DIMS = [64, 128]
LENGTHS = [1, 17, 63, 64, 65, 1000, 4097]
ERROR_FACTOR = 2.0
SLACK = 1e-6
STATE_SLACK = 1e-6


DENOMINATOR_BLOCK = 64  # csrc/based/backward_params.h


# The backward op under test and the forward family whose autograd formula it is.
BACKWARD_OPS = {"based_bwd_sm80": "sm80", "based_bwd_sm90": "sm90"}
UNDER_TEST = {"op": "based_bwd_sm80"}


def op(grad_out, q, k, v, scale=SCALE, initial_state=None, grad_final_state=None, grad_initial_state=False,
       grad_denominator=None):
    return getattr(torch.ops.tk, UNDER_TEST["op"])(grad_out, q, k, v, scale, initial_state, grad_final_state,
                                                   grad_initial_state, grad_denominator)


def block_denominators(q, k, scale=SCALE):
    """d_i = sum of p(s_ij) over the keys j <= i of row i's DENOMINATOR_BLOCK-row block, in q's
    dtype (differentiable): what grad_denominator is the gradient of."""
    s = scale * (q @ k.transpose(-1, -2))
    rows = torch.arange(q.shape[-2], device=q.device)
    keep = (rows[:, None] >= rows[None, :]) & (rows[:, None] // DENOMINATOR_BLOCK == rows[None, :] // DENOMINATOR_BLOCK)
    return torch.where(keep, 1 + s + s * s / 2, torch.zeros((), dtype=s.dtype, device=s.device)).sum(-1)


@pytest.fixture(scope="module", autouse=True, params=list(BACKWARD_OPS))
def kernel_must_run_here(request):
    """Every test of the module once per backward op, with tk.based's family forced to the op's."""
    name = request.param
    if name == "based_bwd_sm90" and torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("tk::based_bwd_sm90 needs an sm_90 (Hopper) GPU")
    UNDER_TEST["op"] = name

    def probe():
        q = torch.zeros(1, 1, 1, FEATURES, device="cuda", dtype=torch.bfloat16)
        v = torch.zeros(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16)
        op(v, q, q, v)

    require_kernel_op("based", name, probe)
    with tk.use_kernel(BACKWARD_OPS[name], "based"):
        yield


def make_inputs(batch, heads, length, value_dim, dtype):
    q = torch.randn(batch, heads, length, FEATURES, device="cuda").to(dtype)
    k = torch.randn(batch, heads, length, FEATURES, device="cuda").to(dtype)
    v = torch.randn(batch, heads, length, value_dim, device="cuda").to(dtype)
    grad_out = torch.randn(batch, heads, length, value_dim, device="cuda").to(dtype)
    return q, k, v, grad_out


def symmetric_final_gradient(batch, heads, value_dim):
    """A final state's gradient the op sees whole: a symmetric quadratic block, a zero last
    column (the op's contract leaves the rest to the autograd formula)."""
    g = torch.randn(batch, heads, STATE_ROWS, value_dim + 1, device="cuda") / 10
    quad = g[..., 1 + FEATURES:, :].unflatten(-2, (FEATURES, FEATURES))
    g = torch.cat([g[..., :1 + FEATURES, :], ((quad + quad.transpose(-2, -3)) / 2).flatten(-3, -2)], -2)
    g[..., -1] = 0
    return g


def expected_and_yardstick(q, k, v, grad_out, initial_state, grad_final):
    """(float64 gradients, PyTorch's in-dtype gradients) of (q, k, v[, initial_state]) for the
    loss <o, grad_out> (+ <final state, grad_final>), unnormalised."""
    with_state = initial_state is not None
    fp64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    if with_state:
        fp64.append(initial_state.detach().double().requires_grad_())
    out, final = reference(*fp64[:3], SCALE, initial_state=fp64[3] if with_state else None,
                           want_state=grad_final is not None)
    loss = (out * grad_out.double()).sum()
    if grad_final is not None:
        loss = loss + (final * grad_final.double()).sum()
    expected = torch.autograd.grad(loss, fp64)

    in_dtype = [t.detach().requires_grad_() for t in (q, k, v)]
    if with_state:
        in_dtype.append(initial_state.detach().clone().requires_grad_())
    out = based_in_dtype(*in_dtype[:3], SCALE, initial_state=in_dtype[3] if with_state else None)
    loss = (out.float() * grad_out.float()).sum()
    if grad_final is not None:
        phi_k = feature_map(in_dtype[1], SCALE).float()
        final = phi_k.transpose(-1, -2) @ with_ones(in_dtype[2].float())
        if with_state:
            final = final + in_dtype[3]
        loss = loss + (final * grad_final).sum()
    yardstick = torch.autograd.grad(loss, in_dtype)
    return expected, yardstick


def assert_gradients(got, expected, yardstick, names=("q", "k", "v", "initial_state")):
    for name, g, want, theirs in zip(names, got, expected, yardstick):
        if name == "initial_state":
            assert g.dtype == torch.float32 and torch.isfinite(g).all(), f"grad of {name}"
            ours, torch_err = rel_l2_error(g, want), rel_l2_error(theirs, want)
            assert ours <= ERROR_FACTOR * torch_err + STATE_SLACK, (
                f"grad of initial_state: relative error {ours:.3e} > {ERROR_FACTOR} x PyTorch's {torch_err:.3e}")
        else:
            assert_within_torch_error(g, theirs, want, f"grad of {name}", ERROR_FACTOR, SLACK)


# ---- the op against float64 autograd --------------------------------------------------------


@pytest.mark.parametrize("states", [False, True], ids=["fresh", "states"])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_gradients_match_reference(dtype, value_dim, length, states):
    seeded("bwd", dtype, value_dim, length, states)
    batch, heads = batch_heads_for(length)
    q, k, v, grad_out = make_inputs(batch, heads, length, value_dim, dtype)
    s0 = state_from_prefix(batch, heads, value_dim, SCALE) if states else None
    grad_final = symmetric_final_gradient(batch, heads, value_dim) if states else None
    dq, dk, dv, d_state = op(grad_out, q, k, v, SCALE, s0, grad_final, states)
    assert dq.dtype == dtype and dq.shape == q.shape and dq.is_contiguous()
    assert dk.shape == k.shape and dv.shape == v.shape and dk.is_contiguous() and dv.is_contiguous()
    assert (d_state.numel() == 0) != states
    expected, yardstick = expected_and_yardstick(q, k, v, grad_out, s0, grad_final)
    assert_gradients((dq, dk, dv, d_state) if states else (dq, dk, dv), expected, yardstick)
    if states:
        assert torch.equal(d_state[..., -1], torch.zeros_like(d_state[..., -1]))


@pytest.mark.parametrize("scale", [0.05, 0.5, 1.0])
def test_other_scales(scale):
    seeded("bwd-scale", scale)
    q, k, v, grad_out = make_inputs(2, 2, 300, 64, torch.bfloat16)
    dq, dk, dv, _ = op(grad_out, q, k, v, scale)
    fp64 = [t.double().requires_grad_() for t in (q, k, v)]
    out, _ = reference(*fp64, scale, want_state=False)
    expected = torch.autograd.grad((out * grad_out.double()).sum(), fp64)
    in_dtype = [t.detach().requires_grad_() for t in (q, k, v)]
    yardstick = torch.autograd.grad((based_in_dtype(*in_dtype, scale).float() * grad_out.float()).sum(), in_dtype)
    assert_gradients((dq, dk, dv), expected, yardstick)


@pytest.mark.parametrize("length", [1, 17, 64, 65, 1000])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_denominator_gradient(dtype, value_dim, length):
    """grad_denominator: dq, dk and dv of <o, grad_out> + <d, g> with d the block-local
    denominators, against float64 autograd, within 2x PyTorch's in-dtype error."""
    seeded("bwd-denominator", dtype, value_dim, length)
    batch, heads = batch_heads_for(length)
    q, k, v, grad_out = make_inputs(batch, heads, length, value_dim, dtype)
    g = torch.randn(batch, heads, length, device="cuda")
    got = op(grad_out, q, k, v, grad_denominator=g)[:3]
    fp64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, _ = reference(*fp64, SCALE, want_state=False)
    loss = (out * grad_out.double()).sum() + (block_denominators(*fp64[:2]) * g.double()).sum()
    expected = torch.autograd.grad(loss, fp64)
    in_dtype = [t.detach().requires_grad_() for t in (q, k, v)]
    loss = ((based_in_dtype(*in_dtype).float() * grad_out.float()).sum()
            + (block_denominators(*in_dtype[:2]).float() * g).sum())
    yardstick = torch.autograd.grad(loss, in_dtype)
    assert_gradients(got, expected, yardstick)


# ---- through tk.based (autograd formula, normalize) -----------------------------------------


@pytest.mark.parametrize("length", [1, 2, 17, 65])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_normalized_gradients_of_short_sequences(dtype, value_dim, length):
    """normalize=True where the output hardly depends on q and k (one key: not at all, so q's
    gradient is 0 up to cancellation): the value and normaliser terms meet in fp32 (the
    kernel's grad_denominator), so the gradients hold the differential suite's rule, whose
    cancellation case is a max-abs bound near float32 noise."""
    seeded("tk-bwd-short", dtype, value_dim, length)
    q, k, v, grad_out = make_inputs(3, 4, length, value_dim, dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    plan = tk.explain_based(*leaves, normalize=True)
    assert plan.uses_kernel, str(plan)
    with tk.strict():
        out = tk.based(*leaves, normalize=True)
    got = torch.autograd.grad((out.float() * grad_out.float()).sum(), leaves)
    fp64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out, _ = reference(*fp64, SCALE, True, want_state=False)
    expected = torch.autograd.grad((ref_out * grad_out.double()).sum(), fp64)
    in_dtype = [t.detach().requires_grad_() for t in (q, k, v)]
    yardstick = torch.autograd.grad((based_in_dtype(*in_dtype, SCALE, True).float() * grad_out.float()).sum(),
                                    in_dtype)
    for name, g, want, theirs in zip("qkv", got, expected, yardstick):
        assert_close(f"grad of {name}", g, want, theirs)
    if length == 1:  # q's gradient is 0 but for eps: float32 noise, not a rounding of O(1) parts
        assert got[0].abs().max().item() < 1e-4, got[0].abs().max().item()


# ---- through tk.based (autograd formula, normalize) -----------------------------------------


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_tk_based_gradients(dtype, value_dim, normalize):
    """All four gradients through tk.based, o and final state both in the loss, an initial state
    with an antisymmetric quadratic part and a noisy normaliser column; the kernel path."""
    seeded("tk-bwd", dtype, value_dim, normalize)
    batch, heads, length = 2, 2, 1000
    q, k, v, grad_out = make_inputs(batch, heads, length, value_dim, dtype)
    s0 = state_from_prefix(batch, heads, value_dim, SCALE)
    s0[..., 1 + FEATURES:, :] += 0.05 * torch.randn_like(s0[..., 1 + FEATURES:, :])
    leaves = [t.clone().requires_grad_() for t in (q, k, v, s0)]
    kwargs = {"normalize": normalize, "initial_state": leaves[3], "output_final_state": True}
    plan = tk.explain_based(*leaves[:3], **kwargs)
    assert plan.uses_kernel and plan.backward is not None and plan.backward.startswith(f"tk.{UNDER_TEST['op']}"), str(plan)
    with tk.strict():
        out, state = tk.based(*leaves[:3], **kwargs)
    grad_state = torch.randn_like(state) / 100
    got = torch.autograd.grad((out.float() * grad_out.float()).sum() + (state * grad_state).sum(), leaves)

    fp64 = [t.detach().double().requires_grad_() for t in (q, k, v, s0)]
    ref_out, ref_state = reference(*fp64[:3], SCALE, normalize, initial_state=fp64[3])
    expected = torch.autograd.grad((ref_out * grad_out.double()).sum() + (ref_state * grad_state.double()).sum(), fp64)
    in_dtype = [t.detach().requires_grad_() for t in (q, k, v, s0)]
    base = based_in_dtype(*in_dtype[:3], SCALE, normalize, initial_state=in_dtype[3])
    phi_k = feature_map(in_dtype[1], SCALE).float()
    base_state = phi_k.transpose(-1, -2) @ with_ones(in_dtype[2].float()) + in_dtype[3]
    yardstick = torch.autograd.grad((base.float() * grad_out.float()).sum() + (base_state * grad_state).sum(), in_dtype)
    for name, leaf, g in zip(("q", "k", "v", "initial_state"), leaves, got):
        assert g.dtype == leaf.dtype, (name, g.dtype)
    assert_gradients(got, expected, yardstick)


# ---- layouts, coverage, repeatability ---------------------------------------------------------


@pytest.mark.parametrize("value_dim", VALUE_DIMS)
def test_strided_inputs_read_in_place(value_dim):
    """(B, N, H, D) memory viewed as (B, H, N, D) for q, k, v and grad_out, and rows padded past
    their last column: the same bits as contiguous inputs."""
    seeded("bwd-strided", value_dim)
    batch, heads, length = 2, 3, 333
    q = torch.randn(batch, length, heads, FEATURES, device="cuda").to(torch.bfloat16).transpose(1, 2)
    k = torch.randn(batch, length, heads, FEATURES + 8, device="cuda").to(torch.bfloat16)[..., :FEATURES].transpose(1, 2)
    v = torch.randn(batch, length, heads, value_dim + 16, device="cuda").to(torch.bfloat16)[..., 8:8 + value_dim]
    v = v.transpose(1, 2)
    grad_out = torch.randn(batch, length, heads, value_dim, device="cuda").to(torch.bfloat16).transpose(1, 2)
    assert not any(t.is_contiguous() for t in (q, k, v, grad_out))
    s0 = state_from_prefix(batch, heads, value_dim, SCALE)
    strided = op(grad_out, q, k, v, SCALE, s0, None, True)
    dense = op(grad_out.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), SCALE, s0, None, True)
    for a, b in zip(strided, dense):
        assert torch.equal(a, b)
    expected, yardstick = expected_and_yardstick(q, k, v, grad_out, s0, None)
    assert_gradients(strided, expected, yardstick)


def poison_free_blocks(*shapes_dtypes):
    """Fills freed allocator blocks of these sizes with NaN, so that an op allocating outputs of
    those sizes next gets them back: an element the kernel does not write stays NaN."""
    torch.cuda.empty_cache()
    blocks = [torch.full(shape, float("nan"), device="cuda", dtype=dtype) for shape, dtype in shapes_dtypes]
    pointers = [b.data_ptr() for b in blocks]
    del blocks
    return pointers


@pytest.mark.parametrize("length", [17, 65, 1000])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
def test_outputs_fully_written(value_dim, length):
    seeded("bwd-poison", value_dim, length)
    q, k, v, grad_out = make_inputs(2, 3, length, value_dim, torch.float16)
    state_shape = (2, 3, STATE_ROWS, value_dim + 1)
    pointers = poison_free_blocks((q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype),
                                  (state_shape, torch.float32))
    dq, dk, dv, d_state = op(grad_out, q, k, v, SCALE, None, None, True)
    if not all(t.data_ptr() in pointers for t in (dq, dk, dv, d_state)):
        pytest.skip("the caching allocator did not hand the poisoned blocks back")
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv, d_state))
    expected, yardstick = expected_and_yardstick(q, k, v, grad_out, None, None)
    assert_gradients((dq, dk, dv), expected, yardstick)


@pytest.mark.parametrize("value_dim", VALUE_DIMS)
def test_batch_times_heads_beyond_65535(value_dim):
    seeded("bwd-many", value_dim)
    q, k, v, grad_out = make_inputs(70000, 1, 17, value_dim, torch.bfloat16)
    got = op(grad_out, q, k, v)[:3]
    expected, yardstick = expected_and_yardstick(q, k, v, grad_out, None, None)
    assert_gradients(got, expected, yardstick)


def test_repeatable_and_on_the_current_stream():
    seeded("bwd-repeat")
    q, k, v, grad_out = make_inputs(2, 4, 1000, 128, torch.bfloat16)
    s0 = state_from_prefix(2, 4, 128, SCALE)
    grad_final = symmetric_final_gradient(2, 4, 128)
    first = op(grad_out, q, k, v, SCALE, s0, grad_final, True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        second = op(grad_out, q, k, v, SCALE, s0, grad_final, True)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("value_dim", VALUE_DIMS)
def test_opcheck(value_dim):
    seeded("bwd-opcheck", value_dim)
    q, k, v, grad_out = make_inputs(2, 3, 100, value_dim, torch.bfloat16)
    s0 = state_from_prefix(2, 3, value_dim, SCALE)
    grad_final = symmetric_final_gradient(2, 3, value_dim)
    grad_denominator = torch.randn(2, 3, 100, device="cuda")
    for denominator in (None, grad_denominator):
        torch.library.opcheck(getattr(torch.ops.tk, UNDER_TEST["op"]).default,
                              (grad_out, q, k, v, SCALE, s0, grad_final, True, denominator),
                              test_utils=("test_schema", "test_faketensor"))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    forward = getattr(torch.ops.tk, "based_fwd_" + BACKWARD_OPS[UNDER_TEST["op"]]).default
    torch.library.opcheck(forward,
                          (*leaves, SCALE, True, 1e-6, s0.clone().requires_grad_(), True),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_torch_compile_of_a_training_step():
    torch._dynamo.reset()
    seeded("bwd-compile")
    q, k, v, grad_out = make_inputs(2, 2, 200, 64, torch.bfloat16)

    def step(q, k, v):
        return tk.based(q, k, v, normalize=True).float().mul(grad_out.float()).sum()

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = torch.autograd.grad(step(*leaves), leaves)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(*leaves), leaves)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2 * b.abs().max().item())


# ---- the op's checks ---------------------------------------------------------------------------


def test_checks_name_the_argument():
    q, k, v, grad_out = make_inputs(1, 2, 70, 64, torch.bfloat16)
    cases = [
        ((grad_out[..., :32], q, k, v), "grad_out must have v's shape"),
        ((grad_out, q[..., :8], k[..., :8], v), "feature dim"),
        ((grad_out[..., :32], q, k, v[..., :32]), "value_dim must be 64 or 128"),
        ((grad_out, q, k.half(), v), "k has dtype"),
        ((grad_out.float(), q.float(), k.float(), v.float()), "bfloat16 or float16"),
        ((grad_out, q, k.cpu(), v), "k must be a CUDA tensor"),
        ((grad_out, q, k[:, :, :69], v), "k must have q's shape"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            op(*args)
    odd_rows = torch.randn(1, 2, 70, 68, device="cuda").to(torch.bfloat16)[..., :64]
    with pytest.raises(RuntimeError, match="grad_out: every stride"):
        op(odd_rows, q, k, v)
    with pytest.raises(RuntimeError, match="scale must be finite and positive"):
        op(grad_out, q, k, v, 0.0)
    with pytest.raises(RuntimeError, match="grad_final_state must have shape"):
        op(grad_out, q, k, v, SCALE, None, torch.zeros(1, 2, STATE_ROWS, 64, device="cuda"))
    with pytest.raises(RuntimeError, match="initial_state must be float32"):
        op(grad_out, q, k, v, SCALE, torch.zeros(1, 2, STATE_ROWS, 65, device="cuda", dtype=torch.float64))
    with pytest.raises(RuntimeError, match="grad_denominator must have shape"):
        op(grad_out, q, k, v, grad_denominator=torch.zeros(1, 2, 69, device="cuda"))
    with pytest.raises(RuntimeError, match="grad_denominator must be float32"):
        op(grad_out, q, k, v, grad_denominator=torch.zeros(1, 2, 70, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="grad_denominator must be on q's device"):
        op(grad_out, q, k, v, grad_denominator=torch.zeros(1, 2, 70))
    assert math.isclose(SCALE, 0.25)
