"""tk::fftconv_fwd_sm80 (the mma.sync causal FFT convolution) on a GPU, called as the op, against
a float64 torch.fft reference: every kernel length, lengths in between (zero padding), both
dtypes, with and without gates, filters shorter than the sequence, strided inputs, many batches
and heads, persistent blocks running many tasks across heads, unwritten output elements; and the
filter spectrum op's layout. tk::fftconv_fwd_sm90 (its wgmma kernels, N = 2048 and 4096, on an
sm_90 GPU) under the same rule: every dtype and gate, the correlation, lengths in between,
strided inputs, batches and heads over blocks, unwritten elements; at its other lengths it is
the sm80 kernel, bit for bit. N = 2048 and 4096 in both of their configurations (the folded one
Hopper runs, and the full layout smaller GPUs run, picked here with TK_FFTCONV_SHARED_PER_BLOCK).

Tolerance. eps = 2^-8 (bf16) or 2^-11 (fp16), the spacing of the 16-bit numbers at 1. Rounding
one tensor of these values to 16 bits costs about 0.42 eps of relative L2 error. The kernel rounds
four times (three intermediates, where they become mma operands, and the output), rounds
u * pregate to 16 bits before it starts, and multiplies by 16-bit DFT matrices; its Python model
(csrc/fftconv/model.py) puts the relative L2 error at 0.8 .. 1.3 eps and the largest element error
at 0.6 .. 1.8 eps * max|y|. The test holds the kernel to

    relative L2 error <= 2 eps        and        max |error| <= 4 eps * max |y_ref|

with y_ref the float64 causal convolution of the same 16-bit inputs (gates multiplied exactly).
fp32 u has no kernel path: a hi/lo 16-bit split reaches only ~2.5e-6 relative error (model), 40x
fp32's rounding, so tk.fftconv sends fp32 to torch.fft.

The correlation (conjugate=True, the input's gradient) is the same kernel with the conjugate
spectrum: the same rule. The filter gradient (tk::fftconv_filter_grad_sm80) transforms two
16-bit sequences per pair (one or two roundings each on the way), rounds the accumulated
product once and runs one inverse (one or two more): the model puts it at 1.1 .. 1.8 eps of
relative L2 error and 0.7 .. 2.2 eps * max|grad| at worst, so it is held to

    relative L2 error <= 3 eps        and        max |error| <= 4 eps * max |grad_ref|

against the float64 correlation of the same 16-bit inputs.

Run: pytest tests/test_fftconv_kernel_gpu.py (GPU tests; skipped without one).
Benchmark (B=16, H=1024, every kernel length, against torch.fft in fp32):
    python tests/test_fftconv_kernel_gpu.py
"""

import math

import pytest
import torch

import thunderkittens  # noqa: F401  (loads the extension: registers torch.ops.tk.*)
from thunderkittens import _extension
from gpu_support import (fftconv_inputs, fftconv_reference as reference, kernel_length, make_filter,
                         require_kernel_op, seeded)

pytestmark = pytest.mark.gpu

KERNEL_LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]  # fft_size = 2 * length
DTYPES = [torch.bfloat16, torch.float16]
EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
REL_FACTOR = 2.0
MAX_FACTOR = 4.0
FILTER_GRAD_REL_FACTOR = 3.0
FILTER_GRAD_MAX_FACTOR = 4.0
GATES = ["none", "pre", "post", "both"]


@pytest.fixture(scope="module", autouse=True)
def kernel_must_run_here():
    def probe():
        spectrum = torch.ops.tk.fftconv_filter_spectrum(torch.zeros(1, 1, device="cuda"), 512)
        u = torch.zeros(1, 1, 256, device="cuda", dtype=torch.bfloat16)
        torch.ops.tk.fftconv_fwd_sm80(u, spectrum, None, None, 512)
        torch.ops.tk.fftconv_filter_grad_sm80(u, u, 512)

    require_kernel_op("fftconv", "fftconv_fwd_sm80", probe)


def fftconv(u, k, pregate=None, postgate=None, fft_size=None, op=None):
    """The op as tk.fftconv will call it: k's spectrum for the kernel length, u (and the gates)
    zero-padded to a multiple of 8 when needed, y sliced back."""
    n = u.shape[-1]
    if fft_size is None:
        fft_size = 2 * kernel_length(n)
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, fft_size)
    pad = -n % 8
    if pad:
        u, pregate, postgate = (None if t is None else torch.nn.functional.pad(t, (0, pad))
                                for t in (u, pregate, postgate))
    y = (op or torch.ops.tk.fftconv_fwd_sm80)(u, spectrum, pregate, postgate, fft_size)
    return y[..., :n] if pad else y


