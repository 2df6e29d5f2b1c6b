"""tk.fftconv's decisions, kept per layout of a call: the argument checks passed, the path
(plan.decide) and the lengths the kernel path pads to and runs.

A model convolves the same shapes layer after layer, and the checks and plan.decide cost about
as much host time as the kernel ops' launches. prepare() decides a call once per key and hands
the same answer to the calls after it; the C++ ops re-check every call cheaply as always.

The key holds everything check_arguments and plan.decide read: the shapes, dtypes and devices
of u, k and the gates (and which gates are given), and the kernel choice; the process-wide facts
(the GPU's shared memory per block, the kernels' shared-memory table, the families and the
build) empty the cache when they change (_decisions.DecisionCache). Not in the key, read on
every call: strides and data pointers (whether an operand is read in place or copied), whether
a gradient is wanted, and strict mode. Calls with other than plain tensors or parameters (None
for a gate) and everything under torch.compile (dynamo traces plan.decide and guards on what it
reads) are decided afresh each time.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._decisions import DecisionCache
from .._scaffold import KernelFamily
from . import plan
from .checks import check_arguments


class Call(NamedTuple):
    """How tk.fftconv runs a call: torch.fft (``family`` None, with the reason), or ``family``'s
    kernel of ``fft_size`` on u padded to ``length``; ``lengths`` (the kernel lengths the GPU
    runs) when the sequence is longer than the longest of them and runs as its blocks."""

    family: KernelFamily | None
    fft_size: int | None
    reason: str | None
    length: int
    lengths: tuple[int, ...] | None = None


def _op_facts() -> tuple:
    return (plan._shared_memory_optin, plan.FFTCONV_SHARED_BYTES, plan.KERNEL_LENGTHS, plan.MAX_BLOCKS,
            plan.LENGTH_MULTIPLE)


_cache = DecisionCache("fftconv", _op_facts)
#: Forget every cached decision.
clear = _cache.clear

# Bound once: this runs on every call (dynamo knows is_compiling by identity).
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_is_compiling = torch.compiler.is_compiling


def _gate_key(gate) -> tuple | None:
    return None if gate is None else (gate.shape, gate.dtype, gate.device)


def _plain(t) -> bool:
    # A filter is often a module's parameter: nn.Parameter is a tensor like any other here.
    return type(t) is _Tensor or type(t) is _Parameter


def cache_key(u, k, pregate, postgate) -> tuple | None:
    """The key of a call (see the module's docstring), or None for a call that is not cached."""
    if (not _plain(u) or not _plain(k) or (pregate is not None and not _plain(pregate))
            or (postgate is not None and not _plain(postgate)) or _is_compiling()):
        return None
    try:
        return (u.shape, u.dtype, u.device, k.shape, k.dtype, k.device, _gate_key(pregate),
                _gate_key(postgate), _cache.choice())
    except RuntimeError:  # tensors without sizes (nested, sparse): decided afresh
        return None


def prepare(u, k, pregate, postgate) -> Call:
    """The Call for these arguments (raising as tk.fftconv does for bad ones): cached, or
    decided now (and cached when the call has a key)."""
    return _cache.decided(cache_key(u, k, pregate, postgate), _decide, u, k, pregate, postgate)


def _decide(u, k, pregate, postgate) -> Call:
    check_arguments(u, k, pregate, postgate)
    family, fft_size, reason = plan.decide(u, k, pregate, postgate)
    n = u.shape[-1]
    length = -(-n // plan.LENGTH_MULTIPLE) * plan.LENGTH_MULTIPLE
    if family is None or length <= fft_size // 2:
        return Call(family, fft_size, reason, length)
    # Longer than the longest kernel this GPU runs: blocks of it.
    return Call(family, fft_size, reason, length, plan.device_lengths(u, pregate, postgate, family))
