"""Autograd formula of tk::attention_fwd_sm90, registered on the op (not a Python
autograd.Function around the call) so that torch.compile, torch.export, CUDA graphs and opcheck
see it.

The forward op returns (out, lse); the backward op reads q, k, v, out and lse, so those are
saved, and gives (dq, dk, dv) in one call:

    torch.ops.tk.attention_bwd_sm90(grad_out, q, k, v, out, lse, is_causal, scale, lower_right,
                                    deterministic)

with dk/dv already summed over each GQA group's query heads. deterministic is
torch.are_deterministic_algorithms_enabled() when the backward runs (as torch's own ops read it,
warn_only or not): the kernel then adds the key blocks' shares of dq in a fixed order, so that
dq is bitwise the same on every run (dk and dv always are).
Under torch.compile the setting is read while the backward is traced; dynamo guards it, so a
change of the setting retraces. lse is not differentiable (nothing
downstream of tk.attention sees it). grad_out arrives in whatever layout autograd made (often an
expanded or transposed view); it is given to the op in a layout the kernel reads (one copy when
needed, by the same rule as the forward's operands). q/k/v are the 4-D operands the forward op
was given (views of the user's tensors, or their copies); the gradients flow back through those
view ops to the user's tensors by ordinary autograd.

A second backward (create_graph=True) is not supported: it raises when it reaches the backward
op. Only the sm90 family has a backward: tk.attention never calls tk::attention_fwd (sm80) with
inputs that need gradients (plan.backward_fallback_reason sends those calls to SDPA).
"""

from __future__ import annotations

import torch

from .operands import kernel_operand

FORWARD_OP = "tk::attention_fwd_sm90"
BACKWARD_OP = "tk::attention_bwd_sm90"


def _setup_context(ctx, inputs, output) -> None:
    # All six schema arguments: torch fills in defaulted ones (lower_right) the caller left out.
    q, k, v, is_causal, scale, lower_right = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal = is_causal
    ctx.scale = scale
    ctx.lower_right = lower_right
    ctx.mark_non_differentiable(lse)
    # No zero-filled gradient for lse (it has none), nor for out when it was not used.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out: torch.Tensor | None, _grad_lse: None):
    if grad_out is None:
        return None, None, None, None, None, None
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.tk.attention_bwd_sm90(kernel_operand(grad_out), q, k, v, out, lse,
                                                 ctx.is_causal, ctx.scale, ctx.lower_right,
                                                 torch.are_deterministic_algorithms_enabled())
    needs_q, needs_k, needs_v = ctx.needs_input_grad[:3]
    return (dq if needs_q else None, dk if needs_k else None, dv if needs_v else None,
            None, None, None)


def _no_double_backward(ctx, *grads):
    raise RuntimeError(
        "tk::attention_bwd_sm90 has no derivative: a second backward (create_graph=True, e.g. "
        "gradient penalties) through tk.attention is not supported; use "
        "F.scaled_dot_product_attention for that")


torch.library.register_autograd(FORWARD_OP, _backward, setup_context=_setup_context)
# The backward op itself is not differentiable: say so if a double backward reaches it, instead
# of the dispatcher's silent (and wrong) treatment of an op without an autograd kernel.
if hasattr(torch.ops.tk, "attention_bwd_sm90"):  # absent from extensions built before it existed
    torch.library.register_autograd(BACKWARD_OP, _no_double_backward)
