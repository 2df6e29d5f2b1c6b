"""Bad input to every op (tk.attention, tk.matmul, and their explain functions): 0-d and 1-d
tensors, empty dims, NaN/Inf values, integer/complex/bool dtypes, tensors on different devices,
the meta device, requires_grad on integer tensors, more than 2^31 elements.

Each call must give either the right answer (what PyTorch's own function gives: the same
shape, dtype and device, values checked against it or a float64 reference) or a clear error:
a ValueError / TypeError (or the exception type PyTorch's function raises) whose message names
the argument; the explain function must raise the same error. On a GPU the attention peer's
answer comes from SDPA on CPU copies, and PyTorch's function is asked only where ours gives no
clear error of its own (torch 2.11's SDPA killed the process with SIGFPE on an empty dim, on the
GPU and the CPU; it is not asked about tensors on two GPUs). NaN/Inf inputs must give a result
that is non-finite exactly where the float64 reference is, and never hang: the GPU's cases run
in the test worker's case server with a time limit (tests/differential/worker.py), as do the
> 2^31 element cases on the GPU (expanded views: no memory for the inputs).
"""


import pytest
import torch
import torch.nn.functional as F

import thunderkittens as tk
from differential import bad_input_cases as cases

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
FLOAT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def raised(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001  (what is raised is the subject)
        return error
    return None


def assert_clear_error(error, names, peer_error=None):
    """``error`` is a ValueError/TypeError (or of the peer's exception type) naming one of
    ``names``."""
    assert error is not None, "no error"
    allowed = (ValueError, TypeError) + ((type(peer_error),) if peer_error is not None else ())
    assert isinstance(error, allowed), f"{type(error).__name__}: {error} (want one of {allowed})"
    assert any(name in str(error) for name in names), f"the message names none of {names}: {error}"


def same_error(a, b):
    return type(a) is type(b) and str(a) == str(b)


def sdpa_on_cpu(*args, **kwargs):
    """F.scaled_dot_product_attention on CPU copies of the tensor arguments, its result moved
    back to the inputs' device: the peer's answer for bad input on a GPU. (CUDA SDPA itself is
    not safe to call with such input: with an empty dim it killed the process with SIGFPE.)"""
    device = next((a.device for a in args if torch.is_tensor(a)), None)
    move = lambda x: x.cpu() if torch.is_tensor(x) and x.device.type == "cuda" else x  # noqa: E731
    out = F.scaled_dot_product_attention(*map(move, args), **{k: move(v) for k, v in kwargs.items()})
    return out.to(device) if device is not None and device.type == "cuda" else out


def answer_or_clear_error(ours, theirs, explain, args, kwargs=None, *, names):
    """Either the right answer (PyTorch's; returned for more checks), or a clear error naming
    one of ``names``, or on the fallback PyTorch's own error (returns None); explain agrees.
    PyTorch's function is asked only when ours does not give a clear error (torch 2.11's SDPA
    killed the process with SIGFPE on an empty dim, even on the CPU)."""
    kwargs = kwargs or {}
    try:
        out = ours(*args, **kwargs)
    except Exception as error:  # noqa: BLE001
        explained = raised(explain, *args, **kwargs)
        if isinstance(error, (ValueError, TypeError)) and any(n in str(error) for n in names):
            assert same_error(explained, error), f"explain raised {explained!r}, the op {error!r}"
            return None
        peer_error = raised(theirs, *args, **kwargs)
        if same_error(error, peer_error):
            # The fallback passed PyTorch's own error on; explain could only say "fallback".
            assert explained is None or same_error(explained, error), explained
            assert not explain(*args, **kwargs).uses_kernel
            return None
        assert_clear_error(error, names, peer_error)
        assert same_error(explained, error), f"explain raised {explained!r}, the op {error!r}"
        return None
    peer_error = raised(theirs, *args, **kwargs)
    assert peer_error is None, (f"PyTorch's own function rejects the call ({peer_error!r}) but ours "
                                f"returned a {tuple(out.shape)} tensor")
    expected = theirs(*args, **kwargs)
    assert out.shape == expected.shape and out.dtype == expected.dtype and out.device == expected.device, \
        (out.shape, out.dtype, out.device, expected.shape, expected.dtype, expected.device)
    explain(*args, **kwargs)  # a plan, not an error
    return out, expected


def attention_inputs(shape_q, shape_kv, dtype=torch.float32, device="cpu"):
    return (torch.randn(shape_q, dtype=dtype, device=device),
            torch.randn(shape_kv, dtype=dtype, device=device),
            torch.randn(shape_kv, dtype=dtype, device=device))


# ---- 0-d, 1-d and low-rank tensors --------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(), (16,), (5, 16)], ids=["0d", "1d", "2d"])
def test_attention_low_rank(device, shape):
    q, k, v = attention_inputs(shape, shape, device=device)
    answer_or_clear_error(tk.attention, sdpa_on_cpu, tk.explain, (q, k, v), names=("query",))


def test_attention_ranks_differ():
    q, k, v = attention_inputs((2, 3, 5, 16), (3, 5, 16))
    assert_clear_error(raised(tk.attention, q, k, v), ("key",))
    assert same_error(raised(tk.explain, q, k, v), raised(tk.attention, q, k, v))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["a", "b"])
