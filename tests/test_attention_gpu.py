"""tk.attention on a GPU: correctness against a float64 reference, held to PyTorch's own error
(FlashAttention's habit), plus the things kernels get wrong in practice: odd lengths, Lq != Lk,
GQA, uninitialised output memory, strided inputs, huge batch*heads, other devices and streams,
CUDA graphs, torch.compile, opcheck, and the fallbacks (torch.export: test_export.py).

Tolerance (tests/differential/tolerance.py, the rule of every test): with ``ref`` the float64
answer on the same bf16/fp16 inputs, our max-abs error must be <= 2 x the max-abs error of
F.scaled_dot_product_attention (default backend, on contiguous copies) + one rounding to the
dtype at the largest value, and our relative L2 error <= 2 x SDPA's + one rounding at the
largest value on 32 elements (relative). lse (float32 from exact bf16/fp16 products) is held to
LSE_ATOL.

The tests skip only without a GPU, or for a family on a GPU it is not for (sm90: sm_90 only);
where a family should run, explain naming no kernel fails the test (tests/kernel_required.py).
"""

import math
import zlib

import pytest
import torch
import torch.nn.functional as F

import thunderkittens as tk
from differential.tolerance import assert_close, record
from thunderkittens._attention.plan import BY_NAME as FAMILIES
from reference import causal_offset_of, lower_right_bias, reference_attention, sdpa_causal_lower_right
from attention_cases import DTYPES, HEAD_DIMS, attention_cases, case_id
from fresh_process import run_in_fresh_process
from fresh_thread import call_in_new_thread
from kernel_required import require_kernel, skip_unless_gpu_for

pytestmark = pytest.mark.gpu

# lse's own error against the float64 reference is ~1e-6 to 1e-5 (fp32 sums and exp2 of
# scores that are exact products); 5e-5 leaves a few times that.
LSE_ATOL = 5e-5


@pytest.fixture(scope="module", autouse=True)
def kernel_must_run_here():
    skip_unless_gpu_for("attention", "sm80")
    q = torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.bfloat16)
    with tk.use_kernel("sm80"):
        require_kernel(tk.explain(q, q, q), "attention", "sm80")


# The kernel families and the op each one runs; tests that call an op directly run per family.
KERNEL_OPS = {"sm80": torch.ops.tk.attention_fwd_sm80, "sm90": torch.ops.tk.attention_fwd_sm90}


def skip_unless_kernel_runs(family):
    """Skips the test on a GPU kernel family ``family`` is not for (sm90: sm_90 only); fails it
    where the family is for this GPU but explain names no kernel."""
    skip_unless_gpu_for("attention", family)
    q = torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.bfloat16)
    with tk.use_kernel(family):
        require_kernel(tk.explain(q, q, q), "attention", family)


@pytest.fixture(params=sorted(KERNEL_OPS))
def kernel(request):
    """A kernel family that runs on this GPU."""
    skip_unless_kernel_runs(request.param)
    return request.param


def per_family(cases, head_dim_of, id_of):
    """(case, family) parameters for each case and each family built for its head dim (the
    sm80 family has no d96: test_head_dim_96_is_sm90_only checks where those calls go)."""
    return [pytest.param(case, family, id=f"{id_of(case)}-{family}")
            for case in cases for family in sorted(KERNEL_OPS) if head_dim_of(case) in FAMILIES[family].head_dims]


def seeded(*key):
    torch.manual_seed(zlib.crc32(repr(key).encode()))


def randn(shape, dtype, device="cuda"):
    return torch.randn(shape, dtype=dtype, device=device)


def make_qkv(batch, heads_q, heads_kv, len_q, len_kv, head_dim, dtype, device="cuda"):
    return (randn((batch, heads_q, len_q, head_dim), dtype, device),
            randn((batch, heads_kv, len_kv, head_dim), dtype, device),
            randn((batch, heads_kv, len_kv, head_dim), dtype, device))


