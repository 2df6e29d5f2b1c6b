"""tk.fftconv and tk.FFTConv on a GPU, called as users call them: the kernel path (explain says
``kernel tk.fftconv_fwd_sm80``, and strict mode turns any fallback into an error; the sm90 family
where forced) against a
float64 torch.fft reference at every kernel length and lengths in between, both dtypes, with and
without gates, filters shorter than the sequence, strided and misaligned views, fp32 and lengths
past the longest kernel on torch.fft (with the reason), gradients of u, k and both gates against
float64 autograd, the module's cached filter spectrum (reused, and renewed when the filter
changes), torch.compile, CUDA-graph capture, a non-default stream, and batch * heads beyond 65535.

On a GPU of sm_80 or newer with the fftconv family built (for this GPU), a call these tests
expect on the kernel that would not take it FAILS (the explain check, and tk.strict()); the module
skips only without such a GPU or build. A GPU with less than Hopper's 227 KiB of shared memory per
block runs the kernel lengths whose kernels fit it (N = 16384 and 4096-with-a-gate do not on
sm_80; N >= 2048 with a gate and N >= 4096 do not on sm_86/89): a length between them takes the
next one that fits, a longer one blocks of the longest that fits, and the tests expect exactly
that (or, where none fits, explain's shared-memory reason and the torch.fft answer).

Tolerance (the rule of tests/test_fftconv_kernel_gpu.py): eps = 2^-8 (bf16) or 2^-11 (fp16), the
unit roundoff of the 16-bit type. With y_ref the float64 causal convolution of the same 16-bit
inputs (gates multiplied exactly):

    relative L2 error <= 2 eps        and        max |error| <= 4 eps * max |y_ref|

Gradients, against float64 autograd of the same computation:
  u, pregate, postgate: relative L2 <= 4 eps, max <= 8 eps * max|ref|. Each passes through one
    kernel convolution (held to 2 eps / 4 eps above; grad_u and grad_pregate through the flipped
    convolution of grad * postgate, grad_postgate through the forward one) and through up to two
    16-bit roundings of elementwise products (grad * postgate before it, the gate after it, about
    0.5 eps of relative L2 each); a gate multiplying after the kernel also scales the kernel's
    max error by max|gate| against the product's own max, hence twice the forward bounds.
  k: relative L2 <= 3 eps, max <= 4 eps * max|ref|. The filter-gradient kernel from grad * postgate
    and u * pregate, each rounded to 16 bits once (a correlation summed over batch and time, so
    those roundings average): its own 16-bit scheme makes 1.1 .. 1.8 eps (the bound of
    tests/test_fftconv_kernel_gpu.py), the result in k's dtype (fp32).
The relative L2 bounds average the roundings of many elements: on outputs of fewer than 64
elements (N = 1: y = u k, every rounding on one value) relative L2 is held to the max bound.
fp32 and fp64 inputs (torch.fft in their own precision): relative L2 and max <= 1e-5 (fp32),
1e-12 (fp64).
"""

import math
import re

import pytest
import torch

import thunderkittens as tk
from gpu_support import (fftconv_inputs, fftconv_reference as reference, kernel_length, make_filter,
                         make_gates, require_family_gpu, seeded)
from thunderkittens import _extension
from thunderkittens._fftconv import api as fftconv_api
from thunderkittens._fftconv import plan as fftconv_plan

pytestmark = pytest.mark.gpu

KERNEL_LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]  # the kernel's FFT has twice as many points
DTYPES = [torch.bfloat16, torch.float16]
DTYPE_IDS = ["bf16", "fp16"]
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
REL_FACTOR, MAX_FACTOR = 2.0, 4.0
GRAD_REL_FACTOR, GRAD_MAX_FACTOR = 4.0, 8.0
FILTER_GRAD_REL_FACTOR, FILTER_GRAD_MAX_FACTOR = 3.0, 4.0
GATES = ["none", "pre", "post", "both"]
KERNEL = "kernel tk.fftconv_fwd_sm80 [sm80 mma.sync]"


