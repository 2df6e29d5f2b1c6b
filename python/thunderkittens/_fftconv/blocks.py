"""Sequences longer than the longest kernel, as blocks of it: the outer decomposition step.

With blocks of M (the longest kernel length) u = [u_0, u_1, ...], k = [k_0, k_1, ...] and
y = [y_0, y_1, ...], the causal convolution's block i is

    y_i = sum_{a <= i} conv(u_a, k_{i-a})  +  sum_{a < i} tail(u_a, k_{i-1-a})

where conv is the causal convolution of two blocks (their product's first M outputs) and tail the
part of the same product that spills into the next block, tail(x, c)[j] = sum_{m > j} x[m]
c[M + j - m]. The tail is the anti-causal correlation of x with the filter c~[d] = c[M - d]
(c~[0] = 0), which the kernel computes with the conjugate spectrum. Every piece is a kernel call
on views of u and its gates (the postgate of block i multiplies each of its pieces inside the
kernel); block i's pieces are summed in fp32 and rounded once. P blocks cost P^2 kernel calls
of length M (fewer when the filter is shorter), so the decomposition stops at MAX_BLOCKS.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops import convolve


def kernel_piece(*args) -> torch.Tensor:
    """One kernel call of the decomposition. Its filter is one of a few filter blocks that many
    pieces share (P^2 pieces, 2P filters): autograd keeps the filter, not a spectrum per piece."""
    return convolve(*args, keep_spectrum=False)


def kernel_fft_size(length: int, kernel_lengths: tuple[int, ...]) -> int:
    """The FFT size of the shortest kernel for a block of `length`."""
    return 2 * next(n for n in kernel_lengths if n >= length)


def block_conv(u: torch.Tensor, k: torch.Tensor, pregate: torch.Tensor | None,
               postgate: torch.Tensor | None, kernel_lengths: tuple[int, ...], family: str) -> torch.Tensor:
    """The causal convolution of u (B, H, n), n longer than the longest kernel and a multiple of
    8, with k (H, Nk <= n), as blocks of the longest kernel length M on the kernel family
    ``kernel`` (u and the gates read in place, so they conform as the kernels need)."""
    block = kernel_lengths[-1]
    n, nk, heads = u.shape[-1], k.shape[-1], k.shape[0]
    starts = range(0, n, block)
    lengths = [min(block, n - start) for start in starts]

    def view(t, a, length):
        return None if t is None else t[..., a * block: a * block + length]

    # The filter's blocks (zero-padded to M) and their tails' filters; None where k is zero.
    filters, tails = [], []
    for start in starts:
        if start >= nk:
            filters.append(None)
            tails.append(None)
            continue
        piece = k[:, start: start + block]
        piece = F.pad(piece, (0, block - piece.shape[-1]))
        filters.append(piece)
        tails.append(torch.cat([piece.new_zeros(heads, 1), piece[:, 1:].flip(-1)], -1))

    outputs = []
    for i, length in enumerate(lengths):
        post = view(postgate, i, length)
        terms = []
        for a in range(i + 1):
            if filters[i - a] is not None:
                terms.append(kernel_piece(view(u, a, length), filters[i - a][:, :length], view(pregate, a, length),
                                          post, kernel_fft_size(length, kernel_lengths), False, family))
        for a in range(i):  # block a < i is whole: its tail needs all of it
            if tails[i - 1 - a] is None:
                continue
            if length == block:  # the postgate has the call's shape: the kernel applies it
                terms.append(kernel_piece(view(u, a, block), tails[i - 1 - a], view(pregate, a, block), post,
                                          2 * block, True, family))
                continue
            term = kernel_piece(view(u, a, block), tails[i - 1 - a], view(pregate, a, block), None, 2 * block,
                                True, family)[..., :length]
            terms.append(term if post is None else term * post)
        if len(terms) == 1:
            outputs.append(terms[0])
            continue
        total = terms[0].float()
        for term in terms[1:]:
            total = total + term
        outputs.append(total.to(u.dtype))
    return torch.cat(outputs, -1)