def call_op_on_poisoned_memory(q, k, v, causal, scale, kernel="sm80", lower_right=False,
                               in_new_thread=False):
    """Call the op so that its outputs land in memory that was just filled with NaN.

    The caching allocator hands a freed block back to the next request of the same size on the
    same stream; allocating NaN tensors of the op's output sizes in the op's order, freeing them
    and calling the op makes the op's outputs reuse exactly those blocks (asserted), so any
    element the kernel forgets to write stays NaN. in_new_thread: the op (only) runs as the
    first CUDA work of a new thread, which then allocates nothing.
    """
    batch, heads_q, len_q, head_dim = q.shape
    poison_out = torch.full((batch, heads_q, len_q, head_dim), math.nan, dtype=q.dtype,
                            device=q.device)
    poison_lse = torch.full((batch, heads_q, len_q), math.nan, dtype=torch.float32,
                            device=q.device)
    addresses = (poison_out.data_ptr(), poison_lse.data_ptr())
    del poison_out, poison_lse
    def op():
        return KERNEL_OPS[kernel](q, k, v, causal, scale, lower_right)

    out, lse = call_in_new_thread(op) if in_new_thread else op()
    assert (out.data_ptr(), lse.data_ptr()) == addresses, "outputs did not reuse the NaN blocks"
    return out, lse


def assert_close_to_reference(out, q, k, v, causal, scale, lse=None, lower_right=False):
    """``out`` (B, Hq, Lq, D) against the float64 reference, within PyTorch's own error.
    lower_right (with causal): SDPA's causal_lower_right, key j visible to query i iff
    j <= i + Lk - Lq; with Lq > Lk the first Lq - Lk rows see no key and must be exactly 0,
    with lse -inf."""
    assert torch.isfinite(out).all(), "output has NaN/inf"
    offset = causal_offset_of(q, k, lower_right)
    hidden = max(0, -offset)  # leading query rows that see no key
    ref_out, ref_lse = reference_attention(q, k, v, causal, scale, causal_offset=offset)
    # The yardstick runs on fresh contiguous copies: SDPA misreads some views (row strides
    # that are not multiples of 16 bytes, starts off a 16-byte boundary).
    q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    if lower_right:
        torch_out = sdpa_causal_lower_right(q, k, v, scale)
    else:
        torch_out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                   enable_gqa=q.shape[1] != k.shape[1])
    zero = torch.zeros(out.shape, dtype=torch.bool, device=out.device)
    zero[:, :, :hidden] = True
    assert_close("output", out, ref_out, torch_out, exact_zero=zero)
    if lse is not None:
        assert torch.isneginf(lse[:, :, :hidden]).all(), "lse of rows that see no key is not -inf"
        assert torch.isfinite(lse[:, :, hidden:]).all(), "lse has NaN/inf"
        lse_err = (lse[:, :, hidden:].double() - ref_lse[:, :, hidden:]).abs().max().item()
        record("lse", lse_err, LSE_ATOL)
        assert lse_err <= LSE_ATOL, f"lse max abs error {lse_err:.3e} > {LSE_ATOL:g}"


# ---- correctness over the parameter space --------------------------------------------------

SMALL_LENGTHS = [(1, 1), (17, 17), (127, 127), (1000, 1000), (17, 1000), (1000, 17)]
LONG_LENGTHS = [(4097, 4097), (128, 4097), (4097, 128), (1, 4097), (4097, 1)]

@pytest.mark.parametrize("case, kernel", per_family(attention_cases(SMALL_LENGTHS, LONG_LENGTHS),
                                                  lambda case: case[3], case_id))
def test_forward_matches_reference(case, kernel):
    skip_unless_kernel_runs(kernel)
    len_q, len_kv, dtype, head_dim, causal, ratio = case
    seeded(case)
    batch, heads_kv = 2, 2
    q, k, v = make_qkv(batch, heads_kv * ratio, heads_kv, len_q, len_kv, head_dim, dtype)
    scale = 1.0 / math.sqrt(head_dim)

    out, lse = call_op_on_poisoned_memory(q, k, v, causal, scale, kernel)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert_close_to_reference(out, q, k, v, causal, scale, lse)

    with tk.use_kernel(kernel), tk.strict():
        public = tk.attention(q, k, v, is_causal=causal, enable_gqa=ratio > 1)
    assert torch.equal(public, out), "tk.attention differs from the op it calls"


# causal_lower_right with Lq != Lk (key j visible to query i iff j <= i + Lk - Lq). Lq > Lk
# leaves the first Lq - Lk rows with no key: with (1000, 17), (4097, 1) and (4097, 1000) whole
# query blocks of both kernels (128 rows; sm90 192 at d64) see none, with (333, 300) only rows
# inside the first block. Lq < Lk: the offset runs past tile boundaries.
LOWER_RIGHT_LENGTHS = [(1000, 17), (333, 300), (4097, 1), (4097, 1000), (300, 333), (17, 4097),
                       (1, 4097)]


