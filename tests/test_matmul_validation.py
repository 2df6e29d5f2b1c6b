"""Every bad-argument rule of tk.matmul raises a clear error that names the argument and the
rule, from both matmul() and explain_matmul(), before any path is chosen. The errors are the
project's ValueError/TypeError and also RuntimeError, which is what torch.matmul raises, so code
written for either catches them. CPU only: the checks never look at data."""

import numpy as np
import pytest
import torch

import thunderkittens as tk


def randn(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=dtype, device=device)


CASES = {
    # types
    "a is a list": (lambda: ([[1.0]], randn(1, 2)), TypeError, "a must be a torch.Tensor, got list"),
    "b is None": (lambda: (randn(2, 3), None), TypeError, "b must be a torch.Tensor, got NoneType"),
    "b is numpy": (lambda: (randn(2, 3), np.ones((3, 2))), TypeError, "b must be a torch.Tensor"),
    "a is a float": (lambda: (2.0, randn(3)), TypeError, "a must be a torch.Tensor, got float"),
    # rank
    "a 0-D": (lambda: (torch.tensor(2.0), randn(3)), ValueError, "a must have at least 1 dim"),
    "b 0-D": (lambda: (randn(3, 4), torch.tensor(1.0)), ValueError, "b must have at least 1 dim"),
    # dtypes and devices
    "dtype mismatch": (lambda: (randn(2, 3), randn(3, 4, dtype=torch.float64)), TypeError,
                       "b dtype torch.float64 differs from a dtype torch.float32"),
    "dtype mismatch bf16/fp16": (lambda: (randn(2, 8, dtype=torch.bfloat16),
                                          randn(8, 4, dtype=torch.float16)), TypeError,
                                 "b dtype torch.float16 differs from a dtype torch.bfloat16"),
    "device mismatch": (lambda: (randn(2, 3), randn(3, 4, device="meta")), ValueError,
                        "b is on meta but a is on cpu"),
    # inner dimension
    "inner 2-D": (lambda: (randn(2, 3), randn(4, 5)), ValueError,
                  r"a.shape\[-1\] \(3\) must equal b.shape\[-2\] \(4\)"),
    "inner batched": (lambda: (randn(7, 2, 16), randn(7, 8, 5)), ValueError,
                      r"a.shape\[-1\] \(16\) must equal b.shape\[-2\] \(8\)"),
    "inner 1-D b": (lambda: (randn(2, 3), randn(4)), ValueError,
                    r"a.shape\[-1\] \(3\) must equal b.shape\[0\] \(4\)"),
    "inner 1-D both": (lambda: (randn(3), randn(4)), ValueError,
                       r"a.shape\[-1\] \(3\) must equal b.shape\[0\] \(4\)"),
    # batch broadcasting
    "batch 2 vs 3": (lambda: (randn(2, 4, 5), randn(3, 5, 6)), ValueError,
                     r"batch dims of a \(2,\) and b \(3,\) cannot be broadcast: sizes 2 and 3"),
    "batch N-D": (lambda: (randn(4, 2, 4, 5), randn(3, 1, 5, 6)), ValueError,
                  r"batch dims of a \(4, 2\) and b \(3, 1\) cannot be broadcast: sizes 4 and 3 "
                  r"differ at batch dim -2"),
}


@pytest.mark.parametrize("function", [tk.matmul, tk.explain_matmul], ids=["matmul", "explain"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_argument_raises(function, case):
    make, error, message = CASES[case]
    with pytest.raises(error, match=message):
        function(*make())


@pytest.mark.parametrize("case", [name for name, (_, error, _) in CASES.items()
                                  if error is not TypeError or "dtype" in name])
def test_shape_dtype_device_errors_are_runtime_errors_too(case):
    """What torch.matmul raises for the same mistakes (non-tensors are TypeError in both)."""
    make, _, _ = CASES[case]
    with pytest.raises(RuntimeError):
        tk.matmul(*make())


@pytest.mark.parametrize("case", ["a 0-D", "dtype mismatch", "inner 2-D", "batch 2 vs 3"])
def test_torch_matmul_rejects_the_same_calls(case):
    make, _, _ = CASES[case]
    with pytest.raises(RuntimeError):
        torch.matmul(*make())


def test_errors_mention_the_function():
    with pytest.raises(ValueError, match=r"^tk\.matmul: "):
        tk.matmul(randn(2, 3), randn(4, 5))


def test_errors_are_raised_on_the_kernel_path_too(cpu_matmul):
    # bf16 CUDA-like inputs that would take the kernel: the same checks run first.
    a = randn(2, 32, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must equal b.shape"):
        tk.matmul(a, randn(32, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="cannot be broadcast"):
        tk.matmul(a, randn(3, 64, 16, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="differs from a dtype"):
        tk.matmul(a, randn(64, 16, dtype=torch.float16))
    assert not cpu_matmul.calls


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((5, 2, 3), (3,)),
    ((3,), (5, 3, 4)), ((5, 2, 3), (3, 4)), ((2, 3), (5, 3, 4)), ((5, 2, 3), (1, 3, 4)),
    ((1, 2, 3), (5, 3, 4)), ((2, 1, 2, 3), (1, 4, 3, 2)), ((6, 2, 3), (2, 1, 3, 4)),
    ((0, 2, 3), (3, 4)), ((2, 0), (0, 4)), ((1, 2, 3), (0, 3, 4)),
])
def test_valid_shapes_are_accepted_with_torch_output_shape(a_shape, b_shape):
    a, b = randn(*a_shape), randn(*b_shape)
    out = tk.matmul(a, b)
    expected = torch.matmul(a, b)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected)
