"""Small Based calls for compute-sanitizer (memcheck / racecheck / synccheck).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python3 tools/sanitize_based.py [step | backward]

Calls torch.ops.tk.based_fwd_sm80 and (on sm_90) tk.based_fwd_sm90 directly (no fallback can hide a
kernel problem) on lengths
around the 64-row chunk, both value dims and dtypes, normalize on and off, with and without an
initial and a final state, and a strided (B, N, H, D) layout; then the decoding step ops
tk.based_step_sm80 and tk.based_step_inplace_sm80 on 1, 4 and 5 tokens (one and two passes over
the state), states at every 4-byte offset from a 16-byte boundary (six slices each) and with
padded slices; then the backward ops tk.based_bwd_sm80 and (on sm_90) tk.based_bwd_sm90 on the
forward's lengths, value dims and dtypes, with and without an initial state and a final state's gradient, q, k and the gradient
strided. Inputs and the float64 references are made on the CPU, so the only GPU work is copies
and our kernels. With the argument `step` (`backward`), only the step (backward) calls. Exits
non-zero on any mismatch.
"""

import itertools
import math
import sys

import torch

import thunderkittens  # noqa: F401  (registers torch.ops.tk.*)
from thunderkittens._based import reference

LENGTHS = [1, 63, 65, 130]
VALUE_DIMS = [64, 128]
DTYPES = [torch.bfloat16, torch.float16]