def assert_close(y, u, k, pregate=None, postgate=None):
    assert y.dtype == u.dtype and y.shape == u.shape
    assert torch.isfinite(y).all(), "output has NaN/inf"
    ref = reference(u, k, pregate, postgate)
    eps = EPS[u.dtype]
    err = y.double() - ref
    rel = err.norm().item() / max(ref.norm().item(), 1e-300)
    rounding = (ref.to(u.dtype).double() - ref).norm().item() / max(ref.norm().item(), 1e-300)
    assert rel <= REL_FACTOR * eps, (f"relative L2 error {rel / eps:.2f} eps > {REL_FACTOR} eps "
                                     f"(rounding the reference alone: {rounding / eps:.2f} eps)")
    worst = err.abs().max().item() / ref.abs().max().item()
    assert worst <= MAX_FACTOR * eps, f"max error {worst / eps:.2f} eps * max|ref| > {MAX_FACTOR} eps"


def call_on_poisoned_memory(u, spectrum, pregate, postgate, fft_size, conjugate=False, op=None):
    """The op's output lands in memory just filled with NaN (the caching allocator hands the freed
    block back to the next request of the same size), so an element the kernel forgets stays NaN."""
    poison = torch.full(u.shape, math.nan, dtype=u.dtype, device=u.device)
    address = poison.data_ptr()
    del poison
    y = (op or torch.ops.tk.fftconv_fwd_sm80)(u, spectrum, pregate, postgate, fft_size, conjugate)
    assert y.data_ptr() == address, "the output did not reuse the NaN block"
    return y


# ---- every kernel length, dtype and gate combination ----------------------------------------

@pytest.mark.parametrize("gates", GATES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", KERNEL_LENGTHS)
def test_matches_reference(n, dtype, gates):
    seeded("ref", n, dtype, gates)
    u, k, pre, post = fftconv_inputs(3, 5, n, dtype, gates)  # odd batch: the last pair has one real sequence
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 2 * n)
    y = call_on_poisoned_memory(u, spectrum, pre, post, 2 * n)
    assert y.is_contiguous()
    assert_close(y, u, k, pre, post)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", KERNEL_LENGTHS)
@pytest.mark.parametrize("filter_length", ["1", "17", "half"])
def test_short_filters(n, dtype, filter_length):
    seeded("short", n, dtype, filter_length)
    nk = n // 2 if filter_length == "half" else int(filter_length)
    u = torch.randn(2, 3, n, device="cuda", dtype=dtype)
    k = make_filter(3, nk)
    assert_close(fftconv(u, k), u, k)


# Lengths between the kernel lengths: multiples of 8 go in as they are (the kernel treats the
# rest of its length as zeros); others are padded to a multiple of 8 first.
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", [1, 8, 17, 255, 264, 300, 1000, 1025, 2040, 2049, 3000, 4095, 4104, 6000, 8191])
def test_lengths_between_kernel_lengths(n, dtype):
    seeded("between", n, dtype)
    u, k, pre, post = fftconv_inputs(3, 2, n, dtype, "both")
    assert_close(fftconv(u, k, pre, post), u, k, pre, post)


