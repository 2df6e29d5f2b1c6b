"""Which path an attention call takes: one of our kernel families, or torch SDPA (and why).

Every decision here reads only shapes, dtypes, devices, flags and configuration, never tensor
data, so it is cheap and torch.compile can trace it (the result is baked into the graph, guarded
on those same properties).
"""

from __future__ import annotations

import torch

from .. import _config
from .._device import device_capability
from .causal_bias import unsupported_mask_reason
from .._extension import BUILT_OPS
from .families import BY_NAME, FAMILIES, KernelFamily

# The device type our kernels run on. A module constant (not a literal in the check) so the CPU
# test suite can trace the kernel path with torch.compile against a CPU stand-in of the op.
KERNEL_DEVICE_TYPE = "cuda"
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
KERNEL_HEAD_DIMS = tuple(sorted({dim for family in FAMILIES for dim in family.head_dims}))
_KERNEL_HEAD_DIMS_TEXT = ", ".join(str(dim) for dim in KERNEL_HEAD_DIMS[:-1]) + f" or {KERNEL_HEAD_DIMS[-1]}"


def _built_backward_ops() -> frozenset[str]:
    """The backward ops this extension defines (an extension built before one existed lacks it:
    then calls needing gradients fall back, with a reason, instead of failing in backward())."""
    names = set()
    for family in FAMILIES:
        if family.backward_op_name is not None and hasattr(torch.ops.tk, family.backward_op_name):
            names.add(family.backward_op_name)
    return frozenset(names)


BUILT_BACKWARD_OPS: frozenset[str] = _built_backward_ops()
# For the fallback reason; made here, not in the traced path (torch 2.11's dynamo failed on
# generators over module constants there).
_WITH_BACKWARD = ", ".join([family.name for family in FAMILIES if family.has_backward])
# Likewise for the head-dim reason: the families that take each head dim, the head dims of each.
_FAMILIES_WITH_HEAD_DIM = {dim: ", ".join([family.name for family in FAMILIES if dim in family.head_dims])
                           for dim in KERNEL_HEAD_DIMS}
_HEAD_DIMS_OF = {family.name: ", ".join([str(dim) for dim in family.head_dims]) for family in FAMILIES}


def feature_fallback_reason(query, key, value, attn_mask, dropout_p, scale=None) -> str | None:
    """Why the call is outside what any attention kernel supports, or None."""
    if query.device.type != KERNEL_DEVICE_TYPE:
        return f"inputs are on {query.device.type}; the kernels need a CUDA GPU"
    if query.dtype not in KERNEL_DTYPES:
        return f"dtype {query.dtype} is not supported by the kernel (bfloat16 and float16 only)"
    head_dim = query.shape[-1]
    if head_dim not in KERNEL_HEAD_DIMS:
        return f"head dim {head_dim} is not supported by the kernel ({_KERNEL_HEAD_DIMS_TEXT} only)"
    if value.shape[-1] != head_dim:
        return (f"value head dim {value.shape[-1]} differs from query head dim {head_dim}; "
                "the kernel needs them equal")
    if attn_mask is not None:
        return unsupported_mask_reason(attn_mask)
    if dropout_p > 0.0:
        return "dropout_p > 0 is not supported by the kernel yet"
    if scale is not None and scale <= 0.0:
        # The kernel takes the running max of raw scores, which is only the max of the
        # scaled scores for a positive scale.
        return f"scale {scale} <= 0 is not supported by the kernel (positive scales only)"
    if "attention" not in BUILT_OPS:
        return ("the attention op family was not compiled into this build (families built: "
                f"{','.join(sorted(BUILT_OPS)) or 'none'}); rebuild with TK_OPS unset")
    return None


def choose_family(device: torch.device) -> tuple[KernelFamily | None, str | None]:
    """(family, None) if a kernel family can run on ``device``, else (None, reason)."""
    found = _family_or_reason(device.index, _config.kernel_choice("attention"))
    if found.startswith(_NO_FAMILY):
        return None, found[len(_NO_FAMILY):]
    return BY_NAME[found], None


