"""tk.based_step and explain_based_step on the CPU: the PyTorch path (several tokens at once,
no tokens, gradients), explain and strict mode, and the kernel path against CPU stand-ins of
tk::based_step_sm80 and tk::based_step_inplace_sm80 (which op a call takes, what it hands the
op, in place or not, the state copies, the fallback reasons, the fake implementations under
torch.compile, opcheck)."""

import re

import pytest
import torch

import thunderkittens as tk
from thunderkittens._based import step as step_module

from gpu_support import feature_map, kernel_standins, with_ones

SCALE = 0.25


def tokens(b=2, h=3, t=1, f=16, dv=64, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)  # noqa: E731
    return make(b, h, t, f), make(b, h, t, f), make(b, h, t, dv)


def a_state(b=2, h=3, f=16, dv=64, dtype=torch.float32, seed=1, n=30):
    """A state as a prefix of n tokens leaves it."""
    k, _, v = tokens(b, h, n, f, dv, seed=seed)
    return (feature_map(k, f ** -0.5).transpose(-1, -2) @ with_ones(v)).to(dtype)


def stepped(q, k, v, state, scale=SCALE, normalize=False, eps=1e-6):
    """float64, token by token: state += phi(k_t)^T [v_t, 1]; o_t = phi(q_t) state (normalised)."""
    state = state.double().clone()
    outs = []
    for t in range(q.shape[2]):
        state += feature_map(k[:, :, t].double(), scale)[..., :, None] * with_ones(v[:, :, t].double())[..., None, :]
        total = (feature_map(q[:, :, t].double(), scale)[..., None, :] @ state)[..., 0, :]
        outs.append(total[..., :-1] / (total[..., -1:] + eps) if normalize else total[..., :-1])
    return torch.stack(outs, 2), state


# ---- the PyTorch path ---------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_several_tokens_at_once_are_applied_in_order(normalize, inplace):
    q, k, v = tokens(t=5)
    state = a_state(dtype=torch.float64)
    expected_out, expected_state = stepped(q, k, v, state, normalize=normalize)
    before = state.clone()
    out, new_state = tk.based_step(q, k, v, state, scale=SCALE, normalize=normalize, inplace=inplace)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(new_state, expected_state)
    assert (new_state is state) == inplace
    if not inplace:
        assert torch.equal(state, before)


def test_no_tokens_return_at_once_even_in_strict_mode():
    q, k, v = tokens(t=0, dtype=torch.bfloat16)
    state = a_state()
    with tk.strict():
        out, new_state = tk.based_step(q, k, v, state)
        same_out, same = tk.based_step(q, k, v, state, inplace=True)
    assert out.shape == (2, 3, 0, 64) and out.dtype == torch.bfloat16 and same_out.shape == out.shape
    assert torch.equal(new_state, state) and new_state is not state and same is state


def test_gradients_of_the_pytorch_path():
    q, k, v = tokens(b=1, h=2, t=3, f=4, dv=3, requires_grad=True)
    state = torch.randn(1, 2, 21, 4, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda q, k, v, s: tk.based_step(q, k, v, s, normalize=True), (q, k, v, state))


def test_explain_on_the_cpu_and_strict_mode():
    q, k, v = tokens(dtype=torch.bfloat16)
    state = a_state()
    plan = tk.explain_based_step(q, k, v, state)
    assert isinstance(plan, tk.BasedStepPlan) and not plan.uses_kernel
    reason = "inputs are on cpu; the kernels need a CUDA GPU"
    assert str(plan) == f"fallback PyTorch ops: {reason}"
    message = f"tk.based_step would fall back to PyTorch ops: {reason}"
    with tk.strict(), pytest.raises(tk.FallbackError, match=re.escape(message)):
        tk.based_step(q, k, v, state)


def test_explain_checks_its_arguments():
    q, k, v = tokens()
    with pytest.raises(ValueError, match=r"tk.based_step: state must have shape"):
        tk.explain_based_step(q, k, v, torch.zeros(2, 3, 273, 64))
    with pytest.raises(TypeError, match="tk.based_step: inplace must be a bool"):
        tk.explain_based_step(q, k, v, a_state(), inplace=1)


# ---- the kernel path against CPU stand-ins --------------------------------------------------


