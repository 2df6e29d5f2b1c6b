"""tk.matmul on a GPU: correctness against a float64 reference, held to cuBLAS's own error
(DESIGN.md section 6), over square, rectangular and odd sizes, transposed operands, batches
(equal, broadcast either side, 3-D @ 2-D, 2-D @ 3-D, 4-D) and both dtypes; gradients; and the
things kernels get wrong in practice: partial tiles, unwritten output elements, streams, CUDA
graphs, torch.compile, opcheck, other devices, and the op's own input checks.

Tolerance (tests/differential/tolerance.py, the rule of every test): with ``ref`` the float64
product of the same bf16/fp16 inputs, our max-abs error must be <= 2 x the max-abs error of
torch.matmul on the same inputs + one rounding to the dtype at the largest output, and our
relative L2 error <= 2 x torch's + one rounding at the largest output on 32 elements (relative).

Kernel-path tests run only on an sm_90 GPU (the kernel is TMA + wgmma, sm_90a); on other GPUs
they are skipped and the fallback tests check that tk.matmul is torch.matmul there. On an sm_90
GPU, explain naming no kernel fails them (tests/kernel_required.py).
"""

import math
import zlib

import pytest
import torch

import thunderkittens as tk
from differential import tolerance
from fresh_process import run_in_fresh_process
from fresh_thread import call_in_new_thread
from kernel_required import require_kernel, skip_unless_gpu_for

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def kernel():
    skip_unless_gpu_for("matmul", "sm90")
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    require_kernel(tk.explain_matmul(a, a), "matmul", "sm90")


def seeded(*key):
    torch.manual_seed(zlib.crc32(repr(key).encode()))


def randn(shape, dtype, device="cuda"):
    return torch.randn(shape, dtype=dtype, device=device)


def assert_close(out, ref, torch_out, what="output"):
    """``out`` against the float64 ``ref``, within the rule above of torch's own ``torch_out``."""
    assert torch.isfinite(out).all(), f"{what} has NaN/inf"
    tolerance.assert_close(what, out, ref, torch_out)


def assert_close_to_reference(out, a, b):
    assert out.dtype == a.dtype and out.is_contiguous()
    assert_close(out, torch.matmul(a.double(), b.double()), torch.matmul(a, b))


def call_op_on_poisoned_memory(a3, b3, in_new_thread=False):
    """Call the op so that its output lands in memory that was just filled with NaN.

    The caching allocator hands a freed block back to the next request of the same size on the
    same stream; allocating a NaN tensor of the output's size, freeing it and calling the op
    makes the output reuse exactly that block (asserted), so any element the kernel forgets to
    write stays NaN. in_new_thread: the op (only) runs as the first CUDA work of a new thread,
    which then allocates nothing.
    """
    batch = max(a3.shape[0], b3.shape[0])
    poison = torch.full((batch, a3.shape[1], b3.shape[2]), math.nan, dtype=a3.dtype,
                        device=a3.device)
    address = poison.data_ptr()
    del poison

    def op():
        return torch.ops.tk.matmul(a3, b3)

    out = call_in_new_thread(op) if in_new_thread else op()
    assert out.data_ptr() == address, "the output did not reuse the NaN block"
    return out


def tma_readable_2d(m, n, k):
    """Whether contiguous (M, K) @ (K, N) operands can be read by TMA (the op's rule): a row of
    a is K elements, so K % 8 == 0 unless a is one row (M == 1) or one column (K == 1, read
    column-major); likewise b needs N % 8 == 0 unless K == 1 or N == 1."""
    a_ok = m == 1 or k == 1 or k % 8 == 0
    b_ok = k == 1 or n == 1 or n % 8 == 0
    return a_ok and b_ok