def families(prefix: str) -> list[str]:
    """The ops `prefix`_sm80 and, on an sm_90 GPU, `prefix`_sm90."""
    return [f"{prefix}_sm80"] + ([f"{prefix}_sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])


def main() -> int:
    torch.manual_seed(0)
    failures = runs = 0
    if sys.argv[1:] == ["step"]:  # the decoding step only
        runs, failures = steps()
        torch.cuda.synchronize()
        print(f"sanitize_based: {runs} step calls, {failures} mismatches")
        return 1 if failures else 0
    if sys.argv[1:] == ["backward"]:  # the backward only
        runs, failures = backward_calls()
        torch.cuda.synchronize()
        print(f"sanitize_based: {runs} backward calls, {failures} mismatches")
        return 1 if failures else 0
    scale = 0.25
    for name, n, dv, dtype, normalize, states in itertools.product(families("based_fwd"), LENGTHS, VALUE_DIMS, DTYPES,
                                                                   (False, True), (False, True)):
        b, h = 2, 3
        q = torch.randn(b, n, h, 16).to(dtype)
        k = torch.randn(b, n, h, 16).to(dtype)
        v = torch.randn(b, h, n, dv).to(dtype)
        state0 = (reference.feature_map(torch.randn(b, h, 40, 16, dtype=torch.float64), scale).transpose(-1, -2)
                  @ torch.cat([torch.randn(b, h, 40, dv, dtype=torch.float64), torch.ones(b, h, 40, 1, dtype=torch.float64)], -1)).float() if states else None
        out, final = getattr(torch.ops.tk, name)(q.cuda().transpose(1, 2), k.cuda().transpose(1, 2), v.cuda(), scale,
                                                 normalize, 1e-6, state0.cuda() if states else None, states)
        ref, ref_state = reference.quadratic(q.transpose(1, 2).double(), k.transpose(1, 2).double(), v.double(), scale,
                                             normalize, 1e-6, state0.double() if states else None)
        err = (out.cpu().double() - ref).abs().max().item()
        bad = not err <= 3e-2 * max(1.0, ref.abs().max().item())
        if states:
            state_err = (final.cpu().double() - ref_state).norm().item() / ref_state.norm().item()
            bad = bad or not state_err <= 1e-2
        runs += 1
        if bad or not math.isfinite(err):
            failures += 1
            print(f"MISMATCH {name} n={n} dv={dv} {dtype} normalize={normalize} states={states}: max err {err:.3e}")
    step_runs, step_failures = steps()
    backward_runs, backward_failures = backward_calls()
    torch.cuda.synchronize()
    runs, failures = runs + step_runs + backward_runs, failures + step_failures + backward_failures
    print(f"sanitize_based: {runs} calls, {failures} mismatches")
    return 1 if failures else 0


def _step_reference(q, k, v, state, scale, normalize, eps):
    """float64 (o, new state) of tokens q, k, v (B, H, T, *) applied in order to ``state``."""
    out, _ = reference.quadratic(q.double(), k.double(), v.double(), scale, normalize, eps, state.double())
    vo = torch.cat([v.double(), torch.ones_like(v[..., :1], dtype=torch.float64)], -1)
    return out, state.double() + reference.feature_map(k.double(), scale).transpose(-1, -2) @ vo


def steps() -> tuple[int, int]:
    failures = runs = 0
    scale, eps = 0.25, 1e-6
    b, h = 2, 3
    for count, dv, dtype, normalize, offset, inplace in itertools.product(
            (1, 4, 5), VALUE_DIMS, DTYPES, (False, True), (0, 1, 2, 3), (False, True)):
        if dtype == torch.float16 and offset in (1, 2):
            continue  # enough offsets on the other dtype
        q, k, v = (torch.randn(b, h, count, d).to(dtype) for d in (16, 16, dv))
        state0 = (reference.feature_map(torch.randn(b, h, 40, 16, dtype=torch.float64), scale).transpose(-1, -2)
                  @ torch.cat([torch.randn(b, h, 40, dv, dtype=torch.float64),
                               torch.ones(b, h, 40, 1, dtype=torch.float64)], -1)).float()
        # Padded slices for offset 3 (slices 3 floats apart), else a contiguous state `offset`
        # floats past the allocation's start.
        slice_floats = state0[0, 0].numel()
        if offset == 3:
            storage = torch.empty(b, h, slice_floats + 3, device="cuda")
            state = storage[..., :slice_floats].view(state0.shape)
        else:
            state = torch.empty(state0.numel() + offset, device="cuda")[offset:].view(state0.shape)
        state.copy_(state0)
        if inplace:
            out = torch.ops.tk.based_step_inplace_sm80(q.cuda(), k.cuda(), v.cuda(), state, scale, normalize, eps)
            new_state = state
        else:
            out, new_state = torch.ops.tk.based_step_sm80(q.cuda(), k.cuda(), v.cuda(), state, scale, normalize, eps)
        ref, ref_state = _step_reference(q, k, v, state0, scale, normalize, eps)
        err = (out.cpu().double() - ref).abs().max().item()
        state_err = (new_state.cpu().double() - ref_state).norm().item() / ref_state.norm().item()
        runs += 1
        if not (err <= 3e-2 * max(1.0, ref.abs().max().item()) and state_err <= 1e-5):
            failures += 1
            print(f"STEP MISMATCH tokens={count} dv={dv} {dtype} normalize={normalize} offset={offset} "
                  f"inplace={inplace}: max err {err:.3e}, state relative err {state_err:.3e}")
    return runs, failures


def backward_calls() -> tuple[int, int]:
    """tk::based_bwd_sm80 and, on an sm_90 GPU, tk::based_bwd_sm90 (the TMA + wgmma kernels) against
    float64 autograd of the quadratic form (unnormalised; the
    states' quadratic blocks symmetric and the final state's gradient without a last column:
    all the op sees)."""
    failures = runs = 0
    scale, b, h = 0.25, 2, 3
    for name, n, dv, dtype, states in itertools.product(families("based_bwd"), LENGTHS, VALUE_DIMS, DTYPES, (False, True)):
        q, k, grad = (torch.randn(b, n, h, d).to(dtype) for d in (16, 16, dv))
        v = torch.randn(b, h, n, dv).to(dtype)
        state0 = grad_final = None
        if states:
            state0 = (reference.feature_map(torch.randn(b, h, 40, 16, dtype=torch.float64), scale).transpose(-1, -2)
                      @ torch.cat([torch.randn(b, h, 40, dv, dtype=torch.float64),
                                   torch.ones(b, h, 40, 1, dtype=torch.float64)], -1)).float()
            grad_final = (reference.feature_map(torch.randn(b, h, 5, 16, dtype=torch.float64), scale).transpose(-1, -2)
                          @ torch.randn(b, h, 5, dv + 1, dtype=torch.float64)).float()
            grad_final[..., -1] = 0
        got = getattr(torch.ops.tk, name)(grad.cuda().transpose(1, 2), q.cuda().transpose(1, 2),
                                          k.cuda().transpose(1, 2), v.cuda(), scale,
                                          state0.cuda() if states else None,
                                          grad_final.cuda() if states else None, states, None)
        leaves = [t.double().requires_grad_() for t in (q.transpose(1, 2), k.transpose(1, 2), v)]
        if states:
            leaves.append(state0.double().requires_grad_())
        out, final = reference.quadratic(*leaves[:3], scale, False, 0.0, leaves[3] if states else None)
        loss = (out * grad.transpose(1, 2).double()).sum()
        if states:
            loss = loss + (final * grad_final.double()).sum()
        worst = 0.0
        for ours, want in zip(got, torch.autograd.grad(loss, leaves)):
            error = (ours.cpu().double() - want).abs().max().item() / max(1.0, want.abs().max().item())
            worst = max(worst, error if math.isfinite(error) else math.inf)
        runs += 1
        if not worst <= 3e-2:
            failures += 1
            print(f"BACKWARD MISMATCH {name} n={n} dv={dv} {dtype} states={states}: max err {worst:.3e}")
    return runs, failures


if __name__ == "__main__":
    sys.exit(main())
