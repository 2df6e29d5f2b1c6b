"""The Based ops (csrc/based/): their handles, fake implementations and autograd formula.

``tk::based_fwd_sm80(q, k, v, scale, normalize, eps, initial_state, output_final_state)
-> (o, final_state)`` (and ``tk::based_fwd_sm90``, the Hopper kernel, with the same contract): q, k (B, H, N, 16), v (B, H, N, Dv) with Dv 64 or 128, bf16/fp16, each
readable in place (see _scaffold.conforms); initial_state None or a contiguous float32
(B, H, 273, Dv + 1) tensor. o is a new contiguous (B, H, N, Dv) tensor in q's dtype;
final_state a new contiguous float32 (B, H, 273, Dv + 1) tensor when output_final_state, else
an empty one.

The backward op of each family, ``tk::based_bwd_sm80(grad_out, q, k, v, scale, initial_state,
grad_final_state, grad_initial_state, grad_denominator) -> (dq, dk, dv, d_initial_state)`` (and
``tk::based_bwd_sm90``, the Hopper kernels, with the same contract): the
gradients of the unnormalised forward (csrc/based/backward_params.h) for grad_out of v's shape
(readable in place), initial_state and grad_final_state None or contiguous float32
(B, H, 273, Dv + 1) tensors, plus with grad_denominator (float32 (B, H, N) or None) the terms of
the block-local denominators' gradient in dq and dk; dq, dk,
dv new contiguous tensors shaped like q, k, v, and d_initial_state (when grad_initial_state) a new
float32 state-shaped tensor with a zero last column, else an empty one. It is the registered
autograd formula of the forward op (autograd.py, which adds what the kernels do not compute: the
normaliser's gradient and the final state's last column): it reads only the forward's inputs and
o.

The fake (meta) implementations give the outputs' shapes, dtypes and strides without running
anything, for torch.compile, torch.export, FakeTensorMode and opcheck.
"""

from __future__ import annotations

import torch

from .. import _scaffold
from . import autograd
from .plan import FAMILIES
from .reference import state_features

#: The forward op of each family, by family name (torch.ops lookups are not free).
FORWARD = {family.name: getattr(torch.ops.tk, family.op_name).default for family in FAMILIES}


def _forward_fake(who: str):
    def fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, normalize: bool,
             eps: float, initial_state: torch.Tensor | None,
             output_final_state: bool) -> tuple[torch.Tensor, torch.Tensor]:
        torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                     lambda: f"{who}: q, k and v must be 4-D (batch, heads, length, dim)")
        torch._check(q.dtype in _scaffold.KERNEL_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype,
                     lambda: f"{who}: q, k and v must all be bfloat16 or all float16")
        torch._check(k.shape == q.shape and v.shape[:3] == q.shape[:3],
                     lambda: f"{who}: k must have q's shape and v q's batch, heads and length")
        batch, heads, _, features = q.shape
        state_shape = (batch, heads, state_features(features), v.shape[-1] + 1)
        if initial_state is not None:
            torch._check(initial_state.dtype == torch.float32 and initial_state.shape == state_shape,
                         lambda: f"{who}: initial_state must be a float32 {state_shape} tensor")
        out = v.new_empty(v.shape)
        final = q.new_empty(state_shape if output_final_state else (0,), dtype=torch.float32)
        return out, final
    return fake


def _backward_fake(who: str):
    def fake(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
             initial_state: torch.Tensor | None, grad_final_state: torch.Tensor | None,
             grad_initial_state: bool, grad_denominator: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and grad_out.dim() == 4,
                     lambda: f"{who}: grad_out, q, k and v must be 4-D (batch, heads, length, dim)")
        torch._check(q.dtype in _scaffold.KERNEL_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype
                     and grad_out.dtype == q.dtype,
                     lambda: f"{who}: grad_out, q, k and v must all be bfloat16 or all float16")
        torch._check(k.shape == q.shape and v.shape[:3] == q.shape[:3] and grad_out.shape == v.shape,
                     lambda: f"{who}: k must have q's shape, v q's batch, heads and length, grad_out v's shape")
        batch, heads, _, features = q.shape
        state_shape = (batch, heads, state_features(features), v.shape[-1] + 1)
        for name, state in (("initial_state", initial_state), ("grad_final_state", grad_final_state)):
            if state is not None:
                torch._check(state.dtype == torch.float32 and state.shape == state_shape,
                             lambda: f"{who}: {name} must be a float32 {state_shape} tensor")
        if grad_denominator is not None:
            torch._check(grad_denominator.dtype == torch.float32 and grad_denominator.shape == q.shape[:3],
                         lambda: f"{who}: grad_denominator must be a float32 {tuple(q.shape[:3])} tensor")
        d_state = q.new_empty(state_shape if grad_initial_state else (0,), dtype=torch.float32)
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), d_state
    return fake


def _register() -> None:
    for family in FAMILIES:
        forward = f"tk::{family.op_name}"
        torch.library.register_fake(forward, _forward_fake(forward))
        backward_op = getattr(torch.ops.tk, family.backward_op_name).default
        torch.library.register_autograd(forward, autograd.backward_formula(backward_op),
                                        setup_context=autograd.setup_context)
    # The backward ops, once each.
    for name in dict.fromkeys(family.backward_op_name for family in FAMILIES):
        backward = f"tk::{name}"
        torch.library.register_fake(backward, _backward_fake(backward))
        torch.library.register_autograd(backward, autograd.no_double_backward(backward))


_register()
