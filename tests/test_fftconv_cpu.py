"""tk.fftconv and tk.FFTConv on the CPU: the torch.fft reference against the definition, the
reference path (gates, short filters, gradients), argument checks, explain, strict mode, and the
kernel path against a CPU stand-in of tk::fftconv (padding, the op's autograd formula against
autograd of the reference, torch.compile, opcheck)."""

import pytest
import torch

import thunderkittens as tk
from thunderkittens._fftconv import ops, plan, reference

from differential.standins import fftconv_filter_grad_contract
from gpu_support import kernel_standins


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
    assert str(tk.explain_fftconv(u, k)) == "fallback torch.fft: inputs are on cpu; the kernels need a CUDA GPU"


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


def conforming(t):
    """What the kernel ops' C++ checks require of a (B, H, n) operand (operand_checks.h)."""
    return t.stride(-1) == 1 and all(t.shape[d] == 1 or t.stride(d) % 8 == 0 for d in range(t.dim() - 1))


class ForwardStandIn:
    """CPU implementation of tk::fftconv_fwd_sm80 from the spectrum it is given (in float64,
    rounded once), recording calls; ``.filter_grad`` stands in for tk::fftconv_filter_grad_sm80."""

    def __init__(self):
        self.calls = []
        self.filter_grad = FilterGradStandIn()

    def __call__(self, u, k_spectrum, pregate, postgate, fft_size, conjugate=False, op="fftconv_fwd_sm80"):
        n, heads = u.shape[-1], u.shape[1]
        assert u.dtype in (torch.bfloat16, torch.float16) and n % 8 == 0 and n <= fft_size // 2
        assert k_spectrum.dtype == torch.float32 and k_spectrum.shape == (heads, fft_size // 2 + 1, 2)
        for t in (u, pregate, postgate):
            assert t is None or (t.dtype == u.dtype and t.shape == u.shape and conforming(t))
        self.calls.append({"u": u, "k_spectrum": k_spectrum, "pregate": pregate, "postgate": postgate,
                           "fft_size": fft_size, "conjugate": conjugate, "op": op})
        w = u if pregate is None else u * pregate  # the kernel rounds u * pregate to 16 bits
        spectrum = torch.view_as_complex(k_spectrum.double())
        if conjugate:
            spectrum = spectrum.conj_physical()  # a lazy conj view is lost under AOT autograd
        y = torch.fft.irfft(torch.fft.rfft(w.double(), n=fft_size) * spectrum, n=fft_size)[..., :n]
        if postgate is not None:
            y = y * postgate.double()
        return y.to(u.dtype)


class FilterGradStandIn:
    """CPU implementation of tk::fftconv_filter_grad_sm80 (float64 torch.fft, rounded to float32)."""

    def __init__(self):
        self.calls = []

    def __call__(self, dy, u, fft_size, dy_gate=None, u_gate=None):
        n = u.shape[-1]
        assert u.dtype in (torch.bfloat16, torch.float16) and n % 8 == 0 and n <= fft_size // 2
        for t in (dy, dy_gate, u_gate):
            assert t is None or (t.dtype == u.dtype and t.shape == u.shape and conforming(t))
        assert conforming(u)
        self.calls.append({"dy": dy, "u": u, "fft_size": fft_size, "dy_gate": dy_gate, "u_gate": u_gate})
        return fftconv_filter_grad_contract(dy, u, fft_size, dy_gate, u_gate)


@pytest.fixture
def cpu_fftconv(monkeypatch):
    monkeypatch.setattr(plan, "_shared_memory_optin", torch.compiler.assume_constant_result(lambda index: 232448))
    standin = ForwardStandIn()
    def sm90(*args):
        return standin(*args, op="fftconv_fwd_sm90")

    with kernel_standins(monkeypatch, "fftconv", {"fftconv_fwd_sm80": standin, "fftconv_fwd_sm90": sm90,
                                                  "fftconv_filter_grad_sm80": standin.filter_grad}):
        yield standin


def test_filter_spectrum_is_the_rfft():
    """tk::fftconv_filter_spectrum (plain ATen, any device) is rfft(k, fft_size) as float pairs."""
    k = torch.randn(3, 200, dtype=torch.float64)
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 512)
    assert spectrum.shape == (3, 257, 2) and spectrum.dtype == torch.float32 and spectrum.is_contiguous()
    expected = torch.view_as_real(torch.fft.rfft(k, n=512))
    torch.testing.assert_close(spectrum.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("length, fft_size", [(1, 512), (100, 512), (256, 512), (1000, 4096)])
def test_rfft_adjoint_is_rffts_gradient(length, fft_size):
    """The GPU spectrum op's autograd formula (ops.rfft_adjoint) is the gradient torch.fft.rfft's
    autograd gives for k, in float64."""
    from thunderkittens._fftconv import ops
    torch.manual_seed(length)
    k = torch.randn(3, length, dtype=torch.float64, requires_grad=True)
    spectrum = torch.view_as_real(torch.fft.rfft(k, n=fft_size))
    grad = torch.randn_like(spectrum)
    (expected,) = torch.autograd.grad(spectrum, k, grad)
    torch.testing.assert_close(ops.rfft_adjoint(grad, length, fft_size).double(), expected, rtol=1e-5,
                               atol=1e-6 * expected.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=lambda d: str(d).removeprefix("torch."))
def test_filter_spectrum_of_a_gpu_tensor_traces(dtype):
    """On a GPU tensor the spectrum op is tk::fftconv_filter_rfft (ATen's pad and rfft for
    float64); under FakeTensorMode, with no GPU, the composite and the kernel op's fake give the
    shapes and dtypes of the real ops."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        k = torch.empty(200, 3, device="cuda", dtype=dtype).t()
        spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 512)
        assert spectrum.shape == (3, 257, 2) and spectrum.dtype == torch.float32
        assert spectrum.device.type == "cuda"
        if dtype != torch.float64:
            direct = torch.ops.tk.fftconv_filter_rfft(k, 512)
            assert direct.shape == (3, 257, 2) and direct.dtype == torch.float32 and direct.is_contiguous()


@pytest.mark.parametrize("n, fft_size", [(8, 512), (100, 512), (256, 512), (257, 1024), (1000, 2048),
                                         (5000, 16384), (8192, 16384), (8200, 32768), (16384, 32768)])
def test_kernel_path_pads_to_the_kernel_length(cpu_fftconv, n, fft_size):
    u, k, _, _ = make(n=n, nk=min(n, 30), dtype=torch.bfloat16)
    assert str(tk.explain_fftconv(u, k)) == f"kernel tk.fftconv_fwd_sm80 [sm80 mma.sync] bf16 n={n} fft={fft_size}"
    y = tk.fftconv(u, k)
    (call,) = cpu_fftconv.calls
    assert call["fft_size"] == fft_size and call["u"].shape[-1] == -(-n // 8) * 8
    assert y.shape == u.shape
    expected = by_definition(u, k)
    torch.testing.assert_close(y.double(), expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


@pytest.mark.parametrize("n, fft_size", [(1000, 2048), (2048, 4096), (4000, 8192), (16384, 32768)])
def test_forced_sm90_family_runs_its_op_forward_and_backward(cpu_fftconv, n, fft_size):
    """use_kernel("sm90", op="fftconv") on an sm_90 GPU: explain names tk.fftconv_fwd_sm90 (its
    wgmma kernels at N = 2048 and 4096, the sm80 ones at the other lengths: one contract), and the
    forward and the backward's convolutions all call it; "auto" keeps the sm80 op."""
    u, k, pre, post = make(n=n, nk=n, dtype=torch.bfloat16, gates=True, requires_grad=True)
    assert str(tk.explain_fftconv(u, k, pre, post)).startswith("kernel tk.fftconv_fwd_sm80 [sm80 mma.sync]")
    with tk.use_kernel("sm90", op="fftconv"):
        assert str(tk.explain_fftconv(u, k, pre, post)) == (
            f"kernel tk.fftconv_fwd_sm90 [sm90 wgmma] bf16 n={n} fft={fft_size} pregate+postgate")
        y = tk.fftconv(u, k, pre, post)
        y.backward(torch.randn_like(y))
    assert len(cpu_fftconv.calls) == 3 and all(call["op"] == "fftconv_fwd_sm90" for call in cpu_fftconv.calls)
    assert all(call["fft_size"] == fft_size for call in cpu_fftconv.calls)


def test_kernel_path_fallback_reasons(cpu_fftconv):
    n = plan.MAX_LENGTH + 1
    u, k, _, _ = make(b=1, h=1, n=n, nk=3, dtype=torch.float16)
    assert f"length {n} is longer than the kernels' longest, {plan.MAX_LENGTH}" in str(tk.explain_fftconv(u, k))
    u, k, _, _ = make(n=64, dtype=torch.float32)
    assert "dtype torch.float32 is not supported by the kernel" in str(tk.explain_fftconv(u, k))


def test_shared_memory_limit_sends_the_call_to_torch_fft(cpu_fftconv, monkeypatch):
    """No kernel fits the GPU's shared memory per block: torch.fft, with the reason."""
    smallest = min(plan.FFTCONV_SHARED_BYTES[2 * plan.KERNEL_LENGTHS[0]])
    monkeypatch.setattr(plan, "_shared_memory_optin", torch.compiler.assume_constant_result(lambda index: smallest - 1))
    u, k, pre, _ = make(n=2048, nk=8, dtype=torch.bfloat16, gates=True)
    assert "needs" in str(tk.explain_fftconv(u, k, pre)) and "bytes of shared memory" in str(tk.explain_fftconv(u, k, pre))
    tk.fftconv(u, k, pre)
    assert cpu_fftconv.calls == []


def test_a_postgate_alone_takes_the_lengths_whose_gated_kernels_fit(cpu_fftconv, monkeypatch):
    """The backward feeds the postgate to the forward kernel as its pregate, so a call with only a
    postgate takes the lengths whose kernels fit with a pregate: on an A100's 163 KiB, N = 4096
    with a postgate runs on the kernel of 8192 (4096's needs 177 KiB with a pregate)."""
    available = 163 * 1024
    monkeypatch.setattr(plan, "_shared_memory_optin", torch.compiler.assume_constant_result(lambda index: available))
    u, k, _, post = make(b=1, h=2, n=4096, nk=100, dtype=torch.bfloat16, gates=True)
    assert plan.FFTCONV_SHARED_BYTES[8192][0] <= available < plan.FFTCONV_SHARED_BYTES[8192][1], "the premise"
    assert plan.FFTCONV_SHARED_BYTES[16384][1] <= available, "the premise"
    assert str(tk.explain_fftconv(u, k)).endswith("n=4096 fft=8192")
    assert str(tk.explain_fftconv(u, k, None, post)).endswith("n=4096 fft=16384 postgate")
    with tk.strict():
        tk.fftconv(u, k, None, post)
    assert [call["fft_size"] for call in cpu_fftconv.calls] == [16384]


@pytest.mark.parametrize("gates", [False, True])
def test_shared_memory_limit_takes_the_kernels_that_fit(cpu_fftconv, monkeypatch, gates):
    """Some kernels fit, the one for u's length does not: blocks of the longest that fits (or its
    next length that fits), never a kernel larger than the GPU's blocks can hold."""
    available = 64 * 1024
    monkeypatch.setattr(plan, "_shared_memory_optin", torch.compiler.assume_constant_result(lambda index: available))
    u, k, pre, post = make(b=1, h=2, n=4096, nk=4096, dtype=torch.bfloat16, gates=gates)
    fits = [n for n in plan.KERNEL_LENGTHS if plan.FFTCONV_SHARED_BYTES[2 * n][int(gates)] <= available]
    assert fits and fits[-1] < 4096, "the premise: some kernels fit, the one for N = 4096 does not"
    blocks = -(-4096 // fits[-1])
    assert str(tk.explain_fftconv(u, k, pre, post)).endswith(
        f"n=4096 fft={2 * fits[-1]}" + (f" blocks={blocks}" if blocks > 1 else "") + (" pregate+postgate" if gates else ""))
    with tk.strict():
        y = tk.fftconv(u, k, pre, post)
    assert cpu_fftconv.calls and all(call["fft_size"] <= 2 * fits[-1] for call in cpu_fftconv.calls)
    expected = reference.causal_conv(u.double(), k.double(), None if pre is None else pre.double(),
                                     None if post is None else post.double())
    assert (y.double() - expected).norm() <= 2 * 2.0**-8 * expected.norm()


@pytest.mark.parametrize("gates", [False, True])
def test_kernel_path_gradients_match_the_reference(cpu_fftconv, gates):
    """The op's backward formula (grad of u and the gates through the forward kernel, the
    filter's through the filter-gradient kernel) against autograd of the float64 reference on
    the same 16-bit inputs."""
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
    # The forward, then the backward's: conv(w, k) for the postgate, the correlation for u and
    # the pregate (grad * postgate fed as its pregate), and the filter's gradient.
    assert [call["conjugate"] for call in cpu_fftconv.calls] == ([False, False, True] if gates else [False, True])
    # The filter's gradient takes the gates as they are (the kernel multiplies them in as it loads).
    (filter_grad,) = cpu_fftconv.filter_grad.calls
    for name, gate in (("dy_gate", post), ("u_gate", pre)):
        assert (filter_grad[name] is None) == (gate is None)
        assert gate is None or torch.equal(filter_grad[name][..., : gate.shape[-1]], gate)


@pytest.fixture
def transforms(monkeypatch):
    """The fft_size of each filter transform (tk::fftconv_filter_spectrum) the fftconv ops make."""
    sizes = []
    spectrum_op = ops.SPECTRUM
    monkeypatch.setattr(ops, "SPECTRUM", lambda k, fft_size: sizes.append(fft_size) or spectrum_op(k, fft_size))
    return sizes


def test_backward_takes_the_forward_spectrum(cpu_fftconv, transforms):
    """The filter is transformed once per forward + backward: the backward's kernel calls get the
    spectrum the forward computed (tk::fftconv returns it, autograd keeps it)."""
    u, k, pre, post = make(n=40, nk=40, dtype=torch.bfloat16, gates=True, requires_grad=True)
    y = tk.fftconv(u, k, pre, post)
    torch.autograd.grad(y, (u, k, pre, post), torch.randn_like(y))
    assert len(transforms) == 1
    forward, *backward = cpu_fftconv.calls
    assert len(backward) == 2 and all(call["k_spectrum"] is forward["k_spectrum"] for call in backward)


def test_block_pieces_keep_their_filters(cpu_fftconv, transforms):
    """A long sequence's pieces share a few filter blocks: autograd keeps those, not a spectrum per
    piece, and the backward transforms each piece's filter again."""
    u, k, _, _ = make(b=1, h=2, n=16400, nk=16400, dtype=torch.bfloat16, requires_grad=True)
    y = tk.fftconv(u, k)
    pieces = sum(block_calls(16400, 16400))
    assert len(transforms) == pieces
    torch.autograd.grad(y, (u, k), torch.randn_like(y))
    assert len(transforms) == 2 * pieces


@pytest.mark.parametrize("gates", [False, True])
@pytest.mark.parametrize("n", [40, 16400], ids=["one call", "blocks"])
def test_calls_wanting_no_gradient_run_the_kernel_ops_directly(cpu_fftconv, monkeypatch, n, gates):
    """Where autograd wants no gradient (no operand requires one, or torch.no_grad) tk.fftconv
    calls the spectrum and forward ops itself, with what tk::fftconv hands them and the same
    result; where it wants one, every kernel call goes through tk::fftconv (its autograd)."""
    through_op = []
    fftconv_op = ops.fftconv_op
    monkeypatch.setattr(ops, "fftconv_op", lambda *args, **kwargs: through_op.append(args) or fftconv_op(*args, **kwargs))
    u, k, pre, post = make(b=1, h=2, n=n, nk=n, dtype=torch.bfloat16, gates=gates)
    k = k.float()
    y = tk.fftconv(u, k, pre, post)
    calls = len(cpu_fftconv.calls)
    assert through_op == [] and calls == sum(block_calls(n, n)) and not y.requires_grad
    k.requires_grad_()
    with torch.no_grad():
        y_no_grad = tk.fftconv(u, k, pre, post)
    assert through_op == [] and not y_no_grad.requires_grad
    y_grad = tk.fftconv(u, k, pre, post)
    assert len(through_op) == calls and y_grad.requires_grad
    assert torch.equal(y_no_grad, y) and torch.equal(y_grad.detach(), y)
    direct, op_calls = cpu_fftconv.calls[:calls], cpu_fftconv.calls[2 * calls:]
    for a, b in zip(direct, op_calls):
        assert a["fft_size"] == b["fft_size"] and a["conjugate"] == b["conjugate"]
        assert torch.equal(a["k_spectrum"], b["k_spectrum"]) and torch.equal(a["u"], b["u"])


@pytest.mark.parametrize("which", ["u", "u_pregate", "pregate", "postgate", "k"])
def test_kernel_path_backward_computes_only_what_is_asked(cpu_fftconv, which):
    """Each gradient alone, against the float64 reference's; grad of u without grad of the
    pregate takes the pregate as the correlation's postgate (one kernel call)."""
    u, k, pre, post = make(n=32, nk=32, dtype=torch.bfloat16, gates=True)
    k = k.float()
    wanted = {"u": (u,), "u_pregate": (u, pre), "pregate": (pre,), "postgate": (post,), "k": (k,)}[which]
    for t in wanted:
        t.requires_grad_()
    y = tk.fftconv(u, k, pre, post)
    grad = torch.randn_like(y)
    ours = torch.autograd.grad(y, wanted, grad)
    leaves = {name: t.detach().double().requires_grad_(any(t is w for w in wanted))
              for name, t in (("u", u), ("k", k), ("pre", pre), ("post", post))}
    expected = torch.autograd.grad(by_definition(leaves["u"], leaves["k"], leaves["pre"], leaves["post"]),
                                   [leaves[n] for n in ("u", "k", "pre", "post") if leaves[n].requires_grad],
                                   grad.double())
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got.double(), want, rtol=3e-2, atol=3e-2 * want.abs().max().item())
    backward_calls = cpu_fftconv.calls[1:]
    kernel_calls = {"u": 1, "u_pregate": 1, "pregate": 1, "postgate": 1, "k": 0}[which]
    assert len(backward_calls) == kernel_calls
    assert len(cpu_fftconv.filter_grad.calls) == (1 if which == "k" else 0)
    if which == "u":
        (call,) = backward_calls
        assert call["conjugate"] and call["postgate"] is pre


def test_kernel_path_backward_with_a_broadcast_gradient(cpu_fftconv):
    """y.sum().backward() hands the formula an expanded gradient (stride 0): the kernels get a
    copy they can read."""
    u, k, _, _ = make(n=40, nk=9, dtype=torch.bfloat16, requires_grad=True)
    k = k.detach().float().requires_grad_()
    tk.fftconv(u, k).sum().backward()
    leaves = [u.detach().double().requires_grad_(), k.detach().double().requires_grad_()]
    by_definition(*leaves).sum().backward()
    for got, want in zip((u.grad, k.grad), (leaves[0].grad, leaves[1].grad)):
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


@pytest.mark.parametrize("gates", [False, True])
def test_filter_gradient_falls_back_where_its_kernel_does_not_fit(cpu_fftconv, monkeypatch, gates):
    """A GPU whose blocks lack the filter-gradient kernel's shared memory gets the filter's
    gradient from torch.fft (of the gated operands, with gates); the rest of the backward stays
    on the kernel."""
    sizes = {size: (plain, gated, 1 << 30, *sm90) for size, (plain, gated, _, *sm90) in plan.FFTCONV_SHARED_BYTES.items()}
    monkeypatch.setattr(plan, "FFTCONV_SHARED_BYTES", sizes)
    u, k, pre, post = make(n=24, nk=24, dtype=torch.float16, gates=gates, requires_grad=True)
    k = k.detach().float().requires_grad_()
    y = tk.fftconv(u, k, pre, post)
    grad = torch.randn_like(y)
    inputs = [t for t in (u, k, pre, post) if t is not None]
    ours = torch.autograd.grad(y, inputs, grad)
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    expected = torch.autograd.grad(by_definition(*(leaves + [None] * (4 - len(leaves)))), leaves, grad.double())
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    assert cpu_fftconv.filter_grad.calls == [] and len(cpu_fftconv.calls) == (3 if gates else 2)


def block_calls(n, nk):
    """(convolution pieces, tail pieces) of blocks.block_conv for lengths n and nk."""
    block = plan.KERNEL_LENGTHS[-1]
    count, filters = -(-n // block), -(-nk // block)
    convs = sum(1 for i in range(count) for a in range(i + 1) if i - a < filters)
    tails = sum(1 for i in range(count) for a in range(i) if i - 1 - a < filters)
    return convs, tails


@pytest.mark.parametrize("n, nk, gates", [(16400, 16400, False), (32768, 32768, True), (34000, 300, True),
                                          (48000, 20000, False), (65536, 65536, True)])
def test_long_sequences_run_as_blocks_of_the_longest_kernel(cpu_fftconv, n, nk, gates):
    """Past the longest kernel: blocks of it (every piece a kernel call of at most its size, the
    tails with the conjugate spectrum), summed to the causal convolution of the whole."""
    u, k, pre, post = make(b=1, h=2, n=n, nk=nk, dtype=torch.bfloat16, gates=gates)
    k = k.float()
    blocks = -(-n // plan.KERNEL_LENGTHS[-1])
    expected_text = (f"kernel tk.fftconv_fwd_sm80 [sm80 mma.sync] bf16 n={n} fft={2 * plan.KERNEL_LENGTHS[-1]} "
                     f"blocks={blocks}" + (" pregate+postgate" if gates else ""))
    assert str(tk.explain_fftconv(u, k, pre, post)) == expected_text
    with tk.strict():
        y = tk.fftconv(u, k, pre, post)
    assert y.shape == u.shape and y.dtype == u.dtype
    expected = reference.causal_conv(u.double(), k.double(), None if pre is None else pre.double(),
                                     None if post is None else post.double())
    eps = 2.0**-8
    assert (y.double() - expected).norm() <= 2 * eps * expected.norm()
    assert (y.double() - expected).abs().max() <= 4 * eps * expected.abs().max()
    convs, tails = block_calls(n, nk)
    calls = cpu_fftconv.calls
    assert len(calls) == convs + tails and sum(call["conjugate"] for call in calls) == tails
    assert all(call["fft_size"] <= 2 * plan.KERNEL_LENGTHS[-1] for call in calls)


def test_long_sequence_gradients(cpu_fftconv):
    """The blocks' pieces are differentiable ops: gradients of every input of a three-block call
    (the last block short) against float64 autograd."""
    u, k, pre, post = make(b=1, h=2, n=16400, nk=10000, dtype=torch.float16, gates=True, requires_grad=True)
    k = k.detach().float().requires_grad_()
    y = tk.fftconv(u, k, pre, post)
    grad = torch.randn_like(y)
    inputs = (u, k, pre, post)
    ours = torch.autograd.grad(y, inputs, grad)
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    expected = torch.autograd.grad(reference.causal_conv(*leaves), leaves, grad.double())
    for name, got, want in zip(("u", "k", "pregate", "postgate"), ours, expected):
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item(), msg=name)
    assert len(cpu_fftconv.filter_grad.calls) == sum(block_calls(16400, 10000))


@pytest.mark.parametrize("n", [24, 8200])
def test_kernel_path_under_torch_compile(cpu_fftconv, n):
    """One kernel call, and blocks of the longest kernel (a loop of calls on views)."""
    u, k, pre, post = make(b=1, h=2, n=n, nk=n, dtype=torch.bfloat16, gates=True)
    compiled = torch.compile(tk.fftconv, fullgraph=True)
    torch.testing.assert_close(compiled(u, k, pre, post), tk.fftconv(u, k, pre, post))


@pytest.mark.parametrize("correlate", [False, True])
def test_opcheck(cpu_fftconv, correlate):
    u, k, pre, post = make(n=16, nk=16, dtype=torch.bfloat16, gates=True, requires_grad=True)
    torch.library.opcheck(torch.ops.tk.fftconv.default,
                          (u, k.detach().float().requires_grad_(), pre, post, 512, correlate),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_correlation_op_gradients(cpu_fftconv):
    """tk::fftconv with correlate=True (the blocks' tail pieces): y[n] = post[n] sum_{m >= n}
    k[m - n] (u pre)[m] and its gradients against float64 autograd of the same formula."""
    u, k, pre, post = make(b=2, h=3, n=32, nk=32, dtype=torch.float16, gates=True, requires_grad=True)
    k = k.detach().float().requires_grad_()
    y, spectrum = torch.ops.tk.fftconv(u, k, pre, post, 512, True)
    assert not spectrum.requires_grad
    torch.testing.assert_close(spectrum, torch.ops.tk.fftconv_filter_spectrum(k.detach(), 512))
    grad = torch.randn_like(y)
    ours = torch.autograd.grad(y, (u, k, pre, post), grad)
    leaves = [t.detach().double().requires_grad_() for t in (u, k, pre, post)]
    wd, kd, pd, qd = leaves
    w = wd * pd
    expected_y = torch.stack([(kd[None, :, : 32 - n] * w[..., n:]).sum(-1) for n in range(32)], -1) * qd
    torch.testing.assert_close(y.double(), expected_y, rtol=1e-2, atol=1e-2 * expected_y.abs().max().item())
    expected = torch.autograd.grad(expected_y, leaves, grad.double())
    for name, got, want in zip(("u", "k", "pregate", "postgate"), ours, expected):
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item(), msg=name)
