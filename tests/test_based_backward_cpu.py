"""tk.based's gradients on the kernel path, on the CPU: the autograd formula of
tk::based_fwd_sm90 and tk::based_fwd_sm80 (thunderkittens/_based/autograd.py; each family in turn) with CPU stand-ins of the forward and
backward ops that follow the ops' contracts in float64, against float64 autograd of the
definition. This checks everything around the backward kernels: the normaliser's share of the
gradient with normalize=True, the initial state's and the final state's parts the kernels do not
see (the normaliser column, the antisymmetric part of the quadratic block), which gradients are
asked for, the path choice and explain, and the backward op's fake implementation.
The kernels themselves: tests/test_based_backward_gpu.py."""

import math

import pytest
import torch

import thunderkittens as tk
from thunderkittens._based import autograd, plan, reference

from differential.standins import based_backward_contract
from gpu_support import kernel_standin, kernel_standins

FEATURES = 16
SCALE = 0.25


def forward_standin(q, k, v, scale, normalize, eps, initial_state, output_final_state):
    state = None if initial_state is None else initial_state.double()
    out, final = reference.quadratic(q.double(), k.double(), v.double(), scale, normalize, eps, state)
    final = final.float() if output_final_state else q.new_empty((0,), dtype=torch.float32)
    return out.to(q.dtype), final


class BackwardStandIn:
    """tk::based_bwd_sm80's contract in float64 (backward_params.h): the unnormalised gradients,
    the initial and final states through the symmetric parts of their value columns."""

    def __init__(self):
        self.calls = []

    def __call__(self, grad_out, q, k, v, scale, initial_state, grad_final_state, grad_initial_state,
                 grad_denominator):
        assert grad_out.dtype == q.dtype and grad_out.shape == v.shape
        for state in (initial_state, grad_final_state):
            assert state is None or (state.dtype == torch.float32 and state.is_contiguous())
        assert grad_denominator is None or (grad_denominator.dtype == torch.float32
                                            and grad_denominator.shape == q.shape[:3])
        self.calls.append({"initial_state": initial_state, "grad_final_state": grad_final_state,
                           "grad_initial_state": grad_initial_state, "grad_denominator": grad_denominator})
        return based_backward_contract(grad_out, q, k, v, scale, initial_state, grad_final_state,
                                       grad_initial_state, grad_denominator)


@pytest.fixture(params=["sm90", "sm80"])
def cpu_kernels(monkeypatch, request):
    """Stand-ins of both forward ops and the backward op, with the family of the parameter picked
    (``auto`` on the pretended Hopper, or sm80 forced); .family names it."""
    monkeypatch.setattr(plan, "_shared_memory_optin", torch.compiler.assume_constant_result(lambda index: 232448))
    backward = BackwardStandIn()
    backward.family = request.param
    with kernel_standins(monkeypatch, "based", {"based_fwd_sm90": forward_standin, "based_fwd_sm80": forward_standin}), \
            kernel_standins(monkeypatch, "based", {"based_bwd_sm80": backward, "based_bwd_sm90": backward}), \
            tk.use_kernel("auto" if request.param == "sm90" else "sm80", op="based"):
        yield backward


