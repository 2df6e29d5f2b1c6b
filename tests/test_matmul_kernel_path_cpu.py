"""The kernel path of tk.matmul, run on the CPU against a stand-in of the op (see the
``cpu_matmul`` fixture in conftest.py): which views, layouts and copies the op is handed for
each of torch.matmul's shape cases, the fallback reasons, strict mode, the registered autograd
formula, torch.compile(fullgraph=True) tracing, and opcheck of the schema, fake implementation
and autograd registration against a real implementation."""

import re

import pytest
import torch

import thunderkittens as tk
from thunderkittens import _extension
from thunderkittens._matmul import layout


def bf16(*shape, requires_grad=False):
    return torch.randn(*shape, dtype=torch.bfloat16, requires_grad=requires_grad)


def assert_matches_reference(out, a, b):
    expected = torch.matmul(a.detach().double(), b.detach().double())
    assert out.shape == expected.shape and out.dtype == a.dtype
    assert out.is_contiguous()
    # The stand-in computes in float64 and rounds once: within half a bf16 ulp.
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=2 ** -8)


def explain(a, b):
    return str(tk.explain_matmul(a, b))


# ---- shapes: what the op is handed ---------------------------------------------------------


def test_2d_is_one_batch_without_copies(cpu_matmul):
    a, b = bf16(64, 32), bf16(32, 48)
    out = tk.matmul(a, b)
    (call,) = cpu_matmul.calls
    assert call["a"].shape == (1, 64, 32) and call["a"].data_ptr() == a.data_ptr()
    assert call["b"].shape == (1, 32, 48) and call["b"].data_ptr() == b.data_ptr()
    assert explain(a, b) == "kernel tk.matmul [sm90 wgmma] bf16 64x48x32 a=row b=row"
    assert_matches_reference(out, a, b)


@pytest.mark.parametrize("a_t", [False, True], ids=["a", "a.mT"])
@pytest.mark.parametrize("b_t", [False, True], ids=["b", "b.mT"])
def test_transposed_views_are_read_in_place(cpu_matmul, a_t, b_t):
    a = bf16(32, 64).mT if a_t else bf16(64, 32)
    b = bf16(48, 32).mT if b_t else bf16(32, 48)
    out = tk.matmul(a, b)
    (call,) = cpu_matmul.calls
    assert call["layouts"] == ("col" if a_t else "row", "col" if b_t else "row")
    assert call["a"].data_ptr() == a.data_ptr() and call["b"].data_ptr() == b.data_ptr()
    assert explain(a, b) == (f"kernel tk.matmul [sm90 wgmma] bf16 64x48x32 "
                             f"a={'col' if a_t else 'row'} b={'col' if b_t else 'row'}")
    assert_matches_reference(out, a, b)


def test_equal_batch(cpu_matmul):
    a, b = bf16(4, 64, 32), bf16(4, 32, 48)
    out = tk.matmul(a, b)
    (call,) = cpu_matmul.calls
    assert call["a"].shape == (4, 64, 32) and call["b"].shape == (4, 32, 48)
    assert explain(a, b) == "kernel tk.matmul [sm90 wgmma] bf16 (B=4) 64x48x32 a=row b=row"
    assert_matches_reference(out, a, b)


@pytest.mark.parametrize("a_shape", [(1, 64, 32), (64, 32)], ids=["3-D batch 1", "2-D"])
def test_a_broadcast_over_the_batch(cpu_matmul, a_shape):
    a, b = bf16(*a_shape), bf16(4, 32, 48).mT.contiguous().mT  # b column-major, batched
    out = tk.matmul(a, b)
    (call,) = cpu_matmul.calls
    assert call["a"].shape == (1, 64, 32) and call["b"].shape == (4, 32, 48)
    assert call["b"].data_ptr() == b.data_ptr()
    assert explain(a, b) == \
        "kernel tk.matmul [sm90 wgmma] bf16 (B=4, a broadcast) 64x48x32 a=row b=col"
    assert_matches_reference(out, a, b)


@pytest.mark.parametrize("b_shape", [(1, 32, 48), (32, 48)], ids=["3-D batch 1", "2-D"])
def test_b_broadcast_folds_a_batch_into_rows(cpu_matmul, b_shape):
    a, b = bf16(4, 64, 32), bf16(*b_shape)
    out = tk.matmul(a, b)
    (call,) = cpu_matmul.calls
    assert call["a"].shape == (1, 256, 32) and call["a"].data_ptr() == a.data_ptr()
    assert explain(a, b) == ("kernel tk.matmul [sm90 wgmma] bf16 256x48x32 a=row b=row "
                             "(a's batch of 4 folded into M)")
    assert out.shape == (4, 64, 48)
    assert_matches_reference(out, a, b)