_NO_FAMILY = "\x00"


@torch.compiler.assume_constant_result
def _family_or_reason(index: int, choice: str) -> str:
    """The name of the family to run on CUDA device ``index`` (``choice``: "auto" or a forced
    family), or _NO_FAMILY + why none can. One string, a trace-time constant under
    torch.compile: torch 2.11's dynamo cannot guard a comparison of the capability tuple
    (NotImplementedError for a constant source), so the tuple never reaches traced code."""
    capability = device_capability(index)
    if choice != "auto":
        reason = BY_NAME[choice].unavailable_reason(capability)
        return choice if reason is None else f"{_NO_FAMILY}kernel {choice} was forced but {reason}"
    reasons = []
    for family in FAMILIES:
        reason = family.unavailable_reason(capability)
        if reason is None:
            return family.name
        reasons.append(reason)
    return _NO_FAMILY + "; ".join(reasons)


def needs_grad(query, key, value) -> bool:
    """Whether autograd will want gradients of query, key or value from this call."""
    return _name_requiring_grad(query, key, value) is not None


def _name_requiring_grad(query, key, value) -> str | None:
    """The first of query/key/value that autograd will want a gradient for, or None."""
    if not torch.is_grad_enabled():
        return None
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.requires_grad:
            return name
    return None


def _backward_op_built(family: KernelFamily) -> bool:
    return family.backward_op_name in BUILT_BACKWARD_OPS


def head_dim_fallback_reason(family: KernelFamily, head_dim: int) -> str | None:
    """Why ``family`` does not take ``head_dim`` (one of KERNEL_HEAD_DIMS), or None."""
    if head_dim in family.head_dims:
        return None
    forced = _config.kernel_choice("attention") != "auto"
    prefix = f"kernel {family.name} was forced but " if forced else ""
    return (f"{prefix}head dim {head_dim} runs on the {_FAMILIES_WITH_HEAD_DIM[head_dim]} kernels only "
            f"(the {family.name} kernels take head dims {_HEAD_DIMS_OF[family.name]})")


def backward_fallback_reason(family: KernelFamily, query, key, value) -> str | None:
    """Why the call cannot run on ``family`` when a gradient is needed, or None.

    Only the sm90 family has a backward kernel; with sm80 (auto on a non-Hopper GPU, or forced)
    a call that needs gradients goes to SDPA, so training works everywhere. (Under
    torch.use_deterministic_algorithms(True) the sm90 backward runs in its deterministic mode.)"""
    name = _name_requiring_grad(query, key, value)
    if name is None:
        return None
    forced = _config.kernel_choice("attention") != "auto"
    prefix = f"kernel {family.name} was forced but " if forced else ""
    if not family.has_backward:
        return (f"{prefix}{name} requires grad and the {family.name} kernels have no backward "
                f"(kernels with a backward: {_WITH_BACKWARD}); under torch.no_grad() or "
                "torch.inference_mode() the kernel runs")
    if not _backward_op_built(family):
        return (f"{prefix}{name} requires grad and this build of thunderkittens has no "
                f"tk::{family.backward_op_name} op (built before the backward kernel); "
                "rebuild with: pip install --no-build-isolation .")
    return None


def decide(query, key, value, attn_mask, dropout_p, scale=None) -> tuple[KernelFamily | None, str | None]:
    """(family, None) for the kernel path, (None, reason) for the SDPA fallback."""
    reason = feature_fallback_reason(query, key, value, attn_mask, dropout_p, scale)
    if reason is not None:
        return None, reason
    family, reason = choose_family(query.device)
    if family is None:
        return None, reason
    reason = head_dim_fallback_reason(family, query.shape[-1])
    if reason is None:
        reason = backward_fallback_reason(family, query, key, value)
    if reason is not None:
        return None, reason
    return family, None
