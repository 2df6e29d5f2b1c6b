"""Which path a matmul call takes: the sm_90 kernel (with the operand views and copies it gets),
or torch.matmul (and why); and the MatmulPlan that explain_matmul() returns.

Every decision here reads only shapes, strides, dtypes, devices and configuration, never tensor
data (see _scaffold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import _config, _scaffold
from .._scaffold import KernelFamily, Plan
from .checks import check_types, check_values
from .layout import Problem, kernel_problem, layout_after_copy, layout_of, unreadable_reason

# The kernel is TMA + wgmma code compiled for sm_90a, which runs on exactly sm_90 GPUs.
SM90 = KernelFamily(
    op="matmul", name="sm90", description="sm90 wgmma", op_name="matmul",
    min_capability=(9, 0), exact_capability=(9, 0),
    wrong_gpu_reason=("the matmul kernel needs an sm_90 (Hopper) GPU, this one is {gpu}; on "
                      "other GPUs tk.matmul is torch.matmul (cuBLAS)"))
_scaffold.register_families(SM90)


@dataclass(frozen=True, kw_only=True)
class MatmulPlan(Plan):
    """What thunderkittens.explain_matmul() returns: the path a matmul call would take."""

    function = "tk.matmul"
    fallback = "torch.matmul"

    batch: int | None               # B of the op call (None on the fallback path)
    m: int | None                   # the op's M, N, K (M includes a folded batch)
    n: int | None
    k: int | None
    a_layout: str | None            # "row" or "col": how the kernel reads each operand
    b_layout: str | None
    broadcast: str | None           # "a" or "b": the operand with batch 1 when B > 1
    folded_batch: int               # a's batch folded into M (1: none)

    def details(self) -> list[str]:
        parts = []
        if self.batch > 1:
            parts.append(f"(B={self.batch}, {self.broadcast} broadcast)" if self.broadcast
                         else f"(B={self.batch})")
        parts += [f"{self.m}x{self.n}x{self.k}", f"a={self.a_layout}", f"b={self.b_layout}"]
        if self.folded_batch > 1:
            parts.append(f"(a's batch of {self.folded_batch} folded into M)")
        return parts


class KernelCall(NamedTuple):
    problem: Problem
    a_layout: str      # layout.ROW or layout.COLUMN, as the kernel reads it
    b_layout: str
    copy_a: bool       # a gets one .contiguous() copy first
    copy_b: bool


def feature_fallback_reason(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """Why the call is outside what the kernel supports whatever the GPU, or None."""
    reason = _scaffold.unsupported_input_reason("matmul", a)
    if reason is not None:
        return reason
    for name, t in (("a", a), ("b", b)):
        if t.dim() == 1:
            return (f"{name} is 1-D; matrix-vector and vector products are left to "
                    "torch.matmul")
    if a.numel() == 0 or b.numel() == 0:
        return (f"an empty operand (a {tuple(a.shape)}, b {tuple(b.shape)}); torch.matmul "
                "handles empty dims")
    return None


_DIM_NAMES = {"a": ("M", "K"), "b": ("K", "N")}


def _operand_layout(name: str, t: torch.Tensor) -> tuple[str | None, bool, str | None]:
    """(layout, needs a copy, None) for a 3-D operand, or (None, False, reason)."""
    layout = layout_of(t)
    if layout is not None:
        return layout, False, None
    layout = layout_after_copy(t)
    if layout is not None:
        return layout, True, None
    return None, False, unreadable_reason(name, t, _DIM_NAMES[name])


def decide(a, b) -> tuple[KernelCall | None, str | None]:
    """Checks the arguments (raising as tk.matmul does); (KernelCall, None) for the kernel path,
    (None, reason) for the torch.matmul fallback."""
    check_types(a, b)
    if a.is_nested or b.is_nested:  # torch.matmul validates nested inputs itself
        return None, "nested tensors are not supported by the kernel"
    out_shape = check_values(a, b)
    reason = feature_fallback_reason(a, b)
    if reason is not None:
        return None, reason
    family, reason = _scaffold.choose_family("matmul", a.device)
    if family is None:
        return None, reason
    problem, reason = kernel_problem(a, b, out_shape)
    if problem is None:
        return None, reason
    a_layout, copy_a, reason = _operand_layout("a", problem.a)
    if a_layout is None:
        return None, reason
    b_layout, copy_b, reason = _operand_layout("b", problem.b)
    if b_layout is None:
        return None, reason
    return KernelCall(problem, a_layout, b_layout, copy_a, copy_b), None


def explain(a, b) -> MatmulPlan:
    call, reason = decide(a, b)
    strict = _config.strict_enabled()
    if call is None:
        return MatmulPlan(uses_kernel=False, reason=reason, kernel=None, kernel_description=None,
                          op=None, dtype=a.dtype, strict=strict, batch=None, m=None, n=None,
                          k=None, a_layout=None, b_layout=None, broadcast=None, folded_batch=1)
    problem = call.problem
    a_batch, m, k = problem.a.shape
    b_batch, _, n = problem.b.shape
    batch = max(a_batch, b_batch)
    broadcast = None
    if batch > 1 and a_batch == 1:
        broadcast = "a"
    elif batch > 1 and b_batch == 1:
        broadcast = "b"
    copies = tuple(name for name, copied in (("a", call.copy_a), ("b", call.copy_b)) if copied)
    return MatmulPlan(uses_kernel=True, reason=None, kernel=SM90.name,
                      kernel_description=SM90.description, op=f"tk.{SM90.op_name}", dtype=a.dtype,
                      copies=copies, strict=strict, batch=int(batch), m=int(m), n=int(n),
                      k=int(k), a_layout=call.a_layout, b_layout=call.b_layout,
                      broadcast=broadcast, folded_batch=int(problem.folded_batch))