LOWER_RIGHT_CASES = [(lengths, dtype, head_dim, ratio) for lengths in LOWER_RIGHT_LENGTHS for dtype in DTYPES
                     for head_dim in HEAD_DIMS for ratio in (1, 4)]


@pytest.mark.parametrize("case, kernel", per_family(
    LOWER_RIGHT_CASES, lambda case: case[2],
    lambda case: f"lq{case[0][0]}-lk{case[0][1]}-{str(case[1]).removeprefix('torch.')}-d{case[2]}-gqa{case[3]}"))
def test_lower_right_matches_reference(case, kernel):
    skip_unless_kernel_runs(kernel)
    (len_q, len_kv), dtype, head_dim, ratio = case
    seeded("lower-right", len_q, len_kv, dtype, head_dim, ratio)
    batch = 1 if max(len_q, len_kv) > 2048 else 2
    q, k, v = make_qkv(batch, 2 * ratio, 2, len_q, len_kv, head_dim, dtype)
    scale = 1.0 / math.sqrt(head_dim)

    out, lse = call_op_on_poisoned_memory(q, k, v, True, scale, kernel, lower_right=True)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert_close_to_reference(out, q, k, v, True, scale, lse, lower_right=True)

    bias = lower_right_bias(len_q, len_kv)
    with tk.use_kernel(kernel), tk.strict():
        assert str(tk.explain(q, k, v, attn_mask=bias, enable_gqa=ratio > 1)).endswith(
            f"d={head_dim} causal lower-right" + (f" gqa={ratio}" if ratio > 1 else ""))
        public = tk.attention(q, k, v, attn_mask=bias, enable_gqa=ratio > 1)
    assert torch.equal(public, out), "tk.attention differs from the op it calls"


@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_picks_a_kernel_and_matches_forced(dtype):
    seeded("auto", dtype)
    q, k, v = make_qkv(2, 8, 2, 300, 333, 128, dtype)
    plan = tk.explain(q, k, v, is_causal=True, enable_gqa=True)
    assert plan.uses_kernel, plan.reason
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    # auto picks the sm90 family on an sm_90 GPU (a build without 90a code fails here).
    family = "sm90" if torch.cuda.get_device_capability() == (9, 0) else "sm80"
    description = {"sm90": "tk.attention_fwd_sm90 [sm90 wgmma+tma]",
                   "sm80": "tk.attention_fwd_sm80 [sm80 mma.sync]"}
    assert str(plan) == f"kernel {description[family]} {name} d=128 causal gqa=4"
    with tk.strict():
        auto = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
    with tk.use_kernel(family), tk.strict():
        forced = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(auto, forced)
    assert_close_to_reference(auto, q, k, v, True, 1 / math.sqrt(128))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_explicit_scale(kernel, head_dim):
    seeded("scale", kernel, head_dim)
    q, k, v = make_qkv(2, 4, 4, 200, 233, head_dim, torch.bfloat16)
    for scale in (0.05, 0.3, 2.0):
        for causal in (False, True):
            with tk.use_kernel(kernel), tk.strict():
                assert tk.explain(q, k, v, is_causal=causal, scale=scale).kernel == kernel
                out = tk.attention(q, k, v, is_causal=causal, scale=scale)
            assert_close_to_reference(out, q, k, v, causal, scale)
            op_out, lse = call_op_on_poisoned_memory(q, k, v, causal, scale, kernel)
            assert torch.equal(op_out, out)
            assert_close_to_reference(op_out, q, k, v, causal, scale, lse)


def test_nonpositive_scale_takes_sdpa_math():
    # Non-positive scales take the SDPA math path (the kernel's running max assumes scale > 0,
    # and so do SDPA's fused backends, which return NaN here): SDPA math's answer exactly, held
    # to the reference with SDPA math as the yardstick.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    seeded("nonpositive scale")
    q, k, v = make_qkv(2, 4, 4, 200, 233, 64, torch.bfloat16)
    for scale in (-0.125, 0.0):
        for causal in (False, True):
            assert not tk.explain(q, k, v, is_causal=causal, scale=scale).uses_kernel
            out = tk.attention(q, k, v, is_causal=causal, scale=scale)
            with sdpa_kernel(SDPBackend.MATH):
                math_out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            assert torch.equal(out, math_out)
            ref_out, _ = reference_attention(q, k, v, causal, scale)
            assert_close("output", out, ref_out, math_out)


