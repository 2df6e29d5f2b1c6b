"""What thunderkittens.explain_matmul() returns: the path a call would take, printable in one
line."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class MatmulPlan:
    uses_kernel: bool
    reason: str | None              # why it falls back (None on the kernel path)
    kernel_description: str | None  # e.g. "sm90 wgmma"
    op: str | None                  # "tk.matmul"
    dtype: torch.dtype
    batch: int | None               # B of the op call (None on the fallback path)
    m: int | None                   # the op's M, N, K (M includes a folded batch)
    n: int | None
    k: int | None
    a_layout: str | None            # "row" or "col": how the kernel reads each operand
    b_layout: str | None
    broadcast: str | None           # "a" or "b": the operand with batch 1 when B > 1
    folded_batch: int               # a's batch folded into M (1: none)
    copies: tuple[str, ...]         # operands that get a .contiguous() copy on the kernel path
    strict: bool                    # strict mode: a fallback would raise FallbackError

    def __str__(self) -> str:
        if not self.uses_kernel:
            text = f"fallback torch.matmul: {self.reason}"
            return text + (" (strict mode: tk.matmul raises FallbackError)" if self.strict else "")
        parts = [f"kernel {self.op} [{self.kernel_description}]",
                 _DTYPE_NAMES.get(self.dtype, str(self.dtype))]
        if self.batch > 1:
            parts.append(f"(B={self.batch}, {self.broadcast} broadcast)" if self.broadcast
                         else f"(B={self.batch})")
        parts += [f"{self.m}x{self.n}x{self.k}", f"a={self.a_layout}", f"b={self.b_layout}"]
        if self.folded_batch > 1:
            parts.append(f"(a's batch of {self.folded_batch} folded into M)")
        if self.copies:
            parts.append(f"(copies {', '.join(self.copies)} with .contiguous())")
        return " ".join(parts)