@pytest.fixture(scope="module", autouse=True)
def gpu_with_the_fftconv_kernel():
    require_family_gpu("fftconv")


MAX_LENGTH = 4 * KERNEL_LENGTHS[-1]  # longer N than the longest kernel: blocks of it, up to 4


def test_the_kernel_lengths():
    """The kernels cover N = 256 .. 16384 (FFTs of 512 .. 32768 points), longer N up to 65536 as
    blocks of the longest; longer still go to torch.fft."""
    assert tuple(fftconv_plan.KERNEL_LENGTHS) == tuple(KERNEL_LENGTHS)
    assert fftconv_plan.MAX_LENGTH == MAX_LENGTH
    assert sorted(_extension.FFTCONV_SHARED_BYTES) == [2 * n for n in KERNEL_LENGTHS]


# ---- the kernel path -------------------------------------------------------------------------


def device_lengths(u, pregate, postgate):
    """The kernel lengths this GPU runs: those whose kernel (with a pregate where either gate is
    given: the backward feeds the postgate to it as its pregate) fits its shared memory per block
    (the sizes are the C++ side's, _C.fftconv_shared_bytes)."""
    available = torch.cuda.get_device_properties(u.device).shared_memory_per_block_optin
    gated = pregate is not None or postgate is not None
    return [n for n in KERNEL_LENGTHS if _extension.FFTCONV_SHARED_BYTES[2 * n][gated] <= available]


def fft_size_for(u, pregate=None, postgate=None):
    """The FFT size of the kernel u's call runs (its blocks' past the longest kernel)."""
    lengths = device_lengths(u, pregate, postgate)
    return 2 * next((m for m in lengths if m >= kernel_length(u.shape[-1])), lengths[-1])


def kernel_fits(u, pregate, postgate):
    """Whether this GPU runs u's call on the kernels (some kernel fits it, and u is at most 4
    blocks of the longest that does)."""
    lengths = device_lengths(u, pregate, postgate)
    return bool(lengths) and u.shape[-1] <= 4 * lengths[-1]


def kernel_plan_text(u, pregate=None, postgate=None, copies=()):
    n = u.shape[-1]
    longest = device_lengths(u, pregate, postgate)[-1]
    parts = [KERNEL, DTYPE_NAMES[u.dtype], f"n={n}", f"fft={fft_size_for(u, pregate, postgate)}"]
    if n > longest:
        parts.append(f"blocks={-(-n // longest)}")
    gates = "+".join(name for name, gate in (("pregate", pregate), ("postgate", postgate)) if gate is not None)
    if gates:
        parts.append(gates)
    if copies:
        parts.append(f"(copies {', '.join(copies)} with .contiguous())")
    return " ".join(parts)


def on_kernel(u, k, pregate=None, postgate=None, copies=()):
    """tk.fftconv(u, k, pregate, postgate), which must take the kernel (explain says so, with
    exactly ``copies`` copied; strict mode makes a fallback an error), unless this GPU lacks the
    kernel's shared memory: then explain must say that, and torch.fft computes it."""
    plan = tk.explain_fftconv(u, k, pregate, postgate)
    if not kernel_fits(u, pregate, postgate):
        assert not plan.uses_kernel and "bytes of shared memory" in plan.reason, str(plan)
        return tk.fftconv(u, k, pregate, postgate)
    assert plan.uses_kernel, f"tk.fftconv does not take the kernel on this GPU: {plan}"
    assert str(plan) == kernel_plan_text(u, pregate, postgate, copies)
    assert plan.copies == tuple(copies), str(plan)
    with tk.strict():
        return tk.fftconv(u, k, pregate, postgate)


# ---- reference and checks --------------------------------------------------------------------


