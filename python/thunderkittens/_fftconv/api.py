"""thunderkittens.fftconv, FFTConv and explain_fftconv."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from .. import _scaffold
from . import blocks, calls, plan, reference
from .checks import check_arguments
from .ops import FORWARD, SPECTRUM, convolve, runs_ops_directly
from .plan import FFTConvPlan


def _padded(t: torch.Tensor | None, length: int) -> torch.Tensor | None:
    if t is None:
        return None
    pad = length - t.shape[-1]
    return _scaffold.operand(F.pad(t, (0, pad)) if pad else t)


def fftconv(u: torch.Tensor, k: torch.Tensor, pregate: torch.Tensor | None = None,
            postgate: torch.Tensor | None = None) -> torch.Tensor:
    """Causal long convolution through the FFT, with optional gates (as in H3 / Hyena)::

        y = irfft(rfft(u * pregate, 2N) * rfft(k, 2N), 2N)[..., :N] * postgate

    i.e. y[b, h, n] = postgate[b, h, n] * sum_{m <= n} k[h, n - m] u[b, h, m] pregate[b, h, m].
    u (B, H, N); k (H, Nk) with 1 <= Nk <= N (a shorter filter is zero-padded), any float
    dtype; the gates (B, H, N) in u's dtype. The result has u's dtype and shape.

    Runs our tensor-core kernel (sm_80 or newer GPUs, Hopper included) for bfloat16/float16 u
    with N up to the longest kernel (see thunderkittens.explain_fftconv), zero-padding N up to
    the next kernel length inside the op, and longer N up to 4 times that as blocks of the
    longest kernel (several kernel calls; on a GPU without the shared memory of the longest
    kernels, of the longest that fits); float32/float64 u, longer N and CPU tensors are
    computed with torch.fft in float32 (float64 for float64). Gradients of u, k and both gates
    flow on both paths: on the kernel path all of them run on the tensor-core kernels (the
    gradient of u is the correlation with k, the forward kernel with the conjugate spectrum; the
    filter's is a correlation summed over the batch, a kernel of its own).
    """
    return _run(calls.prepare(u, k, pregate, postgate), u, k, pregate, postgate)


def _run(call: calls.Call, u, k, pregate, postgate) -> torch.Tensor:
    """tk.fftconv once calls.prepare has made ``call`` of the same arguments."""
    if call.family is None:
        _scaffold.fallback_or_raise(FFTConvPlan, call.reason)
        return reference.causal_conv(u, k, pregate, postgate)
    n, length = u.shape[-1], call.length
    u, pregate, postgate = (_padded(t, length) for t in (u, pregate, postgate))
    if call.lengths is not None:  # longer than the longest kernel this GPU runs: blocks of it
        y = blocks.block_conv(u, k, pregate, postgate, call.lengths, call.family.name)
    else:
        y = convolve(u, k, pregate, postgate, call.fft_size, False, call.family.name)
    return y[..., :n] if length != n else y


def explain_fftconv(u: torch.Tensor, k: torch.Tensor, pregate: torch.Tensor | None = None,
                    postgate: torch.Tensor | None = None) -> FFTConvPlan:
    """Which path ``fftconv`` would take for these arguments, and why; ``str()`` of the result
    is one line, e.g. ``kernel tk.fftconv_fwd_sm80 [sm80 mma.sync] bf16 n=1000 fft=2048`` or
    ``fallback torch.fft: dtype torch.float32 is not supported by the kernel (bfloat16 and
    float16 only)``. Raises the same argument errors as ``fftconv``; does not run anything."""
    check_arguments(u, k, pregate, postgate)
    copies = tuple(name for name, t in (("u", u), ("pregate", pregate), ("postgate", postgate))
                   if t is not None and t.shape[-1] % plan.LENGTH_MULTIPLE == 0 and not _scaffold.conforms(t))
    return plan.explain(u, k, pregate, postgate, copies)


class FFTConv(torch.nn.Module):
    """``tk.FFTConv(seqlen)(u, k, pregate=None, postgate=None)``: tk.fftconv for sequences of up
    to ``seqlen``, as a module (the shape FlashFFTConv users know). In inference (no gradient
    needed), the filter's spectrum is cached and reused while ``k`` is the same tensor object,
    unmodified in place since (its version counter), so a fixed filter is transformed once. A new
    filter tensor (even one at a freed filter's address) gets its own spectrum. Edits through
    ``k.data`` bypass the version counter: call ``clear_cache()`` after them."""

    def __init__(self, seqlen: int):
        super().__init__()
        if not isinstance(seqlen, int) or isinstance(seqlen, bool) or seqlen < 1:
            raise ValueError(f"tk.FFTConv: seqlen must be a positive int, got {seqlen!r}")
        self.seqlen = seqlen
        self.clear_cache()

    def clear_cache(self) -> None:
        """Forget the cached spectrum (the next inference call transforms its filter again)."""
        self._cached_filter = None  # a weak reference: the cache never keeps a filter alive
        self._cached_key = None
        self._cached_spectrum = None

    def forward(self, u: torch.Tensor, k: torch.Tensor, pregate: torch.Tensor | None = None,
                postgate: torch.Tensor | None = None) -> torch.Tensor:
        call = calls.prepare(u, k, pregate, postgate)
        if u.shape[-1] > self.seqlen:
            raise ValueError(f"tk.FFTConv: u's length {u.shape[-1]} exceeds seqlen {self.seqlen}")
        if (call.family is None or call.lengths is not None  # blocks: no spectrum of their own to keep
                or not runs_ops_directly(u, k, pregate, postgate)):
            return _run(call, u, k, pregate, postgate)
        key = (k._version, tuple(k.shape), tuple(k.stride()), k.dtype, k.device, call.fft_size)
        cached = self._cached_filter() if self._cached_filter is not None else None
        if cached is not k or key != self._cached_key:
            self._cached_spectrum = SPECTRUM(k, call.fft_size)
            self._cached_filter = weakref.ref(k)
            self._cached_key = key
        n, length = u.shape[-1], call.length
        y = FORWARD[call.family.name](_padded(u, length), self._cached_spectrum, _padded(pregate, length),
                                      _padded(postgate, length), call.fft_size)
        return y[..., :n] if length != n else y

    def extra_repr(self) -> str:
        return f"seqlen={self.seqlen}"