class StepStandIn:
    """CPU implementations of both step ops (the float64 step above), recording each call and
    holding them to the ops' contracts."""

    def __init__(self):
        self.calls = []

    def _run(self, op, q, k, v, state, scale, normalize, eps):
        assert q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] == 16, (q.dtype, q.shape)
        assert state.dtype == torch.float32, state.dtype
        self.calls.append({"op": op, "q": q, "k": k, "v": v, "state": state, "scale": scale,
                           "normalize": normalize, "eps": eps})
        out, new_state = stepped(q, k, v, state, scale, normalize, eps)
        return out.to(q.dtype), new_state.float()

    def functional(self, q, k, v, state, scale, normalize, eps):
        out, new_state = self._run("based_step_sm80", q, k, v, state, scale, normalize, eps)
        return out, new_state.contiguous()

    def inplace(self, q, k, v, state, scale, normalize, eps):
        assert state.is_contiguous(), state.stride()
        out, new_state = self._run("based_step_inplace_sm80", q, k, v, state, scale, normalize, eps)
        state.copy_(new_state)
        return out


@pytest.fixture
def cpu_step(monkeypatch):
    standin = StepStandIn()
    with kernel_standins(monkeypatch, "based", {"based_step_sm80": standin.functional,
                                                "based_step_inplace_sm80": standin.inplace}):
        yield standin


KERNEL = "kernel tk.{op} [sm80 CUDA cores]"


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("t", [1, 6])
def test_in_place_takes_the_in_place_op(cpu_step, normalize, t):
    q, k, v = tokens(t=t, dtype=torch.bfloat16)
    state = a_state()
    expected_out, expected_state = stepped(q, k, v, state, normalize=normalize)
    plan = tk.explain_based_step(q, k, v, state, normalize=normalize, inplace=True)
    words = f"bf16 dv=64 tokens={t}" + (" normalized" if normalize else "") + " in place"
    assert str(plan) == KERNEL.format(op="based_step_inplace_sm80") + " " + words
    with tk.strict():
        out, returned = tk.based_step(q, k, v, state, normalize=normalize, inplace=True)
    (call,) = cpu_step.calls
    assert call["op"] == "based_step_inplace_sm80" and call["state"] is state and call["scale"] == 0.25
    assert returned is state and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected_out.to(torch.bfloat16))
    torch.testing.assert_close(state, expected_state.float())


def test_a_new_state_leaves_the_given_one_alone(cpu_step):
    q, k, v = tokens(dtype=torch.float16, dv=128)
    state = a_state(dv=128)
    before = state.clone()
    assert str(tk.explain_based_step(q, k, v, state)) == \
        KERNEL.format(op="based_step_sm80") + " fp16 dv=128 tokens=1 -> new state"
    with tk.strict():
        out, new_state = tk.based_step(q, k, v, state, scale=0.1, eps=1e-3, normalize=True)
    (call,) = cpu_step.calls
    assert call["op"] == "based_step_sm80" and call["state"] is state
    assert call["scale"] == 0.1 and call["eps"] == 1e-3 and call["normalize"] is True
    assert torch.equal(state, before) and new_state is not state
    torch.testing.assert_close(new_state, stepped(q, k, v, state, 0.1, True, 1e-3)[1].float())


