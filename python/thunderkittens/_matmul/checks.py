"""Argument checks for thunderkittens.matmul: what torch.matmul rejects, raised before any path
is chosen so that the kernel path and the torch.matmul fallback fail the same way.

torch.matmul raises RuntimeError for bad shapes, dtypes and devices, while this project raises
ValueError / TypeError naming the argument and the rule. The errors below are both: a caller
written against torch.matmul (``except RuntimeError``) still catches them.

The checks read shapes, dtypes and devices only, never tensor data.
"""

from __future__ import annotations

import torch

_WHO = "tk.matmul"


class MatmulValueError(ValueError, RuntimeError):
    """A shape or device rule of torch.matmul is broken (ValueError, and RuntimeError as in torch)."""


class MatmulTypeError(TypeError, RuntimeError):
    """a and b have different dtypes (TypeError, and RuntimeError as in torch.matmul)."""


def check_types(a, b) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_WHO}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _batch_dims(shape) -> tuple:
    """The dims torch.matmul broadcasts: all but the last two (none for 1-D and 2-D)."""
    return tuple(shape[:-2])


def broadcast_batch(a_batch: tuple, b_batch: tuple) -> tuple:
    """Broadcast two batch shapes as torch.matmul does (numpy rules, aligned on the right)."""
    rank = max(len(a_batch), len(b_batch))
    a_full = (1,) * (rank - len(a_batch)) + tuple(a_batch)
    b_full = (1,) * (rank - len(b_batch)) + tuple(b_batch)
    out = []
    for dim, (x, y) in enumerate(zip(a_full, b_full)):
        if x != y and x != 1 and y != 1:
            raise MatmulValueError(
                f"{_WHO}: batch dims of a {tuple(a_batch)} and b {tuple(b_batch)} cannot be "
                f"broadcast: sizes {x} and {y} differ at batch dim {dim - rank} and neither is 1")
        out.append(y if x == 1 else x)
    return tuple(out)


def check_values(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """Everything after the types; returns torch.matmul's output shape for (a, b)."""
    for name, t in (("a", a), ("b", b)):
        if t.dim() == 0:
            raise MatmulValueError(f"{_WHO}: {name} must have at least 1 dim, got a 0-D tensor "
                                   f"(both arguments of matmul need to be at least 1-D)")
    if b.dtype != a.dtype:
        raise MatmulTypeError(f"{_WHO}: b dtype {b.dtype} differs from a dtype {a.dtype} "
                              "(matmul does not promote types)")
    if b.device != a.device:
        raise MatmulValueError(f"{_WHO}: b is on {b.device} but a is on {a.device}")

    # A 1-D a is a row vector (1, K), a 1-D b a column vector (K, 1); their unit dim is dropped
    # from the result.
    inner_a = a.shape[-1]
    inner_b = b.shape[-2] if b.dim() >= 2 else b.shape[0]
    if inner_a != inner_b:
        b_dim = "b.shape[-2]" if b.dim() >= 2 else "b.shape[0]"
        raise MatmulValueError(
            f"{_WHO}: a.shape[-1] ({inner_a}) must equal {b_dim} ({inner_b}): the inner "
            f"dimensions of a {tuple(a.shape)} and b {tuple(b.shape)} differ")

    batch = broadcast_batch(_batch_dims(a.shape), _batch_dims(b.shape))
    rows = (a.shape[-2],) if a.dim() >= 2 else ()
    cols = (b.shape[-1],) if b.dim() >= 2 else ()
    return batch + rows + cols

