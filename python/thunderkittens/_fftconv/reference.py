"""The causal long convolution through torch.fft, the reference and fallback of tk.fftconv:

    y = irfft(rfft(u * pregate, 2N) * rfft(k, 2N), 2N)[..., :N] * postgate

computed in float32 (float64 for float64 inputs); autograd differentiates it as written.
"""

from __future__ import annotations

import torch


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def causal_conv(u, k, pregate=None, postgate=None):
    """y (B, H, N) in u's dtype for u (B, H, N) and k (H, Nk), Nk <= N."""
    dtype = compute_dtype(u)
    n = u.shape[-1]
    fft_size = 2 * n
    w = u.to(dtype) if pregate is None else u.to(dtype) * pregate.to(dtype)
    spectrum = torch.fft.rfft(k.to(dtype), n=fft_size)
    y = torch.fft.irfft(torch.fft.rfft(w, n=fft_size) * spectrum, n=fft_size)[..., :n]
    if postgate is not None:
        y = y * postgate.to(dtype)
    return y.to(u.dtype)


def filter_gradient(grad_w: torch.Tensor, w: torch.Tensor, filter_length: int) -> torch.Tensor:
    """d loss / d k (H, Nk) of y = causal_conv(w, k), given d loss / d y (grad_w, (B, H, N)):
    grad_k[h, t] = sum_b sum_n grad_w[b, h, n] w[b, h, n - t], a correlation summed over b."""
    dtype = compute_dtype(w)
    n = w.shape[-1]
    fft_size = 2 * n
    g = torch.fft.rfft(grad_w.to(dtype), n=fft_size)
    x = torch.fft.rfft(w.to(dtype), n=fft_size)
    # conj_physical: a lazy conjugate view was read unconjugated inside compiled graphs' opaque ops
    return torch.fft.irfft((g * x.conj_physical()).sum(0), n=fft_size)[..., :filter_length]
