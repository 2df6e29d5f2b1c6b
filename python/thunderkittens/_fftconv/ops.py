"""The FFT-conv ops: the kernel ops' handles and fake implementations, and tk::fftconv, the op
tk.fftconv calls, with its autograd formula.

``tk::fftconv_fwd_sm80(u, k_spectrum, pregate, postgate, fft_size, conjugate=False) -> y``
(csrc/fftconv/; ``tk::fftconv_fwd_sm90``, the same contract on Hopper): u (B, H, n) bf16/fp16 with n a multiple of 8 and at most fft_size / 2, readable
in place (see _scaffold.conforms), the filter's spectrum ``tk::fftconv_filter_spectrum(k,
fft_size)`` (rfft(k, fft_size) as (H, fft_size / 2 + 1, 2) floats), optional gates shaped like
u; y a new contiguous tensor shaped like u. ``conjugate`` multiplies by the conjugate spectrum:
the anti-causal correlation y[n] = sum_{m >= n} k[m - n] (u * pregate)[m], times postgate.

``tk::fftconv_filter_grad_sm80(dy, u, fft_size, dy_gate=None, u_gate=None) -> grad`` (H, n)
float32: grad[h, t] = sum_b sum_n dy[b, h, n] u[b, h, n - t], on the tensor cores, with dy and u
times the gates where given (each product rounded to u's dtype, as the forward's pregate: the
kernel applies them as it loads its inputs where it has a gated instantiation, ATen first
elsewhere).

``tk::fftconv(u, k, pregate, postgate, fft_size, correlate=False, family="sm80",
keep_spectrum=True) -> (y, k_spectrum)`` (defined here) is the causal convolution of u with the
filter k (H, Nk) on the kernel family ``family`` (the spectrum, then its forward op), or with
``correlate`` the anti-causal correlation y[n] = sum_{m >= n} k[m - n] w[m] (the pieces of a long
sequence's block decomposition need both, see blocks.py). ``k_spectrum`` is the spectrum y was
computed with (not differentiable). With ``keep_spectrum`` autograd keeps it for the backward,
whose kernel calls take it rather than transform k again (H (fft_size / 2 + 1) 8 bytes held
instead of k, as FlashFFTConv holds its spectrum); without, it keeps k (the block pieces, which
share a few filter blocks). Its backward, with z = grad_y * postgate and w = u * pregate, all on
the kernels (the correlation is the convolution's adjoint, and the other way round):

    grad_w = correlation (convolution) of z with k  (the forward kernel, z fed as its pregate)
    grad_u = grad_w * pregate            (the kernel's postgate when grad_pregate is not wanted)
    grad_pregate = grad_w * u
    grad_postgate = grad_y * conv(w, k)  (the forward kernel with grad_y as its postgate)
    grad_k[h, t] = sum_b sum_n z[b, h, n] w[b, h, n - t]   (the filter-gradient kernel, which
                   (correlation: w and z swapped)          forms z and w from their gates; torch.fft
                                                           where the GPU lacks its shared memory)
"""

from __future__ import annotations

import torch

from .. import _scaffold
from . import plan, reference
from .plan import FAMILIES

#: The forward op of each family, by family name.
FORWARD = {family.name: getattr(torch.ops.tk, family.op_name).default for family in FAMILIES}
FILTER_GRAD = torch.ops.tk.fftconv_filter_grad_sm80.default
SPECTRUM = torch.ops.tk.fftconv_filter_spectrum.default


def _register_forward_fake(op_name: str) -> None:
    @torch.library.register_fake(f"tk::{op_name}")
    def _forward_fake(u, k_spectrum, pregate, postgate, fft_size, conjugate=False):
        torch._check(u.dim() == 3 and u.dtype in _scaffold.KERNEL_DTYPES,
                     lambda: f"tk::{op_name}: u must be a 3-D bfloat16 or float16 tensor")
        return u.new_empty(u.shape)


for _family in FAMILIES:
    _register_forward_fake(_family.op_name)


@torch.library.register_fake("tk::fftconv_filter_grad_sm80")
def _filter_grad_fake(dy, u, fft_size, dy_gate=None, u_gate=None):
    torch._check(u.dim() == 3 and u.dtype in _scaffold.KERNEL_DTYPES,
                 lambda: "tk::fftconv_filter_grad_sm80: u must be a 3-D bfloat16 or float16 tensor")
    return u.new_empty((u.shape[1], u.shape[2]), dtype=torch.float32)


