"""tk.based_step's decision cache (thunderkittens/_based/step_calls.py) on the CPU: a decoding
loop decides once, and everything the decision depends on misses the cache: shapes, dtypes,
devices, requires_grad and gradient mode, scale, eps, normalize, inplace, the kernel choice and
the process-wide facts. A stale hit would be a silent wrong answer (a kernel for a call it cannot
take, the scale of another call), so each change is checked against a fresh decision."""

import pytest
import torch

import thunderkittens as tk
from thunderkittens._based import plan, step_calls

from conftest import counting_decisions
from test_based_step_cpu import SCALE, a_state, cpu_step, stepped, tokens  # noqa: F401 (a fixture)


@pytest.fixture
def decides(monkeypatch):
    """Counts decide's calls (the cache's misses) from here on, on an empty cache."""
    yield counting_decisions(monkeypatch, step_calls, step_calls)
    step_calls.clear()


ARGS = dict(scale=SCALE, normalize=False, eps=1e-6, inplace=True)


def prepared(q, k, v, state, **overrides):
    kwargs = dict(ARGS, **overrides)
    return step_calls.prepare(q, k, v, state, kwargs["scale"], kwargs["normalize"], kwargs["eps"], kwargs["inplace"])


def fresh(q, k, v, state, **overrides):
    """What deciding these arguments afresh gives (the cache emptied first)."""
    step_calls.clear()
    return prepared(q, k, v, state, **overrides)


def test_a_decoding_loop_decides_once(cpu_step, decides):
    state = a_state()
    expected_state = state.double()
    for step in range(4):
        q, k, v = tokens(dtype=torch.bfloat16, seed=10 + step)
        for _layer in range(3):
            out, new_state = tk.based_step(q, k, v, state, scale=SCALE, inplace=True)
            assert new_state is state and cpu_step.calls[-1]["op"] == "based_step_inplace_sm80"
        for _layer in range(3):
            _, expected_state = stepped(q, k, v, expected_state)
    assert decides["n"] == 1 and len(cpu_step.calls) == 12
    torch.testing.assert_close(state.double(), expected_state, rtol=1e-4, atol=1e-3)


def _changes():
    def args(**overrides):
        return lambda q, k, v, state: ((q, k, v, state), overrides)

    return {
        "batch": lambda q, k, v, state: ((q[:1], k[:1], v[:1], state[:1]), {}),
        "tokens": lambda q, k, v, state: (tuple(torch.cat([t, t], 2) for t in (q, k, v)) + (state,), {}),
        "no tokens": lambda q, k, v, state: ((q[:, :, :0], k[:, :, :0], v[:, :, :0], state), {}),
        "value dim": lambda q, k, v, state: ((q, k, torch.cat([v, v], -1), a_state(dv=128)), {}),
        "value dim 32 (PyTorch ops)": lambda q, k, v, state: ((q, k, v[..., :32], a_state(dv=32)), {}),
        "dtype": lambda q, k, v, state: ((q.half(), k.half(), v.half(), state), {}),
        "state dtype": lambda q, k, v, state: ((q, k, v, state.double()), {}),
        "q requires grad": lambda q, k, v, state: ((q.clone().requires_grad_(), k, v, state), {}),
        "state requires grad": lambda q, k, v, state: ((q, k, v, state.clone().requires_grad_()), {}),
        "scale": args(scale=0.5),
        "scale None": args(scale=None),
        "eps": args(eps=1e-3),
        "normalize": args(normalize=True),
        "not in place": args(inplace=False),
    }


CHANGES = _changes()


