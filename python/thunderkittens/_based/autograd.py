"""The gradients of tk::based_fwd_sm80 and tk::based_fwd_sm90, registered as their autograd formula
(ops.py registers it).

The backward op (``tk::based_bwd_sm80`` or ``tk::based_bwd_sm90``, csrc/based/backward_params.h)
computes the gradients of the unnormalised forward: dq, dk, dv and the initial state's value
columns, from q, k, v, the initial state and the gradients of o and of the final state. What it
does not see is done here with small PyTorch ops:

- the final state's normaliser column (the state's last column, z0 + sum_j phi(k_j)): its
  gradient g adds J_phi(k_j)^T g to dk and passes to the initial state's last column unchanged;
  the antisymmetric part of the final state's quadratic block passes to the initial state's
  (the kernels read only the symmetric part, which is all that phi(k)^T S sees);
- normalize=True. With D_i = sum_{j<=i} p(s_ij) + phi(q_i).z0 + eps and o_i = n_i / D_i, the
  gradient of the numerator n_i is g_i = do_i / D_i and that of D_i is delta_i = -(g_i . o_i).
  The numerator is the unnormalised forward, so the kernel gets g (rounded to q's dtype; delta is
  taken from the same rounded g, so the result is the exact gradient for a cotangent one rounding
  away from do). D_i is the unnormalised forward with v = 1 (one value column), computed here in
  chunks (sums of k and k k^T: memory linear in N). delta's terms with the keys of the row's own
  CHUNK-row block go to the kernel (grad_denominator), which adds them to dP before rounding: they
  cancel against the value terms where o_i hardly depends on q (the first rows, exactly with one
  key), and added to the kernel's rounded dq that cancellation would leave about one rounding of
  each part. The earlier blocks' and the initial state's terms are added here.

Saved for the backward: q, k, v (the operands the forward op was given), the initial state, and
with normalize the output o. Nothing of size N^2. A second backward is not supported.
"""

from __future__ import annotations

import math

import torch

from .. import _scaffold

# Rows per chunk of the normaliser's PyTorch computation: the kernels' block of grad_denominator
# (DENOMINATOR_BLOCK in csrc/based/backward_params.h), so "within the chunk" means the same rows.
CHUNK = 64


