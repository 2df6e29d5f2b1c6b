"""tk.based_step's path (decide) and its decisions kept per layout of a call.

A decoding loop makes the same call layer after layer and token after token, and the argument
checks and the path choice cost more host time than the step kernel's launch. prepare() decides
a call once per key and hands the same answer to the calls after it; the C++ ops re-check every
call cheaply as always.

The key holds everything the checks and decide read: the shapes, dtypes, devices and
requires_grad of q, k, v and the state, torch.is_grad_enabled(), scale, normalize, eps and
inplace (calls whose scale, eps, normalize or inplace have other types than float/int, bool and
None are decided afresh: the checks reject a bool that would equal 1), and the kernel choice;
the process-wide facts (the kernels' dims, the families, the build) empty the cache when they
change (_decisions.DecisionCache). Read on every call, never kept: strict mode and whether the
state is contiguous (the in-place op or one copy back). Calls with other than plain tensors and
everything under torch.compile are decided afresh each time.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _scaffold
from .._decisions import DecisionCache
from .._scaffold import KernelFamily
from . import plan
from .api import _scale_or_default
from .checks import check_arguments
from .plan import SM80, first_requiring_grad, unsupported_shape_reason


def check_step_arguments(q, k, v, state, scale, normalize, eps, inplace) -> None:
    check_arguments("tk.based_step", q, k, v, scale, normalize, eps, state, "state")
    if not isinstance(inplace, bool):
        raise TypeError(f"tk.based_step: inplace must be a bool, got {type(inplace).__name__}")


def decide(q, k, v, state) -> tuple[KernelFamily | None, str | None]:
    """(family, None) for the step kernel, (None, reason) for PyTorch ops. The arguments have
    passed check_step_arguments."""
    reason = unsupported_shape_reason(q, v)
    if reason is not None:
        return None, reason
    if state.dtype != torch.float32:
        return None, f"state dtype {state.dtype} is not supported by the kernel (float32 only)"
    family, reason = _scaffold.choose_family("based", q.device)
    if family is None:
        return None, reason
    # The step kernel is the sm80 family's (CUDA cores, every GPU from sm_80 on): it is what runs
    # where the forward would take the sm90 kernel.
    family = SM80
    name = first_requiring_grad(("q", "k", "v", "state"), q, k, v, state)
    if name is not None:
        return None, (f"{_scaffold.forced_prefix(family)}{name} requires grad and the based_step "
                      "kernel has no backward; under torch.no_grad() or torch.inference_mode() the "
                      "kernel runs")
    return family, None


class StepCall(NamedTuple):
    """How tk.based_step runs a call: the step kernel of ``family``, or PyTorch ops (``family``
    None: for ``reason``, or because the call has no tokens), with the scale and eps the ops
    take."""

    family: KernelFamily | None
    reason: str | None
    scale: float
    eps: float
    no_tokens: bool = False


def _op_facts() -> tuple:
    return plan.KERNEL_FEATURE_DIM, plan.KERNEL_VALUE_DIMS


_cache = DecisionCache("based", _op_facts)
#: Forget every cached decision.
clear = _cache.clear

# Bound once: this runs on every call (dynamo knows is_compiling by identity).
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled


def _tensor_key(t) -> tuple:
    return t.shape, t.dtype, t.device, t.requires_grad


def cache_key(q, k, v, state, scale, normalize, eps, inplace) -> tuple | None:
    """The key of a call (see the module's docstring), or None for a call that is not cached."""
    if (type(q) is not _Tensor or type(k) is not _Tensor or type(v) is not _Tensor
            or type(state) is not _Tensor or type(normalize) is not bool or type(inplace) is not bool
            or (scale is not None and type(scale) is not float and type(scale) is not int)
            or (type(eps) is not float and type(eps) is not int) or _is_compiling()):
        return None
    try:
        return (_tensor_key(q), _tensor_key(k), _tensor_key(v), _tensor_key(state), _is_grad_enabled(),
                scale, normalize, eps, inplace, _cache.choice())
    except RuntimeError:  # tensors without sizes (nested, sparse): decided afresh
        return None


def prepare(q, k, v, state, scale, normalize, eps, inplace) -> StepCall:
    """The StepCall for these arguments (raising as tk.based_step does for bad ones): cached, or
    decided now (and cached when the call has a key)."""
    return _cache.decided(cache_key(q, k, v, state, scale, normalize, eps, inplace), _decide_call,
                          q, k, v, state, scale, normalize, eps, inplace)


def _decide_call(q, k, v, state, scale, normalize, eps, inplace) -> StepCall:
    check_step_arguments(q, k, v, state, scale, normalize, eps, inplace)
    scale, eps = _scale_or_default(scale, q.shape[-1]), float(eps)
    if q.shape[2] == 0:
        return StepCall(None, None, scale, eps, no_tokens=True)
    return StepCall(*decide(q, k, v, state), scale, eps)
