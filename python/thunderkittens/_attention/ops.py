"""The attention ops (csrc/attention/): their handles, fake implementations and autograd formula.

Each family's forward op, ``tk::attention_fwd_sm90`` and ``tk::attention_fwd_sm80``:

    (q, k, v, is_causal, scale, lower_right=False) -> (out, lse)

q (B, Hq, Lq, D), k/v (B, H, Lk, D) with Hq a multiple of H, each readable in place (see
_scaffold.conforms); out is a new contiguous (B, Hq, Lq, D) tensor in q's dtype, lse a new
contiguous (B, Hq, Lq) float32 tensor. The backward op of the families that have one,
``tk::attention_bwd_sm90``:

    (grad_out, q, k, v, out, lse, is_causal, scale, lower_right=False, deterministic=False)
        -> (dq, dk, dv)

gives new contiguous tensors shaped like q, k, v (dk/dv already summed over each GQA group's
query heads). All reject lower_right=True without is_causal. The training forward of a family
with a backward, ``tk::attention_fwd_sm90_train``, is the same kernel also returning
``out_residual`` (q's shape and dtype: the fp32 result minus out), which the backward op takes as
its last argument ``out_residual`` (None: delta = rowsum(grad_out * out) from the rounded out).
tk.attention runs it whenever the call needs gradients.

The fake (meta) implementations give the outputs' shapes, dtypes and strides without running
anything, for torch.compile, torch.export, FakeTensorMode and opcheck. The autograd formula is
registered on the forward op (not a Python autograd.Function around the call) so that
torch.compile, torch.export, CUDA graphs and opcheck see it.
"""

from __future__ import annotations

import torch

from .. import _scaffold
from .plan import FAMILIES, AttentionFamily, needs_grad

#: The forward op of each family, by family name (torch.ops lookups are not free).
FORWARD = {family.name: getattr(torch.ops.tk, family.op_name).default for family in FAMILIES}
#: The training forward op of each family that has a backward.
TRAINING_FORWARD = {family.name: getattr(torch.ops.tk, family.training_op_name).default
                    for family in FAMILIES if family.training_op_name}


def forward_op(family: AttentionFamily, query, key, value):
    """The op that runs ``family``'s forward on these operands: its training forward (which keeps
    what the backward reads) when it has a backward and autograd wants a gradient, else the plain
    forward."""
    if family.has_backward and needs_grad(query, key, value):
        return TRAINING_FORWARD[family.name]
    return FORWARD[family.name]


# ---- fake implementations -----------------------------------------------------------------


def _check_lower_right(who: str, is_causal: bool, lower_right: bool) -> None:
    torch._check(is_causal or not lower_right,
                 lambda: f"{who}: lower_right=True needs is_causal=True (it moves the causal "
                         "diagonal to the bottom-right corner; without is_causal there is no "
                         "diagonal)")


def _forward_fake(who: str):
    def fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
             lower_right: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        _check_lower_right(who, is_causal, lower_right)
        torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                     lambda: f"{who}: q, k and v must be 4-D (batch, heads, length, head_dim)")
        torch._check(q.dtype in _scaffold.KERNEL_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype,
                     lambda: f"{who}: q, k and v must all be bfloat16 or all float16")
        batch, heads_q, len_q, head_dim = q.shape
        torch._check(k.shape[-1] == head_dim and v.shape[-1] == head_dim,
                     lambda: f"{who}: q, k and v must have the same head_dim")
        torch._check(heads_q % k.shape[1] == 0,
                     lambda: f"{who}: q heads must be a multiple of k/v heads")
        out = q.new_empty((batch, heads_q, len_q, head_dim))
        lse = q.new_empty((batch, heads_q, len_q), dtype=torch.float32)
        return out, lse
    return fake


def _training_forward_fake(who: str):
    forward = _forward_fake(who)

    def fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
             lower_right: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, lse = forward(q, k, v, is_causal, scale, lower_right)
        return out, lse, torch.empty_like(out)
    return fake