def normaliser(q: torch.Tensor, k: torch.Tensor, scale: float, z0: torch.Tensor | None) -> torch.Tensor:
    """sum_{j<=i} p(scale q_i.k_j) + phi(q_i).z0 for q, k (B, H, N, F) in float32 and z0
    (B, H, 1 + F + F*F) or None: (B, H, N). Inside a chunk of CHUNK rows the masked p(s) matrix;
    across chunks the running sums of k and k k^T (memory linear in N)."""
    batch, heads, length, features = q.shape
    chunks = -(-length // CHUNK)
    pad = chunks * CHUNK - length
    qc = torch.nn.functional.pad(q, (0, 0, 0, pad)).view(batch, heads, chunks, CHUNK, features)
    kc = torch.nn.functional.pad(k, (0, 0, 0, pad)).view(batch, heads, chunks, CHUNK, features)
    c1, c2 = scale, scale * scale / 2
    s = qc @ kc.transpose(-1, -2)
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    inside = torch.where(causal, 1 + c1 * s + c2 * s * s, torch.zeros((), dtype=s.dtype, device=s.device)).sum(-1)
    # Earlier chunks: rows before the chunk, and the exclusive running sums of k and k k^T.
    k_sum = kc.sum(-2)
    k_outer = kc.transpose(-1, -2) @ kc
    k_before = k_sum.cumsum(2) - k_sum
    outer_before = k_outer.cumsum(2) - k_outer
    rows_before = (torch.arange(chunks, device=q.device, dtype=q.dtype) * CHUNK)[:, None]
    earlier = (rows_before + c1 * (qc @ k_before.unsqueeze(-1)).squeeze(-1)
               + c2 * ((qc @ outer_before) * qc).sum(-1))
    total = (inside + earlier).reshape(batch, heads, chunks * CHUNK)[..., :length]
    if z0 is not None:
        quad = z0[..., 1 + features:].unflatten(-1, (features, features))
        total = (total + z0[..., :1] + math.sqrt(scale) * (q @ z0[..., 1:1 + features].unsqueeze(-1)).squeeze(-1)
                 + scale / math.sqrt(2) * ((q @ quad) * q).sum(-1))
    return total


def normaliser_gradients(q: torch.Tensor, k: torch.Tensor, scale: float, delta: torch.Tensor,
                         z0: torch.Tensor | None, within_chunks: bool = True
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The gradients of sum_i delta_i normaliser(q, k, scale, z0)_i with respect to q, k and z0
    (None without z0), written out (no autograd inside a backward formula: torch.compile traces
    this), in q's dtype (float32). delta (B, H, N). within_chunks=False leaves out the terms of
    each row with the keys of its own chunk (the kernels add those: grad_denominator)."""
    batch, heads, length, features = q.shape
    chunks = -(-length // CHUNK)
    pad = chunks * CHUNK - length
    qc = torch.nn.functional.pad(q, (0, 0, 0, pad)).view(batch, heads, chunks, CHUNK, features)
    kc = torch.nn.functional.pad(k, (0, 0, 0, pad)).view(batch, heads, chunks, CHUNK, features)
    dc = torch.nn.functional.pad(delta, (0, pad)).view(batch, heads, chunks, CHUNK, 1)
    c1, c2 = scale, scale * scale / 2
    # Across chunks: q_i meets the sums of k and k k^T of earlier chunks, k_j the sums of
    # delta q and delta q q^T of later ones.
    k_sum = kc.sum(-2)
    k_outer = kc.transpose(-1, -2) @ kc
    k_before = (k_sum.cumsum(2) - k_sum).unsqueeze(-2)
    outer_before = k_outer.cumsum(2) - k_outer
    dq = dc * (c1 * k_before + 2 * c2 * (qc @ outer_before))
    weighted = dc * qc
    q_sum = weighted.sum(-2)
    q_outer = weighted.transpose(-1, -2) @ qc
    q_after = (q_sum.flip(2).cumsum(2).flip(2) - q_sum).unsqueeze(-2)
    outer_after = q_outer.flip(2).cumsum(2).flip(2) - q_outer
    dk = c1 * q_after + 2 * c2 * (kc @ outer_after)
    if within_chunks:  # inside a chunk: delta_i p'(s_ij) for j <= i
        s = qc @ kc.transpose(-1, -2)
        causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
        w = torch.where(causal, dc * (c1 + 2 * c2 * s), torch.zeros((), dtype=s.dtype, device=s.device))
        dq, dk = dq + w @ kc, dk + w.transpose(-1, -2) @ qc
    dq = dq.reshape(batch, heads, chunks * CHUNK, features)[..., :length, :]
    dk = dk.reshape(batch, heads, chunks * CHUNK, features)[..., :length, :]
    dz0 = None
    if z0 is not None:
        quad = z0[..., 1 + features:].unflatten(-1, (features, features))
        dq = dq + delta.unsqueeze(-1) * (math.sqrt(scale) * z0[..., 1:1 + features].unsqueeze(-2)
                                         + scale / math.sqrt(2) * (q @ (quad + quad.transpose(-1, -2))))
        weighted = delta.unsqueeze(-1) * q
        dz0 = torch.cat([delta.sum(-1, keepdim=True), math.sqrt(scale) * weighted.sum(-2),
                         scale / math.sqrt(2) * (weighted.transpose(-1, -2) @ q).flatten(-2)], -1)
    return dq, dk, dz0


def _feature_map_vjp(x: torch.Tensor, g: torch.Tensor, scale: float) -> torch.Tensor:
    """J_phi(x)^T g for x (B, H, N, F) and g (B, H, 1 + F + F*F) (the same g for every row), in
    float32: sqrt(scale) g_linear + scale / sqrt(2) (G + G^T) x with G the quadratic part of g."""
    features = x.shape[-1]
    quad = g[..., 1 + features:].unflatten(-1, (features, features))
    return (math.sqrt(scale) * g[..., 1:1 + features].unsqueeze(-2)
            + scale / math.sqrt(2) * (x.to(g.dtype) @ (quad + quad.transpose(-1, -2))))


def _antisymmetric_part(state: torch.Tensor, features: int) -> torch.Tensor:
    """The state's rows with only the antisymmetric part of the quadratic block (P - P^T) / 2,
    zero elsewhere."""
    quad = state[..., 1 + features:, :].unflatten(-2, (features, features))
    anti = (quad - quad.transpose(-2, -3)) / 2
    return torch.cat([torch.zeros_like(state[..., :1 + features, :]), anti.flatten(-3, -2)], -2)


def backward_formula(backward_op):
    """The autograd formula of a forward op, running ``backward_op`` (its family's tk::based_bwd_*)."""

    def backward(ctx, grad_out: torch.Tensor | None, grad_final: torch.Tensor | None):
        q, k, v, initial_state, out = ctx.saved_tensors
        needs_q, needs_k, needs_v = ctx.needs_input_grad[:3]
        needs_state = ctx.needs_input_grad[6]
        if grad_final is not None and grad_final.numel() == 0:
            grad_final = None  # the forward returned no final state
        if grad_out is None and grad_final is None:
            return (None,) * 8
        scale, normalize, eps = ctx.scale, ctx.normalize, ctx.eps
        features, value_dim = q.shape[-1], v.shape[-1]
        if grad_out is None:
            grad_out = torch.zeros_like(v)
        z0 = None if initial_state is None else initial_state[..., -1]
        delta = None
        if normalize:
            denominator = normaliser(q.float(), k.float(), scale, z0) + eps
            grad_values = (grad_out.float() / denominator.unsqueeze(-1)).to(q.dtype)
            delta = -(grad_values.float() * out.float()).sum(-1)
        else:
            grad_values = grad_out
        final_in = None if grad_final is None else grad_final.to(torch.float32).contiguous()
        dq, dk, dv, d_state = backward_op(_scaffold.operand(grad_values), q, k, v, scale, initial_state,
                                          final_in, needs_state, delta)
        dq_extra = dk_extra = None
        if grad_final is not None:
            dk_extra = _feature_map_vjp(k, final_in[..., -1], scale)
            if needs_state:
                d_state[..., :value_dim] += _antisymmetric_part(final_in[..., :value_dim], features)
                d_state[..., value_dim] += final_in[..., value_dim]
        if normalize:
            dq_extra, dk_norm, dz0 = normaliser_gradients(q.float(), k.float(), scale, delta, z0,
                                                          within_chunks=False)
            dk_extra = dk_norm if dk_extra is None else dk_extra + dk_norm
            if needs_state and dz0 is not None:
                d_state[..., value_dim] += dz0
        if dq_extra is not None:
            dq = (dq.float() + dq_extra).to(q.dtype)
        if dk_extra is not None:
            dk = (dk.float() + dk_extra).to(k.dtype)
        return (dq if needs_q else None, dk if needs_k else None, dv if needs_v else None, None, None, None,
                d_state if needs_state else None, None)

    return backward


def setup_context(ctx, inputs, output) -> None:
    q, k, v, scale, normalize, eps, initial_state, _output_final_state = inputs
    out, _final_state = output
    ctx.save_for_backward(q, k, v, initial_state, out if normalize else None)
    ctx.scale, ctx.normalize, ctx.eps = scale, normalize, eps
    # No zero-filled gradients for an output that was not used (o or the final state).
    ctx.set_materialize_grads(False)


def no_double_backward(who: str):
    def backward(ctx, *grads):
        raise RuntimeError(f"{who} has no derivative: a second backward (create_graph=True) through "
                           "tk.based's kernels is not supported; the PyTorch reference path (e.g. on "
                           "float32 inputs) has one")
    return backward