@pytest.mark.parametrize("change", CHANGES)
def test_every_change_misses_the_cache(cpu_step, decides, change):
    q, k, v = tokens(dtype=torch.bfloat16)
    state = a_state()
    base = prepared(q, k, v, state)
    assert prepared(q, k, v, state) is base and decides["n"] == 1
    (q, k, v, state), overrides = CHANGES[change](q, k, v, state)
    changed = prepared(q, k, v, state, **overrides)
    assert decides["n"] == 2 - (change == "no tokens")  # a call without tokens decides nothing
    assert changed == fresh(q, k, v, state, **overrides)
    kwargs = dict(ARGS, **overrides)
    kwargs["inplace"] = False
    out, new_state = tk.based_step(q, k, v, state, **kwargs)
    if q.shape[2] == 0:
        assert out.shape == v.shape and torch.equal(new_state, state)
        return
    scale = q.shape[-1] ** -0.5 if kwargs["scale"] is None else kwargs["scale"]
    expected_out, expected_state = stepped(q.detach(), k.detach(), v.detach(), state.detach(), scale,
                                           kwargs["normalize"], kwargs["eps"])
    tol = 2e-2 * expected_out.abs().max().item()
    torch.testing.assert_close(out.detach().double(), expected_out, rtol=2e-2, atol=tol)
    torch.testing.assert_close(new_state.detach().double(), expected_state, rtol=2e-2, atol=1e-1)


def test_gradient_mode_misses_the_cache(cpu_step, decides):
    q, k, v = tokens(dtype=torch.bfloat16, requires_grad=True)
    state = a_state()
    assert prepared(q, k, v, state).family is None
    with torch.no_grad():
        assert prepared(q, k, v, state).family is plan.SM80
    assert decides["n"] == 2


def test_the_kernel_choice_and_the_process_facts_miss_the_cache(cpu_step, decides, monkeypatch):
    q, k, v = tokens(dtype=torch.bfloat16)
    state = a_state()
    assert prepared(q, k, v, state).family is plan.SM80
    with tk.use_kernel("sm90", op="based"):
        assert prepared(q, k, v, state).family is plan.SM80  # the step kernel is sm80's
    monkeypatch.setattr(plan, "KERNEL_VALUE_DIMS", (128,))
    call = prepared(q, k, v, state)
    assert call.family is None and "value dim 64 is not supported" in call.reason
    assert decides["n"] == 3


@pytest.mark.parametrize("change", ["scale bool", "scale nan", "eps negative", "normalize int", "inplace int",
                                    "state shape", "k dtype", "v batch"])
def test_bad_calls_of_a_cached_layout_still_raise(cpu_step, decides, change):
    q, k, v = tokens(dtype=torch.bfloat16)
    state = a_state()
    tk.based_step(q, k, v, state, **ARGS)
    kwargs = dict(ARGS)
    if change == "scale bool":
        kwargs["scale"] = True
    elif change == "scale nan":
        kwargs["scale"] = float("nan")
    elif change == "eps negative":
        kwargs["eps"] = -1.0
    elif change == "normalize int":
        kwargs["normalize"] = 0
    elif change == "inplace int":
        kwargs["inplace"] = 1
    elif change == "state shape":
        state = state[..., :-1]
    elif change == "k dtype":
        k = k.half()
    elif change == "v batch":
        v = v[:1]
    for _ in range(2):  # a failed check is never kept
        with pytest.raises((ValueError, TypeError)):
            tk.based_step(q, k, v, state, **kwargs)


def test_strict_mode_and_the_states_layout_are_read_on_every_call(cpu_step, decides):
    q, k, v = tokens(dtype=torch.bfloat16)
    state = a_state()
    tk.based_step(q, k, v, state.double(), **ARGS)  # PyTorch ops: a float64 state
    with tk.strict(), pytest.raises(tk.FallbackError, match="state dtype torch.float64"):
        tk.based_step(q, k, v, state.double(), **ARGS)
    wide = torch.zeros(2, 3, 273, 66)[..., :65]  # not contiguous: the op returning a new state
    wide.copy_(state)
    for s in (state, wide, state):
        _, new_state = tk.based_step(q, k, v, s, **ARGS)
        assert new_state is s
        assert cpu_step.calls[-1]["op"] == ("based_step_inplace_sm80" if s.is_contiguous() else "based_step_sm80")
    assert decides["n"] == 2


def test_compiled_calls_are_traced_not_cached(cpu_step, decides):
    q, k, v = tokens(dtype=torch.bfloat16)

    @torch.compile(fullgraph=True, backend="eager")
    def step(q, k, v, state):
        return tk.based_step(q, k, v, state, scale=SCALE)

    out, _ = step(q, k, v, a_state())
    assert len(step_calls._cache) == 0
    torch.testing.assert_close(out, tk.based_step(q, k, v, a_state(), scale=SCALE)[0])