def test_matmul_zero_dim(device, which):
    a = torch.randn((), device=device) if which == "a" else torch.randn(3, 4, device=device)
    b = torch.randn((), device=device) if which == "b" else torch.randn(4, 5, device=device)
    error = raised(tk.matmul, a, b)
    assert_clear_error(error, (which,), raised(torch.matmul, a, b))
    assert isinstance(error, RuntimeError), "tk.matmul's errors are RuntimeError too (torch.matmul's)"
    assert same_error(raised(tk.explain_matmul, a, b), error)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("a_shape, b_shape", [
    ((64,), (64,)), ((64,), (64, 24)), ((24, 64), (64,)), ((3, 24, 64), (64,)),
    ((64,), (3, 64, 24)), ((1,), (1,)), ((2, 3, 24, 64), (64,)),
])
def test_matmul_one_dim(device, dtype, a_shape, b_shape):
    a, b = torch.randn(a_shape, dtype=dtype, device=device), torch.randn(b_shape, dtype=dtype, device=device)
    out, expected = answer_or_clear_error(tk.matmul, torch.matmul, tk.explain_matmul, (a, b),
                                          names=("a", "b"))
    assert torch.equal(out, expected), "a 1-D operand is torch.matmul's call: the same answer"


# ---- empty dims --------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("dim", [0, 1, 2, 3], ids=["batch", "heads", "length", "head_dim"])
def test_attention_empty_dims(device, dtype, which, dim):
    shapes = {"query": [2, 4, 5, 64], "key": [2, 4, 7, 64], "value": [2, 4, 7, 64]}
    shapes[which][dim] = 0
    q, k, v = (torch.randn(shapes[name], dtype=dtype, device=device) for name in ("query", "key", "value"))
    result = answer_or_clear_error(tk.attention, sdpa_on_cpu, tk.explain, (q, k, v), names=(which,))
    if result is not None:
        out, expected = result
        torch.testing.assert_close(out, expected, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("a_shape, b_shape", [
    ((0, 64), (64, 24)), ((24, 0), (0, 16)), ((24, 64), (64, 0)), ((0, 24, 64), (0, 64, 16)),
    ((3, 0, 64), (3, 64, 16)), ((0, 64), (64,)), ((0,), (0,)), ((2, 0, 24, 8), (8, 16)),
])
def test_matmul_empty_dims(device, dtype, a_shape, b_shape):
    a, b = torch.randn(a_shape, dtype=dtype, device=device), torch.randn(b_shape, dtype=dtype, device=device)
    out, expected = answer_or_clear_error(tk.matmul, torch.matmul, tk.explain_matmul, (a, b),
                                          names=("a", "b"))
    assert torch.equal(out, expected)


# ---- NaN and Inf -------------------------------------------------------------------------------

@pytest.fixture(params=["sdpa", "stand-in"])
def attention_path(request):
    """The CPU fallback, or the kernel path through the CPU stand-in (conftest's cpu_kernel)."""
    if request.param == "stand-in":
        request.getfixturevalue("cpu_kernel")
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("where, value, causal", cases.attention_nonfinite_cases(),
                         ids=lambda x: str(x))
def test_attention_nonfinite_cpu(attention_path, dtype, where, value, causal):
    cases.check_attention_nonfinite(torch.device("cpu"), dtype, 64, where, value, causal)


@pytest.fixture(params=["torch.matmul", "stand-in"])
def matmul_path(request):
    if request.param == "stand-in":
        request.getfixturevalue("cpu_matmul")
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("where", ["a", "b"])
@pytest.mark.parametrize("value", list(cases.VALUES))
def test_matmul_nonfinite_cpu(matmul_path, dtype, where, value):
    plan = cases.check_matmul_nonfinite(torch.device("cpu"), dtype, where, value)
    if matmul_path == "stand-in" and dtype == torch.bfloat16:
        assert plan.startswith("kernel"), plan


# ---- dtypes ------------------------------------------------------------------------------------

NON_FLOAT = [torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]


def non_float(shape, dtype, device="cpu"):
    t = torch.randn(shape, device=device) * 4
    if dtype.is_complex:
        return torch.complex(t, t).to(dtype)
    return (t > 0) if dtype == torch.bool else t.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", NON_FLOAT, ids=str)
@pytest.mark.parametrize("which", ["all", "key"])
def test_attention_non_float_dtypes(device, dtype, which):
    q, k, v = (non_float((2, 4, 5, 16), dtype, device) for _ in range(3))
    if which == "key":
        q, v = ((t.real if dtype.is_complex else t).float() for t in (q, v))
    error = raised(tk.attention, q, k, v)
    assert_clear_error(error, ("query",) if which == "all" else ("key",))
    assert isinstance(error, TypeError), error
    assert same_error(raised(tk.explain, q, k, v), error)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", NON_FLOAT, ids=str)
def test_matmul_non_float_dtypes(device, dtype):
    a, b = non_float((3, 8, 16), dtype, device), non_float((16, 8), dtype, device)
    result = answer_or_clear_error(tk.matmul, torch.matmul, tk.explain_matmul, (a, b), names=("a", "b"))
    if result is not None:
        out, expected = result
        assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_matmul_mixed_dtypes(dtype):
    a, b = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(16, 8, dtype=dtype)
    error = raised(tk.matmul, a, b)
    assert_clear_error(error, ("b dtype",), raised(torch.matmul, a, b))
    assert isinstance(error, RuntimeError)
    assert same_error(raised(tk.explain_matmul, a, b), error)


# ---- requires_grad on integer tensors ----------------------------------------------------------

def test_integer_tensors_cannot_require_grad():
    """torch refuses to make them (so no op sees one); ours then reject or compute the plain
    integer call as PyTorch does, and complex tensors (which may require grad) are refused by
    attention, computed with their gradient by matmul."""
    with pytest.raises(RuntimeError, match="floating point"):
        torch.ones(3, 4, dtype=torch.int64, requires_grad=True)
    with pytest.raises(RuntimeError, match="floating point"):
        torch.ones(3, 4, dtype=torch.int32).requires_grad_()
    q = non_float((1, 2, 5, 16), torch.complex64).requires_grad_()
    assert_clear_error(raised(tk.attention, q, q, q), ("query",))
    a = non_float((6, 16), torch.complex64).requires_grad_()
    b = non_float((16, 4), torch.complex64).requires_grad_()
    out = tk.matmul(a, b)
    out.abs().sum().backward()
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    torch.matmul(a2, b2).abs().sum().backward()
    torch.testing.assert_close(a.grad, a2.grad)
    torch.testing.assert_close(b.grad, b2.grad)


# ---- devices -----------------------------------------------------------------------------------

@pytest.mark.parametrize("odd_one", ["key", "value"])
def test_attention_cpu_and_meta(odd_one):
    q, k, v = attention_inputs((2, 4, 5, 16), (2, 4, 7, 16))
    if odd_one == "key":
        k = k.to("meta")
    else:
        v = v.to("meta")
    error = raised(tk.attention, q, k, v)
    assert_clear_error(error, (odd_one,))
    assert same_error(raised(tk.explain, q, k, v), error)


@pytest.mark.parametrize("odd_one", ["a", "b"])
def test_matmul_cpu_and_meta(odd_one):
    """torch.matmul(cpu, meta) returns a CPU tensor of uninitialised memory; tk.matmul refuses
    the mix with an error naming the operand."""
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    a, b = (a.to("meta"), b) if odd_one == "a" else (a, b.to("meta"))
    error = raised(tk.matmul, a, b)
    assert_clear_error(error, ("b",) if odd_one == "b" else ("b is on", "a is on"))
    assert same_error(raised(tk.explain_matmul, a, b), error)


@pytest.mark.gpu
def test_cpu_and_cuda():
    q, k, v = attention_inputs((2, 4, 5, 64), (2, 4, 7, 64), torch.bfloat16, "cuda")
    error = raised(tk.attention, q, k.cpu(), v)
    assert_clear_error(error, ("key",))
    assert same_error(raised(tk.explain, q, k.cpu(), v), error)
    a, b = torch.randn(8, 16, device="cuda"), torch.randn(16, 8)
    error = raised(tk.matmul, a, b)
    assert_clear_error(error, ("b",), raised(torch.matmul, a, b))
    assert same_error(raised(tk.explain_matmul, a, b), error)


@pytest.mark.gpu
def test_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    q, k, v = attention_inputs((2, 4, 5, 64), (2, 4, 7, 64), torch.bfloat16, "cuda:0")
    error = raised(tk.attention, q, k.to("cuda:1"), v)
    # (SDPA itself is not asked: with inputs on two GPUs it may read one GPU's memory from the other.)
    assert_clear_error(error, ("key",))
    assert same_error(raised(tk.explain, q, k.to("cuda:1"), v), error)
    a = torch.randn(64, 64, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda:1", dtype=torch.bfloat16)
    error = raised(tk.matmul, a, b)
    assert_clear_error(error, ("b",), raised(torch.matmul, a, b))


# ---- the meta device ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("mask", ["none", "causal", "bool"])
@pytest.mark.parametrize("grad", [False, True])
def test_attention_meta(dtype, mask, grad):
    """What SDPA does on the meta device: a meta result of the right shape (and gradients)."""
    q = torch.empty(2, 8, 33, 64, device="meta", dtype=dtype, requires_grad=grad)
    k = torch.empty(2, 2, 40, 64, device="meta", dtype=dtype, requires_grad=grad)
    kwargs = dict(is_causal=mask == "causal", enable_gqa=True,
                  attn_mask=torch.empty(33, 40, device="meta", dtype=torch.bool) if mask == "bool" else None)
    out, expected = answer_or_clear_error(tk.attention, F.scaled_dot_product_attention, tk.explain,
                                          (q, k, k), kwargs, names=("query",))
    assert out.device.type == "meta" and out.shape == (2, 8, 33, 64)
    if grad:
        out.sum().backward()
        assert q.grad is not None and q.grad.shape == q.shape and q.grad.device.type == "meta"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("a_shape, b_shape", [((40, 24), (24, 8)), ((3, 40, 24), (1, 24, 8)),
                                              ((40, 24), (24,)), ((2, 3, 40, 24), (24, 8))])
def test_matmul_meta(dtype, a_shape, b_shape):
    a = torch.empty(a_shape, device="meta", dtype=dtype, requires_grad=True)
    b = torch.empty(b_shape, device="meta", dtype=dtype)
    out, expected = answer_or_clear_error(tk.matmul, torch.matmul, tk.explain_matmul, (a, b),
                                          names=("a", "b"))
    out.sum().backward()
    assert a.grad.shape == a.shape and a.grad.device.type == "meta"


# ---- more than 2^31 elements -------------------------------------------------------------------

def test_more_than_2_31_elements_meta():
    """Shapes only: meta tensors of 2^32 elements go through both ops (and explain) as through
    PyTorch's functions."""
    q = torch.empty(1, 64, 2**16, 1024, device="meta", dtype=torch.bfloat16)
    out, _ = answer_or_clear_error(tk.attention, F.scaled_dot_product_attention, tk.explain,
                                   (q, q, q), {"is_causal": True}, names=("query",))
    assert out.shape == q.shape
    a = torch.empty(2**16, 2**16 + 8, device="meta", dtype=torch.bfloat16)
    out, _ = answer_or_clear_error(tk.matmul, torch.matmul, tk.explain_matmul, (a, a.mT),
                                   names=("a", "b"))
    assert out.shape == (2**16, 2**16)


@pytest.mark.parametrize("stand_in", [False, True])
def test_more_than_2_31_elements_explain(request, stand_in):
    """explain on expanded CPU views of more than 2^31 elements answers without allocating (on
    the stand-in kernel path it says what would be copied)."""
    if stand_in:
        request.getfixturevalue("cpu_kernel")
        request.getfixturevalue("cpu_matmul")
    q = torch.randn(1, 8, 128, 64, dtype=torch.bfloat16).expand(32769, 8, 128, 64)
    assert q.numel() > 2**31
    plan = tk.explain(q, q, q, is_causal=True)
    assert plan.uses_kernel == stand_in, str(plan)
    a = torch.randn(1, 64, dtype=torch.bfloat16).expand(2**25 + 8, 64)
    b = torch.randn(64, 72, dtype=torch.bfloat16)
    assert a.numel() > 2**31
    tk.explain_matmul(a, b)


# ---- on the GPU, in the case server: NaN/Inf (never a hang) and > 2^31 elements ------------------

def run_gpu_case(case_worker, case_id, timeout):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    answer = case_worker.run({"kind": "case", "module": "differential.bad_input_cases",
                              "case": case_id}, timeout=timeout)
    if answer["status"] != "ok":
        pytest.fail(f"{case_id}:\n{answer['message']}\n--- output ---\n{answer['output'][-6000:]}",
                    pytrace=False)


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", cases.gpu_nonfinite_ids())
def test_nonfinite_gpu(case_worker, case_id):
    run_gpu_case(case_worker, case_id, timeout=120)


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", cases.LARGE_IDS)
def test_more_than_2_31_elements_gpu(case_worker, case_id):
    run_gpu_case(case_worker, case_id, timeout=300)
