"""Gradients of tk.attention on a Hopper GPU, through tk::attention_fwd_sm90's registered
autograd formula and tk::attention_bwd_sm90: dq, dk, dv against a float64 reference held to
PyTorch's own error (DESIGN.md section 6) over dtypes, head dims, causal/full, GQA ratios and odd
or unequal lengths; unwritten gradient memory; the public API's views; opcheck; torch.compile of
forward + backward; CUDA-graph capture of forward + backward; and a tiny transformer trained
with tk.attention against the same model trained with SDPA.

Tolerance (tests/differential/tolerance.py, the rule of every test): with ``ref`` the float64
gradient (tests/reference.py) on the same bf16/fp16 inputs and grad_out, the max-abs error of
each of our gradients must be <= 2 x the max-abs error of F.scaled_dot_product_attention's
backward (the less precise of the default backend and the fused ones, same inputs:
fused_sdpa_grads) + one rounding to the dtype at the largest value, and
its relative L2 error <= 2 x SDPA's + one rounding at the largest value on 32 elements
(relative). Between runs, dk and dv are bitwise the same (the
backward sums them in a fixed order); dq, summed in arrival order unless deterministic, is held
to the reference.

Only the sm90 family has a backward, so these tests run only on an sm_90 GPU (elsewhere calls
needing gradients go to SDPA: test_attention_gpu.py checks that fallback); on an sm_90 GPU,
explain naming no kernel fails them (tests/kernel_required.py).
"""

import copy
import math
import zlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import thunderkittens as tk
from differential.attention import fused_sdpa_backward, less_precise
from differential.tolerance import assert_close, gradient_floor
from kernel_required import require_kernel, skip_unless_gpu_for
from reference import (causal_offset_of, lower_right_bias, reference_attention,
                       reference_attention_grads, sdpa_causal_lower_right)
from attention_cases import DTYPES, HEAD_DIMS, attention_cases, case_id

pytestmark = pytest.mark.gpu

forward_op = None
training_op = None
backward_op = None


@pytest.fixture(scope="module", autouse=True)
def sm90_backward_must_run_here():
    global forward_op, training_op, backward_op
    skip_unless_gpu_for("attention", "sm90")
    q = torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with tk.use_kernel("sm90"):
        plan = tk.explain(q, q, q)
    require_kernel(plan, "attention", "sm90")
    assert plan.backward_op == "tk.attention_bwd_sm90", str(plan)
    forward_op = torch.ops.tk.attention_fwd_sm90
    training_op = torch.ops.tk.attention_fwd_sm90_train
    backward_op = torch.ops.tk.attention_bwd_sm90


def seeded(*key):
    torch.manual_seed(zlib.crc32(repr(key).encode()))


def randn(shape, dtype, device="cuda"):
    return torch.randn(shape, dtype=dtype, device=device)


def make_qkv(batch, heads_q, heads_kv, len_q, len_kv, head_dim, dtype):
    return (randn((batch, heads_q, len_q, head_dim), dtype),
            randn((batch, heads_kv, len_kv, head_dim), dtype),
            randn((batch, heads_kv, len_kv, head_dim), dtype))


SDPA_GRID_ROWS = 32768  # (batch*heads) per SDPA call: cuDNN's backward fails beyond the grid limit


def sdpa_grads(q, k, v, grad_out, causal, scale, lower_right=False):
    """PyTorch's own gradients (default SDPA backend) on the same inputs: the yardstick.
    Without GQA every (batch, head) is its own problem, so a batch*heads beyond what SDPA's
    kernels can launch (cuDNN's backward failed at 70000 on the H200) is done in chunks.
    lower_right: SDPA's causal_lower_right (see reference.sdpa_causal_lower_right)."""
    batch, heads = q.shape[:2]
    if batch * heads > SDPA_GRID_ROWS and heads == k.shape[1]:
        flat = [t.reshape(batch * heads, 1, *t.shape[2:]) for t in (q, k, v, grad_out)]
        parts = [sdpa_grads(*(t[i:i + SDPA_GRID_ROWS] for t in flat), causal, scale, lower_right)
                 for i in range(0, batch * heads, SDPA_GRID_ROWS)]
        return tuple(torch.cat(chunks).reshape(like.shape) for chunks, like in zip(zip(*parts), (q, k, v)))
    # Fresh contiguous copies: SDPA misreads some views (strides or a start off 16 bytes).
    leaves = [t.detach().clone(memory_format=torch.contiguous_format).requires_grad_()
              for t in (q, k, v)]
    grad_out = grad_out.clone(memory_format=torch.contiguous_format)
    if lower_right:
        out = sdpa_causal_lower_right(*leaves, scale)
    else:
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
    out.backward(grad_out)
    return tuple(t.grad for t in leaves)


