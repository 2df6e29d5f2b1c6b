"""The attention kernel families, in the order ``auto`` prefers them.

A family is one kernel implementation strategy with its own hardware needs:
``sm90``, the TMA + wgmma + warp-specialised kernels (forward and backward), needs exactly
sm_90 (Hopper) and a 90a build; ``sm80``, the mma.sync + cp.async forward kernel, runs on every
GPU from sm_80 on (Hopper too, when forced with ``use_kernel("sm80")``) and has no backward, so
calls that need gradients go to SDPA when it is the family picked. ``auto`` picks the first
that can run.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._config import KNOWN_KERNELS
from .._extension import BUILT_ARCHS, has_arch_specific_code_for, has_kernel_image_for


@dataclass(frozen=True)
class KernelFamily:
    name: str                       # what users pass to use_kernel / TK_ATTENTION_KERNEL
    description: str                # shown by explain(), e.g. "sm80 mma.sync"
    op_name: str                    # the torch.ops.tk op that runs it
    min_capability: tuple[int, int]
    exact_capability: tuple[int, int] | None = None  # arch-specific code (sm_90a) runs only there
    backward_op_name: str | None = None  # the torch.ops.tk op of its backward pass, if it has one
    head_dims: tuple[int, ...] = (64, 128)  # E == Ev it is built for

    @property
    def has_backward(self) -> bool:
        return self.backward_op_name is not None

    def unavailable_reason(self, capability: tuple[int, int]) -> str | None:
        """Why this family cannot run on a GPU of ``capability``, or None if it can."""
        gpu = f"sm_{capability[0]}{capability[1]}"
        if self.exact_capability is not None and capability != self.exact_capability:
            need = f"sm_{self.exact_capability[0]}{self.exact_capability[1]}"
            return f"the {self.name} kernels need an {need} GPU, this one is {gpu}"
        if capability < self.min_capability:
            need = f"sm_{self.min_capability[0]}{self.min_capability[1]}"
            return f"the {self.name} kernels need {need} or newer, this GPU is {gpu}"
        has_code = (has_arch_specific_code_for(capability) if self.exact_capability is not None
                    else has_kernel_image_for(capability))
        if not has_code:
            return (f"this build has no code for {gpu} (built for {','.join(BUILT_ARCHS)}); "
                    f"rebuild with e.g. TK_CUDA_ARCHS={capability[0]}{capability[1]}"
                    f"{'a' if capability == (9, 0) else ''} pip install --no-build-isolation .")
        return None


SM90 = KernelFamily(name="sm90", description="sm90 wgmma+tma", op_name="attention_fwd_sm90",
                    min_capability=(9, 0), exact_capability=(9, 0),
                    backward_op_name="attention_bwd_sm90", head_dims=(64, 96, 128))
# Not head dim 96: the mma.sync forward ran it at 0.92-0.94x SDPA's FlashAttention-2 (forced on
# an H200, session 34; 1.00-1.04x at d128 in the same run), so those calls go to SDPA.
SM80 = KernelFamily(name="sm80", description="sm80 mma.sync", op_name="attention_fwd",
                    min_capability=(8, 0), head_dims=(64, 128))

FAMILIES: tuple[KernelFamily, ...] = (SM90, SM80)
BY_NAME: dict[str, KernelFamily] = {family.name: family for family in FAMILIES}

assert set(BY_NAME) == set(KNOWN_KERNELS["attention"]), "keep _config.KNOWN_KERNELS in sync"
