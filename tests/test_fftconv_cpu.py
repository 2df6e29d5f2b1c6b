"""tk.fftconv and tk.FFTConv on the CPU: the torch.fft reference against the definition, the
reference path (gates, short filters, gradients), argument checks, explain, strict mode, and the
kernel path against a CPU stand-in of tk::fftconv (padding, the op's autograd formula against
autograd of the reference, torch.compile, opcheck)."""

import pytest
import torch

import thunderkittens as tk
from thunderkittens._fftconv import plan, reference

from gpu_support import kernel_standin


def make(b=2, h=3, n=40, nk=None, dtype=torch.float64, seed=0, gates=False, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)  # noqa: E731
    u, k = rand(b, h, n), rand(h, nk or n)
    pre, post = (rand(b, h, n), rand(b, h, n)) if gates else (None, None)
    return u, k, pre, post


def by_definition(u, k, pre=None, post=None):
    """y[b, h, n] = post * sum_{t <= n} k[h, t] (u * pre)[b, h, n - t], in float64."""
    w = u.double() * (pre.double() if pre is not None else 1)
    n, nk = u.shape[-1], k.shape[-1]
    y = torch.zeros_like(w)
    for t in range(min(n, nk)):
        y[..., t:] += k.double()[None, :, t, None] * w[..., : n - t]
    return y * (post.double() if post is not None else 1)


@pytest.mark.parametrize("n, nk", [(1, 1), (17, 17), (64, 5), (100, 100)])
@pytest.mark.parametrize("gates", [False, True])
def test_reference_is_the_causal_convolution(n, nk, gates):
    u, k, pre, post = make(n=n, nk=nk, gates=gates)
    torch.testing.assert_close(reference.causal_conv(u, k, pre, post), by_definition(u, k, pre, post))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_fftconv_on_cpu_runs_the_reference(dtype):
    u, k, pre, post = make(n=50, nk=20, dtype=dtype, gates=True)
    y = tk.fftconv(u, k, pre, post)
    assert y.dtype == dtype and y.shape == u.shape
    expected = by_definition(u, k, pre, post)
    tol = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol * expected.abs().max().item())
    assert str(tk.explain_fftconv(u, k)) == "fallback torch.fft: inputs are on cpu; the kernel needs a CUDA GPU"


def test_gradients_of_the_reference_path():
    u, k, pre, post = make(n=12, nk=7, gates=True, requires_grad=True)
    torch.autograd.gradcheck(tk.fftconv, (u, k, pre, post))


@pytest.mark.parametrize("args, error, text", [
    (lambda u, k: (u[0], k), ValueError, "u must be 3-D"),
    (lambda u, k: (u, k[0]), ValueError, "k must be 2-D"),
    (lambda u, k: (u, k[:2]), ValueError, "k has 2 heads but u has 3"),
    (lambda u, k: (u, torch.cat([k, k], -1)), ValueError, "k's length must be 1 .. u's length 40"),
    (lambda u, k: (u.long(), k), TypeError, "u must have a floating-point dtype"),
    (lambda u, k: (u, k.to("meta")), ValueError, "k is on meta"),
    (lambda u, k: (u[:, :, :0], k[:, :0]), ValueError, "u is empty"),
    (lambda u, k: (u, k, u.float()), TypeError, "pregate dtype torch.float32 differs"),
    (lambda u, k: (u, k, None, u[:1]), ValueError, "postgate must have u's shape"),
])
def test_bad_arguments(args, error, text):
    u, k, _, _ = make()
    with pytest.raises(error, match=text):
        tk.fftconv(*args(u, k))


def test_strict_mode_refuses_the_reference():
    u, k, _, _ = make()
    with tk.strict(), pytest.raises(tk.FallbackError, match="tk.fftconv would fall back to torch.fft"):
        tk.fftconv(u, k)


def test_module_checks_its_length():
    u, k, _, _ = make(n=40)
    with pytest.raises(ValueError, match="exceeds seqlen 32"):
        tk.FFTConv(32)(u, k)
    with pytest.raises(ValueError, match="seqlen must be a positive int"):
        tk.FFTConv(0)
    torch.testing.assert_close(tk.FFTConv(40)(u, k), tk.fftconv(u, k))


# ---- the kernel path against a CPU stand-in -----------------------------------------------


