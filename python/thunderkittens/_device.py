"""Facts about the GPU a call would run on, shared by every op's path choice.

They are trace-time constants under torch.compile: the device a tensor lives on is already
guarded on, and the GPU behind a device index does not change while a process runs.
"""

from __future__ import annotations

import torch


@torch.compiler.assume_constant_result
def device_capability(index: int) -> tuple[int, int]:
    """(major, minor) compute capability of CUDA device ``index``."""
    return torch.cuda.get_device_capability(index)
