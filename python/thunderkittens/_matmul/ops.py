"""The torch op behind tk.matmul, resolved once at import.

``torch.ops.tk.matmul(Tensor a, Tensor b) -> Tensor``: a (Ba, M, K) @ b (Bb, K, N) with Ba, Bb in
{1, B}, each operand TMA-readable as row- or column-major (see layout.py), bf16/fp16 on an
sm_90 GPU; returns a new contiguous (B, M, N) tensor in a's dtype, accumulated in fp32.

Its schema is defined in csrc/registration.cpp whatever op families were built, so it exists in
any current build; an extension built before the op existed lacks it. Then OP is None, the
package still imports, and every tk.matmul call falls back to torch.matmul with that reason.
"""

from __future__ import annotations

import torch

NAME = "tk::matmul"


def _resolve() -> torch._ops.OpOverload | None:
    try:
        return torch.ops.tk.matmul.default
    except (AttributeError, RuntimeError):
        return None


OP = _resolve()