def _backward_fake(who: str):
    def fake(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, is_causal: bool, scale: float,
             lower_right: bool = False, deterministic: bool = False,
             out_residual: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _check_lower_right(who, is_causal, lower_right)
        torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
                     lambda: f"{who}: q, k and v must be 4-D (batch, heads, length, head_dim)")
        torch._check(q.dtype in _scaffold.KERNEL_DTYPES and k.dtype == q.dtype
                     and v.dtype == q.dtype and out.dtype == q.dtype and grad_out.dtype == q.dtype,
                     lambda: f"{who}: grad_out, q, k, v and out must all be bfloat16 or all float16")
        torch._check(out.shape == q.shape and grad_out.shape == q.shape,
                     lambda: f"{who}: out and grad_out must have q's shape")
        torch._check(k.shape == v.shape and k.shape[0] == q.shape[0] and k.shape[-1] == q.shape[-1],
                     lambda: f"{who}: k and v must be (batch, heads_kv, len_kv, head_dim) like q")
        torch._check(q.shape[1] % k.shape[1] == 0,
                     lambda: f"{who}: q heads must be a multiple of k/v heads")
        torch._check(lse.dtype == torch.float32 and lse.shape == q.shape[:3],
                     lambda: f"{who}: lse must be the forward's float32 (batch, heads_q, len_q) tensor")
        torch._check(out_residual is None
                     or (out_residual.shape == q.shape and out_residual.dtype == q.dtype),
                     lambda: f"{who}: out_residual must be the training forward's tensor of q's "
                             "shape and dtype")
        return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape))
    return fake


# ---- autograd -----------------------------------------------------------------------------
# The forward op returns (out, lse), the training forward op also out_residual; the backward op
# reads q, k, v, out, lse (and out_residual), so those are saved, and gives (dq, dk, dv) in one
# call. deterministic is
# torch.are_deterministic_algorithms_enabled() when the backward runs (as torch's own ops read
# it, warn_only or not): the kernel then adds the key blocks' shares of dq in a fixed order, so
# dq is bitwise the same on every run (dk and dv always are). Under torch.compile the setting is
# read while the backward is traced; dynamo guards it, so a change of the setting retraces.
# lse is not differentiable (nothing downstream of tk.attention sees it). grad_out arrives in
# whatever layout autograd made (often an expanded or transposed view); it is given to the op
# in a layout the kernel reads. q/k/v are the 4-D operands the forward op was given (views of
# the user's tensors, or their copies); the gradients flow back through those view ops to the
# user's tensors by ordinary autograd. A second backward (create_graph=True) is not supported.


def _setup_context(ctx, inputs, output) -> None:
    # All six schema arguments: torch fills in defaulted ones (lower_right) the caller left out.
    q, k, v, is_causal, scale, lower_right = inputs
    out, lse, *residual = output
    ctx.save_for_backward(q, k, v, out, lse, *residual)
    ctx.is_causal = is_causal
    ctx.scale = scale
    ctx.lower_right = lower_right
    ctx.mark_non_differentiable(lse, *residual)
    # No zero-filled gradient for lse and out_residual (they have none), nor for out when it was
    # not used.
    ctx.set_materialize_grads(False)


def _backward_formula(family: AttentionFamily):
    backward_op = getattr(torch.ops.tk, family.backward_op_name).default

    def backward(ctx, grad_out: torch.Tensor | None, _grad_lse: None, *_grad_residual: None):
        if grad_out is None:
            return None, None, None, None, None, None
        q, k, v, out, lse, *residual = ctx.saved_tensors
        dq, dk, dv = backward_op(_scaffold.operand(grad_out), q, k, v, out, lse, ctx.is_causal,
                                 ctx.scale, ctx.lower_right,
                                 torch.are_deterministic_algorithms_enabled(),
                                 residual[0] if residual else None)
        needs_q, needs_k, needs_v = ctx.needs_input_grad[:3]
        return (dq if needs_q else None, dk if needs_k else None, dv if needs_v else None,
                None, None, None)
    return backward


def _no_double_backward(who: str):
    def backward(ctx, *grads):
        raise RuntimeError(
            f"{who} has no derivative: a second backward (create_graph=True, e.g. gradient "
            "penalties) through tk.attention is not supported; use "
            "F.scaled_dot_product_attention for that")
    return backward


def _register() -> None:
    for family in FAMILIES:
        forward = f"tk::{family.op_name}"
        torch.library.register_fake(forward)(_forward_fake(forward))
        if not family.has_backward:
            continue  # tk.attention never calls it with inputs that need gradients (plan.py)
        backward = f"tk::{family.backward_op_name}"
        training = f"tk::{family.training_op_name}"
        torch.library.register_fake(backward)(_backward_fake(backward))
        torch.library.register_fake(training)(_training_forward_fake(training))
        for op in (forward, training):
            torch.library.register_autograd(op, _backward_formula(family),
                                            setup_context=_setup_context)
        # The backward op itself is not differentiable: say so if a double backward reaches it,
        # instead of the dispatcher's silent (and wrong) treatment of an op without autograd.
        torch.library.register_autograd(backward, _no_double_backward(backward))


_register()