# ---- layouts -------------------------------------------------------------------------------


def test_transposed_inputs_are_read_in_place():
    seeded("transposed")
    b, l, h, d = 2, 300, 8, 128
    q, k, v = (randn((b, l, h, d), torch.bfloat16).transpose(1, 2) for _ in range(3))
    plan = tk.explain(q, k, v, is_causal=True)
    assert plan.uses_kernel and not plan.copies, str(plan)
    with tk.strict():
        out = tk.attention(q, k, v, is_causal=True)
    assert_close_to_reference(out, q, k, v, True, 1 / math.sqrt(d))


def test_sliced_head_dim_inputs():
    seeded("sliced")
    # Row stride 136 (a multiple of 8): read in place.
    q, k, v = (randn((2, 4, 257, 136), torch.float16)[..., :128] for _ in range(3))
    assert not tk.explain(q, k, v).copies
    with tk.strict():
        out = tk.attention(q, k, v)
    assert_close_to_reference(out, q, k, v, False, 1 / math.sqrt(128))
    # Row stride 67: copied first.
    q, k, v = (randn((2, 4, 257, 67), torch.float16)[..., :64] for _ in range(3))
    assert tk.explain(q, k, v).copies == ("query", "key", "value")
    with tk.strict():
        out = tk.attention(q, k, v, is_causal=True)
    assert_close_to_reference(out, q, k, v, True, 1 / math.sqrt(64))


def test_misaligned_input_is_copied():
    seeded("misaligned")
    shape = (2, 4, 100, 64)
    flat = randn((math.prod(shape) + 3,), torch.bfloat16)
    q = flat[3:].view(shape)
    assert q.data_ptr() % 16 != 0
    k, v = randn(shape, torch.bfloat16), randn(shape, torch.bfloat16)
    assert tk.explain(q, k, v).copies == ("query",)
    with tk.strict():
        out = tk.attention(q, k, v)
    assert_close_to_reference(out, q, k, v, False, 1 / math.sqrt(64))


@pytest.mark.parametrize("shape_q, shape_kv, causal", [
    ((1, 70000, 16, 64), (1, 70000, 16, 64), False),
    ((70000, 1, 16, 64), (70000, 1, 16, 64), True),
    ((1, 70000, 16, 64), (1, 7000, 16, 64), True),
])
def test_batch_times_heads_beyond_grid_limit(shape_q, shape_kv, causal, kernel):
    seeded("large-bh", shape_q, shape_kv, causal)
    q = randn(shape_q, torch.bfloat16)
    k, v = randn(shape_kv, torch.bfloat16), randn(shape_kv, torch.bfloat16)
    out, lse = call_op_on_poisoned_memory(q, k, v, causal, 0.125, kernel)
    assert_close_to_reference(out, q, k, v, causal, 0.125, lse)


# The sm90 forward at d64 splits the non-causal tasks left over after the grid's full rounds
# over their key tiles, in a power of two pieces of at least 4 tiles each that fit in one round
# and take at least 12 tiles off the longest task (csrc/attention/task_order.h:
# split_last_round), and merges the pieces' partial results. Tasks are 192 query rows of one
# (batch, head). The cases, with S the SM count: fewer tasks than SMs (2 heads x 2 query
# blocks => 8 pieces of 4-5 tiles, the last one partial), full rounds and 2 tasks more (S + 2
# heads of one query block => 8 pieces of 4 tiles), and GQA (16 tasks, 4 pieces). d128 splits
# only with three consumer warpgroups (non-causal, Lq and Lk >= 3072; also 192-row tasks): 8
# heads of 17 query blocks are 136 tasks, a full round and 4 more; 32 heads of 17 blocks (GQA)
# are 4 full rounds and 16 more, so each block runs four whole tasks and then a piece; the
# other cases run it unsplit. Those have 17 query blocks per head; with an even number (3300:
# 18, 4097: 22) and an even SM count, the three-consumer d128 kernel runs in clusters of two
# blocks that take neighbouring tasks and share their K/V tiles (forward_sm90.cu: paired_tasks),
# pieces paired by share: 36 tasks in 72 pieces (fewer tasks than SMs), 144 tasks (a full
# round and 12 more, in 48 pieces), GQA 576 (4 rounds and 48 more, in 96 pieces), and 132
# tasks (one round, nothing split).
def _split_cases():
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    return [  # batch, heads_q, heads_kv, len_q, len_kv
        (1, 2, 2, 300, 4097),
        (1, sms + 2, sms + 2, 100, 4000),
        (2, 8, 2, 128, 2000),
        (1, 8, 8, 3100, 3100),
        (2, 16, 4, 3100, 3200),
        (1, 2, 2, 3300, 3100),
        (1, 8, 8, 3300, 3300),
        (2, 16, 4, 3300, 3200),
        (1, 6, 6, 4097, 3500),
    ]