def fused_sdpa_grads(q, k, v, grad_out, causal, scale, lower_right=False):
    """The gradients of SDPA's fused backward (differential.attention.fused_sdpa_backward) on
    fresh copies of the same inputs, or None where none runs the call. The rule
    (docs/development.md) holds an attention gradient to the less precise of this and the
    default backend's: SDPA's default for GQA calls is the math backend, which keeps P and dS in
    float32, where the fused kernels, and ours, round them to the dtype first."""
    if q.shape[0] * q.shape[1] > SDPA_GRID_ROWS:
        return None
    leaves = [t.detach().clone(memory_format=torch.contiguous_format).requires_grad_()
              for t in (q, k, v)]
    if not fused_sdpa_backward(*leaves, grad_out.clone(memory_format=torch.contiguous_format),
                               causal, scale, lower_right):
        return None
    return tuple(t.grad for t in leaves)


def assert_grads_close(grads, q, k, v, grad_out, causal, scale, lower_right=False, also=()):
    """(dq, dk, dv) against the float64 reference, each within SDPA's own error (the rule in the
    module docstring); ``also``: more (dq, dk, dv) tuples of the same call, held to the same.
    lower_right (with causal): SDPA's causal_lower_right; with Lq > Lk the first Lq - Lk query
    rows see no key, so their dq must be exactly 0."""
    offset = causal_offset_of(q, k, lower_right)
    hidden = max(0, -offset)
    zero_dq = torch.zeros(q.shape, dtype=torch.bool, device=q.device)
    zero_dq[:, :, :hidden] = True
    refs = reference_attention_grads(grad_out, q, k, v, causal, scale, causal_offset=offset)
    theirs = sdpa_grads(q, k, v, grad_out, causal, scale, lower_right)
    fused = fused_sdpa_grads(q, k, v, grad_out, causal, scale, lower_right)
    if fused is not None:
        theirs = tuple(less_precise(t, f, r) for t, f, r in zip(theirs, fused, refs))
    names = ("dq", "dk", "dv")
    floor = gradient_floor(max(q.shape[1] // k.shape[1] * q.shape[2], k.shape[2]))
    for run in (grads, *also):
        for name, ours, ref, torch_grad, like in zip(names, run, refs, theirs, (q, k, v)):
            assert ours.shape == like.shape and ours.dtype == like.dtype, \
                f"{name}: {tuple(ours.shape)} {ours.dtype}, expected {tuple(like.shape)} {like.dtype}"
            assert torch.isfinite(ours).all(), f"{name} has NaN/inf"
            assert_close(name, ours, ref, torch_grad, exact_zero=zero_dq if name == "dq" else None,
                         floor=floor)
    del refs, theirs


def assert_same_dk_dv(grads, others, what):
    """dk and dv bitwise the same in another run of the same backward (fixed summation order)."""
    for name, a, b in zip(("dk", "dv"), grads[1:], others[1:]):
        assert torch.equal(a, b), f"{name} differs bitwise ({what})"


def op_grads(q, k, v, grad_out, causal, scale, lower_right=False):
    """The ops as tk.attention runs them for a call that needs gradients: the training forward,
    whose out residual the backward reads."""
    out, lse, residual = training_op(q, k, v, causal, scale, lower_right)
    return backward_op(grad_out, q, k, v, out, lse, causal, scale, lower_right, False, residual)


# ---- correctness over the parameter space --------------------------------------------------

SMALL_LENGTHS = [(1, 1), (17, 17), (127, 127), (128, 128), (1000, 1000), (17, 1000), (1000, 17)]
LONG_LENGTHS = [(4097, 4097)]

@pytest.mark.parametrize("case", attention_cases(SMALL_LENGTHS, LONG_LENGTHS), ids=case_id)
def test_gradients_match_reference(case):
    len_q, len_kv, dtype, head_dim, causal, ratio = case
    seeded("grad", case)
    batch = 1 if max(len_q, len_kv) > 2048 else 2
    heads_kv = 2
    q, k, v = make_qkv(batch, heads_kv * ratio, heads_kv, len_q, len_kv, head_dim, dtype)
    grad_out = randn(q.shape, dtype)
    scale = 1.0 / math.sqrt(head_dim)

    grads = op_grads(q, k, v, grad_out, causal, scale)
    for grad, like in zip(grads, (q, k, v)):
        assert grad.is_contiguous() and grad.device == like.device
    assert_grads_close(grads, q, k, v, grad_out, causal, scale)


# causal_lower_right with Lq != Lk; see LOWER_RIGHT_LENGTHS in test_attention_gpu.py.
LOWER_RIGHT_LENGTHS = [(1000, 17), (333, 300), (4097, 1), (300, 333), (17, 4097), (1, 4097)]


@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("len_q, len_kv", LOWER_RIGHT_LENGTHS)
def test_lower_right_gradients_match_reference(len_q, len_kv, dtype, head_dim, ratio):
    seeded("grad-lower-right", len_q, len_kv, dtype, head_dim, ratio)
    batch = 1 if max(len_q, len_kv) > 2048 else 2
    q, k, v = make_qkv(batch, 2 * ratio, 2, len_q, len_kv, head_dim, dtype)
    grad_out = randn(q.shape, dtype)
    scale = 1.0 / math.sqrt(head_dim)
    grads = op_grads(q, k, v, grad_out, True, scale, lower_right=True)

    # The public API: the bias runs the forward and backward kernels with lower_right.
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    bias = lower_right_bias(len_q, len_kv)
    with tk.strict():
        assert str(tk.explain(*leaves, attn_mask=bias, enable_gqa=ratio > 1)).endswith(
            "causal lower-right" + (f" gqa={ratio}" if ratio > 1 else "")
            + " + backward tk.attention_bwd_sm90")
        tk.attention(*leaves, attn_mask=bias, enable_gqa=ratio > 1).backward(grad_out)
    public = tuple(t.grad for t in leaves)
    assert_same_dk_dv(public, grads, "the public API against the op")
    assert_grads_close(grads, q, k, v, grad_out, True, scale, lower_right=True, also=(public,))


# causal_lower_right with Lq > Lk on tiny problems: the differential suite found dq 10-20x
# PyTorch's error on the sm90 backward (minimal example causal_lower_right(4, 3), bf16, d64), where
# the long lengths above pass. The first Lq - Lk rows see no key; the others see 1..Lk keys.
TINY_LOWER_RIGHT = [(4, 3), (3, 2), (2, 1), (5, 3), (9, 4), (65, 63), (130, 127)]


@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("len_q, len_kv", TINY_LOWER_RIGHT)
def test_lower_right_gradients_tiny_lq_above_lk(len_q, len_kv, dtype, head_dim, ratio):
    seeded("grad-lower-right-tiny", len_q, len_kv, dtype, head_dim, ratio)
    q, k, v = make_qkv(1, 2 * ratio, 2, len_q, len_kv, head_dim, dtype)
    grad_out = randn(q.shape, dtype)
    scale = 1.0 / math.sqrt(head_dim)
    grads = op_grads(q, k, v, grad_out, True, scale, lower_right=True)
    assert_grads_close(grads, q, k, v, grad_out, True, scale, lower_right=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("causal, lower_right", [(False, False), (True, False), (True, True)],
                         ids=["full", "causal", "lower_right"])
@pytest.mark.parametrize("len_q, len_kv", [(1, 2), (3, 3), (17, 30), (1000, 1000), (333, 4097)])
def test_training_forward_is_the_forward_plus_its_rounding_residual(len_q, len_kv, causal,
                                                                     lower_right, dtype):
    """attention_fwd_sm90_train's out and lse are bitwise the plain forward's; the residual is
    within out's rounding step, and out + residual is closer to the exact result than out: by
    about 3x (max and mean), not by the full 2^8, since the kernel's float32 O carries the
    rounding of P for its P V product; held here to 3/4. Where every row sees one key, out is
    exact and the residual 0 (the kernel's P is exactly 1 at a row's largest score)."""
    seeded("residual", len_q, len_kv, causal, lower_right, dtype)
    for head_dim in HEAD_DIMS:
        q, k, v = make_qkv(2, 4, 2, len_q, len_kv, head_dim, dtype)
        out, lse = forward_op(q, k, v, causal, 0.3, lower_right)
        out_t, lse_t, residual = training_op(q, k, v, causal, 0.3, lower_right)
        assert torch.equal(out, out_t) and torch.equal(lse, lse_t)
        assert residual.shape == q.shape and residual.dtype == dtype and residual.is_contiguous()
        step = torch.finfo(dtype).eps * out.double().abs() + torch.finfo(dtype).tiny
        assert torch.isfinite(residual).all() and (residual.double().abs() <= step).all()
        exact = reference_attention(q, k, v, causal, 0.3,
                                    causal_offset=causal_offset_of(q, k, lower_right))[0]
        rounded = (out.double() - exact).abs()
        refined = (out.double() + residual.double() - exact).abs()
        if rounded.max() == 0:
            assert (residual == 0).all(), head_dim
            continue
        for stat in (torch.max, torch.mean):
            assert stat(refined) < 0.75 * stat(rounded), (head_dim, stat.__name__, stat(rounded).item(),
                                                         stat(refined).item())


# A peaked softmax (large scale): dS = P (dP - delta) cancels almost to nothing on a row's
# dominant key, so an error in delta = rowsum(dO * O) from out's rounding alone (|dO| |O| 2^-9 in
# bf16) was as large as the gradient there (the differential suite found 3-6x PyTorch's error,
# GQA, scale 1 and 2). The training forward's out residual makes delta exact to fp32.
@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("scale", [1.0, 2.0])
@pytest.mark.parametrize("len_q, len_kv", [(1, 2), (3, 3), (30, 30), (125, 125), (1000, 1000)])
def test_peaked_softmax_gradients(len_q, len_kv, scale, dtype, head_dim, ratio):
    seeded("peaked", len_q, len_kv, scale, dtype, head_dim, ratio)
    q, k, v = make_qkv(1, 2 * ratio, 2, len_q, len_kv, head_dim, dtype)
    grad_out = randn(q.shape, dtype)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with tk.strict():
        tk.attention(*leaves, scale=scale, enable_gqa=ratio > 1).backward(grad_out)
    assert_grads_close(tuple(t.grad for t in leaves), q, k, v, grad_out, False, scale)


@pytest.mark.parametrize("len_kv", [1, 2, 129])
def test_fp16_keys_past_the_end_do_not_overflow(len_kv):
    """fp16, keys scoring far below 0: P of the padding keys past Lk (exp(-lse)) overflowed fp16
    and an infinite dS times their zero K rows made dq NaN; they are masked."""
    seeded("fp16-padding", len_kv)
    q, k, v = make_qkv(2, 8, 1, 75, len_kv, 96, torch.float16)
    q, k = q.abs(), -k.abs()  # every score about -60
    grad_out = randn(q.shape, torch.float16)
    grads = op_grads(q, k, v, grad_out, False, 1.0)
    assert_grads_close(grads, q, k, v, grad_out, False, 1.0)


def test_gradients_with_explicit_scale():
    seeded("scale")
    q, k, v = make_qkv(2, 8, 2, 300, 333, 128, torch.bfloat16)
    grad_out = randn(q.shape, torch.bfloat16)
    for scale in (0.05, 0.3, 2.0):
        for causal in (False, True):
            assert_grads_close(op_grads(q, k, v, grad_out, causal, scale), q, k, v, grad_out,
                               causal, scale)


def _fill_cache_with_nan(nbytes):
    """Best effort: release the allocator's cached blocks, then leave one free block of at least
    ``nbytes`` (whole 2 MiB pages, so it is the whole segment) filled with NaN, from which the
    next large allocations are likely carved."""
    nbytes = -(-nbytes // (2 << 20)) * (2 << 20)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    poison = torch.full((nbytes // 4,), math.nan, dtype=torch.float32, device="cuda")
    del poison


@pytest.mark.parametrize("causal, lower_right", [(False, False), (True, False), (True, True)],
                         ids=["full", "causal", "lower_right"])
@pytest.mark.parametrize("shapes", [
    ((2, 8, 1000, 128), (2, 2, 1500, 128)),   # GQA 4, Lk not a multiple of the tile
    ((1, 4, 333, 64), (1, 4, 4097, 64)),
    ((1, 16, 4097, 64), (1, 2, 4100, 64)),    # GQA 8, Lk > Lq
    ((1, 8, 1000, 64), (1, 2, 17, 64)),       # Lq > Lk: lower-right leaves whole blocks unseen
])
def test_gradients_are_fully_written(shapes, causal, lower_right):
    """dk and dv are uninitialised allocations, made where the allocator just held NaN (or the
    op's own temporaries): an element the kernel forgets to write stays NaN (caught by the
    isfinite check) or stale (caught by the reference comparison). dq goes through a zeroed fp32
    accumulator, so a missed dq contribution shows in the reference comparison."""
    seeded("poison", shapes, causal, lower_right)
    q_shape, kv_shape = shapes
    q = randn(q_shape, torch.bfloat16)
    k, v = randn(kv_shape, torch.bfloat16), randn(kv_shape, torch.bfloat16)
    grad_out = randn(q_shape, torch.bfloat16)
    scale = 1 / math.sqrt(q_shape[-1])
    out, lse = forward_op(q, k, v, causal, scale, lower_right)
    _fill_cache_with_nan(4 * sum(math.prod(s) * 4 for s in (q_shape, kv_shape, kv_shape)))
    dq, dk, dv = backward_op(grad_out, q, k, v, out, lse, causal, scale, lower_right)
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert torch.isfinite(grad).all(), f"{name} has NaN/inf (unwritten elements?)"
    assert_grads_close((dq, dk, dv), q, k, v, grad_out, causal, scale, lower_right)


@pytest.mark.parametrize("shape_q, shape_kv, causal", [
    ((1, 70000, 16, 64), (1, 70000, 16, 64), False),
    ((70000, 1, 16, 64), (70000, 1, 16, 64), True),
])
def test_batch_times_heads_beyond_grid_limit(shape_q, shape_kv, causal):
    seeded("large-bh", shape_q, causal)
    q = randn(shape_q, torch.bfloat16)
    k, v = randn(shape_kv, torch.bfloat16), randn(shape_kv, torch.bfloat16)
    grad_out = randn(shape_q, torch.bfloat16)
    assert_grads_close(op_grads(q, k, v, grad_out, causal, 0.125), q, k, v, grad_out, causal,
                       0.125)


# ---- deterministic mode ----------------------------------------------------------------------

# (batch, heads_q, heads_kv, len_q, len_kv, head_dim, causal, lower_right): many key blocks add
# into every dq block, so arrival-order sums would differ between runs.
DETERMINISTIC_CASES = {
    "full d128 gqa4": (2, 8, 2, 1000, 1500, 128, False, False),
    "causal d64": (2, 16, 16, 2048, 2048, 64, True, False),
    "lower-right d128 Lq<Lk": (1, 8, 8, 700, 2100, 128, True, True),
    "lower-right d64 Lq>Lk gqa8": (2, 16, 2, 1500, 1000, 64, True, True),
    "causal d128 gqa8, more tasks than SMs": (4, 32, 4, 1024, 1024, 128, True, False),
    "full d96 gqa4": (2, 8, 2, 1000, 1500, 96, False, False),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", list(DETERMINISTIC_CASES))
def test_deterministic_backward_is_bitwise_repeatable(case, dtype):
    batch, heads_q, heads_kv, len_q, len_kv, head_dim, causal, lower_right = DETERMINISTIC_CASES[case]
    seeded("deterministic", case, dtype)
    q, k, v = make_qkv(batch, heads_q, heads_kv, len_q, len_kv, head_dim, dtype)
    grad_out = randn(q.shape, dtype)
    scale = 1 / math.sqrt(head_dim)
    out, lse = forward_op(q, k, v, causal, scale, lower_right)

    def run():
        return backward_op(grad_out, q, k, v, out, lse, causal, scale, lower_right, True)

    first = run()
    assert_grads_close(first, q, k, v, grad_out, causal, scale, lower_right)
    # Again, twice alone and twice while another stream keeps SMs busy (the blocks then start
    # and take their tasks at other times): the same bits every time.
    busy = randn((4096, 4096), torch.bfloat16)
    side = torch.cuda.Stream()
    for attempt in range(4):
        if attempt >= 2:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(4):
                    busy @ busy
        again = run()
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs in run {attempt + 2}"
    torch.cuda.synchronize()


def test_deterministic_mode_through_the_public_api(deterministic):
    seeded("deterministic-public")
    leaves = [randn((2, 8, 1100, 64), torch.bfloat16).requires_grad_() for _ in range(3)]
    grad_out = randn((2, 8, 1100, 64), torch.bfloat16)
    deterministic()
    with tk.strict():
        assert str(tk.explain(*leaves, is_causal=True)).endswith(
            "+ backward tk.attention_bwd_sm90 (deterministic)")
        runs = []
        for _ in range(3):
            for t in leaves:
                t.grad = None
            tk.attention(*leaves, is_causal=True).backward(grad_out)
            runs.append([t.grad.clone() for t in leaves])
    for later in runs[1:]:
        for a, b in zip(runs[0], later):
            assert torch.equal(a, b)
    assert_grads_close(runs[0], *(t.detach() for t in leaves), grad_out, True, 1 / math.sqrt(64))


# ---- the public API: autograd through the views tk.attention makes ---------------------------


def test_public_api_uses_the_backward_kernel():
    seeded("public")
    b, l, hq, hkv, d = 2, 300, 8, 2, 128
    # (B, L, H, D) leaves viewed as (B, H, L, D), as a model's projections give them.
    leaves = [randn((b, l, h, d), torch.bfloat16).requires_grad_() for h in (hq, hkv, hkv)]
    q, k, v = (t.transpose(1, 2) for t in leaves)
    plan = tk.explain(q, k, v, is_causal=True, enable_gqa=True)
    assert str(plan) == ("kernel tk.attention_fwd_sm90 [sm90 wgmma+tma] bf16 d=128 causal gqa=4 "
                         "+ backward tk.attention_bwd_sm90"), str(plan)
    grad_out = randn((b, hq, l, d), torch.bfloat16)
    with tk.strict():
        out = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
    out.backward(grad_out)
    grads = tuple(t.grad.transpose(1, 2) for t in leaves)
    assert_grads_close(grads, q.detach(), k.detach(), v.detach(), grad_out, True, 1 / math.sqrt(d))


def test_public_api_rank3_and_rank5_and_copied_inputs():
    seeded("ranks")
    q3, k3, v3 = (randn((6, 129, 64), torch.bfloat16).requires_grad_() for _ in range(3))
    grad_out3 = randn((6, 129, 64), torch.bfloat16)
    with tk.strict():
        tk.attention(q3, k3, v3, is_causal=True).backward(grad_out3)
    for t in (q3, k3, v3):
        assert t.grad.shape == (6, 129, 64)
    assert_grads_close(tuple(t.grad.unsqueeze(0) for t in (q3, k3, v3)),
                       *(t.detach().unsqueeze(0) for t in (q3, k3, v3)), grad_out3.unsqueeze(0),
                       True, 0.125)

    q5 = randn((2, 3, 8, 65, 128), torch.float16).requires_grad_()
    k5, v5 = (randn((2, 3, 2, 70, 128), torch.float16).requires_grad_() for _ in range(2))
    grad_out = randn((2, 3, 8, 65, 128), torch.float16)
    with tk.strict():
        tk.attention(q5, k5, v5, enable_gqa=True).backward(grad_out)
    assert_grads_close((q5.grad.flatten(0, 1), k5.grad.flatten(0, 1), v5.grad.flatten(0, 1)),
                       q5.detach().flatten(0, 1), k5.detach().flatten(0, 1),
                       v5.detach().flatten(0, 1), grad_out.flatten(0, 1), False, 1 / math.sqrt(128))

    # Row stride 67: copied for the kernel; the gradient flows back through the copy and slice.
    leaf = randn((2, 4, 257, 67), torch.bfloat16).requires_grad_()
    q = leaf[..., :64]
    k, v = (randn((2, 4, 257, 64), torch.bfloat16).requires_grad_() for _ in range(2))
    grad_out = randn((2, 4, 257, 64), torch.bfloat16)
    with tk.strict():
        tk.attention(q, k, v, is_causal=True).backward(grad_out)
    assert torch.all(leaf.grad[..., 64:] == 0)
    assert_grads_close((leaf.grad[..., :64], k.grad, v.grad), q.detach(), k.detach(), v.detach(),
                       grad_out, True, 0.125)


def test_expanded_grad_out_is_made_readable():
    # out.sum() gives an expanded (stride 0) gradient, which the kernel cannot read in place.
    seeded("sum")
    q, k, v = (randn((2, 4, 200, 64), torch.bfloat16).requires_grad_() for _ in range(3))
    with tk.strict():
        tk.attention(q, k, v).sum().backward()
    assert_grads_close((q.grad, k.grad, v.grad), q.detach(), k.detach(), v.detach(),
                       torch.ones_like(q), False, 0.125)


# ---- opcheck, the op's checks ----------------------------------------------------------------


@pytest.mark.parametrize("shapes", [
    ((2, 8, 129, 64), (2, 2, 77, 64)),
    ((1, 4, 1, 128), (1, 4, 300, 128)),
])
def test_opcheck_backward(shapes):
    seeded("opcheck", shapes)
    q = randn(shapes[0], torch.bfloat16)
    k, v = randn(shapes[1], torch.bfloat16), randn(shapes[1], torch.bfloat16)
    for causal, scale, lower_right, deterministic in ((True, 0.125, False, False),
                                                      (False, 0.3, False, False),
                                                      (True, 0.125, True, False),
                                                      (True, 0.125, False, True),
                                                      (False, 0.3, False, True)):
        out, lse = forward_op(q, k, v, causal, scale, lower_right)
        grad_out = randn(shapes[0], torch.bfloat16)
        torch.library.opcheck(backward_op.default,
                              (grad_out, q, k, v, out, lse, causal, scale, lower_right,
                               deterministic))
    # transposed (B, L, H, D) memory for q and grad_out
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    out, lse = forward_op(qt, k, v, True, 0.125)
    grad_out = randn(shapes[0][:1] + shapes[0][2:3] + shapes[0][1:2] + shapes[0][3:],
                     torch.bfloat16).transpose(1, 2)
    torch.library.opcheck(backward_op.default, (grad_out, qt, k, v, out, lse, True, 0.125))


def test_opcheck_forward_autograd():
    seeded("opcheck-fwd")
    q = randn((2, 8, 129, 64), torch.bfloat16).requires_grad_()
    k, v = (randn((2, 2, 77, 64), torch.bfloat16).requires_grad_() for _ in range(2))
    torch.library.opcheck(forward_op.default, (q, k, v, True, 0.125))
    torch.library.opcheck(forward_op.default, (q, k, v, True, 0.125, True))  # lower-right, Lq > Lk


def _bwd_direct(**changes):
    q, k, v = make_qkv(1, 4, 4, 32, 32, 64, torch.bfloat16)
    out, lse = forward_op(q, k, v, False, 0.125)
    args = {"grad_out": randn(q.shape, torch.bfloat16), "q": q, "k": k, "v": v, "out": out,
            "lse": lse}
    args.update({name: make(args) for name, make in changes.items()})
    return backward_op(args["grad_out"], args["q"], args["k"], args["v"], args["out"],
                       args["lse"], False, 0.125)


@pytest.mark.parametrize("changes, message", [
    ({"grad_out": lambda a: randn((1, 4, 64, 32), torch.bfloat16).transpose(-1, -2)},
     "grad_out must have a contiguous last dimension"),
    ({"lse": lambda a: a["lse"].half()}, "lse must be the forward's float32"),
    ({"grad_out": lambda a: randn((1, 4, 31, 64), torch.bfloat16)}, "must have q's shape"),
    ({"k": lambda a: randn((1, 4, 32, 64), torch.float16)}, "k has dtype"),
], ids=["grad_out-layout", "lse-dtype", "grad_out-shape", "k-dtype"])
def test_backward_op_rejects_bad_inputs(changes, message):
    with pytest.raises(RuntimeError, match=message):
        _bwd_direct(**changes)


def test_ops_reject_lower_right_without_is_causal():
    q, k, v = make_qkv(1, 4, 4, 32, 16, 64, torch.bfloat16)
    with pytest.raises(RuntimeError, match="lower_right=True needs is_causal=True"):
        forward_op(q, k, v, False, 0.125, True)
    out, lse = forward_op(q, k, v, True, 0.125, True)
    with pytest.raises(RuntimeError, match="lower_right=True needs is_causal=True"):
        backward_op(randn(q.shape, torch.bfloat16), q, k, v, out, lse, False, 0.125, True)


# ---- torch.compile, CUDA graphs --------------------------------------------------------------


def test_torch_compile_forward_backward_matches_eager():
    torch._dynamo.reset()
    seeded("compile")
    w = randn((2, 8, 1000, 128), torch.float32)

    def loss_fn(q, k, v):
        out = tk.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                           is_causal=True, enable_gqa=True)
        return (out.float() * w).sum()

    leaves = [randn((2, 1000, h, 128), torch.bfloat16).requires_grad_() for h in (8, 2, 2)]
    results = []
    with tk.strict():
        for fn in (loss_fn, torch.compile(loss_fn, fullgraph=True)):
            for t in leaves:
                t.grad = None
            loss = fn(*leaves)
            loss.backward()
            results.append((loss.detach(), [t.grad.clone() for t in leaves]))
    (eager_loss, eager_grads), (compiled_loss, compiled_grads) = results
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-3, atol=1e-2)  # sum order
    # The same backward op on the same inputs: dk and dv bitwise, dq (arrival-order sums) held
    # to the reference as eager's is.
    as_bhld = lambda grads: tuple(g.transpose(1, 2) for g in grads)  # noqa: E731
    assert_same_dk_dv(as_bhld(compiled_grads), as_bhld(eager_grads), "compiled against eager")
    q, k, v = (t.detach().transpose(1, 2) for t in leaves)
    grad_out = w.to(torch.bfloat16)
    assert_grads_close(as_bhld(eager_grads), q, k, v, grad_out, True, 1 / math.sqrt(128),
                       also=(as_bhld(compiled_grads),))


def test_cuda_graph_capture_and_replay_forward_backward():
    seeded("graph")
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 8, 2, 777, 777, 128, torch.float16))
    grad_out = randn(q.shape, torch.float16)

    def step():
        out = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(grad_out)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), tk.strict():
        for _ in range(2):  # warm-up outside the capture
            for t in (q, k, v):
                t.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), tk.strict():
        static_out = step()
    static_grads = (q.grad, k.grad, v.grad)

    for _ in range(3):
        with torch.no_grad():
            for t in (q, k, v, grad_out):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(static_out).all()
        qe, ke, ve = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with tk.strict():
            eager = tk.attention(qe, ke, ve, is_causal=True, enable_gqa=True)
        eager.backward(grad_out)
        assert torch.equal(static_out, eager.detach())
        eager_grads = (qe.grad, ke.grad, ve.grad)
        assert_same_dk_dv(static_grads, eager_grads, "graph replay against eager")
        assert_grads_close(static_grads, q.detach(), k.detach(), v.detach(), grad_out, True,
                           1 / math.sqrt(128), also=(eager_grads,))