@pytest.mark.parametrize("n", [256, 1024, 4096, 8192])
def test_larger_fft_than_needed(n):
    """A call may run a longer kernel than its length needs (more zero padding): same answer."""
    seeded("larger", n)
    u = torch.randn(2, 2, n // 2, device="cuda", dtype=torch.bfloat16)
    k = make_filter(2, n // 4)
    assert_close(fftconv(u, k, fft_size=2 * n), u, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", KERNEL_LENGTHS)
def test_strided_inputs(n, dtype):
    """u and the gates as views: a slice of a wider buffer (head stride and offset), heads and
    batch transposed; the last dim contiguous, other strides multiples of 8."""
    seeded("strided", n, dtype)
    batch, heads = 4, 3
    wide = torch.randn(batch, 2 * heads, n + 16, device="cuda", dtype=dtype)
    u = wide[:, ::2, 8:8 + n]
    pre = torch.randn(heads, batch, n, device="cuda", dtype=dtype).transpose(0, 1)
    post = torch.randn(batch, heads, 2 * n, device="cuda", dtype=dtype)[..., n:]
    k = make_filter(heads, n)
    assert not u.is_contiguous() and not pre.is_contiguous() and not post.is_contiguous()
    assert_close(fftconv(u, k, pre, post), u, k, pre, post)


@pytest.mark.parametrize("batch", [2, 5, 32])
@pytest.mark.parametrize("n", KERNEL_LENGTHS)
def test_many_tasks_per_block(n, batch):
    """Enough (head, pair) tasks that every persistent block runs many, through its cp.async
    ring, changing heads (and the filter's spectrum) every 1, 3 or 16 tasks."""
    seeded("many", n, batch)
    u, k, pre, post = fftconv_inputs(batch, 2048 * 256 // n, n, torch.bfloat16, "both")
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 2 * n)
    y = call_on_poisoned_memory(u, spectrum, pre, post, 2 * n)
    assert_close(y, u, k, pre, post)


@pytest.mark.parametrize("batch, heads", [(1, 1), (1, 7), (2, 1), (5, 3), (2, 40000)])
def test_batch_and_heads(batch, heads):
    """One sequence, odd batches, and batch * heads beyond a grid dimension's 65535."""
    seeded("bh", batch, heads)
    n = 256
    u = torch.randn(batch, heads, n, device="cuda", dtype=torch.float16)
    k = make_filter(heads, n)
    assert_close(fftconv(u, k), u, k)


def test_every_element_written_at_every_length():
    """Lengths that end mid-tile: elements past the length are not written, the rest are."""
    for n in (8, 136, 264, 520, 1032, 2056, 4088, 4104, 8184, 8200, 16376):
        seeded("tail", n)
        u = torch.randn(3, 2, n, device="cuda", dtype=torch.bfloat16)
        k = make_filter(2, min(n, 64))
        spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 2 * kernel_length(n))
        y = call_on_poisoned_memory(u, spectrum, None, None, 2 * kernel_length(n))
        assert_close(y, u, k)


def test_non_default_stream():
    seeded("stream")
    u = torch.randn(4, 8, 1024, device="cuda", dtype=torch.bfloat16)
    k = make_filter(8, 1024)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = fftconv(u, k)
    torch.cuda.current_stream().wait_stream(stream)
    assert_close(y, u, k)


# ---- the spectrum ----------------------------------------------------------------------------


FILTER_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def filter_view(heads, length, dtype, layout):
    """k (heads, length) as a contiguous tensor, a transposed view or a view with a step."""
    if layout == "transposed":
        return torch.randn(length, heads, device="cuda").to(dtype).t()
    if layout == "step":
        return torch.randn(heads, 3 * length, device="cuda").to(dtype)[:, ::3]
    return torch.randn(heads, length, device="cuda").to(dtype)


def assert_is_the_rfft(spectrum, k, fft_size):
    """spectrum is rfft(k, fft_size) of k's values as float pairs, to fp32's accuracy: a relative
    L2 error of at most 1e-6 and no element off by more than 1e-5 of the largest (an fp32
    transform of these lengths, cuFFT's or ours, is at a few 1e-7)."""
    assert spectrum.dtype == torch.float32 and spectrum.shape == (k.shape[0], fft_size // 2 + 1, 2)
    assert spectrum.is_contiguous()
    expected = torch.view_as_real(torch.fft.rfft(k.double(), n=fft_size))
    error = spectrum.double() - expected
    assert error.norm().item() <= 1e-6 * expected.norm().item()
    assert error.abs().max().item() <= 1e-5 * expected.abs().max().item()


SPECTRUM_SIZES = [512, 1024, 2048, 4096, 8192, 16384, 32768]


@pytest.mark.parametrize("fft_size", SPECTRUM_SIZES)
@pytest.mark.parametrize("dtype", FILTER_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "step"])
def test_filter_rfft_is_the_rfft(fft_size, dtype, layout):
    """tk::fftconv_filter_rfft (the spectrum op's kernel on a GPU) is rfft(k, fft_size) for every
    kernel size, filter dtype and layout, at full, odd and short lengths, every element written:
    its output lands on NaN-filled memory."""
    for length in sorted({1, 3, 17, fft_size // 2 - 5, fft_size // 2}):
        seeded("rfft", fft_size, dtype, layout, length)
        k = filter_view(5, length, dtype, layout)
        poison = torch.full((5, fft_size // 2 + 1, 2), math.nan, device="cuda")
        address = poison.data_ptr()
        del poison
        spectrum = torch.ops.tk.fftconv_filter_rfft(k, fft_size)
        assert spectrum.data_ptr() == address, "the output did not reuse the NaN block"
        assert_is_the_rfft(spectrum, k, fft_size)


@pytest.mark.parametrize("heads", [1, 2, 7, 9, 1000])
def test_filter_rfft_heads(heads):
    """Short transforms run several heads per block (8 at fft_size 512, 2 at 2048): head counts
    that do not fill the last block, and many blocks."""
    for fft_size in (512, 1024, 2048, 4096):
        seeded("rfft-heads", heads, fft_size)
        k = torch.randn(heads, fft_size // 2, device="cuda")
        assert_is_the_rfft(torch.ops.tk.fftconv_filter_rfft(k, fft_size), k, fft_size)
    assert torch.ops.tk.fftconv_filter_rfft(torch.randn(0, 5, device="cuda"), 512).shape == (0, 257, 2)


@pytest.mark.parametrize("dtype", FILTER_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_filter_spectrum_gradient(dtype):
    """The spectrum's gradient through the GPU's kernel is torch.fft.rfft's (in fp32), rounded
    once to k's dtype: within 1e-5 in fp32, within one rounding (eps relative) in 16 bits."""
    seeded("spectrum-grad", dtype)
    rtol = {torch.float32: 1e-5, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    for length, fft_size in [(300, 1024), (512, 1024), (1, 512), (8000, 32768)]:
        k = torch.randn(4, length, device="cuda").to(dtype).requires_grad_()
        weight = torch.randn(4, fft_size // 2 + 1, 2, device="cuda")
        (torch.ops.tk.fftconv_filter_spectrum(k, fft_size) * weight).sum().backward()
        k32 = k.detach().float().requires_grad_()
        (torch.view_as_real(torch.fft.rfft(k32, n=fft_size)) * weight).sum().backward()
        assert k.grad.dtype == dtype
        torch.testing.assert_close(k.grad.float(), k32.grad, rtol=rtol, atol=1e-5 * k32.grad.abs().max().item())


def test_filter_rfft_takes_atens_route_where_its_block_does_not_fit(monkeypatch):
    """Where the kernel's block passes the device's shared memory per block (136 KiB at fft_size
    32768; an RTX 4090 gives a block 99), the op pads k and runs ATen's r2c: with
    TK_FFTCONV_SHARED_PER_BLOCK=0 every size takes that route here. Its result is the rfft too,
    a tensor of its own (not a view of r2c's output), and not the kernel's bits."""
    for fft_size in SPECTRUM_SIZES:
        seeded("rfft-aten", fft_size)
        k = filter_view(3, fft_size // 2 - 5, torch.bfloat16, "step")
        monkeypatch.delenv("TK_FFTCONV_SHARED_PER_BLOCK", raising=False)
        kernel = torch.ops.tk.fftconv_filter_rfft(k, fft_size)
        monkeypatch.setenv("TK_FFTCONV_SHARED_PER_BLOCK", "0")
        aten = torch.ops.tk.fftconv_filter_rfft(k, fft_size)
        assert aten._base is None
        assert_is_the_rfft(aten, k, fft_size)
        assert not torch.equal(aten, kernel)


def test_filter_rfft_opcheck():
    seeded("rfft", "opcheck")
    torch.library.opcheck(torch.ops.tk.fftconv_filter_rfft.default,
                          (torch.randn(3, 100, device="cuda", requires_grad=True), 512))


def test_filter_rfft_rejects_what_it_cannot_take():
    op = torch.ops.tk.fftconv_filter_rfft
    k = torch.randn(2, 8, device="cuda")
    for bad, fft_size, message in [
        (k[0], 512, "k must be 2-D"),
        (k.double(), 512, "k must be float32, bfloat16 or float16"),
        (k.int(), 512, "k must be a floating-point tensor"),
        (k, 500, "fft_size must be one of"),
        (torch.randn(2, 257, device="cuda"), 512, "k's length must be 1 .. fft_size / 2 = 256"),
        (k[:, :0], 512, "k's length must be 1 .. fft_size / 2"),
    ]:
        with pytest.raises(RuntimeError, match="tk::fftconv_filter_rfft: " + message):
            op(bad, fft_size)


@pytest.mark.parametrize("fft_size", SPECTRUM_SIZES)
def test_filter_spectrum_is_the_rfft(fft_size):
    """The kernels take rfft(k, fft_size) as (H, fft_size / 2 + 1, 2) floats and build each
    position's K[f] (conj(K[L - f]) above L / 2) themselves."""
    seeded("spectrum", fft_size)
    k = torch.randn(3, fft_size // 2 - 5, device="cuda")
    assert_is_the_rfft(torch.ops.tk.fftconv_filter_spectrum(k, fft_size), k, fft_size)
    # float64 takes ATen's route
    assert_is_the_rfft(torch.ops.tk.fftconv_filter_spectrum(k.double(), fft_size), k, fft_size)


# ---- the correlation (conjugate spectrum) ------------------------------------------------------


def correlation_reference(u, k, pregate=None, postgate=None):
    """float64 y[n] = postgate[n] * sum_{m >= n} k[m - n] (u * pregate)[m]."""
    n = u.shape[-1]
    w = u.double() if pregate is None else u.double() * pregate.double()
    spectrum = torch.fft.rfft(k.double(), n=2 * n).conj()
    y = torch.fft.irfft(torch.fft.rfft(w, n=2 * n) * spectrum, n=2 * n)[..., :n]
    return y if postgate is None else y * postgate.double()


def assert_correlation_close(y, u, k, pregate=None, postgate=None):
    """assert_close's rule against the float64 correlation."""
    assert torch.isfinite(y).all(), "output has NaN/inf"
    ref = correlation_reference(u, k, pregate, postgate)
    err = y.double() - ref
    eps = EPS[u.dtype]
    assert err.norm().item() <= REL_FACTOR * eps * ref.norm().item()
    assert err.abs().max().item() <= MAX_FACTOR * eps * ref.abs().max().item()


@pytest.mark.parametrize("gates", ["none", "both"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", KERNEL_LENGTHS)
def test_conjugate_spectrum_is_the_correlation(n, dtype, gates):
    seeded("correlation", n, dtype, gates)
    u, k, pre, post = fftconv_inputs(3, 4, n, dtype, gates)
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 2 * n)
    poison = torch.full(u.shape, math.nan, dtype=dtype, device="cuda")
    address = poison.data_ptr()
    del poison
    y = torch.ops.tk.fftconv_fwd_sm80(u, spectrum, pre, post, 2 * n, True)
    assert y.data_ptr() == address
    assert_correlation_close(y, u, k, pre, post)


# ---- a smaller GPU's configurations, run here --------------------------------------------------
# N = 2048 and 4096 fold T1 into their DFT matrices where a block holds the folded tables (Hopper;
# an A100 at 2048); elsewhere (an RTX 4090 at 2048, an A100 at 4096) the full layout runs.
# TK_FFTCONV_SHARED_PER_BLOCK caps the shared memory the op's choice assumes; 0 picks the full
# layout here.

FOLDED_LENGTHS = [2048, 4096]


@pytest.mark.parametrize("conjugate", [False, True], ids=["convolution", "correlation"])
@pytest.mark.parametrize("gates", GATES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", FOLDED_LENGTHS)
def test_full_layout_matches_reference(monkeypatch, n, dtype, gates, conjugate):
    seeded("full-layout", n, dtype, gates, conjugate)
    u, k, pre, post = fftconv_inputs(3, 5, n - 8 * 37, dtype, gates)  # a shorter sequence too: zero padding
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 2 * n)
    monkeypatch.setenv("TK_FFTCONV_SHARED_PER_BLOCK", "0")
    y = call_on_poisoned_memory(u, spectrum, pre, post, 2 * n, conjugate)
    (assert_correlation_close if conjugate else assert_close)(y, u, k, pre, post)


@pytest.mark.parametrize("n", FOLDED_LENGTHS)
def test_shared_memory_cap_picks_the_configuration(monkeypatch, n):
    """The folded and the full layout round differently, so their outputs differ in some bits:
    the cap reaches the kernel choice (and a cap above the device's is the device's)."""
    seeded("cap", n)
    u, k, pre, post = fftconv_inputs(4, 3, n, torch.bfloat16, "none")
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 2 * n)
    op = torch.ops.tk.fftconv_fwd_sm80
    folded = op(u, spectrum, None, None, 2 * n)
    monkeypatch.setenv("TK_FFTCONV_SHARED_PER_BLOCK", str(1 << 30))
    assert torch.equal(op(u, spectrum, None, None, 2 * n), folded)
    monkeypatch.setenv("TK_FFTCONV_SHARED_PER_BLOCK", "0")
    full = op(u, spectrum, None, None, 2 * n)
    assert not torch.equal(full, folded)
    assert_close(full, u, k)
    monkeypatch.setenv("TK_FFTCONV_SHARED_PER_BLOCK", "lots")
    with pytest.raises(RuntimeError, match="TK_FFTCONV_SHARED_PER_BLOCK must be a number of bytes"):
        op(u, spectrum, None, None, 2 * n)


# ---- the filter gradient ----------------------------------------------------------------------


def filter_grad_reference(dy, u):
    """float64 grad[h, t] = sum_b sum_n dy[b, h, n] u[b, h, n - t], t < n."""
    n = u.shape[-1]
    products = torch.fft.rfft(dy.double(), n=2 * n) * torch.fft.rfft(u.double(), n=2 * n).conj()
    return torch.fft.irfft(products.sum(0), n=2 * n)[..., :n]


def assert_filter_grad_close(grad, dy, u):
    assert grad.dtype == torch.float32 and grad.shape == (u.shape[1], u.shape[2])
    assert torch.isfinite(grad).all(), "filter gradient has NaN/inf"
    ref = filter_grad_reference(dy, u)
    eps = EPS[u.dtype]
    err = grad.double() - ref
    rel = err.norm().item() / ref.norm().item()
    assert rel <= FILTER_GRAD_REL_FACTOR * eps, f"relative L2 error {rel / eps:.2f} eps"
    worst = err.abs().max().item() / ref.abs().max().item()
    assert worst <= FILTER_GRAD_MAX_FACTOR * eps, f"max error {worst / eps:.2f} eps * max|ref|"


@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", KERNEL_LENGTHS)
def test_filter_grad_matches_reference(n, dtype, batch):
    """Every kernel length; one sequence, an odd batch (a half-used pair), many pairs per head."""
    seeded("filter-grad", n, dtype, batch)
    u = torch.randn(batch, 5, n, device="cuda", dtype=dtype)
    dy = torch.randn(batch, 5, n, device="cuda", dtype=dtype)
    assert_filter_grad_close(torch.ops.tk.fftconv_filter_grad_sm80(dy, u, 2 * n), dy, u)


@pytest.mark.parametrize("n", [8, 136, 264, 1000, 2056, 4088, 4104, 8184])
def test_filter_grad_lengths_between_kernel_lengths(n):
    seeded("filter-grad-between", n)
    u = torch.randn(3, 2, n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(3, 2, n, device="cuda", dtype=torch.bfloat16)
    assert_filter_grad_close(torch.ops.tk.fftconv_filter_grad_sm80(dy, u, 2 * kernel_length(n)), dy, u)


@pytest.mark.parametrize("batch, heads", [(64, 3), (40, 300), (2, 5000), (1, 1)])
@pytest.mark.parametrize("n", [256, 2048, 4096, 8192])
def test_filter_grad_heads_over_blocks(n, batch, heads):
    """A head's pairs spread over several blocks (few heads, many pairs: partial sums added into
    the output), or many whole heads per block."""
    seeded("filter-grad-blocks", n, batch, heads)
    u = torch.randn(batch, heads, n, device="cuda", dtype=torch.float16)
    dy = torch.randn(batch, heads, n, device="cuda", dtype=torch.float16)
    assert_filter_grad_close(torch.ops.tk.fftconv_filter_grad_sm80(dy, u, 2 * n), dy, u)


@pytest.mark.parametrize("n", [256, 1024, 4096, 8192])
def test_filter_grad_small_gradients_in_fp16(n):
    """dy around 1e-4 (fp16's normal range ends at 6e-5): the accumulated spectrum is scaled by a
    power of two before it becomes a 16-bit operand, so its digits survive."""
    seeded("filter-grad-small", n)
    u = torch.randn(4, 3, n, device="cuda", dtype=torch.float16) * 0.05
    dy = (torch.randn(4, 3, n, device="cuda") * 1e-4).half()
    assert_filter_grad_close(torch.ops.tk.fftconv_filter_grad_sm80(dy, u, 2 * n), dy, u)


@pytest.mark.parametrize("n", [512, 4096, 8192])
def test_filter_grad_strided_inputs(n):
    seeded("filter-grad-strided", n)
    u = torch.randn(4, 6, n + 16, device="cuda", dtype=torch.bfloat16)[:, ::2, 8:8 + n]
    dy = torch.randn(3, 4, n, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    assert not u.is_contiguous() and not dy.is_contiguous()
    assert_filter_grad_close(torch.ops.tk.fftconv_filter_grad_sm80(dy, u, 2 * n), dy, u)


def gated_operands(dy, u, dy_gate, u_gate):
    """What the op's gradient is of: dy * dy_gate and u * u_gate, each rounded to 16 bits."""
    return (dy if dy_gate is None else dy * dy_gate), (u if u_gate is None else u * u_gate)


def assert_same_sums(grad, expected):
    """Equal but for the order in which blocks add their shares of a head into grad (fp32
    atomics: more than two shares of an element sum in any order)."""
    assert (grad - expected).abs().max().item() <= 1e-6 * expected.abs().max().item()


@pytest.mark.parametrize("gates", ["dy", "u", "both"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", KERNEL_LENGTHS)
def test_filter_grad_gates_are_the_rounded_products(n, dtype, gates):
    """With gates, the gradient of dy * dy_gate and u * u_gate: what the op gives for those 16-bit
    products (the kernel multiplies them in as it loads, or ATen first at the lengths without a
    gated kernel), and within the reference's tolerance; an odd batch (a half-used pair)."""
    seeded("filter-grad-gates", n, dtype, gates)
    dy, u, dy_gate, u_gate = (torch.randn(3, 5, n, device="cuda", dtype=dtype) for _ in range(4))
    dy_gate = dy_gate if gates in ("dy", "both") else None
    u_gate = u_gate if gates in ("u", "both") else None
    op = torch.ops.tk.fftconv_filter_grad_sm80
    grad = op(dy, u, 2 * n, dy_gate, u_gate)
    products = gated_operands(dy, u, dy_gate, u_gate)
    assert_same_sums(grad, op(*products, 2 * n))
    assert_filter_grad_close(grad, *products)


@pytest.mark.parametrize("n", [256, 2048, 4096, 8192])
def test_filter_grad_gates_strided_and_on_atens_route(n, monkeypatch):
    """Strided gates; and the gates multiplied in by ATen where the gated kernel's block does not
    fit the shared memory per block (TK_FFTCONV_SHARED_PER_BLOCK=0 here): the same numbers."""
    seeded("filter-grad-gates-strided", n)
    u = torch.randn(4, 3, n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(4, 3, n, device="cuda", dtype=torch.bfloat16)
    dy_gate = torch.randn(3, 4, n, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    u_gate = torch.randn(4, 6, n + 16, device="cuda", dtype=torch.bfloat16)[:, ::2, 8:8 + n]
    assert not dy_gate.is_contiguous() and not u_gate.is_contiguous()
    op = torch.ops.tk.fftconv_filter_grad_sm80
    grad = op(dy, u, 2 * n, dy_gate, u_gate)
    products = gated_operands(dy, u, dy_gate, u_gate)
    assert_same_sums(grad, op(*products, 2 * n))
    monkeypatch.setenv("TK_FFTCONV_SHARED_PER_BLOCK", "0")
    assert_same_sums(op(dy, u, 2 * n, dy_gate, u_gate), grad)


def test_filter_grad_rejects_what_the_kernel_cannot_take():
    u = torch.randn(2, 3, 256, device="cuda", dtype=torch.bfloat16)
    op = torch.ops.tk.fftconv_filter_grad_sm80
    with pytest.raises(RuntimeError, match="fft_size"):
        op(u, u, 768)
    with pytest.raises(RuntimeError, match="dy must have u's shape"):
        op(u[:1], u, 512)
    with pytest.raises(RuntimeError, match="dy has dtype"):
        op(u.half(), u, 512)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        op(u[..., :250], u[..., :250], 512)
    with pytest.raises(RuntimeError, match="dy_gate must have u's shape"):
        op(u, u, 512, u[:1])
    with pytest.raises(RuntimeError, match="u_gate has dtype"):
        op(u, u, 512, None, u.half())


# ---- the op's own checks ----------------------------------------------------------------------

def test_rejects_what_the_kernel_cannot_take():
    u = torch.randn(2, 3, 256, device="cuda", dtype=torch.bfloat16)
    spectrum = torch.ops.tk.fftconv_filter_spectrum(torch.randn(3, 256, device="cuda"), 512)
    op = torch.ops.tk.fftconv_fwd_sm80
    with pytest.raises(RuntimeError, match="fft_size"):
        op(u, spectrum, None, None, 768)
    with pytest.raises(RuntimeError, match="at most fft_size / 2"):
        op(torch.randn(2, 3, 512, device="cuda", dtype=torch.bfloat16), spectrum, None, None, 512)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        op(u[..., :250], spectrum, None, None, 512)
    with pytest.raises(RuntimeError, match="bfloat16 or float16"):
        op(u.float(), spectrum, None, None, 512)
    with pytest.raises(RuntimeError, match="pregate"):
        op(u, spectrum, u.half(), None, 512)
    with pytest.raises(RuntimeError, match="postgate"):
        op(u, spectrum, None, u[:, :2], 512)
    with pytest.raises(RuntimeError, match="k_spectrum must have shape"):
        op(u, spectrum[:2], None, None, 512)
    with pytest.raises(RuntimeError, match="strides"):
        op(torch.randn(2, 3, 260, device="cuda", dtype=torch.bfloat16)[..., :256], spectrum, None, None, 512)
    with pytest.raises(RuntimeError, match="k's length"):
        torch.ops.tk.fftconv_filter_spectrum(torch.randn(3, 257, device="cuda"), 512)
    with pytest.raises(RuntimeError, match="k_spectrum must have shape"):
        op(u, torch.randn(3, 512, 2, device="cuda"), None, None, 512)


# ---- benchmark ------------------------------------------------------------------------------

# ---- tk::fftconv_fwd_sm90 (wgmma) ---------------------------------------------------------------

WGMMA_LENGTHS = [2048, 4096]


@pytest.fixture
def sm90_op():
    if not (torch.cuda.get_device_capability() == (9, 0) and _extension.has_arch_specific_code_for((9, 0))):
        pytest.skip("tk::fftconv_fwd_sm90 needs an sm_90 GPU and a 90a build")
    return torch.ops.tk.fftconv_fwd_sm90


@pytest.mark.parametrize("conjugate", [False, True], ids=["convolution", "correlation"])
@pytest.mark.parametrize("gates", GATES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", WGMMA_LENGTHS)
def test_sm90_matches_reference(sm90_op, n, dtype, gates, conjugate):
    seeded("sm90", n, dtype, gates, conjugate)
    u, k, pre, post = fftconv_inputs(3, 5, n, dtype, gates)  # odd batch: the last pair has one real sequence
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 2 * n)
    y = call_on_poisoned_memory(u, spectrum, pre, post, 2 * n, conjugate, op=sm90_op)
    assert y.is_contiguous()
    (assert_correlation_close if conjugate else assert_close)(y, u, k, pre, post)


@pytest.mark.parametrize("n", [8, 1000, 1032, 2040, 2056, 3000, 4088])
def test_sm90_lengths_below_the_kernel_length(sm90_op, n):
    """Sequences shorter than the kernel length (the FFT size of the next wgmma length): the zero
    padding, and the outputs past the sequence not written."""
    seeded("sm90 lengths", n)
    fft_size = 4096 if n <= 2048 else 8192
    u, k, pre, post = fftconv_inputs(4, 3, n, torch.bfloat16, "both", filter_length=min(n, 100))
    assert_close(fftconv(u, k, pre, post, fft_size=fft_size, op=sm90_op), u, k, pre, post)


@pytest.mark.parametrize("n", WGMMA_LENGTHS)
def test_sm90_strided_inputs(sm90_op, n):
    seeded("sm90 strided", n)
    base = torch.randn(4, 6, n + 16, device="cuda", dtype=torch.float16)
    u = base[:, ::2, 8:8 + n]  # head stride 2 (n + 16), batch stride 6 (n + 16), data 16-byte aligned
    gates = torch.randn(3, 4, n, device="cuda", dtype=torch.float16).transpose(0, 1)  # head stride 4 n
    k = make_filter(3, n)
    y = fftconv(u, k, gates, gates, op=sm90_op)
    assert_close(y, u, k, gates, gates)


@pytest.mark.parametrize("batch, heads", [(1, 1), (2, 1), (5, 3), (32, 7), (2, 40000)])
@pytest.mark.parametrize("n", WGMMA_LENGTHS)
def test_sm90_batches_and_heads_over_blocks(sm90_op, n, batch, heads):
    """A block runs consecutive (head, pair) tasks and reloads the spectrum where the head changes."""
    n_check = min(heads, 64)  # heads checked against the reference, spread over the whole range
    seeded("sm90 tasks", n, batch, heads)
    u = torch.randn(batch, heads, n, device="cuda", dtype=torch.bfloat16)
    k = make_filter(heads, n)
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 2 * n)
    y = call_on_poisoned_memory(u, spectrum, None, None, 2 * n, op=sm90_op)
    picked = torch.linspace(0, heads - 1, n_check, device="cuda").long().unique()
    assert_close(y[:, picked].contiguous(), u[:, picked].contiguous(), k[picked])


@pytest.mark.parametrize("n", [256, 1024, 8192, 16384])
def test_sm90_op_is_the_sm80_kernel_at_its_other_lengths(sm90_op, n):
    seeded("sm90 other", n)
    u, k, pre, post = fftconv_inputs(3, 4, n, torch.bfloat16, "both")
    spectrum = torch.ops.tk.fftconv_filter_spectrum(k, 2 * n)
    expected = torch.ops.tk.fftconv_fwd_sm80(u, spectrum, pre, post, 2 * n)
    assert torch.equal(sm90_op(u, spectrum, pre, post, 2 * n), expected)


def test_sm90_rejects_what_the_kernel_cannot_take(sm90_op):
    u = torch.randn(2, 3, 2048, device="cuda", dtype=torch.bfloat16)
    spectrum = torch.ops.tk.fftconv_filter_spectrum(make_filter(3, 2048), 4096)
    with pytest.raises(RuntimeError, match="tk::fftconv_fwd_sm90: u's length 2048 must be at most fft_size / 2"):
        sm90_op(u, spectrum[:, :1025].contiguous(), None, None, 2048)
    with pytest.raises(RuntimeError, match="tk::fftconv_fwd_sm90: u must be bfloat16 or float16"):
        sm90_op(u.float(), spectrum, None, None, 4096)
    with pytest.raises(RuntimeError, match="tk::fftconv_fwd_sm90: pregate must have u's shape"):
        sm90_op(u, spectrum, u[:, :2], None, 4096)


def _time_ms(fn, repeats=20, rounds=5):
    """Median over rounds of the mean time of `repeats` back-to-back calls, by CUDA events."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / repeats)
    return sorted(times)[len(times) // 2]


def benchmark(batch=16, heads=1024, dtype=torch.bfloat16):
    """tk (spectrum precomputed, as a module caching it would; and with the spectrum computed per
    call) against torch.fft in fp32 on the same causal computation, interleaved in one process."""
    print(f"{torch.cuda.get_device_name()}: causal fftconv, B={batch} H={heads} {str(dtype)[6:]}")
    print(f"{'N':>6} {'torch ms':>9} {'tk ms':>8} {'speedup':>8} {'GB/s':>7} {'tk+spec ms':>11} {'speedup':>8}")
    for n in KERNEL_LENGTHS:
        fft_size = 2 * n
        u = torch.randn(batch, heads, n, device="cuda", dtype=dtype)
        k = torch.randn(heads, n, device="cuda")
        spectrum = torch.ops.tk.fftconv_filter_spectrum(k, fft_size)

        def run_torch():
            y = torch.fft.irfft(torch.fft.rfft(u.float(), n=fft_size) * torch.fft.rfft(k, n=fft_size), n=fft_size)
            return y[..., :n].to(dtype)

        def run_tk():
            return torch.ops.tk.fftconv_fwd_sm80(u, spectrum, None, None, fft_size)

        def run_tk_with_spectrum():
            return torch.ops.tk.fftconv_fwd_sm80(u, torch.ops.tk.fftconv_filter_spectrum(k, fft_size), None, None,
                                                 fft_size)

        times = {"torch": [], "tk": [], "tk+spec": []}
        for _ in range(3):  # interleaved: A B C A B C ...
            times["torch"].append(_time_ms(run_torch))
            times["tk"].append(_time_ms(run_tk))
            times["tk+spec"].append(_time_ms(run_tk_with_spectrum))
        t = {name: sorted(v)[1] for name, v in times.items()}
        moved = 2 * u.numel() * u.element_size()  # u read + y written
        print(f"{n:>6} {t['torch']:>9.3f} {t['tk']:>8.3f} {t['torch'] / t['tk']:>7.2f}x "
              f"{moved / t['tk'] / 1e6:>7.0f} {t['tk+spec']:>11.3f} {t['torch'] / t['tk+spec']:>7.2f}x")


if __name__ == "__main__":
    benchmark()
    benchmark(dtype=torch.float16)