def test_tokens_are_handed_over_in_place_whatever_their_strides(cpu_step):
    b, t, h = 2, 3, 4
    q = torch.randn(b, t, h, 32, dtype=torch.bfloat16).transpose(1, 2)[..., ::2]  # strided last dim
    k = torch.randn(b, t, h, 16, dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(b, t, h, 64, dtype=torch.bfloat16).transpose(1, 2)
    state = a_state(b, h)
    assert "copies" not in str(tk.explain_based_step(q, k, v, state, inplace=True))
    tk.based_step(q, k, v, state, inplace=True)
    (call,) = cpu_step.calls
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert call[name].data_ptr() == t.data_ptr() and call[name].stride() == t.stride(), name


def test_a_non_contiguous_state_in_place_is_updated_through_a_copy(cpu_step):
    q, k, v = tokens(dtype=torch.bfloat16)
    state = a_state().transpose(0, 1).contiguous().transpose(0, 1)  # (B, H) strides swapped
    assert not state.is_contiguous()
    expected_out, expected_state = stepped(q, k, v, state)
    assert str(tk.explain_based_step(q, k, v, state, inplace=True)) == \
        KERNEL.format(op="based_step_sm80") + " bf16 dv=64 tokens=1 in place (copies state with .contiguous())"
    with tk.strict():
        out, returned = tk.based_step(q, k, v, state, inplace=True)
    assert [c["op"] for c in cpu_step.calls] == ["based_step_sm80"]
    assert returned is state
    torch.testing.assert_close(state, expected_state.float())
    torch.testing.assert_close(out, expected_out.to(torch.bfloat16))


def test_a_misaligned_state_is_copied_for_a_new_state_not_in_place(cpu_step):
    q, k, v = tokens(dtype=torch.bfloat16)
    buffer = torch.empty(2 * 3 * 273 * 65 + 1)
    state = buffer[1:].view(2, 3, 273, 65).copy_(a_state())  # contiguous, 4 bytes past 16
    assert state.data_ptr() % 16 != 0
    assert str(tk.explain_based_step(q, k, v, state)).endswith("(copies state with .contiguous())")
    assert "copies" not in str(tk.explain_based_step(q, k, v, state, inplace=True))


@pytest.mark.parametrize("case, reason", [
    (lambda: (*tokens(f=8, dtype=torch.bfloat16), a_state(f=8)),
     "feature dim 8 is not supported by the kernel (16 only)"),
    (lambda: (*tokens(dv=32, dtype=torch.bfloat16), a_state(dv=32)),
     "value dim 32 is not supported by the kernel (64 or 128 only)"),
    (lambda: (*tokens(dtype=torch.float32), a_state()),
     "dtype torch.float32 is not supported by the kernel (bfloat16 and float16 only)"),
    (lambda: (*tokens(dtype=torch.bfloat16), a_state(dtype=torch.float64)),
     "state dtype torch.float64 is not supported by the kernel (float32 only)"),
    (lambda: (*tokens(dtype=torch.bfloat16), a_state(dtype=torch.bfloat16)),
     "state dtype torch.bfloat16 is not supported by the kernel (float32 only)"),
    (lambda: (*tokens(dtype=torch.bfloat16, requires_grad=True), a_state()),
     "q requires grad and the based_step kernel has no backward"),
    (lambda: (*tokens(dtype=torch.bfloat16), a_state().requires_grad_()),
     "state requires grad and the based_step kernel has no backward"),
], ids=["feature-dim-8", "value-dim-32", "fp32", "fp64-state", "bf16-state", "q-grad", "state-grad"])
def test_what_the_kernel_does_not_take_runs_pytorch_ops(cpu_step, case, reason):
    q, k, v, state = case()
    plan = tk.explain_based_step(q, k, v, state)
    assert not plan.uses_kernel and reason in str(plan), str(plan)
    with tk.strict(), pytest.raises(tk.FallbackError, match=re.escape(reason)):
        tk.based_step(q, k, v, state)
    out, new_state = tk.based_step(q, k, v, state, scale=SCALE)
    assert cpu_step.calls == [] and out.dtype == q.dtype and new_state.dtype == state.dtype
    expected_out, expected_state = stepped(q.detach(), k.detach(), v.detach(), state.detach())
    tol = dict(rtol=2e-2, atol=2e-2 * expected_out.abs().max().item())
    torch.testing.assert_close(out.detach().double(), expected_out, **tol)
    torch.testing.assert_close(new_state.detach().double(), expected_state, rtol=2e-2, atol=1e-1)


def test_inputs_that_require_grad_take_the_kernel_under_no_grad(cpu_step):
    q, k, v = tokens(dtype=torch.bfloat16, requires_grad=True)
    state = a_state()
    with torch.no_grad():
        assert tk.explain_based_step(q, k, v, state).uses_kernel
        tk.based_step(q, k, v, state)
    assert len(cpu_step.calls) == 1


def test_forced_family_names_itself_in_the_reason(cpu_step):
    q, k, v = tokens(dtype=torch.bfloat16, requires_grad=True)
    with tk.use_kernel("sm80", op="based"):
        assert "kernel sm80 was forced but q requires grad" in str(tk.explain_based_step(q, k, v, a_state()))


@pytest.mark.parametrize("inplace", [False, True])
def test_kernel_path_under_torch_compile(cpu_step, inplace):
    q, k, v = tokens(t=2, dtype=torch.bfloat16)
    state, eager_state = a_state(), a_state()

    def f(q, k, v, state):
        out, new_state = tk.based_step(q, k, v, state, normalize=True, inplace=inplace)
        return out * 2, new_state

    compiled = torch.compile(f, fullgraph=True)
    with tk.strict():
        out, new_state = compiled(q, k, v, state)
        expected_out, expected_state = f(q, k, v, eager_state)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(new_state, expected_state)
    if inplace:
        torch.testing.assert_close(state, eager_state)  # the compiled call updated its state too
    else:
        torch.testing.assert_close(state, a_state())


def test_opcheck(cpu_step):
    q, k, v = tokens(t=3, dtype=torch.bfloat16)
    args = (q, k, v, a_state(), 0.25, True, 1e-6)
    for op in (torch.ops.tk.based_step_sm80.default, torch.ops.tk.based_step_inplace_sm80.default):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_the_public_names():
    assert tk.based_step is step_module.based_step and tk.explain_based_step is step_module.explain_based_step
    assert "explain_based_step" in tk.__all__ and "BasedStepPlan" in tk.__all__