def test_b_broadcast_without_fold_when_a_batch_is_not_above_its_rows(cpu_matmul):
    a = bf16(4, 32, 64).mT  # (4, 64, 32), column-major: batch and rows do not merge
    b = bf16(32, 48)
    out = tk.matmul(a, b)
    (call,) = cpu_matmul.calls
    assert call["a"].shape == (4, 64, 32) and call["b"].shape == (1, 32, 48)
    assert explain(a, b) == \
        "kernel tk.matmul [sm90 wgmma] bf16 (B=4, b broadcast) 64x48x32 a=col b=row"
    assert_matches_reference(out, a, b)


@pytest.mark.parametrize("a_shape, b_shape, op_a, op_b", [
    ((2, 3, 64, 32), (2, 3, 32, 48), (6, 64, 32), (6, 32, 48)),
    ((2, 3, 64, 32), (32, 48), (1, 384, 32), (1, 32, 48)),
    ((2, 3, 64, 32), (1, 1, 32, 48), (1, 384, 32), (1, 32, 48)),
    ((64, 32), (2, 3, 32, 48), (1, 64, 32), (6, 32, 48)),
    ((1, 1, 64, 32), (2, 3, 32, 48), (1, 64, 32), (6, 32, 48)),
    ((5, 2, 1, 64, 32), (5, 2, 1, 32, 48), (10, 64, 32), (10, 32, 48)),
    ((2, 2, 2, 2, 64, 32), (32, 48), (1, 1024, 32), (1, 32, 48)),
])
def test_nd_batch_dims_are_flattened_with_views(cpu_matmul, a_shape, b_shape, op_a, op_b):
    a, b = bf16(*a_shape), bf16(*b_shape)
    out = tk.matmul(a, b)
    (call,) = cpu_matmul.calls
    assert call["a"].shape == op_a and call["b"].shape == op_b
    assert call["a"].data_ptr() == a.data_ptr() and call["b"].data_ptr() == b.data_ptr()
    assert "copies" not in explain(a, b)
    assert_matches_reference(out, a, b)


@pytest.mark.parametrize("a_shape, b_shape, reason", [
    ((2, 3, 64, 32), (3, 32, 48), r"batch dims of b \(3,\) broadcast .* to \(2, 3\) but are "
                                  "neither all of them nor all 1"),
    ((2, 1, 64, 32), (1, 3, 32, 48), r"batch dims of a \(2, 1\) .* neither all of them nor all 1"),
])
def test_partial_batch_broadcast_falls_back(cpu_matmul, a_shape, b_shape, reason):
    a, b = bf16(*a_shape), bf16(*b_shape)
    assert not tk.explain_matmul(a, b).uses_kernel
    assert re.search(reason, explain(a, b)), explain(a, b)
    out = tk.matmul(a, b)
    assert not cpu_matmul.calls
    assert torch.equal(out, torch.matmul(a, b))


def test_batch_dims_that_do_not_merge_fall_back(cpu_matmul):
    a = bf16(3, 2, 64, 32).transpose(0, 1)  # (2, 3, 64, 32), batch strides (2048, 4096)
    b = bf16(2, 3, 32, 48)
    assert "batch dims of a (2, 3) (strides (2048, 4096)) cannot be flattened into one batch " \
           "dim without a copy" in explain(a, b)
    assert torch.equal(tk.matmul(a, b), torch.matmul(a, b))
    assert not cpu_matmul.calls


def test_expanded_batch_is_read_as_batch_one(cpu_matmul):
    a, w = bf16(4, 64, 32), bf16(32, 48)
    b = w.expand(4, 32, 48)  # batch stride 0: one matrix repeated
    out = tk.matmul(a, b)
    (call,) = cpu_matmul.calls
    assert call["b"].shape == (1, 32, 48) and call["b"].data_ptr() == w.data_ptr()
    assert "copies" not in explain(a, b)
    assert_matches_reference(out, a, b)


