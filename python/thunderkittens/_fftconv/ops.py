"""The FFT-conv ops: the kernel op's handle and fake implementation, and tk::fftconv, the op
tk.fftconv calls, with its autograd formula.

``tk::fftconv_fwd_sm80(u, k_spectrum, pregate, postgate, fft_size) -> y`` (csrc/fftconv/): u
(B, H, n) bf16/fp16 with n a multiple of 8 and at most fft_size / 2, readable in place (see
_scaffold.conforms), the filter's spectrum in the kernel's layout from
``tk::fftconv_filter_spectrum(k, fft_size)``, optional gates shaped like u; y a new contiguous
tensor shaped like u.

``tk::fftconv(u, k, pregate, postgate, fft_size) -> y`` (defined here) is the causal convolution
of u with the filter k (H, Nk) on the kernel: the spectrum, then the forward op. Its backward,
with z = grad_y * postgate and w = u * pregate:

    grad_w = flip(conv(flip(z), k))        (a correlation is a convolution backwards in time:
                                            the same kernel)
    grad_u = grad_w * pregate,  grad_pregate = grad_w * u,  grad_postgate = grad_y * conv(w, k)
    grad_k[h, t] = sum_b sum_n z[b, h, n] w[b, h, n - t]      (torch.fft, summed over the batch)
"""

from __future__ import annotations

import torch

from .. import _scaffold
from . import reference
from .plan import SM80

FORWARD = getattr(torch.ops.tk, SM80.op_name).default
SPECTRUM = torch.ops.tk.fftconv_filter_spectrum.default


@torch.library.register_fake(f"tk::{SM80.op_name}")
def _forward_fake(u, k_spectrum, pregate, postgate, fft_size):
    torch._check(u.dim() == 3 and u.dtype in _scaffold.KERNEL_DTYPES,
                 lambda: f"tk::{SM80.op_name}: u must be a 3-D bfloat16 or float16 tensor")
    return u.new_empty(u.shape)


@torch.library.custom_op("tk::fftconv", mutates_args=())
def fftconv_op(u: torch.Tensor, k: torch.Tensor, pregate: torch.Tensor | None,
               postgate: torch.Tensor | None, fft_size: int) -> torch.Tensor:
    return FORWARD(u, SPECTRUM(k.float(), fft_size), pregate, postgate, fft_size)


@fftconv_op.register_fake
def _fftconv_fake(u, k, pregate, postgate, fft_size):
    return u.new_empty(u.shape)


def _setup_context(ctx, inputs, output) -> None:
    u, k, pregate, postgate, fft_size = inputs
    ctx.save_for_backward(u, k, pregate, postgate)
    ctx.fft_size = fft_size


def _backward(ctx, grad):
    u, k, pregate, postgate = ctx.saved_tensors
    needs_u, needs_k, needs_pre, needs_post = ctx.needs_input_grad[:4]
    fft_size = ctx.fft_size
    z = grad if postgate is None else grad * postgate
    grad_post = None
    if needs_post:
        grad_post = grad * fftconv_op(u, k, pregate, None, fft_size)
    grad_u = grad_pre = grad_k = None
    if needs_u or needs_pre:
        grad_w = fftconv_op(z.flip(-1), k, None, None, fft_size).flip(-1)
        grad_u = grad_w if pregate is None else grad_w * pregate
        grad_pre = grad_w * u if needs_pre else None
    if needs_k:
        w = u if pregate is None else u * pregate
        grad_k = reference.filter_gradient(z, w, k.shape[-1]).to(k.dtype)
    return grad_u, grad_k, grad_pre, grad_post, None


fftconv_op.register_autograd(_backward, setup_context=_setup_context)