def assert_within(got, ref, rel_bound, max_bound, what):
    """relative L2 error <= rel_bound and max |error| <= max_bound * max|ref| (on fewer than 64
    elements relative L2 <= max_bound: the docstring's rule)."""
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if got.numel() < 64:
        rel_bound = max(rel_bound, max_bound)
    assert torch.isfinite(got).all(), f"{what}: NaN/inf"
    err = got.double() - ref
    scale = max(ref.norm().item(), 1e-300)
    rel = err.norm().item() / scale
    worst = err.abs().max().item() / max(ref.abs().max().item(), 1e-300)
    assert rel <= rel_bound, f"{what}: relative L2 error {rel:.3e} > {rel_bound:.3e}"
    assert worst <= max_bound, f"{what}: max error {worst:.3e} * max|ref| > {max_bound:.3e} * max|ref|"


def assert_close(y, u, k, pregate=None, postgate=None):
    """y against the float64 convolution of the same inputs, by the rule of the docstring."""
    assert y.dtype == u.dtype and y.shape == u.shape, (y.dtype, y.shape)
    ref = reference(u, k, pregate, postgate)
    if u.dtype in EPS:
        eps = EPS[u.dtype]
        assert_within(y, ref, REL_FACTOR * eps, MAX_FACTOR * eps, "y")
    else:
        tol = 1e-5 if u.dtype == torch.float32 else 1e-12
        assert_within(y, ref, tol, tol, "y")


# ---- every kernel length, lengths in between -------------------------------------------------