def padded_operand(batch, rows, cols, column_major, dtype):
    """A (batch, rows, cols) operand, row-major or column-major, its leading stride rounded up to
    a multiple of 8 elements (what TMA needs) so that odd sizes work in either layout."""
    def pad8(x):
        return -(-x // 8) * 8
    if column_major:
        return randn((batch, cols, pad8(rows)), dtype)[..., :rows].mT
    return randn((batch, rows, pad8(cols)), dtype)[..., :cols]


def dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


# ---- 2-D sizes -----------------------------------------------------------------------------

SQUARE = [(n, n, n) for n in (128, 256, 1024)]
RECTANGULAR = [(256, 1024, 512), (1024, 256, 2048), (128, 4096, 64), (8, 2048, 4096),
               (2048, 8, 4096)]
ODD_SIZES = (1, 17, 1000, 4097)
ODD = [(m, n, k) for m in ODD_SIZES for n in ODD_SIZES for k in ODD_SIZES]
NAMED = [(17, 1000, 4096), (1000, 17, 4096), (4097, 1000, 1024), (1, 4096, 1024),
         (4096, 1, 1024), (1000, 1000, 1000), (4097, 4097, 4096), (100, 200, 8)]
SIZES = list(dict.fromkeys(SQUARE + RECTANGULAR + NAMED + ODD))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_2d_matches_reference(kernel, mnk, dtype):
    m, n, k = mnk
    seeded("2d", mnk, dtype)
    a, b = randn((m, k), dtype), randn((k, n), dtype)
    plan = tk.explain_matmul(a, b)
    if not tma_readable_2d(m, n, k):
        assert str(plan).startswith("fallback torch.matmul: where TMA alignment rules cannot "
                                    "be met"), str(plan)
        out = tk.matmul(a, b)
        assert torch.equal(out, torch.matmul(a, b))
        assert_close_to_reference(out, a, b)
        return
    assert plan.uses_kernel and not plan.copies, str(plan)
    assert (plan.m, plan.n, plan.k, plan.batch) == (m, n, k, 1)
    out = call_op_on_poisoned_memory(a.unsqueeze(0), b.unsqueeze(0))[0]
    assert_close_to_reference(out, a, b)
    with tk.strict():
        public = tk.matmul(a, b)
    assert torch.equal(public, out), "tk.matmul differs from the op it calls"


# ---- split-K and skinny products -----------------------------------------------------------

# Few output tiles and a long K: on a GPU with 132 SMs (H100/H200) the kernel shares each tile's
# K steps among the blocks of a cluster (split-K; 128 x 128 tiles, at least 16 steps each, at
# most 8 shares): 64 tiles x 2 shares, 3 uneven shares (49 steps) with partial tiles in M, N and
# K, 8 shares (15 tiles: the most clusters of 8 that fit), the cap of 8 with 22 wanted, batches.
SPLIT_K = {
    "1000x1000x8192": (1, 1, 1000, 1000, 8192),
    "partial-300x640x3100": (1, 1, 300, 640, 3100),
    "partial-300x640x12000": (1, 1, 300, 640, 12000),
    "deep-130x264x32768": (1, 1, 130, 264, 32768),
    "batched-3x100x256x8192": (3, 3, 100, 256, 8192),
}
# A side of C of at most 64 (decode-size M, or a narrow N) runs on 128 x 64 tiles with that side
# as the short one, or at most 16 / 32 on 128 x 16 / 128 x 32 (thin) tiles when that side's
# operand is K-major (row-major a, column-major b: 17, 24 and 32 take 32-wide tiles); a short M runs swapped (C^T = B^T A^T, C stored transposed from
# registers). Cases: M = 1 and 16 at decode sizes (split 3 ways, and 112 tiles unsplit), K steps
# that do not divide evenly (225 over 3), partial tiles with a K that is not a multiple of 64 (5
# shares; thin: 4 shares of 16-17 steps), a narrow N (natural layout, split and unsplit), both
# sides small, batches, each side broadcast. Over a long K the tiles are 64 rows tall when that
# keeps more SMs busy (16x4096x14336; 64x4096x8192; thin-32 24x4000x8200: 63 tiles, the last
# partial, in 2 uneven shares of 64 and 65 steps).
SKINNY = {
    "decode-1x4096x4096": (1, 1, 1, 4096, 4096),
    "decode-16x14336x4096": (1, 1, 16, 14336, 4096),
    "decode-16x4096x14336": (1, 1, 16, 4096, 14336),
    "uneven-k-33x4096x14344": (1, 1, 33, 4096, 14344),
    "thin-uneven-k-9x3000x4104": (1, 1, 9, 3000, 4104),
    "thin32-decode-32x4096x4104": (1, 1, 32, 4096, 4104),
    "decode-64x1000x3000": (1, 1, 64, 1000, 3000),
    "short-rows-64x4096x8192": (1, 1, 64, 4096, 8192),
    "short-rows-thin32-24x4000x8200": (1, 1, 24, 4000, 8200),
    "narrow-n-4096x16x4096": (1, 1, 4096, 16, 4096),
    "narrow-n-1000x40x520": (1, 1, 1000, 40, 520),
    "both-small-33x24x776": (1, 1, 33, 24, 776),
    "batched-3x17x700x2048": (3, 3, 17, 700, 2048),
    "broadcast-a-4x40x520x1024": (1, 4, 40, 520, 1024),
    "broadcast-b-4x64x512x8192": (4, 1, 64, 512, 8192),
    "broadcast-b-2x8x1000x2048": (2, 1, 8, 1000, 2048),
}


# Each against the reference on poisoned output memory, in every operand layout, and for a
# bitwise-repeatable result (split-K sums its partials in split order whichever block finishes
# first).
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("a_t", [False, True], ids=["a", "a.mT"])
@pytest.mark.parametrize("b_t", [False, True], ids=["b", "b.mT"])
@pytest.mark.parametrize("case", list(SPLIT_K) + list(SKINNY))
def test_split_k_and_skinny_match_reference(kernel, case, a_t, b_t, dtype):
    batch_a, batch_b, m, n, k = {**SPLIT_K, **SKINNY}[case]
    seeded("few-tiles", case, a_t, b_t, dtype)
    a = padded_operand(batch_a, m, k, a_t, dtype)
    b = padded_operand(batch_b, k, n, b_t, dtype)
    out = call_op_on_poisoned_memory(a, b)
    assert_close_to_reference(out, a, b)
    assert torch.equal(torch.ops.tk.matmul(a, b), out), "result not bitwise repeatable"


# ---- transposed operands -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("a_t", [False, True], ids=["a", "a.mT"])
@pytest.mark.parametrize("b_t", [False, True], ids=["b", "b.mT"])
@pytest.mark.parametrize("mnk", [(1000, 1000, 1000), (256, 4096, 512), (4096, 264, 1000),
                                 (136, 8, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_transposed_views_are_read_in_place(kernel, mnk, a_t, b_t, dtype):
    m, n, k = mnk
    seeded("transposed", mnk, a_t, b_t, dtype)
    a = randn((k, m), dtype).mT if a_t else randn((m, k), dtype)
    b = randn((n, k), dtype).mT if b_t else randn((k, n), dtype)
    plan = tk.explain_matmul(a, b)
    assert plan.uses_kernel and not plan.copies, str(plan)
    assert (plan.a_layout, plan.b_layout) == ("col" if a_t else "row", "col" if b_t else "row")
    out = call_op_on_poisoned_memory(a.unsqueeze(0), b.unsqueeze(0))[0]
    assert_close_to_reference(out, a, b)
    with tk.strict():
        assert torch.equal(tk.matmul(a, b), out)


def test_linear_layout_x_at_w_transposed(kernel):
    seeded("linear")
    x, w = randn((4, 333, 1024), torch.bfloat16), randn((4096, 1024), torch.bfloat16)
    plan = tk.explain_matmul(x, w.mT)
    assert str(plan) == ("kernel tk.matmul [sm90 wgmma] bf16 1332x4096x1024 a=row b=col "
                         "(a's batch of 4 folded into M)")
    with tk.strict():
        out = tk.matmul(x, w.mT)
    assert out.shape == (4, 333, 4096)
    assert_close_to_reference(out, x, w.mT)


# ---- batches -------------------------------------------------------------------------------

BATCHED = {
    "equal batch": ((4, 1000, 512), (4, 512, 264)),
    "equal batch odd M/N": ((3, 17, 1024), (3, 1024, 1000)),
    "a batch 1": ((1, 257, 512), (5, 512, 136)),
    "b batch 1": ((5, 257, 512), (1, 512, 136)),
    "3-D @ 2-D": ((6, 100, 256), (256, 520)),
    "2-D @ 3-D": ((100, 256), (6, 256, 520)),
    "4-D": ((2, 3, 129, 64), (2, 3, 64, 200)),
    "4-D @ 2-D": ((2, 3, 129, 64), (64, 200)),
    "2-D @ 4-D": ((129, 64), (2, 3, 64, 200)),
    "4-D broadcast 1x1": ((1, 1, 129, 64), (2, 3, 64, 200)),
    "many small": ((512, 17, 64), (512, 64, 24)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", list(BATCHED))
def test_batched_matches_reference(kernel, case, dtype):
    a_shape, b_shape = BATCHED[case]
    seeded("batched", case, dtype)
    a, b = randn(a_shape, dtype), randn(b_shape, dtype)
    plan = tk.explain_matmul(a, b)
    assert plan.uses_kernel and not plan.copies, str(plan)
    with tk.strict():
        out = tk.matmul(a, b)
    assert out.shape == torch.matmul(a, b).shape
    assert_close_to_reference(out, a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_batched_transposed_and_broadcast(kernel, dtype):
    seeded("batched-transposed", dtype)
    a = randn((4, 512, 264), dtype).mT          # (4, 264, 512) column-major
    b = randn((1, 200, 512), dtype).mT          # (1, 512, 200) column-major, broadcast
    plan = tk.explain_matmul(a, b)
    assert str(plan) == (f"kernel tk.matmul [sm90 wgmma] {'bf16' if dtype == torch.bfloat16 else 'fp16'} "
                         "(B=4, b broadcast) 264x200x512 a=col b=col")
    out = call_op_on_poisoned_memory(a, b)
    assert_close_to_reference(out, a, b)


def test_copied_operands(kernel):
    seeded("copies")
    a = randn((512, 256, 2), torch.bfloat16)[..., 0]     # strides (512, 2): no contiguous dim
    b = randn((256, 300), torch.bfloat16)[:, :264]        # row stride 300: not a multiple of 8
    assert tk.explain_matmul(a, b).copies == ("a", "b")
    with tk.strict():
        out = tk.matmul(a, b)
    assert_close_to_reference(out, a, b)
    flat = randn((512 * 256 + 3,), torch.bfloat16)
    misaligned = flat[3:].view(512, 256)
    assert tk.explain_matmul(misaligned, b).copies == ("a", "b")
    with tk.strict():
        assert_close_to_reference(tk.matmul(misaligned, b), misaligned, b)


# ---- gradients -----------------------------------------------------------------------------

GRAD_CASES = {
    "2-D": lambda dtype: (randn((512, 256), dtype), randn((256, 1000), dtype)),
    "a.mT @ b.mT": lambda dtype: (randn((256, 512), dtype).mT, randn((1000, 256), dtype).mT),
    "odd M": lambda dtype: (randn((1001, 256), dtype), randn((256, 136), dtype)),
    "a broadcast (2-D @ 3-D)": lambda dtype: (randn((300, 256), dtype), randn((4, 256, 512), dtype)),
    "b broadcast (3-D @ 2-D)": lambda dtype: (randn((4, 300, 256), dtype), randn((256, 512), dtype)),
    "b batch 1, a column-major": lambda dtype: (randn((4, 256, 304), dtype).mT,
                                                randn((1, 256, 512), dtype)),
    "4-D": lambda dtype: (randn((2, 3, 129, 64), dtype), randn((2, 3, 64, 200), dtype)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradients_match_reference(kernel, case, dtype):
    seeded("grad", case, dtype)
    a, b = GRAD_CASES[case](dtype)
    a.requires_grad_()
    b.requires_grad_()
    assert tk.explain_matmul(a, b).uses_kernel
    with tk.strict():  # forward and both gradients on the kernel path
        out = tk.matmul(a, b)
        grad_out = torch.randn_like(out)
        grad_a, grad_b = torch.autograd.grad(out, (a, b), grad_out)
    torch_grad_a, torch_grad_b = torch.autograd.grad(torch.matmul(a, b), (a, b), grad_out)
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    ref_grad_a, ref_grad_b = torch.autograd.grad(torch.matmul(a64, b64), (a64, b64),
                                                 grad_out.double())
    assert grad_a.dtype == dtype and grad_b.dtype == dtype
    assert_close(grad_a, ref_grad_a, torch_grad_a, "grad a")
    assert_close(grad_b, ref_grad_b, torch_grad_b, "grad b")


def test_first_cuda_call_of_a_new_thread(kernel):
    """The op as the first CUDA work of a fresh thread, on a shape no other test uses (so its
    tensor maps are encoded there, not served from the cache), with its output block freed
    beforehand (so the thread makes no allocation that would set up its context first)."""
    seeded("thread")
    a, b = randn((777, 264), torch.bfloat16), randn((264, 520), torch.bfloat16)
    out = call_op_on_poisoned_memory(a.unsqueeze(0), b.unsqueeze(0), in_new_thread=True)[0]
    assert_close_to_reference(out, a, b)


def test_gradient_of_one_operand_only(kernel):
    seeded("grad-one")
    a = randn((256, 512), torch.bfloat16).requires_grad_()
    w = randn((512, 128), torch.bfloat16)
    with tk.strict():
        tk.matmul(a, w).float().sum().backward()
    assert w.grad is None and a.grad is not None
    expected = torch.ones(256, 128, dtype=torch.float64, device="cuda") @ w.double().T
    assert_close(a.grad, expected, (torch.ones(256, 128, dtype=torch.bfloat16, device="cuda")
                                    @ w.T), "grad a")


# ---- devices, streams, graphs, compile, opcheck --------------------------------------------


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device(kernel):
    seeded("device1")
    with torch.cuda.device(0):
        a = randn((1000, 512), torch.bfloat16, device="cuda:1")
        b = randn((512, 264), torch.bfloat16, device="cuda:1")
        with tk.strict():
            out = tk.matmul(a, b)
        assert out.device == torch.device("cuda:1")
    torch.cuda.synchronize(1)
    assert_close_to_reference(out, a, b)


def test_runs_on_the_current_stream(kernel):
    seeded("stream")
    a, b = randn((2048, 2048), torch.bfloat16), randn((2048, 1024), torch.bfloat16)
    a_new = randn(a.shape, torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # The side stream is busy for a while before a is overwritten; a kernel launched on any
        # other stream would read the old a.
        torch.cuda._sleep(100_000_000)
        a.copy_(a_new)
        with tk.strict():
            out = tk.matmul(a, b)
    torch.cuda.current_stream().wait_stream(side)
    assert_close_to_reference(out, a_new, b)


def test_cuda_graph_capture_and_replay(kernel):
    seeded("graph")
    a, b = randn((3, 777, 512), torch.float16), randn((512, 1000), torch.float16).mT.contiguous().mT
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), tk.strict():
        tk.matmul(a, b)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), tk.strict():
        static_out = tk.matmul(a, b)
    for _ in range(3):
        for t in (a, b):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(static_out, a, b)
        with tk.strict():
            assert torch.equal(static_out, tk.matmul(a, b))


# A split product's first call in a process, inside a CUDA graph capture: the launch asks the
# driver once how many clusters fit (cached per device), and the split launch itself is a
# cluster launch; both must be legal under capture. A fresh process, so nothing is cached yet.
FIRST_CALL_IN_A_GRAPH = """
    import torch, thunderkittens as tk
    from differential.tolerance import assert_close
    torch.manual_seed(0)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(1000, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 1000, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), tk.strict():
        thin, narrow = tk.matmul(x, w.mT), tk.matmul(a, b)
    for _ in range(2):
        for t in (x, w, a, b):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        for out, p, q in ((thin, x, w.mT), (narrow, a, b)):
            ref = p.double() @ q.double()
            assert_close("output", out, ref, p @ q)  # the rule of every test
    print("ok")
"""


def test_split_products_first_called_inside_a_graph_capture(kernel):
    result = run_in_fresh_process(FIRST_CALL_IN_A_GRAPH)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


def test_torch_compile_fullgraph_matches_eager(kernel):
    torch._dynamo.reset()
    seeded("compile")

    def f(x, w):
        return tk.matmul(x, w.mT) * 2

    x, w = randn((4, 1000, 1024), torch.bfloat16), randn((2048, 1024), torch.bfloat16)
    with tk.strict():
        eager = f(x, w)
        compiled = torch.compile(f, fullgraph=True)(x, w)
    assert torch.equal(compiled, eager)
    torch._dynamo.reset()


def test_torch_compile_backward_matches_eager(kernel):
    torch._dynamo.reset()
    seeded("compile-backward")

    def f(x, w):
        return tk.matmul(x, w).float().square().mean()

    x, w = randn((2, 256, 512), torch.bfloat16), randn((512, 264), torch.bfloat16)
    grads = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        with tk.strict():
            fn(xg, wg).backward()
        grads.append((xg.grad, wg.grad))
    torch.testing.assert_close(grads[1][0], grads[0][0])
    torch.testing.assert_close(grads[1][1], grads[0][1])
    torch._dynamo.reset()


@pytest.mark.parametrize("make", [
    pytest.param(lambda: (randn((1, 129, 64), torch.bfloat16), randn((1, 64, 200), torch.bfloat16)),
                 id="2-D as 3-D"),
    pytest.param(lambda: (randn((1, 129, 64), torch.bfloat16), randn((3, 64, 200), torch.bfloat16)),
                 id="broadcast a"),
    pytest.param(lambda: (randn((3, 129, 64), torch.float16), randn((1, 64, 200), torch.float16)),
                 id="broadcast b"),
    pytest.param(lambda: (randn((2, 64, 136), torch.bfloat16).mT,
                          randn((2, 200, 64), torch.bfloat16).mT), id="transposed"),
])
def test_opcheck(kernel, make):
    seeded("opcheck")
    a, b = make()
    torch.library.opcheck(torch.ops.tk.matmul.default, (a.requires_grad_(), b.requires_grad_()))


# ---- the op's own checks (direct callers of torch.ops.tk.matmul) ---------------------------


def _direct(a=None, b=None):
    a = a if a is not None else randn((1, 64, 32), torch.bfloat16)
    b = b if b is not None else randn((1, 32, 48), torch.bfloat16)
    return torch.ops.tk.matmul(a, b)


@pytest.mark.parametrize("make, message", [
    (lambda: _direct(a=randn((1, 64, 17), torch.bfloat16), b=randn((1, 17, 48), torch.bfloat16)),
     "a must be row-major"),
    (lambda: _direct(b=randn((1, 32, 17), torch.bfloat16)), "b must be row-major"),
    (lambda: _direct(a=randn((1, 64, 32), torch.bfloat16, device="cpu")), "a must be a CUDA tensor"),
    (lambda: _direct(a=randn((64, 32), torch.bfloat16)), "a must be 3-D"),
    (lambda: _direct(a=randn((1, 64, 32), torch.float32), b=randn((1, 32, 48), torch.float32)),
     "a must be bfloat16 or float16"),
    (lambda: _direct(b=randn((1, 32, 48), torch.float16)), "b has dtype"),
    (lambda: _direct(a=randn((2, 64, 32), torch.bfloat16), b=randn((3, 32, 48), torch.bfloat16)),
     "batch sizes must be equal or 1"),
    (lambda: _direct(b=randn((1, 16, 48), torch.bfloat16)), "must equal b's second-to-last dim"),
    (lambda: _direct(a=randn((64 * 32 + 1,), torch.bfloat16)[1:].view(1, 64, 32)),
     "data pointer must be 16-byte aligned"),
    (lambda: _direct(a=randn((1, 0, 32), torch.bfloat16)), "must not be empty"),
])
def test_op_rejects_bad_inputs(kernel, make, message):
    with pytest.raises(RuntimeError, match=message):
        make()


# ---- fallbacks on the GPU ------------------------------------------------------------------


@pytest.mark.parametrize("make, reason, decided_on_hopper_only", [
    (lambda: (randn((64, 32), torch.float32), randn((32, 48), torch.float32)),
     "dtype torch.float32 is not supported", False),
    (lambda: (randn((64,), torch.bfloat16), randn((64, 48), torch.bfloat16)), "a is 1-D", False),
    (lambda: (randn((64, 17), torch.bfloat16), randn((17, 48), torch.bfloat16)),
     "where TMA alignment rules cannot be met", True),
    (lambda: (randn((2, 1, 64, 32), torch.bfloat16), randn((1, 3, 32, 48), torch.bfloat16)),
     "neither all of them nor all 1", True),
])
def test_fallbacks_give_torch_matmul_answer(request, make, reason, decided_on_hopper_only):
    if decided_on_hopper_only:  # elsewhere the GPU itself is the reason
        request.getfixturevalue("kernel")
    seeded("fallback", reason)
    a, b = make()
    plan = tk.explain_matmul(a, b)
    assert not plan.uses_kernel and reason in plan.reason, str(plan)
    assert torch.equal(tk.matmul(a, b), torch.matmul(a, b))
    with tk.strict(), pytest.raises(tk.FallbackError, match=reason):
        tk.matmul(a, b)


def test_non_hopper_gpu_is_torch_matmul():
    if torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("an sm_90 GPU runs the kernel")
    a, b = randn((256, 512), torch.bfloat16), randn((512, 128), torch.bfloat16)
    plan = tk.explain_matmul(a, b)
    assert not plan.uses_kernel
    if "matmul" in tk.BUILT_OPS:
        assert "the matmul kernel needs an sm_90 (Hopper) GPU" in plan.reason
    assert torch.equal(tk.matmul(a, b), torch.matmul(a, b))
