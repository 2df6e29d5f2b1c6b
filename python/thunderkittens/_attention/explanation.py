"""What thunderkittens.explain() returns: the path a call would take, printable in one line."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class AttentionPlan:
    uses_kernel: bool
    reason: str | None              # why it falls back (None on the kernel path)
    kernel: str | None              # family name, e.g. "sm80"
    kernel_description: str | None  # e.g. "sm80 mma.sync"
    op: str | None                  # e.g. "tk.attention_fwd"
    dtype: torch.dtype
    head_dim: int
    causal: bool
    gqa_ratio: int
    copies: tuple[str, ...]         # inputs that get a .contiguous() copy on the kernel path
    strict: bool                    # strict mode: a fallback would raise FallbackError
    backward_op: str | None = None  # e.g. "tk.attention_bwd_sm90" when gradients are needed
    # The backward would run in its deterministic mode (torch.use_deterministic_algorithms is on
    # now; the setting is read again when the backward runs).
    deterministic_backward: bool = False
    lower_right: bool = False       # causal diagonal bottom-right (causal_lower_right, Lq != Lk)

    def __str__(self) -> str:
        if not self.uses_kernel:
            text = f"fallback torch SDPA: {self.reason}"
            return text + (" (strict mode: tk.attention raises FallbackError)" if self.strict else "")
        parts = [f"kernel {self.op} [{self.kernel_description}]",
                 _DTYPE_NAMES.get(self.dtype, str(self.dtype)), f"d={self.head_dim}",
                 _mask_name(self.causal, self.lower_right)]
        if self.gqa_ratio > 1:
            parts.append(f"gqa={self.gqa_ratio}")
        if self.backward_op:
            parts.append(f"+ backward {self.backward_op}"
                         + (" (deterministic)" if self.deterministic_backward else ""))
        if self.copies:
            parts.append(f"(copies {', '.join(self.copies)} with .contiguous())")
        return " ".join(parts)


def _mask_name(causal: bool, lower_right: bool) -> str:
    if not causal:
        return "full"
    return "causal lower-right" if lower_right else "causal"
