"""Small FFT convolutions for compute-sanitizer (memcheck / racecheck / synccheck).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python3 tools/sanitize_fftconv.py [LENGTH ...]

Calls torch.ops.tk.fftconv_fwd_sm80 (the convolution and, with the conjugate spectrum, the
correlation; at N = 2048 and 4096 also in the full layout a smaller GPU runs, picked with
TK_FFTCONV_SHARED_PER_BLOCK=0), on an sm_90 GPU also torch.ops.tk.fftconv_fwd_sm90 (its wgmma
kernels at N = 2048 and 4096), and torch.ops.tk.fftconv_filter_grad_sm80 directly (no fallback can hide a kernel
problem) at every kernel length, both dtypes, with and without gates, shorter inputs than the
kernel length, and batches that leave a head's last pair half-used (the kernel lengths given on
the command line only, if any). Inputs and the float64 references are made on the CPU. Exits
non-zero on any mismatch.
"""

import itertools
import os
import sys
from unittest import mock

import torch

import thunderkittens  # noqa: F401  (registers torch.ops.tk.*)
from thunderkittens._fftconv import plan

DTYPES = [torch.bfloat16, torch.float16]


def reference(u, k, pre, post, conjugate):
    n = u.shape[-1]
    w = u.double() * (pre.double() if pre is not None else 1)
    spectrum = torch.fft.rfft(k.double(), n=2 * n)
    y = torch.fft.irfft(torch.fft.rfft(w, n=2 * n) * (spectrum.conj() if conjugate else spectrum), n=2 * n)[..., :n]
    return y * (post.double() if post is not None else 1)


def filter_grad_reference(dy, u):
    n = u.shape[-1]
    products = torch.fft.rfft(dy.double(), n=2 * n) * torch.fft.rfft(u.double(), n=2 * n).conj()
    return torch.fft.irfft(products.sum(0), n=2 * n)[..., :n]


def relative(got, ref):
    return ((got.cpu().double() - ref).norm() / ref.norm()).item()


# Kernel lengths whose sm80 forward has a second configuration, the full layout of GPUs with less
# shared memory per block (csrc/fftconv/configs.cuh).
FULL_LAYOUT_LENGTHS = (2048, 4096)


def shared_per_block_cap(value):
    """TK_FFTCONV_SHARED_PER_BLOCK set to `value` (None: left as it is) for the block."""
    return mock.patch.dict(os.environ, {} if value is None else {"TK_FFTCONV_SHARED_PER_BLOCK": value})


def forward_ops(length):
    """(op, shared-per-block cap) to check at a kernel length: the sm80 op (and its full layout
    where it has one), and the sm90 one on an sm_90 GPU where it has a wgmma kernel."""
    ops = [(torch.ops.tk.fftconv_fwd_sm80, None)]
    if length in FULL_LAYOUT_LENGTHS:
        ops.append((torch.ops.tk.fftconv_fwd_sm80, "0"))
    if torch.cuda.get_device_capability() == (9, 0) and length in plan.WGMMA_LENGTHS:
        ops.append((torch.ops.tk.fftconv_fwd_sm90, None))
    return ops


def main() -> int:
    torch.manual_seed(0)
    failures = runs = 0
    lengths = [int(arg) for arg in sys.argv[1:]] or plan.KERNEL_LENGTHS
    for length, dtype, gated, batch in itertools.product(lengths, DTYPES, (False, True), (1, 3)):
        fft_size = 2 * length
        heads, n = 2, max(8, length - 40) // 8 * 8
        u = torch.randn(batch, heads, n).to(dtype)
        k = torch.randn(heads, n // 2)
        pre = torch.randn(batch, heads, n).to(dtype) if gated else None
        post = torch.randn(batch, heads, n).to(dtype) if gated else None
        spectrum = torch.ops.tk.fftconv_filter_spectrum(k.cuda(), fft_size)
        for conjugate, (op, cap) in itertools.product((False, True), forward_ops(length)):
            with shared_per_block_cap(cap):
                y = op(u.cuda(), spectrum, pre.cuda() if gated else None, post.cuda() if gated else None, fft_size,
                       conjugate)
            err = relative(y, reference(u, k, pre, post, conjugate))
            runs += 1
            if not err <= 2 ** -6:
                failures += 1
                print(f"MISMATCH {op} (shared-per-block cap {cap}) length={length} {dtype} gated={gated} "
                      f"batch={batch} conjugate={conjugate}: relative L2 {err:.3e}")
        # The filter gradient; gated, of post * dy and pre * u (the gated instantiation where a
        # length has one), each product rounded to 16 bits.
        dy = torch.randn(batch, heads, n).to(dtype)
        grad = torch.ops.tk.fftconv_filter_grad_sm80(dy.cuda(), u.cuda(), fft_size, post.cuda() if gated else None,
                                                     pre.cuda() if gated else None)
        err = relative(grad, filter_grad_reference(dy * post if gated else dy, u * pre if gated else u))
        runs += 1
        if not err <= 2 ** -6:
            failures += 1
            print(f"MISMATCH filter gradient length={length} {dtype} gated={gated} batch={batch}: "
                  f"relative L2 {err:.3e}")
    torch.cuda.synchronize()
    print(f"sanitize_fftconv: {runs} calls, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
