"""Calls the kernel does not take go to torch.matmul: on the CPU every call does. The answer must
be torch.matmul's exactly (values, shape, dtype, gradients), explain_matmul() must say fallback
and why, and strict mode must raise."""

import pytest
import torch

import thunderkittens as tk


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


CALLS = {
    "1-D @ 1-D": ((7,), (7,)),
    "1-D @ 2-D": ((7,), (7, 5)),
    "2-D @ 1-D": ((3, 7), (7,)),
    "1-D @ 3-D": ((7,), (2, 7, 5)),
    "4-D @ 1-D": ((2, 3, 4, 7), (7,)),
    "2-D @ 2-D": ((33, 17), (17, 9)),
    "3-D @ 3-D": ((4, 33, 17), (4, 17, 9)),
    "3-D @ 3-D batch-1 b": ((4, 33, 17), (1, 17, 9)),
    "3-D @ 2-D": ((4, 33, 16), (16, 9)),
    "2-D @ 3-D": ((33, 16), (4, 16, 9)),
    "4-D @ 4-D": ((2, 3, 5, 8), (2, 3, 8, 4)),
    "4-D @ 3-D broadcast": ((2, 3, 5, 8), (3, 8, 4)),
    "partial broadcast": ((2, 1, 5, 8), (1, 3, 8, 4)),
    "5-D @ 2-D": ((2, 2, 2, 5, 8), (8, 4)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("name", list(CALLS))
def test_cpu_fallback_returns_torch_matmul_answer(name, dtype):
    a_shape, b_shape = CALLS[name]
    a, b = randn(*a_shape, dtype=dtype), randn(*b_shape, dtype=dtype)
    out = tk.matmul(a, b)
    expected = torch.matmul(a, b)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert torch.equal(out, expected)
    assert str(tk.explain_matmul(a, b)) == \
        "fallback torch.matmul: inputs are on cpu; the kernel needs a CUDA GPU"


def test_integer_inputs_fall_back_too():
    a, b = torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 2))
    assert torch.equal(tk.matmul(a, b), a @ b)


def test_non_contiguous_inputs():
    a = randn(8, 6)[::2].mT                  # (6, 4), strides (1, 12)
    b = randn(3, 4, 5).transpose(0, 1)[:, 1]  # (4, 5), strides (5, 1) inside a permuted tensor
    assert torch.equal(tk.matmul(a, b), a @ b)


def test_cpu_fallback_keeps_autograd():
    a, b = randn(2, 5, 8).requires_grad_(), randn(8, 3).requires_grad_()
    grad_out = randn(2, 5, 3)
    tk.matmul(a, b).backward(grad_out)
    grads = (a.grad.clone(), b.grad.clone())
    a.grad = b.grad = None
    torch.matmul(a, b).backward(grad_out)
    assert torch.equal(grads[0], a.grad) and torch.equal(grads[1], b.grad)


def test_explain_result_fields():
    a, b = randn(3, 8), randn(8, 2)
    plan = tk.explain_matmul(a, b)
    assert isinstance(plan, tk.MatmulPlan)
    assert not plan.uses_kernel and plan.op is None and plan.batch is None
    assert "cpu" in plan.reason


def test_meta_tensors_fall_back_too():
    a = torch.empty(4, 64, 32, device="meta", dtype=torch.bfloat16)
    b = torch.empty(32, 16, device="meta", dtype=torch.bfloat16)
    assert tk.matmul(a, b).shape == (4, 64, 16)
    assert "inputs are on meta" in str(tk.explain_matmul(a, b))


def test_empty_dims_follow_torch():
    a, b = randn(3, 0), randn(0, 4)
    assert torch.equal(tk.matmul(a, b), torch.zeros(3, 4))
    assert tk.matmul(randn(0, 3, 4), randn(4, 5)).shape == (0, 3, 5)


# ---- strict mode --------------------------------------------------------------------------


def test_strict_raises_with_reason():
    a, b = randn(3, 8), randn(8, 2)
    with tk.strict():
        with pytest.raises(tk.FallbackError,
                           match="tk.matmul would fall back to torch.matmul: inputs are on cpu"):
            tk.matmul(a, b)
        assert "strict mode: tk.matmul raises FallbackError" in str(tk.explain_matmul(a, b))
    assert torch.equal(tk.matmul(a, b), a @ b)  # no longer strict


def test_strict_env_var_raises(monkeypatch):
    monkeypatch.setenv("TK_STRICT", "1")
    with pytest.raises(tk.FallbackError, match="fall back to torch.matmul"):
        tk.matmul(randn(3, 8), randn(8, 2))


def test_argument_errors_win_over_strict_fallback():
    with tk.strict(), pytest.raises(ValueError, match="must equal"):
        tk.matmul(randn(3, 8), randn(7, 2))


# ---- torch.compile -------------------------------------------------------------------------


def test_compile_fullgraph_traces_the_fallback():
    from torch._dynamo.testing import CompileCounterWithBackend

    def f(a, b):
        return tk.matmul(a, b) + 1

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, backend=counter, fullgraph=True)
    try:
        for a, b in ((randn(2, 5, 8), randn(8, 3)), (randn(7), randn(7, 2))):
            assert torch.equal(compiled(a, b), f(a, b))
        assert all("tk.matmul" not in str(node.target) for graph in counter.graphs
                   for node in graph.graph.nodes)
    finally:
        torch._dynamo.reset()
