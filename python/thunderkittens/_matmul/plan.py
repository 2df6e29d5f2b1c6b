"""Which path a matmul call takes: the sm_90 kernel (with the operand views and copies it gets),
or torch.matmul (and why).

Every decision here reads only shapes, strides, dtypes, devices and configuration, never tensor
data, so it is cheap and torch.compile can trace it (the result is baked into the graph, guarded
on those same properties).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _extension
from .._device import device_capability
from .._extension import BUILT_ARCHS, BUILT_OPS
from . import op as _op
from .layout import layout_after_copy, layout_of, unreadable_reason
from .problem import Problem, kernel_problem

# The device type the kernel runs on. A module constant (not a literal in the check) so the CPU
# test suite can trace the kernel path against a CPU stand-in of the op.
KERNEL_DEVICE_TYPE = "cuda"
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
# The kernel is TMA + wgmma code compiled for sm_90a, which runs on exactly sm_90 GPUs.
KERNEL_CAPABILITY = (9, 0)
KERNEL_DESCRIPTION = "sm90 wgmma"


class KernelCall(NamedTuple):
    problem: Problem
    a_layout: str      # layout.ROW or layout.COLUMN, as the kernel reads it
    b_layout: str
    copy_a: bool       # a gets one .contiguous() copy first
    copy_b: bool


def feature_fallback_reason(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """Why the call is outside what the kernel supports whatever the GPU, or None."""
    if a.device.type != KERNEL_DEVICE_TYPE:
        return f"inputs are on {a.device.type}; the kernel needs a CUDA GPU"
    if a.dtype not in KERNEL_DTYPES:
        return f"dtype {a.dtype} is not supported by the kernel (bfloat16 and float16 only)"
    for name, t in (("a", a), ("b", b)):
        if t.dim() == 1:
            return (f"{name} is 1-D; matrix-vector and vector products are left to "
                    "torch.matmul")
    if a.numel() == 0 or b.numel() == 0:
        return (f"an empty operand (a {tuple(a.shape)}, b {tuple(b.shape)}); torch.matmul "
                "handles empty dims")
    return None


def device_fallback_reason(device: torch.device) -> str | None:
    """Why the kernel cannot run on ``device`` with this build, or None."""
    if "matmul" not in BUILT_OPS:
        return ("the matmul op family was not compiled into this build (families built: "
                f"{','.join(sorted(BUILT_OPS)) or 'none'}); rebuild with TK_OPS unset")
    if _op.OP is None:
        return ("this build of the extension has no tk::matmul op (it predates it); rebuild: "
                "pip install --no-build-isolation .")
    return _gpu_reason(device.index) or None


@torch.compiler.assume_constant_result
def _gpu_reason(index: int) -> str:
    """Why the kernel cannot run on CUDA device ``index`` ("" if it can). One string, a
    trace-time constant under torch.compile: torch 2.11's dynamo cannot guard a comparison of
    the capability tuple (NotImplementedError for a constant source)."""
    capability = device_capability(index)
    gpu = f"sm_{capability[0]}{capability[1]}"
    if capability != KERNEL_CAPABILITY:
        return (f"the matmul kernel needs an sm_90 (Hopper) GPU, this one is {gpu}; on other "
                "GPUs tk.matmul is torch.matmul (cuBLAS)")
    if not _extension.has_arch_specific_code_for(capability):
        return (f"this build has no sm_90a code (built for {','.join(BUILT_ARCHS)}); rebuild "
                "with e.g. TK_CUDA_ARCHS=90a pip install --no-build-isolation .")
    return ""


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


def decide(a: torch.Tensor, b: torch.Tensor,
           out_shape: tuple) -> tuple[KernelCall | None, str | None]:
    """(KernelCall, None) for the kernel path, (None, reason) for the torch.matmul fallback.

    ``a`` and ``b`` have passed validation; ``out_shape`` is torch.matmul's output shape.
    """
    reason = feature_fallback_reason(a, b) or device_fallback_reason(a.device)
    if reason is not None:
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