def test_expanded_rows_are_copied(cpu_matmul):
    a = bf16(1, 32).expand(64, 32)  # row stride 0
    b = bf16(32, 48)
    assert explain(a, b).endswith("(copies a with .contiguous())")
    out = tk.matmul(a, b)
    assert cpu_matmul.calls[0]["a"].stride() == (2048, 32, 1)
    assert_matches_reference(out, a, b)


def test_output_is_the_op_output_viewed(cpu_matmul):
    a, b = bf16(2, 3, 64, 32), bf16(2, 3, 32, 48)
    out = tk.matmul(a, b)
    assert out.shape == (2, 3, 64, 48) and out.is_contiguous()
    assert out._base is not None and out._base.shape == (6, 64, 48)


# ---- copies and alignment ------------------------------------------------------------------


@pytest.mark.parametrize("make, why", [
    (lambda: bf16(64, 64)[:, ::2], "every other column: no contiguous dim"),
    (lambda: bf16(64, 36)[:, :32], "row stride 36 is not a multiple of 8"),
    (lambda: bf16(64 * 32 + 3)[3:].view(64, 32), "data pointer not 16-byte aligned"),
    (lambda: bf16(64, 32, 2)[..., 0], "a strided slice: strides (64, 2)"),
])
def test_unreadable_operand_is_copied_once(cpu_matmul, make, why):
    a, b = make(), bf16(32, 48)
    assert explain(a, b).endswith("(copies a with .contiguous())"), why
    out = tk.matmul(a, b)
    passed = cpu_matmul.calls[0]["a"]
    assert passed.is_contiguous() and passed.data_ptr() % 16 == 0, why
    assert_matches_reference(out, a, b)


def test_sliced_columns_with_aligned_row_stride_are_not_copied(cpu_matmul):
    a = bf16(64, 40)[:, :32]  # row stride 40 = 5 * 8
    tk.matmul(a, bf16(32, 48))
    assert cpu_matmul.calls[0]["a"].stride()[1:] == (40, 1)


@pytest.mark.parametrize("m, n, k, rule", [
    (64, 48, 17, "a (M=64, K=17, batch 1) cannot be read as row- or column-major"),
    (64, 17, 32, "b (K=32, N=17, batch 1) cannot be read as row- or column-major"),
    (64, 48, 4097, "that needs K % 8 == 0"),
    (64, 1000 + 1, 1000, "that needs N % 8 == 0"),
])
def test_tma_alignment_rules_that_cannot_be_met_fall_back(cpu_matmul, m, n, k, rule):
    a, b = bf16(m, k), bf16(k, n)
    text = explain(a, b)
    assert text.startswith("fallback torch.matmul: where TMA alignment rules cannot be met, "
                           "torch.matmul is used: ")
    assert rule in text
    assert torch.equal(tk.matmul(a, b), torch.matmul(a, b))
    assert not cpu_matmul.calls


@pytest.mark.parametrize("m, n, k, layouts", [
    (1, 48, 17, ("row", "row")),    # a single row needs no row stride
    (64, 1, 32, ("row", "col")),    # a single column of b is column-major
    (64, 48, 1, ("col", "row")),    # K = 1: a is one column, b one row
    (1, 1, 1, ("row", "row")),
    (17, 1000, 1000, ("row", "row")),
])
def test_odd_sizes_the_kernel_can_read(cpu_matmul, m, n, k, layouts):
    a, b = bf16(m, k), bf16(k, n)
    out = tk.matmul(a, b)
    assert cpu_matmul.calls[0]["layouts"] == layouts
    assert "copies" not in explain(a, b)
    assert_matches_reference(out, a, b)


# ---- fallback reasons on a kernel-capable device -------------------------------------------


def reason(a, b):
    plan_ = tk.explain_matmul(a, b)
    assert not plan_.uses_kernel
    return plan_.reason


def test_reason_dtype(cpu_matmul):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    assert reason(a, b) == ("dtype torch.float32 is not supported by the kernel "
                            "(bfloat16 and float16 only)")


@pytest.mark.parametrize("a_shape, b_shape, which", [((8,), (8, 16), "a"), ((16, 8), (8,), "b"),
                                                     ((8,), (2, 8, 16), "a")])
def test_reason_1d(cpu_matmul, a_shape, b_shape, which):
    a, b = bf16(*a_shape), bf16(*b_shape)
    assert reason(a, b).startswith(f"{which} is 1-D")
    assert torch.equal(tk.matmul(a, b), torch.matmul(a, b))


