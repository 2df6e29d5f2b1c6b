"""Which path a Based call takes: a kernel family, or the PyTorch reference (and why); and the
BasedPlan that explain_based() returns.

The kernels are built for feature dim 16 and value dims 64 and 128, bf16/fp16, forward only;
``sm80`` (mma.sync + cp.async) runs on every GPU from sm_80 on, Hopper included. A call that
needs gradients runs the chunked PyTorch reference, whose autograd gives them.

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

SM80 = KernelFamily(op="based", name="sm80", description="sm80 mma.sync", op_name="based_fwd_sm80",
                    min_capability=(8, 0))
FAMILIES: tuple[KernelFamily, ...] = (SM80,)
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

    def details(self) -> list[str]:
        parts = [f"dv={self.value_dim}"]
        if self.normalize:
            parts.append("normalized")
        if self.initial_state:
            parts.append("+ initial state")
        if self.final_state:
            parts.append("-> final state")
        return parts


def _needs_grad(*tensors) -> str | None:
    if not torch.is_grad_enabled():
        return None
    for name, t in zip(("q", "k", "v", "initial_state"), tensors):
        if t is not None and t.requires_grad:
            return name
    return None


def decide(q, k, v, initial_state) -> tuple[KernelFamily | None, str | None]:
    """(family, None) for the kernel path, (None, reason) for the reference. The arguments have
    passed checks.check_arguments."""
    reason = _scaffold.unsupported_input_reason("based", q)
    if reason is not None:
        return None, reason
    if q.shape[-1] != KERNEL_FEATURE_DIM:
        return None, (f"feature dim {q.shape[-1]} is not supported by the kernel "
                      f"({KERNEL_FEATURE_DIM} only)")
    if v.shape[-1] not in KERNEL_VALUE_DIMS:
        return None, (f"value dim {v.shape[-1]} is not supported by the kernel "
                      f"({' or '.join(str(d) for d in KERNEL_VALUE_DIMS)} only)")
    family, reason = _scaffold.choose_family("based", q.device)
    if family is None:
        return None, reason
    name = _needs_grad(q, k, v, initial_state)
    if name is not None:
        return None, (f"{_scaffold.forced_prefix(family)}{name} requires grad and the based "
                      "kernels have no backward yet; under torch.no_grad() or "
                      "torch.inference_mode() the kernel runs")
    return family, None


def explain(q, k, v, normalize, initial_state, output_final_state, copies) -> BasedPlan:
    family, reason = decide(q, k, v, initial_state)
    return BasedPlan(uses_kernel=family is not None, reason=reason,
                     kernel=family.name if family else None,
                     kernel_description=family.description if family else None,
                     op=f"tk.{family.op_name}" if family else None, dtype=q.dtype,
                     copies=copies if family else (), strict=_config.strict_enabled(),
                     value_dim=int(v.shape[-1]), normalize=normalize,
                     initial_state=initial_state is not None, final_state=output_final_state)