# ---- end to end: a tiny transformer trained with tk.attention vs SDPA ------------------------


def _tk_attention(q, k, v):
    with tk.strict():  # the kernels (forward and backward), never a silent SDPA fallback
        return tk.attention(q, k, v, is_causal=True)


def _sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x, attention):
        b, l, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, l, 3, self.heads, d // self.heads)
        # (B, H, L, Dh) views into the projection's output: strided, read in place.
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        o = attention(q, k, v)
        x = x + self.proj(o.transpose(1, 2).reshape(b, l, d))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=512, d_model=256, heads=4, layers=2, max_len=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens, attention):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, attention)
        return self.head(self.norm(x))


def _train(model, attention, tokens, steps):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1], attention)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                               tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_tiny_transformer_trains_like_sdpa():
    seeded("e2e")
    vocab, seq, batch, steps = 512, 256, 4, 20
    model_tk = TinyTransformer(vocab=vocab, max_len=seq).cuda()
    model_sdpa = copy.deepcopy(model_tk)
    tokens = torch.randint(0, vocab, (batch, seq + 1), device="cuda")
    losses_tk = _train(model_tk, _tk_attention, tokens, steps)
    losses_sdpa = _train(model_sdpa, _sdpa_attention, tokens, steps)
    for step, (ours, theirs) in enumerate(zip(losses_tk, losses_sdpa)):
        assert math.isfinite(ours), f"step {step}: loss {ours}"
        assert abs(ours - theirs) <= 2e-2 * theirs, \
            f"step {step}: loss {ours:.4f} with tk.attention vs {theirs:.4f} with SDPA\n" \
            f"tk:   {[round(x, 4) for x in losses_tk]}\nsdpa: {[round(x, 4) for x in losses_sdpa]}"
    for losses in (losses_tk, losses_sdpa):
        assert losses[-1] < 0.9 * losses[0], losses