@pytest.mark.parametrize("gates", GATES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", KERNEL_LENGTHS)
def test_every_kernel_length(n, dtype, gates):
    seeded("length", n, dtype, gates)
    u, k, pre, post = fftconv_inputs(3, 5, n, dtype, gates)
    y = on_kernel(u, k, pre, post)
    assert y.is_contiguous()
    assert_close(y, u, k, pre, post)


@pytest.mark.parametrize("gates", ["none", "both"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [1, 17, 100, 1000, 3000, 4095, 4097, 6000, 8191])
def test_lengths_between_kernel_lengths(n, dtype, gates):
    """Zero-padded up to the next kernel length (and to a multiple of 8) inside the op."""
    seeded("between", n, dtype, gates)
    u, k, pre, post = fftconv_inputs(3, 2, n, dtype, gates)
    assert_close(on_kernel(u, k, pre, post), u, k, pre, post)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [256, 1000, 4096, 8192])
@pytest.mark.parametrize("filter_length", ["1", "7", "half"])
def test_filters_shorter_than_the_sequence(filter_length, n, dtype):
    seeded("short", filter_length, n, dtype)
    nk = n // 2 if filter_length == "half" else int(filter_length)
    u, k, pre, post = fftconv_inputs(2, 3, n, dtype, "both", filter_length=nk)
    assert_close(on_kernel(u, k), u, k)
    assert_close(on_kernel(u, k, pre, post), u, k, pre, post)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_filter_in_the_inputs_dtype(dtype):
    seeded("filter-dtype", dtype)
    u = torch.randn(2, 3, 1000, device="cuda", dtype=dtype)
    k = make_filter(3, 300, dtype)
    assert_close(on_kernel(u, k), u, k)


# ---- layouts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [256, 1000, 4096, 8192])
def test_strided_views_are_read_in_place(n, dtype):
    """u a slice of a wider buffer (every other head, 16 bytes into each row), the gates a
    transposed and a sliced view: last dim contiguous, other strides multiples of 16 bytes, data
    16-byte aligned. Read in place (explain names no copy), the same bits as contiguous inputs."""
    seeded("strided", n, dtype)
    batch, heads = 4, 3
    u = torch.randn(batch, 2 * heads, n + 16, device="cuda", dtype=dtype)[:, ::2, 8:8 + n]
    pre = torch.randn(heads, batch, n, device="cuda", dtype=dtype).transpose(0, 1)
    post = torch.randn(batch, heads, 2 * n, device="cuda", dtype=dtype)[..., n:]
    k = make_filter(heads, n)
    assert not u.is_contiguous() and not pre.is_contiguous() and not post.is_contiguous()
    y = on_kernel(u, k, pre, post)
    assert_close(y, u, k, pre, post)
    assert torch.equal(y, on_kernel(u.contiguous(), k, pre.contiguous(), post.contiguous()))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_views_the_kernel_cannot_read_are_copied(dtype):
    """u 6 bytes off a 16-byte boundary, a pregate with rows of N + 3 elements, a postgate with a
    strided last dim: each is copied (explain names them), with the contiguous inputs' answer."""
    seeded("misaligned", dtype)
    batch, heads, n = 2, 3, 1024
    u = torch.randn(batch * heads * n + 3, device="cuda", dtype=dtype)[3:].view(batch, heads, n)
    assert u.data_ptr() % 16 != 0
    pre = torch.randn(batch, heads, n + 3, device="cuda", dtype=dtype)[..., :n]
    post = torch.randn(batch, heads, 2 * n, device="cuda", dtype=dtype)[..., ::2]
    k = make_filter(heads, n)
    y = on_kernel(u, k, pre, post, copies=("u", "pregate", "postgate"))
    assert_close(y, u, k, pre, post)
    assert torch.equal(y, on_kernel(u.clone(), k, pre.contiguous(), post.contiguous()))


def test_batch_times_heads_beyond_65535():
    """16 x 4096 (batch, head) pairs at N = 256: more sequences than a grid dimension holds."""
    seeded("many")
    batch, heads, n = 16, 4096, 256
    u = torch.randn(batch, heads, n, device="cuda", dtype=torch.bfloat16)
    k = make_filter(heads, n)
    y = on_kernel(u, k)
    assert_close(y, u, k)


# ---- torch.fft paths -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_float_inputs_go_to_torch_fft(dtype):
    seeded("float", dtype)
    u, k, pre, post = fftconv_inputs(2, 3, 1000, dtype, "both", filter_dtype=dtype)
    reason = f"dtype {dtype} is not supported by the kernel (bfloat16 and float16 only)"
    plan = tk.explain_fftconv(u, k, pre, post)
    assert not plan.uses_kernel and str(plan) == f"fallback torch.fft: {reason}"
    message = f"tk.fftconv would fall back to torch.fft: {reason}"
    with tk.strict(), pytest.raises(tk.FallbackError, match=re.escape(message)):
        tk.fftconv(u, k, pre, post)
    assert_close(tk.fftconv(u, k, pre, post), u, k, pre, post)


@pytest.mark.parametrize("gates", ["none", "both"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n, nk", [(16400, 16400), (24000, 300), (32768, 32768), (40000, 40000), (65536, 65536)])
def test_lengths_past_the_longest_kernel_run_as_blocks(n, nk, dtype, gates):
    """Blocks of the longest kernel length (2 .. 4 of them, the last one short or whole)."""
    seeded("blocks", n, nk, dtype, gates)
    u, k, pre, post = fftconv_inputs(2, 3, n, dtype, gates, filter_length=nk)
    assert_close(on_kernel(u, k, pre, post), u, k, pre, post)
    with torch.no_grad():
        assert_close(tk.FFTConv(n)(u, k, pre, post), u, k, pre, post)


@pytest.mark.parametrize("n", [MAX_LENGTH + 8, 80000])
def test_lengths_past_the_blocks_go_to_torch_fft(n):
    seeded("long", n)
    u = torch.randn(1, 2, n, device="cuda", dtype=torch.bfloat16)
    k = make_filter(2, n)
    longest = device_lengths(u, None, None)[-1]  # the longest kernel this GPU runs (all of them on Hopper)
    reason = f"length {n} is longer than the kernels' longest, {4 * longest} (4 blocks of {longest})"
    plan = tk.explain_fftconv(u, k)
    assert not plan.uses_kernel and str(plan) == f"fallback torch.fft: {reason}"
    with tk.strict(), pytest.raises(tk.FallbackError, match=re.escape(reason)):
        tk.fftconv(u, k)
    assert_close(tk.fftconv(u, k), u, k)
    assert_close(tk.FFTConv(2 * MAX_LENGTH)(u, k), u, k)


# ---- gradients -------------------------------------------------------------------------------


def backward_nodes(y):
    """The names of the autograd nodes behind y."""
    names, seen, todo = [], set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(node.name())
        todo.extend(next_node for next_node, _ in node.next_functions)
    return names



@pytest.mark.parametrize("n, nk", [(256, 256), (300, 37), (512, 512), (1000, 1000), (2048, 2048),
                                   (4096, 4096), (4000, 100), (8192, 8192), (6000, 300), (16400, 10000)])
@pytest.mark.parametrize("gates", GATES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gradients_match_float64_autograd(dtype, gates, n, nk):
    """The kernel path's backward (grad of u and the gates through the forward kernel, the
    filter's through the filter-gradient kernel) against float64 autograd of the same
    convolution, by the docstring's bounds."""
    seeded("grad", dtype, gates, n, nk)
    u = torch.randn(2, 3, n, device="cuda", dtype=dtype, requires_grad=True)
    k = make_filter(3, nk).requires_grad_()
    pre, post = (None if g is None else g.requires_grad_() for g in make_gates(u.shape, dtype, gates))
    y = on_kernel(u, k, pre, post)
    if kernel_fits(u, pre, post):
        assert any("tk_fftconv" in name for name in backward_nodes(y)), backward_nodes(y)  # the op's formula
    grad = torch.randn_like(y)
    names, inputs = zip(*((name, t) for name, t in (("u", u), ("k", k), ("pregate", pre), ("postgate", post))
                          if t is not None))
    with tk.strict():
        ours = torch.autograd.grad(y, inputs, grad)
    assert_gradients_close(names, inputs, ours, grad, dtype)


def assert_gradients_close(names, inputs, ours, grad, dtype):
    """Our gradients of ``inputs`` (named u, k, pregate, postgate) for the output gradient ``grad``
    against float64 autograd of the convolution, by the docstring's bounds."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    by_name = dict(zip(names, leaves))
    ref = reference(by_name["u"], by_name["k"], by_name.get("pregate"), by_name.get("postgate"))
    expected = torch.autograd.grad(ref, leaves, grad.double())
    eps = EPS[dtype]
    for name, leaf, got, want in zip(names, inputs, ours, expected):
        assert got.dtype == leaf.dtype, (name, got.dtype)
        if name == "k":
            assert_within(got, want, FILTER_GRAD_REL_FACTOR * eps, FILTER_GRAD_MAX_FACTOR * eps, "grad of k")
        else:
            assert_within(got, want, GRAD_REL_FACTOR * eps, GRAD_MAX_FACTOR * eps, f"grad of {name}")


# ---- the sm90 family (forced) ----------------------------------------------------------------


@pytest.mark.parametrize("n, nk", [(2048, 2048), (4096, 4096), (1500, 300), (3000, 3000)])
@pytest.mark.parametrize("gates", GATES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_forced_sm90_forward_and_gradients(dtype, gates, n, nk):
    """use_kernel("sm90", op="fftconv"): the wgmma kernels at N = 2048 and 4096 (and the lengths
    padded to them) for the forward and the backward's convolutions, against float64, by the
    docstring's bounds."""
    if not (torch.cuda.get_device_capability() == (9, 0) and _extension.has_arch_specific_code_for((9, 0))):
        pytest.skip("the sm90 family needs an sm_90 GPU and a 90a build")
    seeded("sm90 grad", dtype, gates, n, nk)
    u = torch.randn(3, 3, n, device="cuda", dtype=dtype, requires_grad=True)
    k = make_filter(3, nk).requires_grad_()
    pre, post = (None if g is None else g.requires_grad_() for g in make_gates(u.shape, dtype, gates))
    names, inputs = zip(*((name, t) for name, t in (("u", u), ("k", k), ("pregate", pre), ("postgate", post))
                          if t is not None))
    with tk.use_kernel("sm90", op="fftconv"), tk.strict():
        plan = tk.explain_fftconv(u, k, pre, post)
        assert str(plan).startswith(f"kernel tk.fftconv_fwd_sm90 [sm90 wgmma] {DTYPE_NAMES[dtype]} n={n} "
                                    f"fft={4096 if n <= 2048 else 8192}"), str(plan)
        y = tk.fftconv(u, k, pre, post)
        assert_close(y.detach(), u.detach(), k.detach(), None if pre is None else pre.detach(),
                     None if post is None else post.detach())
        grad = torch.randn_like(y)
        ours = torch.autograd.grad(y, inputs, grad)
    assert_gradients_close(names, inputs, ours, grad, dtype)


# ---- the module ------------------------------------------------------------------------------


@pytest.fixture
def spectrum_calls(monkeypatch):
    """Counts the filter spectra tk.FFTConv computes."""
    calls = []
    real = fftconv_api.SPECTRUM

    def counting(k, fft_size):
        calls.append(fft_size)
        return real(k, fft_size)

    monkeypatch.setattr(fftconv_api, "SPECTRUM", counting)
    return calls


@pytest.mark.parametrize("n", [1000, 4096, 8192])
def test_module_caches_the_filter_spectrum_in_inference(spectrum_calls, n):
    seeded("module", n)
    m = tk.FFTConv(n)
    u, u2 = (torch.randn(2, 3, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k = make_filter(3, n)
    pre, post = make_gates(u.shape, torch.bfloat16, "both")
    if not kernel_fits(u, pre, post):
        plan = tk.explain_fftconv(u, k, pre, post)
        assert not plan.uses_kernel and "bytes of shared memory" in plan.reason, str(plan)
        pytest.skip(f"no kernel for this length on this GPU, so nothing to cache: {plan}")
    with tk.strict():
        y1 = m(u, k, pre, post)
        y2 = m(u2, k, pre, post)
        y3 = m(u, k, pre, post)
    assert len(spectrum_calls) == 1, "the spectrum of an unchanged filter was computed again"
    assert torch.equal(y1, on_kernel(u, k, pre, post)) and torch.equal(y3, y1)
    assert torch.equal(y2, on_kernel(u2, k, pre, post))
    assert_close(y1, u, k, pre, post)

    # An in-place edit of the filter is noticed: the next call uses the new filter.
    k[:, : n // 4].mul_(-3.0)
    with tk.strict():
        y4 = m(u, k, pre, post)
    assert len(spectrum_calls) == 2, "the filter changed in place but its old spectrum was used"
    assert torch.equal(y4, on_kernel(u, k, pre, post)) and not torch.equal(y4, y1)
    assert_close(y4, u, k, pre, post)


def test_module_with_a_new_filter_where_a_freed_one_was():
    """One module for several layers (as FlashFFTConv is used), each passing a filter made afresh
    (Hyena's implicit filters): a new filter in the memory of a freed one is a different filter,
    though its address and version counter (0, fresh) are the old one's. The filter's size (1.5
    MiB) is used by nothing else here, so the caching allocator hands the freed block back."""
    seeded("module-fresh")
    heads, n = 384, 1024
    m = tk.FFTConv(n)
    u = torch.randn(1, heads, n, device="cuda", dtype=torch.float16)
    k = torch.randn(heads, n, device="cuda")
    address = k.data_ptr()
    with tk.strict():
        first = m(u, k)
    assert torch.equal(first, on_kernel(u, k))
    del k
    k = torch.randn(heads, n, device="cuda")
    reused = k.data_ptr() == address
    with tk.strict():
        second = m(u, k)
    right = torch.equal(second, on_kernel(u, k))
    assert right, f"stale filter spectrum (the new filter {'is' if reused else 'is not'} at the freed one's address)"


def test_module_in_training_gives_the_functions_gradients():
    """With a filter that requires grad nothing is cached: the result and gradients are tk.fftconv's."""
    seeded("module-train")
    n = 1000
    m = tk.FFTConv(n)
    u = torch.randn(2, 3, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = make_filter(3, n).requires_grad_()
    grad = torch.randn(2, 3, n, device="cuda", dtype=torch.bfloat16)
    with tk.strict():
        y = m(u, k)
        ours = torch.autograd.grad(y, (u, k), grad)
        y_fn = tk.fftconv(u, k)
        expected = torch.autograd.grad(y_fn, (u, k), grad)
    assert torch.equal(y, y_fn)
    assert all(torch.equal(a, b) for a, b in zip(ours, expected))


# ---- compile, graphs, streams ----------------------------------------------------------------


@pytest.mark.parametrize("n", [100, 1024, 8192])
def test_torch_compile_fullgraph(n):
    torch._dynamo.reset()
    seeded("compile", n)
    u = torch.randn(2, 4, n, device="cuda", dtype=torch.bfloat16)
    k = make_filter(4, n)
    pre, post = make_gates(u.shape, torch.bfloat16, "both")
    m = tk.FFTConv(n)

    def f(u, k, pre, post):
        return tk.fftconv(u, k, pre, post) * 2, m(u, k, pre, post)

    expected = on_kernel(u, k, pre, post)
    with tk.strict():
        eager = f(u, k, pre, post)
        compiled = torch.compile(f, fullgraph=True)(u, k, pre, post)
    assert torch.equal(eager[0], expected * 2)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], expected)
    assert_close(expected, u, k, pre, post)


def test_cuda_graph_capture_and_replay():
    seeded("graph")
    n = 1000  # padded to 1008 inside the op, run on the 1024 kernel
    u = torch.randn(2, 8, n, device="cuda", dtype=torch.float16)
    k = make_filter(8, n)
    pre, post = make_gates(u.shape, torch.float16, "both")
    m = tk.FFTConv(n)

    def call():
        return tk.fftconv(u, k, pre, post), m(u, k, pre, post)

    assert tk.explain_fftconv(u, k, pre, post).uses_kernel
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), tk.strict():
        call()  # warm-up outside the capture (the module caches k's spectrum here)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), tk.strict():
        static_y, static_module_y = call()
    for _ in range(3):
        for t in (u, pre, post):
            t.copy_(torch.randn_like(t))
        graph.replay()
        with tk.strict():
            eager = tk.fftconv(u, k, pre, post)
        torch.cuda.synchronize()
        assert torch.equal(static_y, eager) and torch.equal(static_module_y, eager)
    # The function's graph computes k's spectrum on every replay: a new filter is used.
    k.copy_(make_filter(8, n))
    graph.replay()
    torch.cuda.synchronize()
    with tk.strict():
        assert torch.equal(static_y, tk.fftconv(u, k, pre, post))
    assert_close(static_y, u, k, pre, post)


def test_runs_on_the_current_stream():
    seeded("stream")
    u = torch.randn(4, 8, 1024, device="cuda", dtype=torch.bfloat16)
    u_new = torch.randn_like(u)
    k = make_filter(8, 1024)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # The side stream is busy for a while before u is overwritten; a kernel launched on any
        # other stream would read the old u.
        torch.cuda._sleep(100_000_000)
        u.copy_(u_new)
        y = on_kernel(u, k)
    torch.cuda.current_stream().wait_stream(side)
    assert_close(y, u_new, k)
