"""Which path an FFT convolution takes: the kernel (and its FFT size), or torch.fft (and why);
and the FFTConvPlan that explain_fftconv() returns.

The kernels take u in bfloat16/float16 of length N up to the largest kernel size (the causal
FFT has twice that length), zero-padding N up to the next kernel size (a causal convolution's
first N outputs do not see the padding); longer N, up to MAX_BLOCKS times it, as blocks of the
largest kernel size (blocks.py). A GPU runs the kernel lengths whose kernels fit its shared
memory per block (device_lengths): on one with less than the longest kernel needs, the longest
that fits takes that role. Every decision reads only shapes, dtypes, devices and
configuration, never tensor data (see _scaffold).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _config, _scaffold
from .._extension import FFTCONV_SHARED_BYTES
from .._scaffold import KernelFamily, Plan

SM80 = KernelFamily(op="fftconv", name="sm80", description="sm80 mma.sync",
                    op_name="fftconv_fwd_sm80", min_capability=(8, 0))
# Hopper's wgmma kernels for N = 2048 and 4096 (WGMMA_LENGTHS; the other lengths run the sm80
# kernels). Second in "auto" order: they are still slower than the mma.sync ones on an H100
# (docs/performance.md), so they run where forced (use_kernel("sm90", op="fftconv")).
SM90 = KernelFamily(op="fftconv", name="sm90", description="sm90 wgmma",
                    op_name="fftconv_fwd_sm90", min_capability=(9, 0), exact_capability=(9, 0))
FAMILIES: tuple[KernelFamily, ...] = (SM80, SM90)
#: The lengths the sm90 family runs on its wgmma kernels.
WGMMA_LENGTHS = (2048, 4096)
BY_NAME = _scaffold.register_families(*FAMILIES)

#: The lengths N with a kernel (its FFT has 2N points); other N are padded up to the next one.
KERNEL_LENGTHS = tuple(sorted(size // 2 for size in FFTCONV_SHARED_BYTES))
#: The kernels read and write u in 16-byte pieces: its length is padded to a multiple of 8.
LENGTH_MULTIPLE = 8
#: Longer sequences are blocks of the longest kernel length (blocks.py), up to this many: P
#: blocks cost P^2 kernel calls.
MAX_BLOCKS = 4
#: The longest N on the kernels (on a GPU that has the shared memory of every kernel).
MAX_LENGTH = KERNEL_LENGTHS[-1] * MAX_BLOCKS if KERNEL_LENGTHS else 0


@dataclass(frozen=True, kw_only=True)
class FFTConvPlan(Plan):
    """What thunderkittens.explain_fftconv() returns: the path an fftconv call would take."""

    function = "tk.fftconv"
    fallback = "torch.fft"

    length: int
    fft_size: int | None            # the kernel's FFT length (twice its kernel length)
    gates: str                      # "", "pregate", "postgate" or "pregate+postgate"
    blocks: int = 1                 # > 1: blocks of the longest kernel length (blocks.py)

    def details(self) -> list[str]:
        parts = [f"n={self.length}", f"fft={self.fft_size}"]
        if self.blocks > 1:
            parts.append(f"blocks={self.blocks}")
        if self.gates:
            parts.append(self.gates)
        return parts


def kernel_length(length: int, lengths: tuple[int, ...] = KERNEL_LENGTHS) -> int | None:
    """The kernel length (of `lengths`, those a GPU runs) a sequence of `length` runs on (its
    blocks' for long ones), or None."""
    for size in lengths:
        if size >= length:
            return size
    return lengths[-1] if lengths and length <= lengths[-1] * MAX_BLOCKS else None


def block_count(length: int, lengths: tuple[int, ...] = KERNEL_LENGTHS) -> int:
    """How many blocks of the longest of `lengths` a sequence of `length` is computed as."""
    return 1 if length <= lengths[-1] else -(-length // lengths[-1])


@torch.compiler.assume_constant_result
def _shared_memory_optin(index: int) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def forward_shared_bytes(fft_size: int, gated: bool, family: KernelFamily = SM80) -> int:
    """The shared memory per block of ``family``'s forward kernel for fft_size."""
    return FFTCONV_SHARED_BYTES[fft_size][int(gated) + (3 if family is SM90 else 0)]


def device_lengths(u, pregate, postgate, family: KernelFamily = SM80) -> tuple[int, ...]:
    """The kernel lengths whose forward kernel (``family``'s) fits the shared memory per block of
    u's GPU: with a pregate where either gate is given (the backward feeds the postgate to the
    forward kernel as its pregate)."""
    available = _shared_memory_optin(u.device.index)
    gated = pregate is not None or postgate is not None
    return tuple(n for n in KERNEL_LENGTHS if forward_shared_bytes(2 * n, gated, family) <= available)


def decide(u, k, pregate, postgate) -> tuple[KernelFamily | None, int | None, str | None]:
    """(family, fft_size, None) for the kernel path, (None, None, reason) for torch.fft. The
    arguments have passed checks.check_arguments."""
    reason = _scaffold.unsupported_input_reason("fftconv", u)
    if reason is not None:
        return None, None, reason
    family, reason = _scaffold.choose_family("fftconv", u.device)
    if family is None:
        return None, None, reason
    lengths = device_lengths(u, pregate, postgate, family)
    if not lengths:
        shortest = KERNEL_LENGTHS[0]
        needed = forward_shared_bytes(2 * shortest, pregate is not None, family)
        return None, None, (f"{_scaffold.forced_prefix(family)}the kernel for length {shortest}"
                            f"{' with a pregate' if pregate is not None else ''} needs {needed} bytes "
                            f"of shared memory per block, this GPU has {_shared_memory_optin(u.device.index)}")
    length = kernel_length(u.shape[-1], lengths)
    if length is None:
        longest = lengths[-1] * MAX_BLOCKS
        return None, None, (f"length {u.shape[-1]} is longer than the kernels' longest, {longest} "
                            f"({MAX_BLOCKS} blocks of {lengths[-1]})")
    return family, 2 * length, None


def filter_grad_fits(u, fft_size: int) -> bool:
    """Whether u's GPU gives a block the shared memory of the filter-gradient kernel for fft_size
    (the backward computes the filter's gradient with torch.fft where it does not)."""
    return FFTCONV_SHARED_BYTES[fft_size][2] <= _shared_memory_optin(u.device.index)


def explain(u, k, pregate, postgate, copies) -> FFTConvPlan:
    family, fft_size, reason = decide(u, k, pregate, postgate)
    gates = "+".join(name for name, gate in (("pregate", pregate), ("postgate", postgate)) if gate is not None)
    return FFTConvPlan(uses_kernel=family is not None, reason=reason,
                       kernel=family.name if family else None,
                       kernel_description=family.description if family else None,
                       op=f"tk.{family.op_name}" if family else None, dtype=u.dtype,
                       copies=copies if family else (), strict=_config.strict_enabled(),
                       length=int(u.shape[-1]), fft_size=fft_size, gates=gates,
                       blocks=block_count(int(u.shape[-1]), device_lengths(u, pregate, postgate, family))
                       if family else 1)