@pytest.mark.parametrize("a_shape, b_shape", [((0, 8), (8, 16)), ((8, 0), (0, 16)),
                                              ((8, 8), (8, 0)), ((0, 8, 8), (8, 8))])
def test_reason_empty(cpu_matmul, a_shape, b_shape):
    a, b = bf16(*a_shape), bf16(*b_shape)
    assert "empty operand" in reason(a, b)
    assert torch.equal(tk.matmul(a, b), torch.matmul(a, b))


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_reason_not_hopper(cpu_matmul, capability):
    cpu_matmul.set_capability(capability)
    a, b = bf16(64, 32), bf16(32, 48)
    gpu = f"sm_{capability[0]}{capability[1]}"
    assert reason(a, b) == (f"the matmul kernel needs an sm_90 (Hopper) GPU, this one is {gpu}; "
                            "on other GPUs tk.matmul is torch.matmul (cuBLAS)")
    assert torch.equal(tk.matmul(a, b), torch.matmul(a, b))


def test_reason_op_family_not_built(cpu_matmul, monkeypatch):
    monkeypatch.setattr(_extension, "BUILT_OPS", frozenset({"attention"}))
    assert "matmul op family was not compiled into this build (families built: attention)" in \
        reason(bf16(64, 32), bf16(32, 48))


def test_reason_no_sm90a_code(cpu_matmul, monkeypatch):
    # sm_80 machine code and even sm_90 PTX cannot hold wgmma: only a 90a target can.
    monkeypatch.setattr(_extension, "_TARGETS", ((8, 0, "", False), (9, 0, "", True)))
    assert "this build has no sm_90a code" in reason(bf16(64, 32), bf16(32, 48))
    assert "TK_CUDA_ARCHS=90a" in reason(bf16(64, 32), bf16(32, 48))


def test_strict_raises_on_kernel_capable_device_too(cpu_matmul):
    with tk.strict():
        tk.matmul(bf16(64, 32), bf16(32, 48))  # kernel path: no error
        with pytest.raises(tk.FallbackError, match="where TMA alignment rules cannot be met"):
            tk.matmul(bf16(64, 17), bf16(17, 48))


# ---- autograd ------------------------------------------------------------------------------


def reference_grads(a, b, grad_out):
    a64 = a.detach().double().requires_grad_(a.requires_grad)
    b64 = b.detach().double().requires_grad_(b.requires_grad)
    torch.matmul(a64, b64).backward(grad_out.double())
    return a64.grad, b64.grad


