"""What this machine and this build can run, worked out from the public facts (the device's
compute capability, tk.BUILT_ARCHS, tk.BUILT_OPS), not from the path choice under test: the
suite uses it to say which path each call must take and which kernels a run must have reached,
so that a path-choice regression fails instead of quietly moving cases to the fallback.

The rules restate the documented contract (tk.attention's and tk.matmul's docstrings):
  attention kernels: inputs on the kernels' device, bfloat16/float16, E == Ev, no attn_mask but
    SDPA's two causal biases, dropout_p == 0, scale None or > 0; sm90 (exact sm_90, a 90a build,
    head dims 64/96/128, forward and backward) first, else sm80 (sm_80 or newer, head dims 64
    and 128, no backward: calls needing gradients fall back); use_kernel forces one family.
  matmul kernel: sm_90 with a 90a build and the matmul family, bfloat16/float16, both operands
    at least 2-D and not empty (layouts and batch shapes decide further; see expected_matmul_path).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import torch

import thunderkittens as tk
from thunderkittens._attention.decode import prefers_decode

ATTENTION_KERNEL_DTYPES = (torch.bfloat16, torch.float16)
# What each attention family is built for (the C++ module says so too, when it is new enough).
_DEFAULT_HEAD_DIMS = {"sm90": (64, 96, 128), "sm80": (64, 128)}


def attention_head_dims() -> dict[str, tuple[int, ...]]:
    try:
        from thunderkittens import _C
        dims = getattr(_C, "attention_head_dims", None)
    except ImportError:
        dims = None
    if not dims:
        return dict(_DEFAULT_HEAD_DIMS)
    return {family: tuple(int(d) for d in values) for family, values in dims.items()}


def _targets(archs) -> list[tuple[int, int, str, bool]]:
    targets = []
    for name in archs:
        ptx = name.endswith("+PTX")
        match = re.fullmatch(r"(\d+)(\d)([af]?)", name.removesuffix("+PTX"))
        if match:
            targets.append((int(match.group(1)), int(match.group(2)), match.group(3), ptx))
    return targets


def runs_on(archs, capability, *, arch_specific: bool) -> bool:
    """Whether a build for ``archs`` has code for a GPU of ``capability``: arch-specific code
    (sm_90a) only on exactly that GPU; otherwise SASS of the same major and a lower or equal
    minor, or PTX of a lower or equal capability (JIT-compiled)."""
    for major, minor, suffix, ptx in _targets(archs):
        if suffix == "a":
            if (major, minor) == tuple(capability):
                return True
        elif arch_specific:
            continue
        elif ptx and (major, minor) <= tuple(capability):
            return True
        elif major == capability[0] and minor <= capability[1]:
            return True
    return False


@dataclass(frozen=True)
class Environment:
    device_type: str                 # where the cases' tensors live: "cuda" or "cpu"
    kernel_device: bool              # the kernels (or their CPU stand-ins) run there
    capability: tuple[int, int] | None
    built_archs: tuple[str, ...]
    built_ops: frozenset
    head_dims: dict
    has_attention_backward: bool
    matmul_op: bool
    device_count: int = 1
    side_streams: bool = False

    @classmethod
    def cuda(cls) -> "Environment":
        return cls(device_type="cuda", kernel_device=True,
                   capability=tuple(torch.cuda.get_device_capability(0)),
                   built_archs=tuple(tk.BUILT_ARCHS), built_ops=frozenset(tk.BUILT_OPS),
                   head_dims=attention_head_dims(),
                   has_attention_backward=hasattr(torch.ops.tk, "attention_bwd_sm90"),
                   matmul_op=hasattr(torch.ops.tk, "matmul"),
                   device_count=torch.cuda.device_count(), side_streams=True)

    @classmethod
    def cpu(cls, stand_ins: bool = False, *, matmul_stand_in: bool = False) -> "Environment":
        """The CPU; with ``stand_ins`` (the cpu_kernel fixture) the attention path choice sees an
        sm_90 GPU with a 90a build that has the attention family, with ``matmul_stand_in`` (the
        cpu_matmul fixture) the same with the matmul family (conftest.pretend_sm90_build)."""
        archs, ops = tuple(tk.BUILT_ARCHS), frozenset(tk.BUILT_OPS)
        if stand_ins:
            archs, ops = archs + ("90a",), ops | {"attention"}
        if matmul_stand_in:
            archs, ops = archs + ("90a",), ops | {"matmul"}
        return cls(device_type="cpu", kernel_device=stand_ins or matmul_stand_in,
                   capability=(9, 0) if (stand_ins or matmul_stand_in) else None,
                   built_archs=archs, built_ops=ops, head_dims=attention_head_dims(),
                   has_attention_backward=hasattr(torch.ops.tk, "attention_bwd_sm90"),
                   matmul_op=hasattr(torch.ops.tk, "matmul"))

    def device(self, index: int = 0) -> torch.device:
        return torch.device("cuda", index) if self.device_type == "cuda" else torch.device("cpu")

    # ---- attention --------------------------------------------------------------------------

    def attention_family_runs(self, family: str) -> bool:
        """Whether attention family ``family`` can run here at all."""
        if not self.kernel_device or self.capability is None or "attention" not in self.built_ops:
            return False
        if family == "sm90":
            return self.capability == (9, 0) and runs_on(self.built_archs, (9, 0), arch_specific=True)
        if family in ("sm80", "decode"):
            return self.capability >= (8, 0) and runs_on(self.built_archs, self.capability,
                                                         arch_specific=False)
        raise ValueError(family)

    def attention_families(self) -> list[str]:
        """The families a run must reach here (forward), in auto's order."""
        return [f for f in ("sm90", "sm80") if self.attention_family_runs(f)]

    def expected_attention_family(self, *, kernel: str, dtype, head_dim: int, head_dim_v: int,
                                  mask: str, dropout_p: float, scale, needs_grad: bool, len_q: int = 0,
                                  len_kv: int = 0) -> str | None:
        """The family that must run the call, or None for the SDPA fallback. Under auto, short
        queries against long keys that need no gradient run the decode kernel where it can
        (thunderkittens/_attention/decode.py's rule)."""
        if not self.kernel_device or dtype not in ATTENTION_KERNEL_DTYPES:
            return None
        if head_dim != head_dim_v or mask in ("bool", "float") or dropout_p > 0:
            return None
        if scale is not None and scale <= 0:
            return None
        if kernel == "auto":
            runnable = self.attention_families()
            if not runnable:
                return None
            family = runnable[0]
            if (not needs_grad and prefers_decode(len_q, len_kv) and self.attention_family_runs("decode")
                    and head_dim in self.head_dims.get("decode", ())):
                family = "decode"
        else:
            if not self.attention_family_runs(kernel):
                return None
            family = kernel
        if head_dim not in self.head_dims.get(family, ()):
            return None
        if needs_grad and (family != "sm90" or not self.has_attention_backward):
            return None
        return family

    # ---- matmul -----------------------------------------------------------------------------

    def matmul_kernel_runs(self) -> bool:
        return (self.kernel_device and self.capability == (9, 0) and self.matmul_op
                and "matmul" in self.built_ops
                and runs_on(self.built_archs, (9, 0), arch_specific=True))


@dataclass
class PathCounts:
    """How many cases of one property went to each path ("sm90", "sm80", "fallback", each
    "+backward" when gradients were computed)."""
    prop: str
    counts: Counter = field(default_factory=Counter)

    def add(self, path: str) -> None:
        self.counts[path] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reached(self, family: str) -> int:
        return sum(n for path, n in self.counts.items() if path.split("+")[0] == family)

    def line(self, profile: str, seed: int) -> str:
        parts = ", ".join(f"{path} {n}" for path, n in sorted(self.counts.items()))
        return (f"differential {self.prop} [profile {profile}, seed {seed}]: {self.total} cases"
                f"{': ' + parts if parts else ''}")


def run_on_stream(stream_kind: str, device: torch.device, run):
    """``run()`` on the current stream ("default") or on a side stream ordered after it and
    before it again ("side"); on a GPU, synchronized before the result is read."""
    if stream_kind == "side":
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            out = run()
        torch.cuda.current_stream(device).wait_stream(stream)
    else:
        out = run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out