class FFTConvStandIn:
    """CPU implementation of tk::fftconv (the reference in float64, rounded once), recording calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, u, k, pregate, postgate, fft_size):
        assert u.dtype in (torch.bfloat16, torch.float16) and u.shape[-1] % 8 == 0
        assert u.shape[-1] <= fft_size // 2 and k.shape[-1] <= fft_size // 2
        self.calls.append({"u": u, "k": k, "pregate": pregate, "postgate": postgate, "fft_size": fft_size})
        w = u.double() * (pregate.double() if pregate is not None else 1)
        y = reference.causal_conv(w, k.double(), None, postgate.double() if postgate is not None else None)
        return y.to(u.dtype)


@pytest.fixture
def cpu_fftconv(monkeypatch):
    monkeypatch.setattr(plan, "_shared_memory_optin", torch.compiler.assume_constant_result(lambda index: 232448))
    with kernel_standin(monkeypatch, "fftconv", "fftconv", FFTConvStandIn()) as standin:
        yield standin


@pytest.mark.parametrize("n, fft_size", [(8, 512), (100, 512), (256, 512), (257, 1024), (1000, 2048)])
def test_kernel_path_pads_to_the_kernel_length(cpu_fftconv, n, fft_size):
    u, k, _, _ = make(n=n, nk=min(n, 30), dtype=torch.bfloat16)
    assert str(tk.explain_fftconv(u, k)) == f"kernel tk.fftconv_fwd_sm80 [sm80 mma.sync] bf16 n={n} fft={fft_size}"
    y = tk.fftconv(u, k)
    (call,) = cpu_fftconv.calls
    assert call["fft_size"] == fft_size and call["u"].shape[-1] == -(-n // 8) * 8
    assert y.shape == u.shape
    expected = by_definition(u, k)
    torch.testing.assert_close(y.double(), expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


def test_kernel_path_fallback_reasons(cpu_fftconv):
    u, k, _, _ = make(n=5000, nk=3, dtype=torch.float16)
    longest = plan.KERNEL_LENGTHS[-1]
    assert f"length 5000 is longer than the kernels' longest, {longest}" in str(tk.explain_fftconv(u, k))
    u, k, _, _ = make(n=64, dtype=torch.float32)
    assert "dtype torch.float32 is not supported by the kernel" in str(tk.explain_fftconv(u, k))


def test_shared_memory_limit_sends_the_call_to_torch_fft(cpu_fftconv, monkeypatch):
    monkeypatch.setattr(plan, "_shared_memory_optin", torch.compiler.assume_constant_result(lambda index: 64 * 1024))
    u, k, pre, _ = make(n=2048, nk=8, dtype=torch.bfloat16, gates=True)
    assert "needs" in str(tk.explain_fftconv(u, k, pre)) and "bytes of shared memory" in str(tk.explain_fftconv(u, k, pre))
    tk.fftconv(u, k, pre)
    assert cpu_fftconv.calls == []


@pytest.mark.parametrize("gates", [False, True])
def test_kernel_path_gradients_match_the_reference(cpu_fftconv, gates):
    """The op's backward formula (grad_u through the op on flipped inputs, grad_k by torch.fft)
    against autograd of the float64 reference on the same 16-bit inputs."""
    u, k, pre, post = make(n=44, nk=13, dtype=torch.float16, gates=gates, requires_grad=True)
    k = k.detach().float().requires_grad_()
    y = tk.fftconv(u, k, pre, post)
    grad = torch.randn_like(y)
    inputs = [t for t in (u, k, pre, post) if t is not None]
    ours = torch.autograd.grad(y, inputs, grad)
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    expected_y = by_definition(*(leaves + [None] * (4 - len(leaves))))
    expected = torch.autograd.grad(expected_y, leaves, grad.double())
    for name, got, want in zip(("u", "k", "pregate", "postgate"), ours, expected):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * scale, msg=name)
    assert len(cpu_fftconv.calls) >= 2  # the forward, and the backward's flipped convolution


def test_kernel_path_under_torch_compile(cpu_fftconv):
    u, k, pre, post = make(n=24, nk=24, dtype=torch.bfloat16, gates=True)
    compiled = torch.compile(tk.fftconv, fullgraph=True)
    torch.testing.assert_close(compiled(u, k, pre, post), tk.fftconv(u, k, pre, post))


def test_opcheck(cpu_fftconv):
    u, k, pre, post = make(n=16, nk=16, dtype=torch.bfloat16, gates=True, requires_grad=True)
    torch.library.opcheck(torch.ops.tk.fftconv.default, (u, k.detach().float().requires_grad_(), pre, post, 512),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
