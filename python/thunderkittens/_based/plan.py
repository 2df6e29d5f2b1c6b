"""Which path a Based call takes: a kernel family, or the PyTorch reference (and why); and the
BasedPlan that explain_based() returns.

The kernels are built for feature dim 16 and value dims 64 and 128, bf16/fp16. The forward
families, in the order ``auto`` prefers them: ``sm90`` (TMA + wgmma, csrc/based/forward_sm90.cu)
needs exactly sm_90 (Hopper) and a 90a build; ``sm80`` (mma.sync + cp.async) runs on every GPU
from sm_80 on, Hopper included (``use_kernel("sm80", op="based")`` forces it there). Both have
one contract; each has its backward op (``based_bwd_sm90``: TMA + wgmma kernels;
``based_bwd_sm80``: mma.sync), and either backward reads only the inputs and o. A call that needs
gradients runs the forward kernel with its family's backward kernels as its autograd formula (with
normalize, the normaliser's share of the gradient by PyTorch ops: autograd.py), where the GPU
gives the backward kernels the shared memory they need; else the chunked PyTorch reference for
both passes, whose autograd gives the gradients.

Every decision here reads only shapes, dtypes, devices, flags and configuration, never tensor
data (see _scaffold).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _config, _scaffold
from .._scaffold import KernelFamily, Plan

KERNEL_FEATURE_DIM = 16
KERNEL_VALUE_DIMS = (64, 128)

SM90 = KernelFamily(op="based", name="sm90", description="sm90 wgmma+tma", op_name="based_fwd_sm90",
                    min_capability=(9, 0), exact_capability=(9, 0), backward_op_name="based_bwd_sm90")
SM80 = KernelFamily(op="based", name="sm80", description="sm80 mma.sync", op_name="based_fwd_sm80",
                    min_capability=(8, 0), backward_op_name="based_bwd_sm80")
# Dynamic shared memory per block of each family's backward kernels (the larger of the dq and the
# dk/dv kernel; csrc/based/backward_*.cu, whose op checks it too), by value dim.
BACKWARD_SHARED_BYTES = {"sm90": {64: 114688, 128: 114688}, "sm80": {64: 94208, 128: 155648}}
FAMILIES: tuple[KernelFamily, ...] = (SM90, SM80)
BY_NAME = _scaffold.register_families(*FAMILIES)


@dataclass(frozen=True, kw_only=True)
class BasedPlan(Plan):
    """What thunderkittens.explain_based() returns: the path a Based call would take."""

    function = "tk.based"
    fallback = "the PyTorch reference (chunked)"

    value_dim: int
    normalize: bool
    initial_state: bool
    final_state: bool
    backward: str | None = None     # what computes the gradients, when the call needs them

    def details(self) -> list[str]:
        parts = [f"dv={self.value_dim}"]
        if self.normalize:
            parts.append("normalized")
        if self.initial_state:
            parts.append("+ initial state")
        if self.final_state:
            parts.append("-> final state")
        if self.backward is not None:
            parts.append(f"(gradients: {self.backward})")
        return parts


def first_requiring_grad(names: tuple[str, ...], *tensors) -> str | None:
    """The name of the first of ``tensors`` (None ones skipped) that autograd will need a
    gradient for, or None."""
    if not torch.is_grad_enabled():
        return None
    for name, t in zip(names, tensors):
        if t is not None and t.requires_grad:
            return name
    return None


def needs_grad(*tensors) -> str | None:
    """The first of q, k, v, initial_state that autograd will need a gradient for, or None."""
    return first_requiring_grad(("q", "k", "v", "initial_state"), *tensors)


def unsupported_shape_reason(q, v) -> str | None:
    """Why the Based kernels cannot take q and v (device, dtype, feature or value dim), or None."""
    reason = _scaffold.unsupported_input_reason("based", q)
    if reason is not None:
        return reason
    if q.shape[-1] != KERNEL_FEATURE_DIM:
        return (f"feature dim {q.shape[-1]} is not supported by the kernel "
                f"({KERNEL_FEATURE_DIM} only)")
    if v.shape[-1] not in KERNEL_VALUE_DIMS:
        return (f"value dim {v.shape[-1]} is not supported by the kernel "
                f"({' or '.join(str(d) for d in KERNEL_VALUE_DIMS)} only)")
    return None


@torch.compiler.assume_constant_result
def _shared_memory_optin(index: int) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def backward_description(family: KernelFamily, normalize: bool) -> str:
    """What computes the gradients of a kernel call (explain's words)."""
    text = f"tk.{family.backward_op_name}"
    return text + " + the normaliser's share by PyTorch ops" if normalize else text


def decide(q, k, v, initial_state) -> tuple[KernelFamily | None, str | None]:
    """(family, None) for the kernel path, (None, reason) for the reference. The arguments have
    passed checks.check_arguments."""
    reason = unsupported_shape_reason(q, v)
    if reason is not None:
        return None, reason
    family, reason = _scaffold.choose_family("based", q.device)
    if family is None:
        return None, reason
    name = needs_grad(q, k, v, initial_state)
    if name is not None:
        value_dim = int(v.shape[-1])
        needed, available = BACKWARD_SHARED_BYTES[family.name][value_dim], _shared_memory_optin(q.device.index)
        if needed > available:
            return None, (f"{_scaffold.forced_prefix(family)}{name} requires grad and the backward "
                          f"kernels for value dim {value_dim} need {needed} bytes of shared memory "
                          f"per block, this GPU has {available}; under torch.no_grad() or "
                          "torch.inference_mode() the forward kernel runs")
    return family, None


def explain(q, k, v, normalize, initial_state, output_final_state, copies) -> BasedPlan:
    family, reason = decide(q, k, v, initial_state)
    backward = (backward_description(family, normalize)
                if family is not None and needs_grad(q, k, v, initial_state) is not None else None)
    return BasedPlan(uses_kernel=family is not None, reason=reason,
                     kernel=family.name if family else None,
                     kernel_description=family.description if family else None,
                     op=f"tk.{family.op_name}" if family else None, dtype=q.dtype,
                     copies=copies if family else (), strict=_config.strict_enabled(),
                     value_dim=int(v.shape[-1]), normalize=normalize,
                     initial_state=initial_state is not None, final_state=output_final_state,
                     backward=backward)