@pytest.mark.parametrize("shape", _split_cases(), ids=lambda s: "b{}-hq{}-hkv{}-lq{}-lk{}".format(*s))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_forward_split_last_round(shape, head_dim, dtype):
    skip_unless_kernel_runs("sm90")
    batch, heads_q, heads_kv, len_q, len_kv = shape
    seeded("split", shape, head_dim, dtype)
    q, k, v = make_qkv(batch, heads_q, heads_kv, len_q, len_kv, head_dim, dtype)
    scale = 1 / math.sqrt(head_dim)
    out, lse = call_op_on_poisoned_memory(q, k, v, False, scale, "sm90")
    assert_close_to_reference(out, q, k, v, False, scale, lse)
    # The pieces merge in a fixed order, whichever finishes last: the forward stays deterministic.
    again, lse_again = torch.ops.tk.attention_fwd_sm90(q, k, v, False, scale)
    assert torch.equal(again, out) and torch.equal(lse_again, lse), "split forward differs between runs"


def test_rank3_and_rank5_inputs():
    seeded("ranks")
    q3, k3, v3 = (randn((6, 129, 64), torch.bfloat16) for _ in range(3))
    with tk.strict():
        out3 = tk.attention(q3, k3, v3, is_causal=True)
    assert out3.shape == (6, 129, 64)
    assert_close_to_reference(out3.unsqueeze(0), q3.unsqueeze(0), k3.unsqueeze(0),
                              v3.unsqueeze(0), True, 0.125)
    q5 = randn((2, 3, 8, 65, 128), torch.float16)
    k5, v5 = randn((2, 3, 2, 70, 128), torch.float16), randn((2, 3, 2, 70, 128), torch.float16)
    with tk.strict():
        out5 = tk.attention(q5, k5, v5, enable_gqa=True)
    assert out5.shape == (2, 3, 8, 65, 128)
    assert_close_to_reference(out5.flatten(0, 1), q5.flatten(0, 1), k5.flatten(0, 1),
                              v5.flatten(0, 1), False, 1 / math.sqrt(128))


# ---- devices, streams, graphs, compile -----------------------------------------------------


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device(kernel):
    seeded("device1")
    with torch.cuda.device(0):
        q, k, v = make_qkv(2, 8, 2, 333, 333, 128, torch.bfloat16, device="cuda:1")
        with tk.strict():
            out = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
        assert out.device == torch.device("cuda:1")
        with tk.use_kernel(kernel), tk.strict():
            out = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
        out2, lse = KERNEL_OPS[kernel](q, k, v, True, 1 / math.sqrt(128))
    torch.cuda.synchronize(1)
    assert torch.equal(out, out2)
    assert_close_to_reference(out, q, k, v, True, 1 / math.sqrt(128), lse)


def test_first_cuda_call_of_a_new_thread(kernel):
    """The op as the first CUDA work of a fresh thread (shape used nowhere else, so its tensor
    maps are made there; NaN output blocks freed beforehand, so the thread allocates nothing)."""
    seeded("thread", kernel)
    q, k, v = make_qkv(1, 3, 3, 333, 271, 64, torch.bfloat16)
    out, lse = call_op_on_poisoned_memory(q, k, v, True, 0.125, kernel, in_new_thread=True)
    assert_close_to_reference(out, q, k, v, True, 0.125, lse)


def test_runs_on_the_current_stream():
    seeded("stream")
    q, k, v = make_qkv(2, 4, 4, 512, 512, 64, torch.bfloat16)
    q_new = randn(q.shape, torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # The side stream is busy for a while before q is overwritten; a kernel launched on any
        # other stream would read the old q.
        torch.cuda._sleep(100_000_000)
        q.copy_(q_new)
        with tk.strict():
            out = tk.attention(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    assert_close_to_reference(out, q_new, k, v, False, 0.125)


def test_cuda_graph_capture_and_replay():
    seeded("graph")
    q, k, v = make_qkv(2, 8, 2, 777, 777, 128, torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), tk.strict():
        tk.attention(q, k, v, is_causal=True, enable_gqa=True)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), tk.strict():
        static_out = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        with tk.strict():
            eager = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager)


