"""Autograd through tk.attention's kernel path, run on the CPU against stand-ins of the sm90
forward and backward ops (the ``cpu_kernel`` fixture in conftest.py; the backward stand-in
computes float64 reference gradients): the backward op is called once with the tensors the
forward saved, gradients reach the user's original tensors through the views tk.attention
made (transposed, 3-D, 5-D, copied inputs), GQA gradient shapes, torch.compile(fullgraph=True)
of forward + backward, and opcheck of tk::attention_bwd_sm90 and of the forward's autograd
registration."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

import thunderkittens as tk


def bf16(*shape, requires_grad=True):
    return torch.randn(*shape, dtype=torch.bfloat16, requires_grad=requires_grad)


def reference_grads(tensors, grad_out, **kwargs):
    """Float64 gradients of F.scaled_dot_product_attention with respect to ``tensors``."""
    copies = [t.detach().double().requires_grad_() for t in tensors]
    out = F.scaled_dot_product_attention(*copies, **kwargs)
    return out, torch.autograd.grad(out, copies, grad_out.double())


def assert_grads_match(tensors, grad_out, **kwargs):
    expected_out, expected = reference_grads(tensors, grad_out, **kwargs)
    for name, t, ref in zip(("query", "key", "value"), tensors, expected):
        assert t.grad is not None, f"{name} got no gradient"
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype, name
        torch.testing.assert_close(t.grad.double(), ref, atol=3e-2, rtol=3e-2, msg=name)
    return expected_out


def test_backward_calls_the_op_once_with_the_saved_tensors(cpu_kernel):
    q, k, v = bf16(2, 8, 17, 64), bf16(2, 2, 23, 64), bf16(2, 2, 23, 64)
    out = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
    assert out.requires_grad and len(cpu_kernel.calls) == 1 and not cpu_kernel.backward.calls
    grad_out = torch.randn_like(out)
    out.backward(grad_out)

    assert len(cpu_kernel.calls) == 1  # no hidden second forward
    assert len(cpu_kernel.backward.calls) == 1
    forward, backward = cpu_kernel.calls[0], cpu_kernel.backward.calls[0]
    for name in ("q", "k", "v"):
        assert backward[name].data_ptr() == forward[name].data_ptr(), name
        assert backward[name].shape == forward[name].shape, name
    assert backward["q"].data_ptr() == q.data_ptr()  # the user's tensors, not copies
    assert backward["out"].data_ptr() == out.data_ptr()  # the forward's output, saved
    assert torch.equal(backward["grad_out"], grad_out)
    assert backward["lse"].shape == (2, 8, 17) and backward["lse"].dtype == torch.float32
    # The training forward ran and its out residual reached the backward.
    assert forward.get("training") is True
    assert backward["out_residual"] is not None and backward["out_residual"].shape == out.shape
    assert backward["is_causal"] is True
    assert backward["scale"] == pytest.approx(1 / math.sqrt(64))
    assert_grads_match((q, k, v), grad_out, is_causal=True, enable_gqa=True)
    assert k.grad.shape == (2, 2, 23, 64)  # GQA: summed over each group's query heads


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize("lengths", [(1, 1), (17, 17), (5, 40), (40, 5)])
def test_gradients_match_reference(cpu_kernel, causal, ratio, lengths):
    len_q, len_kv = lengths
    q = bf16(2, 2 * ratio, len_q, 128)
    k, v = bf16(2, 2, len_kv, 128), bf16(2, 2, len_kv, 128)
    out = tk.attention(q, k, v, is_causal=causal, enable_gqa=ratio > 1, scale=0.3)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert len(cpu_kernel.backward.calls) == 1
    assert cpu_kernel.backward.calls[0]["scale"] == 0.3
    assert_grads_match((q, k, v), grad_out, is_causal=causal, enable_gqa=ratio > 1, scale=0.3)


@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize("lengths", [(5, 40), (40, 5), (1, 9), (9, 1)])
def test_lower_right_gradients_match_reference(cpu_kernel, ratio, lengths):
    # causal_lower_right with Lq != Lk: the backward op gets lower_right=True; with Lq > Lk the
    # first Lq - Lk query rows see no key, so their output and dq are 0 (as SDPA's math backend
    # gives) and they add nothing to dk/dv.
    from reference import lower_right_bias
    len_q, len_kv = lengths
    q = bf16(2, 2 * ratio, len_q, 128)
    k, v = bf16(2, 2, len_kv, 128), bf16(2, 2, len_kv, 128)
    bias = lower_right_bias(len_q, len_kv)
    out = tk.attention(q, k, v, attn_mask=bias, enable_gqa=ratio > 1, scale=0.3)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert cpu_kernel.calls[0]["lower_right"] is True
    backward = cpu_kernel.backward.calls[0]
    assert backward["is_causal"] is True and backward["lower_right"] is True
    expected_out = assert_grads_match((q, k, v), grad_out, attn_mask=bias, enable_gqa=ratio > 1,
                                      scale=0.3)
    torch.testing.assert_close(out.double(), expected_out, atol=3e-2, rtol=3e-2)
    hidden = max(0, len_q - len_kv)
    assert torch.all(out[:, :, :hidden] == 0) and torch.all(q.grad[:, :, :hidden] == 0)


def test_gradients_reach_transposed_inputs(cpu_kernel):
    # (B, L, H, D) leaves viewed as (B, H, L, D): read in place, gradients land in the leaves.
    leaves = [bf16(2, 19, 4, 64) for _ in range(3)]
    q, k, v = (t.transpose(1, 2) for t in leaves)
    out = tk.attention(q, k, v, is_causal=True)
    assert cpu_kernel.calls[0]["q"].data_ptr() == leaves[0].data_ptr()  # no copy
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    _, expected = reference_grads((q, k, v), grad_out, is_causal=True)
    for leaf, ref in zip(leaves, expected):
        assert leaf.grad.shape == (2, 19, 4, 64)
        torch.testing.assert_close(leaf.grad.double(), ref.transpose(1, 2), atol=3e-2, rtol=3e-2)


def test_gradients_reach_rank3_inputs(cpu_kernel):
    q, k, v = bf16(3, 10, 64), bf16(3, 12, 64), bf16(3, 12, 64)
    out = tk.attention(q, k, v)
    assert cpu_kernel.calls[0]["q"].shape == (1, 3, 10, 64)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert cpu_kernel.backward.calls[0]["grad_out"].shape == (1, 3, 10, 64)
    assert_grads_match((q, k, v), grad_out)


def test_gradients_reach_rank5_gqa_inputs(cpu_kernel):
    q, k, v = bf16(2, 3, 4, 9, 64), bf16(2, 3, 2, 9, 64), bf16(2, 3, 2, 9, 64)
    out = tk.attention(q, k, v, enable_gqa=True, is_causal=True)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert k.grad.shape == (2, 3, 2, 9, 64)
    assert_grads_match((q, k, v), grad_out, enable_gqa=True, is_causal=True)


def test_gradients_reach_copied_inputs(cpu_kernel):
    # Row stride 67 is not a multiple of 8: the kernel gets a copy; the gradient flows back
    # through the copy and the slice into the full leaf.
    leaf = bf16(2, 4, 9, 67)
    q = leaf[..., :64]
    k, v = bf16(2, 4, 9, 64), bf16(2, 4, 9, 64)
    out = tk.attention(q, k, v)
    assert cpu_kernel.calls[0]["q"].data_ptr() != leaf.data_ptr()
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    _, expected = reference_grads((q, k, v), grad_out)
    assert leaf.grad.shape == (2, 4, 9, 67)
    assert torch.all(leaf.grad[..., 64:] == 0)
    torch.testing.assert_close(leaf.grad[..., :64].double(), expected[0], atol=3e-2, rtol=3e-2)


def test_only_the_needed_gradients_are_returned(cpu_kernel):
    q = bf16(1, 2, 16, 64)
    k, v = bf16(1, 2, 16, 64, requires_grad=False), bf16(1, 2, 16, 64, requires_grad=False)
    assert tk.explain(q, k, v).uses_kernel
    tk.attention(q, k, v).backward(torch.randn(1, 2, 16, 64, dtype=torch.bfloat16))
    assert q.grad is not None and k.grad is None and v.grad is None


@pytest.mark.parametrize("make_loss", [
    lambda out: out.float().sum(),                         # expanded (stride 0) gradient
    lambda out: (out.transpose(1, 2).contiguous() * 3).sum(),  # gradient in (B, L, H, D) memory
    lambda out: out[..., :32].float().pow(2).sum(),        # gradient of a slice
], ids=["sum", "transposed", "slice"])
def test_any_grad_out_layout_is_made_kernel_readable(cpu_kernel, make_loss):
    q, k, v = bf16(2, 4, 24, 64), bf16(2, 4, 24, 64), bf16(2, 4, 24, 64)
    make_loss(tk.attention(q, k, v)).backward()  # the stand-in rejects unreadable operands
    assert len(cpu_kernel.backward.calls) == 1
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    make_loss(F.scaled_dot_product_attention(q2, k2, v2)).backward()
    for ours, theirs in zip((q, k, v), (q2, k2, v2)):
        torch.testing.assert_close(ours.grad.double(), theirs.grad.double(), atol=3e-2, rtol=3e-2)


def test_no_grad_and_inference_do_not_record(cpu_kernel):
    q = bf16(1, 2, 16, 64)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            out = tk.attention(q, q, q)
        assert not out.requires_grad
    assert len(cpu_kernel.calls) == 2 and not cpu_kernel.backward.calls


def test_lse_is_not_differentiable(cpu_kernel):
    q, k, v = bf16(1, 2, 16, 64), bf16(1, 2, 16, 64), bf16(1, 2, 16, 64)
    out, lse = torch.ops.tk.attention_fwd_sm90(q, k, v, False, 0.125)
    assert out.requires_grad and not lse.requires_grad
    (out.float().sum() + lse.sum()).backward()
    assert len(cpu_kernel.backward.calls) == 1 and q.grad is not None


def test_sm80_op_is_never_given_inputs_that_need_grad(cpu_kernel):
    q = bf16(1, 2, 16, 64)
    with tk.use_kernel("sm80"):
        out = tk.attention(q, q, q)
    out.float().sum().backward()  # SDPA's own backward
    assert not cpu_kernel.calls and not cpu_kernel.backward.calls and q.grad is not None


# ---- torch.compile ---------------------------------------------------------------------------


def _capturing_backend():
    graphs = {"forward": [], "backward": []}

    def compiler(kind):
        def compile_graph(gm, example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm.forward)
        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward")), graphs


def _targets(gm):
    return [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]


def test_compile_fullgraph_forward_backward_matches_eager(cpu_kernel):
    def loss_fn(q, k, v, w):
        out = tk.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                           is_causal=True, enable_gqa=True)
        return (out.float() * w).sum()

    q, k, v = bf16(2, 33, 8, 64), bf16(2, 40, 2, 64), bf16(2, 40, 2, 64)
    w = torch.randn(2, 8, 33, 64)
    eager_loss = loss_fn(q, k, v, w)
    eager_loss.backward()
    eager_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    calls_before = len(cpu_kernel.backward.calls)

    backend, graphs = _capturing_backend()
    compiled_loss = torch.compile(loss_fn, backend=backend, fullgraph=True)(q, k, v, w)
    compiled_loss.backward()
    assert torch.equal(compiled_loss, eager_loss)
    for ours, eager in zip((q.grad, k.grad, v.grad), eager_grads):
        assert torch.equal(ours, eager)
    assert len(cpu_kernel.backward.calls) == calls_before + 1
    assert len(graphs["forward"]) == 1 and len(graphs["backward"]) == 1
    # A call that needs gradients runs the training forward, whose out_residual the backward reads.
    assert _targets(graphs["forward"][0]).count("tk.attention_fwd_sm90_train.default") == 1
    assert _targets(graphs["backward"][0]).count("tk.attention_bwd_sm90.default") == 1
    assert cpu_kernel.backward.calls[-1]["out_residual"] is not None


def test_compile_dynamic_shapes_forward_backward(cpu_kernel):
    def loss_fn(q, k, v):
        return tk.attention(q, k, v, is_causal=True, enable_gqa=True).float().pow(2).sum()

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True, dynamic=True)
    for length in (33, 47, 100):
        q, k, v = bf16(2, 8, length, 64), bf16(2, 2, length + 5, 64), bf16(2, 2, length + 5, 64)
        loss_fn(q, k, v).backward()
        eager = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        compiled(q, k, v).backward()
        for t, expected in zip((q, k, v), eager):
            assert torch.equal(t.grad, expected)


def test_compile_keeps_the_sm80_fallback_for_gradients(cpu_kernel):
    def loss_fn(q):
        with tk.use_kernel("sm80"):
            return tk.attention(q, q, q).float().sum()

    q = bf16(1, 2, 16, 64)
    torch.compile(loss_fn, backend="aot_eager", fullgraph=True)(q).backward()
    assert not cpu_kernel.calls and not cpu_kernel.backward.calls and q.grad is not None


# ---- opcheck ---------------------------------------------------------------------------------


def _backward_args(q, k, v, is_causal, scale, lower_right=False):
    with torch.no_grad():
        out, lse = torch.ops.tk.attention_fwd_sm90(q, k, v, is_causal, scale, lower_right)
    return (torch.randn_like(out), q, k, v, out, lse, is_causal, scale, lower_right)


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_backward_op(cpu_kernel, causal):
    q, k, v = (bf16(2, 8, 33, 128, requires_grad=False), bf16(2, 2, 40, 128, requires_grad=False),
               bf16(2, 2, 40, 128, requires_grad=False))
    torch.library.opcheck(torch.ops.tk.attention_bwd_sm90.default,
                          _backward_args(q, k, v, causal, 0.125))
    with torch.no_grad():  # with the training forward's out residual
        out, lse, residual = torch.ops.tk.attention_fwd_sm90_train(q, k, v, causal, 0.125)
    torch.library.opcheck(torch.ops.tk.attention_bwd_sm90.default,
                          (torch.randn_like(out), q, k, v, out, lse, causal, 0.125, False, False,
                           residual))
    if causal:  # lower-right, Lq < Lk and Lq > Lk
        torch.library.opcheck(torch.ops.tk.attention_bwd_sm90.default,
                              _backward_args(q, k, v, True, 0.125, lower_right=True))
        torch.library.opcheck(torch.ops.tk.attention_bwd_sm90.default,
                              _backward_args(k.repeat(1, 4, 1, 1), q[:, :2], q[:, :2], True, 0.125,
                                             lower_right=True))
    # (B, L, H, D) memory viewed as (B, H, L, D)
    q, k, v = (bf16(1, 17, 2, 64, requires_grad=False).transpose(1, 2) for _ in range(3))
    torch.library.opcheck(torch.ops.tk.attention_bwd_sm90.default,
                          _backward_args(q, k, v, causal, 1.0))


def test_opcheck_forward_autograd_registration(cpu_kernel):
    q, k, v = bf16(2, 8, 33, 64), bf16(2, 2, 40, 64), bf16(2, 2, 40, 64)
    torch.library.opcheck(torch.ops.tk.attention_fwd_sm90.default, (q, k, v, True, 0.125))
    torch.library.opcheck(torch.ops.tk.attention_fwd_sm90.default,
                          (q, k.detach(), v.detach(), False, 0.3))
    torch.library.opcheck(torch.ops.tk.attention_fwd_sm90.default, (q, k, v, True, 0.125, True))
    torch.library.opcheck(torch.ops.tk.attention_fwd_sm90_train.default, (q, k, v, True, 0.125))
    torch.library.opcheck(torch.ops.tk.attention_fwd_sm90_train.default,
                          (q, k.detach(), v.detach(), True, 0.3, True))


def test_backward_fake_shapes():
    q = torch.empty(2, 8, 33, 128, device="meta", dtype=torch.float16).transpose(1, 2)
    q = q.transpose(1, 2)
    k = torch.empty(2, 2, 40, 128, device="meta", dtype=torch.float16)
    out = torch.empty(2, 8, 33, 128, device="meta", dtype=torch.float16)
    lse = torch.empty(2, 8, 33, device="meta", dtype=torch.float32)
    dq, dk, dv = torch.ops.tk.attention_bwd_sm90(out, q, k, k, out, lse, True, 0.125)
    assert dq.shape == q.shape and dq.is_contiguous() and dq.dtype == torch.float16
    assert dk.shape == k.shape and dk.is_contiguous() and dv.shape == k.shape
    with pytest.raises(RuntimeError, match="lse must be the forward's float32"):
        torch.ops.tk.attention_bwd_sm90(out, q, k, k, out, lse.half(), True, 0.125)
    with pytest.raises(RuntimeError, match="multiple of k/v heads"):
        k3 = torch.empty(2, 3, 40, 128, device="meta", dtype=torch.float16)
        torch.ops.tk.attention_bwd_sm90(out, q, k3, k3, out, lse, True, 0.125)


@pytest.mark.parametrize("causal", [False, True, "lower_right"])
@pytest.mark.parametrize("lengths", [(1, 1), (7, 7), (3, 9), (9, 3)])
def test_reference_grads_are_autograd_of_reference_attention(causal, lengths):
    from reference import reference_attention, reference_attention_grads
    len_q, len_kv = lengths
    offset = len_kv - len_q if causal == "lower_right" else 0
    q = torch.randn(2, 4, len_q, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, len_kv, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, len_kv, 16, dtype=torch.float64, requires_grad=True)
    out, lse = reference_attention(q, k, v, bool(causal), 0.3, causal_offset=offset)
    grad_out = torch.randn_like(out)
    expected = torch.autograd.grad(out, (q, k, v), grad_out)
    ours = reference_attention_grads(grad_out, q, k, v, bool(causal), 0.3, causal_offset=offset)
    for mine, theirs in zip(ours, expected):
        assert torch.isfinite(mine).all() and torch.isfinite(theirs).all()
        torch.testing.assert_close(mine, theirs, atol=1e-12, rtol=1e-10)
    # Rows that see no key (lower-right, Lq > Lk): out 0, lse -inf, dq 0.
    hidden = max(0, -offset)
    assert torch.all(out[:, :, :hidden] == 0) and torch.all(ours[0][:, :, :hidden] == 0)
    assert torch.all(torch.isneginf(lse[:, :, :hidden]))
    assert torch.isfinite(lse[:, :, hidden:]).all()


@pytest.mark.parametrize("lengths", [(5, 9), (9, 5), (6, 6)])
def test_reference_lower_right_matches_sdpa(lengths):
    # The fp64 reference with causal_offset = Lk - Lq is SDPA's causal_lower_right (CPU, math
    # backend, rows that see no key 0), and sdpa_causal_lower_right (the GPU tests' yardstick)
    # gives the same.
    from reference import lower_right_bias, reference_attention, sdpa_causal_lower_right
    len_q, len_kv = lengths
    q = torch.randn(2, 4, len_q, 16, dtype=torch.float64)
    k, v = (torch.randn(2, 2, len_kv, 16, dtype=torch.float64) for _ in range(2))
    ours, _ = reference_attention(q, k, v, True, 0.3, causal_offset=len_kv - len_q)
    bias = lower_right_bias(len_q, len_kv)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(sdpa_causal_lower_right(q, k, v, 0.3), theirs)


def test_double_backward_raises(cpu_kernel):
    q = bf16(1, 2, 8, 64)
    out = tk.attention(q, q, q)
    (grad_q,) = torch.autograd.grad(out.float().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="a second backward .* is not supported"):
        grad_q.float().sum().backward()


# ---- torch.use_deterministic_algorithms -------------------------------------------------------


def test_deterministic_mode_runs_the_deterministic_backward(cpu_kernel, deterministic):
    # The sm90 backward has a deterministic mode (dq added over key blocks in a fixed order):
    # torch's deterministic mode selects it, so training stays on the kernel.
    q, k, v = bf16(1, 4, 17, 64), bf16(1, 2, 23, 64), bf16(1, 2, 23, 64)
    assert str(tk.explain(q, k, v, is_causal=True, enable_gqa=True)).endswith(
        "+ backward tk.attention_bwd_sm90")
    out = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
    out.backward(torch.randn_like(out))
    deterministic()
    for t in (q, k, v):
        t.grad = None
    assert str(tk.explain(q, k, v, is_causal=True, enable_gqa=True)).endswith(
        "+ backward tk.attention_bwd_sm90 (deterministic)")
    out = tk.attention(q, k, v, is_causal=True, enable_gqa=True)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    assert len(cpu_kernel.calls) == 2
    assert [call["deterministic"] for call in cpu_kernel.backward.calls] == [False, True]
    assert_grads_match((q, k, v), grad_out, is_causal=True, enable_gqa=True)


def test_deterministic_mode_is_read_when_the_backward_runs(cpu_kernel, deterministic):
    # As torch's own ops read it: the setting at backward time counts, warn_only or not.
    q = bf16(1, 2, 16, 64)
    out = tk.attention(q, q, q)
    deterministic(warn_only=True)
    out.float().sum().backward()
    assert [call["deterministic"] for call in cpu_kernel.backward.calls] == [True]


def test_compile_follows_deterministic_mode(cpu_kernel, deterministic):
    def loss_fn(q):
        return tk.attention(q, q, q, is_causal=True).float().sum()

    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    q = bf16(1, 2, 16, 64)
    compiled(q).backward()
    deterministic()  # the same compiled function must retrace with the deterministic backward
    q.grad = None
    compiled(q).backward()
    assert len(cpu_kernel.calls) == 2 and q.grad is not None
    assert [call["deterministic"] for call in cpu_kernel.backward.calls] == [False, True]
