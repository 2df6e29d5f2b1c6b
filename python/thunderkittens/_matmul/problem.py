"""From torch.matmul's shapes to the op's: a (Ba, M, K) @ b (Bb, K, N) with Ba, Bb in {1, B}.

Only views are made here, never copies:

- a 2-D operand gets a batch of 1 (``unsqueeze``); the kernel broadcasts a batch of 1;
- the broadcast leading dims of an N-D operand are flattened into one batch dim, when the
  operand either carries all of them (its batch shape is the broadcast one) or none (all 1),
  and its strides let the batch dims merge into one (otherwise: fallback, with the reason);
- a batch dim of stride 0 (an expanded tensor: one matrix repeated) is read as a batch of 1
  when the other operand carries the batch;
- when b has a batch of 1 and a's batch sits right above its rows in memory (any contiguous
  a), a's batch is folded into its rows: one (1, B*M, K) @ (1, K, N) product, as torch.matmul
  itself does, which fills the GPU better than B small products.

The kernel's (B, M, N) output is contiguous, so viewing it as torch.matmul's output shape (the
broadcast batch dims, then M, N) is free.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class Problem(NamedTuple):
    a: torch.Tensor              # (Ba, M, K) view of the caller's a
    b: torch.Tensor              # (Bb, K, N) view of the caller's b
    out_shape: tuple[int, ...]   # torch.matmul's output shape
    folded_batch: int            # a's batch folded into M (1: nothing folded)


def _batch_dims_merge(t: torch.Tensor, batch_rank: int) -> bool:
    """Whether t's first ``batch_rank`` dims can be viewed as one dim. Size-1 dims are
    skipped: their strides never matter."""
    live = [(t.shape[d], t.stride(d)) for d in range(batch_rank) if t.shape[d] != 1]
    for (_, outer), (size, inner) in zip(live, live[1:]):  # a loop, not all(...): see _extension
        if outer != inner * size:
            return False
    return True


def _to_3d(name: str, t: torch.Tensor, out_batch: tuple) -> tuple[torch.Tensor | None, str | None]:
    """(t as (Bt, rows, cols) with Bt in {1, prod(out_batch)}, None), or (None, reason)."""
    rows, cols = t.shape[-2], t.shape[-1]
    if t.dim() == 2:
        return t.unsqueeze(0), None
    batch = tuple(t.shape[:-2])
    if math.prod(batch) == 1:
        return t.reshape(1, rows, cols), None  # drops size-1 dims only: always a view
    padded = (1,) * (len(out_batch) - len(batch)) + batch
    if padded != tuple(out_batch):
        return None, (f"the batch dims of {name} {batch} broadcast against the other operand's "
                      f"to {tuple(out_batch)} but are neither all of them nor all 1, so they "
                      "cannot be flattened into one batch dim without a copy")
    if not _batch_dims_merge(t, len(batch)):
        return None, (f"the batch dims of {name} {batch} (strides {tuple(t.stride())[:-2]}) "
                      "cannot be flattened into one batch dim without a copy")
    return t.reshape(math.prod(batch), rows, cols), None


def _drop_repeated_batch(a3: torch.Tensor, b3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Read a stride-0 batch as a batch of 1 when the other operand has a real batch."""
    def repeated(t):
        return t.shape[0] > 1 and t.stride(0) == 0
    if repeated(a3) and not repeated(b3) and b3.shape[0] == a3.shape[0]:
        return a3[:1], b3
    if repeated(b3) and not repeated(a3) and a3.shape[0] == b3.shape[0]:
        return a3, b3[:1]
    return a3, b3


# The op takes every dim as a 32-bit int.
MAX_DIM = 2**31 - 1


def _fold_batch_into_rows(a3: torch.Tensor, b3: torch.Tensor) -> tuple[torch.Tensor, int]:
    batch, rows, cols = a3.shape
    if (b3.shape[0] == 1 and batch > 1 and a3.stride(0) == rows * a3.stride(1)
            and batch * rows <= MAX_DIM):
        return a3.reshape(1, batch * rows, cols), batch
    return a3, 1


def kernel_problem(a: torch.Tensor, b: torch.Tensor,
                   out_shape: tuple) -> tuple[Problem | None, str | None]:
    """(Problem, None) when (a, b) map onto the op with views only, else (None, reason).

    ``a`` and ``b`` have passed validation and are at least 2-D; ``out_shape`` is
    torch.matmul's output shape for them.
    """
    out_batch = tuple(out_shape[:-2])
    a3, reason = _to_3d("a", a, out_batch)
    if a3 is None:
        return None, reason
    b3, reason = _to_3d("b", b, out_batch)
    if b3 is None:
        return None, reason
    for name, t in (("a", a3), ("b", b3)):
        if max(t.shape) > MAX_DIM:
            return None, (f"{name} flattened to {tuple(t.shape)} has a dim beyond 2^31 - 1, "
                          "which the kernel does not take")
    a3, b3 = _drop_repeated_batch(a3, b3)
    a3, folded = _fold_batch_into_rows(a3, b3)
    return Problem(a3, b3, tuple(out_shape), folded), None