def make(b, h, n, value_dim, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, v = rand(b, h, n, FEATURES).to(dtype), rand(b, h, n, FEATURES).to(dtype), rand(b, h, n, value_dim).to(dtype)
    # A state as a prefix leaves it, plus an antisymmetric quadratic part and noise in the
    # normaliser column (the gradients must not depend on the kernels seeing only part of it).
    prefix_k, prefix_v = rand(b, h, 30, FEATURES), rand(b, h, 30, value_dim)
    s0 = reference.feature_map(prefix_k, SCALE).transpose(-1, -2) @ torch.cat([prefix_v, torch.ones_like(prefix_v[..., :1])], -1)
    s0[..., 1 + FEATURES:, :] += 0.1 * rand(b, h, 256, value_dim + 1)
    return q, k, v, s0.float()


def float64_gradients(q, k, v, s0, normalize, grad_out, grad_final, eps=1e-6):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s0 = None if s0 is None else s0.detach().double().requires_grad_()
    out, final = reference.quadratic(*leaves, SCALE, normalize, eps, s0)
    loss = (out * grad_out.double()).sum()
    if grad_final is not None:
        loss = loss + (final * grad_final.double()).sum()
    return torch.autograd.grad(loss, leaves + ([s0] if s0 is not None else []))


def assert_close(got, want, what):
    error = ((got.double() - want).norm() / want.norm()).item()
    assert error < 1e-2, f"{what}: relative error {error:.2e}"


@pytest.mark.parametrize("with_final", [False, True], ids=["o", "o+final"])
@pytest.mark.parametrize("with_initial", [False, True], ids=["fresh", "initial"])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
def test_gradients_through_the_kernel_path(cpu_kernels, normalize, with_initial, with_final):
    q, k, v, s0 = make(2, 3, 150, 64)
    s0 = s0 if with_initial else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([s0.clone().requires_grad_()] if with_initial else [])
    plan_text = str(tk.explain_based(*leaves[:3], normalize=normalize, initial_state=leaves[3] if with_initial else None,
                                     output_final_state=with_final))
    assert plan_text.startswith(f"kernel tk.based_fwd_{cpu_kernels.family}"), plan_text
    assert f"(gradients: tk.based_bwd_{cpu_kernels.family}" in plan_text
    assert ("normaliser's share by PyTorch" in plan_text) == normalize
    result = tk.based(*leaves[:3], normalize=normalize, initial_state=leaves[3] if with_initial else None,
                      output_final_state=with_final)
    out, final = result if with_final else (result, None)
    g = torch.Generator().manual_seed(1)
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grad_final = torch.randn(final.shape, generator=g, dtype=torch.float64) / 10 if with_final else None
    loss = (out.double() * grad_out).sum() + ((final.double() * grad_final).sum() if with_final else 0)
    got = torch.autograd.grad(loss, leaves)
    want = float64_gradients(q, k, v, s0, normalize, grad_out.to(q.dtype), grad_final)
    for name, a, b in zip(("q", "k", "v", "initial_state"), got, want):
        assert a.dtype == (torch.float32 if name == "initial_state" else q.dtype)
        assert_close(a, b, f"grad of {name}")
    (call,) = cpu_kernels.calls
    assert call["grad_initial_state"] == with_initial
    assert (call["grad_final_state"] is not None) == with_final


def test_only_the_gradients_asked_for(cpu_kernels):
    q, k, v, s0 = make(1, 2, 70, 128)
    v.requires_grad_()
    out = tk.based(q, k, v, initial_state=s0)
    (dv,) = torch.autograd.grad(out.float().sum(), [v])
    assert dv.shape == v.shape and dv.dtype == v.dtype
    assert cpu_kernels.calls[0]["grad_initial_state"] is False


def test_final_state_alone(cpu_kernels):
    """A loss on the final state only: o's gradient is absent (zeros reach the kernel)."""
    q, k, v, _ = make(1, 2, 40, 64)
    k.requires_grad_()
    v.requires_grad_()
    _, final = tk.based(q, k, v, output_final_state=True)
    grad_final = torch.randn_like(final)
    got = torch.autograd.grad((final * grad_final).sum(), [k, v])
    want = float64_gradients(q, k, v, None, False, torch.zeros_like(v), grad_final)
    assert_close(got[0], want[1], "grad of k")
    assert_close(got[1], want[2], "grad of v")


def test_normaliser_matches_the_reference():
    q, k, v, s0 = make(2, 2, 130, 64, dtype=torch.float64)
    z0 = s0[..., -1].double()
    ones = torch.ones_like(v[..., :1])
    expected, _ = reference.quadratic(q, k, ones, SCALE, False, 0.0,
                                      torch.stack([z0, torch.zeros_like(z0)], -1))
    got = autograd.normaliser(q, k, SCALE, z0)
    torch.testing.assert_close(got, expected[..., 0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("with_z0", [False, True])
@pytest.mark.parametrize("n", [1, 63, 64, 150])
def test_normaliser_gradients_match_autograd(n, with_z0):
    q, k, _, s0 = make(2, 2, n, 64, dtype=torch.float64)
    z0 = s0[..., -1].double() if with_z0 else None
    delta = torch.randn(2, 2, n, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    leaves = [q.clone().requires_grad_(), k.clone().requires_grad_()] + ([z0.clone().requires_grad_()] if with_z0 else [])
    total = autograd.normaliser(leaves[0], leaves[1], SCALE, leaves[2] if with_z0 else None)
    expected = torch.autograd.grad((delta * total).sum(), leaves)
    dq, dk, dz0 = autograd.normaliser_gradients(q, k, SCALE, delta, z0)
    torch.testing.assert_close(dq, expected[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dk, expected[1], rtol=1e-10, atol=1e-10)
    if with_z0:
        torch.testing.assert_close(dz0, expected[2], rtol=1e-10, atol=1e-10)
    else:
        assert dz0 is None


@pytest.mark.parametrize("n", [1, 63, 64, 150])
def test_normaliser_gradients_split_at_the_kernels_blocks(n):
    """The terms within each row's own chunk (the kernels' grad_denominator, as the op contract
    computes them) plus normaliser_gradients(within_chunks=False) are the whole gradient."""
    q, k, v, s0 = make(2, 2, n, 64, dtype=torch.float64)
    z0 = s0[..., -1].double()
    delta = torch.randn(2, 2, n, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    whole = autograd.normaliser_gradients(q, k, SCALE, delta, z0)
    across = autograd.normaliser_gradients(q, k, SCALE, delta, z0, within_chunks=False)
    zero = torch.zeros_like(v)
    within = based_backward_contract(zero, q, k, v, SCALE, None, None, False, delta)
    within_q, within_k = within[0].double(), within[1].double()
    torch.testing.assert_close(across[0] + within_q, whole[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(across[1] + within_k, whole[1], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(across[2], whole[2], rtol=0, atol=0)


@pytest.mark.parametrize("n", [1, 70])
def test_normalize_hands_the_kernel_its_denominator_gradient(cpu_kernels, n):
    """normalize=True passes grad_denominator = -(g . o) with g = grad_out / D rounded as the
    kernel reads it; without normalize, None."""
    q, k, v, _ = make(1, 2, n, 64)
    grad = torch.randn(1, 2, n, 64, generator=torch.Generator().manual_seed(7)).to(q.dtype)
    for normalize in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = tk.based(*leaves, normalize=normalize)
        torch.autograd.grad((out.float() * grad.float()).sum(), leaves)
        given = cpu_kernels.calls[-1]["grad_denominator"]
        if not normalize:
            assert given is None
            continue
        denominator = autograd.normaliser(q.float(), k.float(), SCALE, None) + 1e-6
        g = (grad.float() / denominator.unsqueeze(-1)).to(q.dtype).float()
        torch.testing.assert_close(given, -(g * out.float()).sum(-1), rtol=0, atol=0)


def test_backward_fallback_where_shared_memory_is_short(cpu_kernels, monkeypatch):
    monkeypatch.setattr(plan, "_shared_memory_optin", torch.compiler.assume_constant_result(lambda index: 101376))
    q, k, v, _ = make(1, 2, 20, 128)
    q.requires_grad_()
    text = str(tk.explain_based(q, k, v))
    needed = plan.BACKWARD_SHARED_BYTES[cpu_kernels.family][128]
    assert f"q requires grad and the backward kernels for value dim 128 need {needed} bytes" in text, text
    with torch.no_grad():
        assert str(tk.explain_based(q, k, v)).startswith("kernel")
    q64, k64, v64, _ = make(1, 2, 20, 64)
    q64.requires_grad_()
    text = str(tk.explain_based(q64, k64, v64))
    if cpu_kernels.family == "sm80":
        assert text.startswith("kernel"), text  # Dv = 64 fits
    else:  # the wgmma kernels take more (every sm_90 GPU has 227 KiB)
        assert "the backward kernels for value dim 64 need 114688 bytes" in text, text


def test_backward_op_fake_and_schema(cpu_kernels):
    q, k, v, s0 = make(2, 3, 16, 64)
    grad = torch.randn_like(v)
    for state, final, want, denominator in ((None, None, False, None),
                                            (s0, torch.randn_like(s0), True, torch.randn(2, 3, 16))):
        torch.library.opcheck(getattr(torch.ops.tk, f"based_bwd_{cpu_kernels.family}").default,
                              (grad, q, k, v, SCALE, state, final, want, denominator),
                              test_utils=("test_schema", "test_faketensor"))


def test_second_backward_is_refused(cpu_kernels):
    q, k, v, _ = make(1, 1, 10, 64)
    q.requires_grad_()
    out = tk.based(q, k, v)
    (dq,) = torch.autograd.grad(out.float().sum(), [q], create_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        dq.float().sum().backward()


def test_feature_map_vjp():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, FEATURES, generator=g, dtype=torch.float64, requires_grad=True)
    z = torch.randn(2, 3, 273, generator=g, dtype=torch.float64)
    (expected,) = torch.autograd.grad((reference.feature_map(x, SCALE) * z.unsqueeze(-2)).sum(), [x])
    torch.testing.assert_close(autograd._feature_map_vjp(x, z, SCALE), expected)
    assert math.isclose(SCALE, 0.25)


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
def test_training_step_under_torch_compile(cpu_kernels, normalize):
    """The autograd formula traced by torch.compile (fullgraph) gives eager's gradients."""
    torch._dynamo.reset()
    q, k, v, s0 = make(1, 2, 70, 64)
    grad = torch.randn(v.shape, generator=torch.Generator().manual_seed(2)).to(v.dtype)

    def step(q, k, v, s0):
        out, state = tk.based(q, k, v, normalize=normalize, initial_state=s0, output_final_state=True)
        return (out.float() * grad.float()).sum() + state.sum() / 100

    leaves = [t.clone().requires_grad_() for t in (q, k, v, s0)]
    eager = torch.autograd.grad(step(*leaves), leaves)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, s0)]
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True)(*leaves), leaves)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2 * b.float().abs().max().item())