# The long non-causal d128 forward runs in clusters of two on sm_90: its first call in a process
# asks the driver how many clusters fit (cached per device) and launches a cluster grid, both
# inside a graph capture here. A fresh process, so nothing is cached yet; checked against a
# float64 reference after replays on new inputs (the pieces of the split last round included:
# 2 x 16 heads of 18 query blocks are 4 rounds of 132 and 48 tasks more).
FIRST_PAIRED_CALL_IN_A_GRAPH = """
    import torch, thunderkittens as tk
    from differential.tolerance import assert_close
    torch.manual_seed(0)
    q = torch.randn(2, 16, 3300, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4, 3200, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), tk.strict():
        out = tk.attention(q, k, v, enable_gqa=True)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        kk, vv = (t.double().repeat_interleave(4, dim=1) for t in (k, v))
        ref = torch.softmax(q.double() @ kk.mT / 128 ** 0.5, dim=-1) @ vv
        theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert_close("output", out, ref, theirs)  # the rule of every test
    print("ok")
"""


def test_paired_forward_first_called_inside_a_graph_capture():
    skip_unless_kernel_runs("sm90")
    result = run_in_fresh_process(FIRST_PAIRED_CALL_IN_A_GRAPH)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


def test_torch_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    seeded("compile")

    def f(q, k, v):
        return tk.attention(q, k, v, is_causal=True, enable_gqa=True) * 2

    q, k, v = make_qkv(2, 8, 2, 1000, 1000, 128, torch.bfloat16)
    with tk.strict():
        eager = f(q, k, v)
        compiled = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("len_q, len_kv", [(1000, 300), (300, 1000)])
def test_torch_compile_fullgraph_lower_right(len_q, len_kv):
    torch._dynamo.reset()
    seeded("compile-lower-right", len_q, len_kv)
    # Made outside the compiled function (torch 2.15's dynamo cannot construct a CausalBias).
    bias = lower_right_bias(len_q, len_kv)

    def f(q, k, v):
        return tk.attention(q, k, v, attn_mask=bias, enable_gqa=True) * 2

    q, k, v = make_qkv(2, 8, 2, len_q, len_kv, 128, torch.bfloat16)
    with tk.strict():
        eager = f(q, k, v)
        compiled = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(compiled, eager)
    assert_close_to_reference(eager / 2, q, k, v, True, 1 / math.sqrt(128), lower_right=True)


@pytest.mark.parametrize("shapes", [
    ((2, 8, 129, 64), (2, 2, 77, 64)),
    ((1, 4, 1, 128), (1, 4, 300, 128)),
])
def test_opcheck(shapes, kernel):
    seeded("opcheck", shapes)
    q = randn(shapes[0], torch.bfloat16)
    k, v = randn(shapes[1], torch.bfloat16), randn(shapes[1], torch.bfloat16)
    op = KERNEL_OPS[kernel].default
    torch.library.opcheck(op, (q, k, v, True, 0.125))
    torch.library.opcheck(op,
                          (q.transpose(1, 2).contiguous().transpose(1, 2), k, v, False, 0.3))
    torch.library.opcheck(op, (q, k, v, True, 0.125, True))  # lower-right


# ---- the op's own checks (direct callers of torch.ops.tk.attention_fwd_sm80) ---------------


def _direct(q=None, k=None, v=None, scale=0.125):
    base = make_qkv(1, 4, 4, 32, 32, 64, torch.bfloat16)
    q, k, v = (given if given is not None else default for given, default in zip((q, k, v), base))
    return torch.ops.tk.attention_fwd_sm80(q, k, v, False, scale)