@torch.library.register_fake("tk::fftconv_filter_rfft")
def _filter_rfft_fake(k, fft_size):
    torch._check(k.dim() == 2 and k.dtype in (torch.float32, torch.bfloat16, torch.float16),
                 lambda: "tk::fftconv_filter_rfft: k must be a 2-D float32, bfloat16 or float16 tensor")
    return k.new_empty((k.shape[0], fft_size // 2 + 1, 2), dtype=torch.float32)


def _filter_rfft_setup_context(ctx, inputs, output) -> None:
    k, fft_size = inputs
    ctx.length, ctx.dtype, ctx.fft_size = k.shape[-1], k.dtype, fft_size


def rfft_adjoint(grad: torch.Tensor, length: int, fft_size: int) -> torch.Tensor:
    """The adjoint of rfft(k, fft_size) (k zero-padded, the one-sided half): grad (H, fft_size / 2
    + 1, 2) back to k's first ``length`` values. It is Re(sum_f g_f exp(2 pi i f t / fft_size)),
    which irfft gives scaled by fft_size / 2 once its first and last bins are doubled (irfft counts
    each other bin twice, for its mirror)."""
    g = torch.view_as_complex(grad.float().contiguous())
    g = torch.cat([2 * g[:, :1], g[:, 1:-1], 2 * g[:, -1:]], dim=1)
    return torch.fft.irfft(g, n=fft_size)[:, :length] * (fft_size / 2)


def _filter_rfft_backward(ctx, grad):
    return rfft_adjoint(grad, ctx.length, ctx.fft_size).to(ctx.dtype), None


# The GPU's kernel inside tk::fftconv_filter_spectrum (a composite op).
torch.library.register_autograd("tk::fftconv_filter_rfft", _filter_rfft_backward,
                                setup_context=_filter_rfft_setup_context)


@torch.library.custom_op("tk::fftconv", mutates_args=())
def fftconv_op(u: torch.Tensor, k: torch.Tensor, pregate: torch.Tensor | None,
               postgate: torch.Tensor | None, fft_size: int, correlate: bool = False,
               family: str = "sm80", keep_spectrum: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    # Not "kernel": inductor's fallback-kernel constructor has an argument of that name.
    k_spectrum = SPECTRUM(k, fft_size)
    return FORWARD[family](u, k_spectrum, pregate, postgate, fft_size, correlate), k_spectrum


@fftconv_op.register_fake
def _fftconv_fake(u, k, pregate, postgate, fft_size, correlate=False, family="sm80", keep_spectrum=True):
    return u.new_empty(u.shape), k.new_empty((k.shape[0], fft_size // 2 + 1, 2), dtype=torch.float32)


def _setup_context(ctx, inputs, output) -> None:
    u, k, pregate, postgate, fft_size, correlate, family, keep_spectrum = inputs
    _, k_spectrum = output
    # The spectrum, or (without keep_spectrum) k to transform again.
    ctx.save_for_backward(u, pregate, postgate, k_spectrum if keep_spectrum else None, None if keep_spectrum else k)
    ctx.filter_length, ctx.filter_dtype = k.shape[-1], k.dtype
    ctx.fft_size, ctx.correlate, ctx.family = fft_size, correlate, family
    ctx.mark_non_differentiable(k_spectrum)
    ctx.set_materialize_grads(False)  # no zero-filled gradient for k_spectrum


def _backward(ctx, grad, _grad_spectrum):
    if grad is None:
        return (None,) * 8
    u, pregate, postgate, spectrum, k = ctx.saved_tensors
    needs_u, needs_k, needs_pre, needs_post = ctx.needs_input_grad[:4]
    fft_size, correlate, forward = ctx.fft_size, ctx.correlate, FORWARD[ctx.family]
    grad = _scaffold.operand(grad.to(u.dtype))
    grad_u = grad_k = grad_pre = grad_post = None
    if needs_u or needs_pre or needs_post:
        if spectrum is None:
            spectrum = SPECTRUM(k, fft_size)
        if needs_post:
            grad_post = forward(u, spectrum, pregate, grad, fft_size, correlate)
        if needs_pre:
            grad_w = forward(grad, spectrum, postgate, None, fft_size, not correlate)
            grad_pre = grad_w * u
            if needs_u:
                grad_u = grad_w * pregate
        elif needs_u:
            grad_u = forward(grad, spectrum, postgate, pregate, fft_size, not correlate)
    if needs_k:  # of z = grad * postgate and w = u * pregate
        z, w = (grad, postgate), (u, pregate)
        (dy, dy_gate), (x, x_gate) = (w, z) if correlate else (z, w)
        if plan.filter_grad_fits(u, fft_size):
            grad_k = FILTER_GRAD(dy, x, fft_size, dy_gate, x_gate)[:, : ctx.filter_length]
        else:
            gated = (t if gate is None else t * gate for t, gate in ((dy, dy_gate), (x, x_gate)))
            grad_k = reference.filter_gradient(*gated, ctx.filter_length)
        grad_k = grad_k.to(ctx.filter_dtype)
    return grad_u, grad_k, grad_pre, grad_post, None, None, None, None


fftconv_op.register_autograd(_backward, setup_context=_setup_context)


# Bound once: this runs on every call (dynamo knows is_compiling by identity).
_is_compiling = torch.compiler.is_compiling


def runs_ops_directly(*tensors: torch.Tensor | None) -> bool:
    """Whether a call on these operands (None ones skipped) may run the kernel ops itself rather
    than tk::fftconv: autograd will want no gradient of any of them, and torch.compile (which
    traces tk::fftconv) is not tracing."""
    if _is_compiling():
        return False
    return not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in tensors)


def convolve(u: torch.Tensor, k: torch.Tensor, pregate: torch.Tensor | None, postgate: torch.Tensor | None,
             fft_size: int, correlate: bool = False, family: str = "sm80", keep_spectrum: bool = True) -> torch.Tensor:
    """tk::fftconv's y. Where autograd will want no gradient of any operand (inference, or no
    operand requiring one) its two ops run directly, as tk::fftconv's body does: the custom op's
    Python layers (its autograd and dispatch) cost host time that only a gradient needs. Under
    torch.compile, which traces tk::fftconv, the op always runs."""
    if runs_ops_directly(u, k, pregate, postgate):
        return FORWARD[family](u, SPECTRUM(k, fft_size), pregate, postgate, fft_size, correlate)
    y, _ = fftconv_op(u, k, pregate, postgate, fft_size, correlate, family, keep_spectrum)
    return y