GRAD_CASES = {
    "2-D": lambda: (bf16(64, 32), bf16(32, 48)),
    "a.mT @ b.mT": lambda: (bf16(32, 64).mT, bf16(48, 32).mT),
    "batched": lambda: (bf16(3, 64, 32), bf16(3, 32, 48)),
    "a broadcast": lambda: (bf16(64, 32), bf16(3, 32, 48)),
    "b broadcast (folded)": lambda: (bf16(3, 64, 32), bf16(1, 32, 48)),
    "b broadcast (not folded)": lambda: (bf16(3, 32, 64).mT, bf16(32, 48)),
    "4-D": lambda: (bf16(2, 3, 64, 32), bf16(2, 3, 32, 48)),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradients_match_reference(cpu_matmul, case):
    a, b = GRAD_CASES[case]()
    a.requires_grad_()
    b.requires_grad_()
    out = tk.matmul(a, b)
    grad_out = torch.randn(out.shape, dtype=out.dtype)
    out.backward(grad_out)
    assert len(cpu_matmul.calls) == 3, "forward, grad_a and grad_b all on the kernel path"
    ref_a, ref_b = reference_grads(a, b, grad_out)
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    # Each grad is one bf16 rounding of an exact sum, except broadcast ones (a sum of B
    # rounded products): a few bf16 ulps of the largest value.
    for grad, ref in ((a.grad, ref_a), (b.grad, ref_b)):
        torch.testing.assert_close(grad.double(), ref, atol=4 * 2 ** -8 * ref.abs().max().item(),
                                   rtol=0)


def test_gradient_views_need_no_copies(cpu_matmul):
    a, b = bf16(64, 32, requires_grad=True), bf16(32, 48, requires_grad=True)
    out = tk.matmul(a, b)
    out.backward(torch.randn(64, 48, dtype=torch.bfloat16))
    forward, grad_a, grad_b = cpu_matmul.calls
    assert grad_a["layouts"] == ("row", "col") and grad_a["b"].data_ptr() == b.data_ptr()
    assert grad_b["layouts"] == ("col", "row") and grad_b["a"].data_ptr() == a.data_ptr()


@pytest.mark.parametrize("which", ["a", "b"])
def test_only_needed_gradients_are_computed(cpu_matmul, which):
    a, b = bf16(64, 32, requires_grad=which == "a"), bf16(32, 48, requires_grad=which == "b")
    tk.matmul(a, b).sum().backward()
    assert len(cpu_matmul.calls) == 2
    assert (a.grad is not None) == (which == "a") and (b.grad is not None) == (which == "b")


def test_no_grad_mode_still_takes_the_kernel(cpu_matmul):
    a, b = bf16(64, 32, requires_grad=True), bf16(32, 48)
    with torch.no_grad():
        out = tk.matmul(a, b)
    assert not out.requires_grad and len(cpu_matmul.calls) == 1


# ---- torch.compile and opcheck -------------------------------------------------------------


def graph_targets(counter):
    return [str(node.target) for graph in counter.graphs for node in graph.graph.nodes
            if node.op == "call_function"]


def test_compile_fullgraph_matches_eager(cpu_matmul):
    from torch._dynamo.testing import CompileCounterWithBackend

    def f(x, w):
        return tk.matmul(x, w.mT) * 2

    x, w = bf16(4, 64, 32), bf16(48, 32)
    eager = f(x, w)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    assert torch.equal(compiled(x, w), eager)
    assert counter.frame_count == 1
    assert graph_targets(counter).count("tk.matmul.default") == 1  # the path choice left no trace


def test_compile_with_backward_matches_eager(cpu_matmul):
    def f(x, w):
        return tk.matmul(x, w).float().square().sum()

    x, w = bf16(3, 64, 32), bf16(32, 48)
    grads = []
    for fn in (f, torch.compile(f, backend="aot_eager", fullgraph=True)):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(xg, wg).backward()
        grads.append((xg.grad, wg.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_compile_fallback_path_matches_eager(cpu_matmul):
    def f(a, b):
        return tk.matmul(a, b)

    a, b = bf16(64, 17), bf16(17, 48)  # K % 8 != 0: torch.matmul
    assert torch.equal(torch.compile(f, backend="aot_eager", fullgraph=True)(a, b), f(a, b))
    assert not cpu_matmul.calls


def test_compile_dynamic_shapes(cpu_matmul):
    def f(a, b):
        return tk.matmul(a, b)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=True)
    for m, n in ((64, 48), (40, 56), (100, 8)):
        a, b = bf16(2, m, 32), bf16(2, 32, n)
        assert torch.equal(compiled(a, b), f(a, b))


@pytest.mark.parametrize("a, b", [
    pytest.param(lambda: bf16(1, 64, 32), lambda: bf16(1, 32, 48), id="2-D as 3-D"),
    pytest.param(lambda: bf16(1, 64, 32), lambda: bf16(3, 32, 48), id="broadcast a"),
    pytest.param(lambda: bf16(3, 64, 32), lambda: bf16(1, 32, 48), id="broadcast b"),
    pytest.param(lambda: bf16(2, 32, 64).mT, lambda: bf16(2, 48, 32).mT, id="transposed"),
])
def test_opcheck(cpu_matmul, a, b):
    torch.library.opcheck(torch.ops.tk.matmul.default,
                          (a().requires_grad_(), b().requires_grad_()))


def test_dims_beyond_int32_fall_back(cpu_matmul):
    # Expanded views: huge shapes without the memory. The op takes 32-bit dims.
    a = bf16(1, 1, 32).expand(2**31, 1, 32)
    b = bf16(1, 32, 8).expand(2**31, 32, 8)
    assert "beyond 2^31 - 1" in reason(a, b)


def test_fold_stays_within_int32(cpu_matmul, monkeypatch):
    monkeypatch.setattr(layout, "MAX_DIM", 255)
    a, b = bf16(4, 64, 32), bf16(32, 48)
    assert tk.explain_matmul(a, b).folded_batch == 1 and tk.explain_matmul(a, b).batch == 4
    monkeypatch.setattr(layout, "MAX_DIM", 256)
    assert tk.explain_matmul(a, b).folded_batch == 4