@pytest.mark.parametrize("make, message", [
    (lambda: _direct(q=randn((1, 4, 32, 80), torch.bfloat16)),
     r"q head_dim must be 64 or 128 \(the sm80 kernel\), got 80"),
    (lambda: _direct(q=randn((1, 4, 32, 64), torch.float32), k=randn((1, 4, 32, 64), torch.float32),
                     v=randn((1, 4, 32, 64), torch.float32)), "q must be bfloat16 or float16"),
    (lambda: _direct(k=randn((1, 4, 32, 64), torch.float16)), "k has dtype"),
    (lambda: _direct(v=randn((1, 4, 32, 64), torch.bfloat16, device="cpu")), "v must be a CUDA tensor"),
    (lambda: _direct(k=randn((1, 4, 32, 67), torch.bfloat16)[..., :64]),
     "k: every stride except the last must be a multiple of 8"),
    (lambda: _direct(v=randn((1, 4, 64, 32), torch.bfloat16).transpose(-1, -2)),
     "v must have a contiguous last dimension"),
    (lambda: _direct(q=randn((4 * 32 * 64 + 1,), torch.bfloat16)[1:].view(1, 4, 32, 64)),
     "q: data pointer must be 16-byte aligned"),
    (lambda: _direct(q=randn((1, 6, 32, 64), torch.bfloat16)), r"q heads \(6\) must be a multiple"),
    (lambda: _direct(k=randn((1, 4, 0, 64), torch.bfloat16)), "k must not be empty"),
    (lambda: _direct(q=randn((4, 32, 64), torch.bfloat16)), "q must be 4-D"),
    (lambda: _direct(scale=-0.125), "scale must be finite and positive"),
    (lambda: _direct(scale=0.0), "scale must be finite and positive"),
    (lambda: torch.ops.tk.attention_fwd_sm80(*make_qkv(1, 4, 4, 32, 16, 64, torch.bfloat16),
                                             False, 0.125, True),
     "lower_right=True needs is_causal=True"),
])
def test_op_rejects_bad_inputs(make, message):
    with pytest.raises(RuntimeError, match=message):
        make()


# ---- fallbacks on the GPU ------------------------------------------------------------------


def test_fallback_attn_mask_gives_sdpa_answer():
    seeded("mask")
    q, k, v = make_qkv(2, 4, 4, 100, 120, 64, torch.bfloat16)
    mask = torch.rand(100, 120, device="cuda") > 0.2
    assert str(tk.explain(q, k, v, attn_mask=mask)) == \
        ("fallback torch SDPA: attn_mask is not supported by the kernel yet (only the causal "
         "biases causal_upper_left and causal_lower_right are)")
    out = tk.attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    with tk.strict(), pytest.raises(tk.FallbackError, match="attn_mask"):
        tk.attention(q, k, v, attn_mask=mask)


def test_fallback_dropout():
    seeded("dropout")
    q, k, v = make_qkv(2, 4, 4, 100, 100, 64, torch.bfloat16)
    assert "dropout_p > 0 is not supported" in str(tk.explain(q, k, v, dropout_p=0.1))
    out = tk.attention(q, k, v, dropout_p=0.1)
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("dtype, head_dim, reason", [
    (torch.float32, 64, "dtype torch.float32 is not supported"),
    (torch.bfloat16, 80, "head dim 80 is not supported"),
    (torch.float16, 256, "head dim 256 is not supported"),
])
def test_fallback_unsupported_dtype_or_head_dim(dtype, head_dim, reason):
    seeded("unsupported", dtype, head_dim)
    q, k, v = make_qkv(2, 4, 4, 100, 100, head_dim, dtype)
    assert reason in str(tk.explain(q, k, v))
    torch.testing.assert_close(tk.attention(q, k, v, is_causal=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("mask", ["none", "lower_right"])
@pytest.mark.parametrize("len_q", [1, 7])
def test_fallback_keeps_short_queries_off_flash_split_kv(mask, len_q):
    # SDPA's flash backend splits the keys of a call with few query blocks, and its merge kernel
    # writes past the end of the softmax statistics (compute-sanitizer memcheck, torch 2.11):
    # the fallback runs such calls without that backend, says so, and is right.
    from torch.profiler import ProfilerActivity, profile
    seeded("flash split", mask, len_q)
    q, k, v = make_qkv(1, 2, 2, len_q, 1000, 80, torch.float16)  # head dim 80: the fallback
    kwargs = {"attn_mask": lower_right_bias(len_q, 1000)} if mask == "lower_right" else {}
    plan = tk.explain(q, k, v, **kwargs)
    assert not plan.uses_kernel and "without SDPA's flash backend" in str(plan)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = tk.attention(q, k, v, **kwargs)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    # FlashAttention-2's kernels live in namespace pytorch_flash (cuDNN's have "flash" in their
    # names too, and may run).
    assert kernels and not any("pytorch_flash" in name for name in kernels), kernels
    ref_out, _ = reference_attention(q, k, v, mask == "lower_right", 80 ** -0.5,
                                     causal_offset=1000 - len_q)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        math_out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert_close("output", out, ref_out, math_out)
    # Enough query blocks to fill the GPU: SDPA's own choice, flash included.
    q = torch.randn(1, 2, 64 * torch.cuda.get_device_properties(0).multi_processor_count, 80,
                    device="cuda", dtype=torch.float16)
    assert "flash" not in str(tk.explain(q, k, v))


def test_head_dim_96_is_sm90_only():
    # The sm80 family is not built for d96 (_C.attention_head_dims): with it picked, such calls go
    # to SDPA with the reason, and its op refuses them; the sm90 kernels take them (and their op
    # refuses 80).
    seeded("d96 routing")
    q, k, v = make_qkv(2, 4, 4, 100, 100, 96, torch.bfloat16)
    with tk.use_kernel("sm80"):
        plan = tk.explain(q, k, v, is_causal=True)
        assert not plan.uses_kernel
        assert plan.reason == ("kernel sm80 was forced but head dim 96 runs on the sm90 kernels only "
                               "(the sm80 kernels take head dims 64, 128)")
        torch.testing.assert_close(tk.attention(q, k, v, is_causal=True),
                                   F.scaled_dot_product_attention(q, k, v, is_causal=True))
        with tk.strict(), pytest.raises(tk.FallbackError, match="head dim 96 runs on the sm90"):
            tk.attention(q, k, v, is_causal=True)
    with pytest.raises(RuntimeError, match=r"q head_dim must be 64 or 128 \(the sm80 kernel\), got 96"):
        torch.ops.tk.attention_fwd_sm80(q, k, v, True, 0.1, False)
    q80 = randn((1, 4, 32, 80), torch.bfloat16)
    with pytest.raises(RuntimeError, match="q head_dim must be 64, 96 or 128, got 80"):
        torch.ops.tk.attention_fwd_sm90(q80, q80, q80, True, 0.1, False)
    if torch.cuda.get_device_capability() == (9, 0):
        require_kernel(tk.explain(q, k, v, is_causal=True), "attention", "sm90")


def test_fallback_requires_grad_on_sm80_and_gradients_flow():
    # The sm80 family has no backward: calls needing gradients go to SDPA (the sm90 backward is
    # tested in test_attention_grad_gpu.py).
    seeded("grad")
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 4, 4, 100, 100, 64, torch.bfloat16))
    grad_out = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16)
    with tk.use_kernel("sm80"):
        assert "requires grad and the sm80 kernels have no backward" in str(tk.explain(q, k, v))
        tk.attention(q, k, v, is_causal=True).backward(grad_out)
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad_out)
    for mine, theirs in zip(ours, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(mine, theirs)
    with torch.no_grad(), tk.use_kernel("sm80"):
        assert tk.explain(q, k, v).uses_kernel


def test_causal_biases_run_on_the_kernel():
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left
    seeded("causal-bias")
    q, k, v = make_qkv(2, 4, 4, 300, 333, 128, torch.bfloat16)
    with tk.strict():
        out = tk.attention(q, k, v, attn_mask=causal_upper_left(300, 333))
    assert_close_to_reference(out, q, k, v, True, 1 / math.sqrt(128))
    q2 = randn((2, 4, 333, 128), torch.bfloat16)
    with tk.strict():
        out2 = tk.attention(q2, k, v, attn_mask=causal_lower_right(333, 333))
    assert_close_to_reference(out2, q2, k, v, True, 1 / math.sqrt(128))
    # Lq != Lk lower-right, both ways: the kernel with the diagonal offset Lk - Lq (the rows of
    # Lq > Lk that see no key come out 0). test_lower_right_matches_reference covers the space.
    with tk.strict():
        out3 = tk.attention(q, k, v, attn_mask=causal_lower_right(300, 333))
    assert_close_to_reference(out3, q, k, v, True, 1 / math.sqrt(128), lower_right=True)
    q4 = randn((2, 4, 400, 128), torch.bfloat16)
    with tk.strict():
        out4 = tk.attention(q4, k, v, attn_mask=lower_right_bias(400, 333))
    assert_close_to_reference(out4, q4, k, v, True, 1 / math.sqrt(128), lower_right=True)
