"""tk.based and tk.based_step on the CPU: the references against each other and the definition,
the reference path (outputs, state, gradients, decoding), argument checks, explain, strict mode,
and the kernel path against a CPU stand-in of tk::based_fwd_sm90 and tk::based_fwd_sm80, each family
in turn (``auto`` on the pretended Hopper, and sm80 forced) (operands it is handed, the
fake implementation under torch.compile, opcheck)."""

import math

import pytest
import torch

import thunderkittens as tk
from thunderkittens._based import reference

from gpu_support import kernel_standins


def inputs(b=2, h=3, n=50, f=16, dv=64, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)  # noqa: E731
    return make(b, h, n, f), make(b, h, n, f), make(b, h, n, dv)


def by_definition(q, k, v, scale, normalize=False, eps=1e-6):
    """o_i = sum_{j<=i} (1 + s_ij + s_ij^2/2) v_j, one row at a time, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    out = torch.empty_like(v)
    for i in range(q.shape[-2]):
        s = scale * (k[..., : i + 1, :] @ q[..., i, :, None])[..., 0]
        w = 1 + s + s * s / 2
        o = (w[..., None] * v[..., : i + 1, :]).sum(-2)
        out[..., i, :] = o / (w.sum(-1, keepdim=True) + eps) if normalize else o
    return out


# ---- the references -----------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("n", [1, 17, 64, 130])
def test_references_match_the_definition(normalize, n):
    q, k, v = inputs(n=n)
    expected = by_definition(q, k, v, 0.25, normalize)
    quad, quad_state = reference.quadratic(q, k, v, 0.25, normalize)
    chunk, chunk_state = reference.chunked(q, k, v, 0.25, normalize, chunk=32)
    torch.testing.assert_close(quad, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunk, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunk_state, quad_state, rtol=1e-12, atol=1e-12)


def test_state_is_the_feature_map_sum():
    q, k, v = inputs(n=20)
    _, state = reference.quadratic(q, k, v, 0.3)
    phi = reference.feature_map(k, 0.3)
    assert phi.shape[-1] == 273
    expected = phi.transpose(-1, -2) @ torch.cat([v, torch.ones_like(v[..., :1])], -1)
    torch.testing.assert_close(state, expected)
    # phi(q) . phi(k) is the polynomial of the scaled score.
    s = 0.3 * (q[0, 0, 3] @ k[0, 0, 5])
    assert math.isclose(reference.feature_map(q, 0.3)[0, 0, 3] @ phi[0, 0, 5], 1 + s + s * s / 2, rel_tol=1e-12)


# ---- the public functions on the reference path -------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("normalize", [False, True])
def test_based_on_cpu_runs_the_reference(dtype, normalize):
    q, k, v = inputs(n=70, dtype=dtype)
    out, state = tk.based(q, k, v, normalize=normalize, output_final_state=True)
    assert out.dtype == dtype and out.shape == v.shape
    assert state.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert state.shape == (2, 3, 273, 65)
    expected = by_definition(q, k, v, 0.25, normalize)
    tol = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol * expected.abs().max().item())
    assert "fallback the PyTorch reference (chunked): inputs are on cpu" in str(tk.explain_based(q, k, v))


def test_default_scale_is_one_over_sqrt_feature_dim():
    q, k, v = inputs(f=9, n=12)
    torch.testing.assert_close(tk.based(q, k, v), by_definition(q, k, v, 1 / 3))
    torch.testing.assert_close(tk.based(q, k, v, scale=0.5), by_definition(q, k, v, 0.5))


def test_initial_state_continues_a_prefix():
    q, k, v = inputs(n=90)
    whole, whole_state = tk.based(q, k, v, output_final_state=True)
    first, state = tk.based(q[..., :37, :], k[..., :37, :], v[..., :37, :], output_final_state=True)
    rest, rest_state = tk.based(q[..., 37:, :], k[..., 37:, :], v[..., 37:, :],
                                initial_state=state, output_final_state=True)
    torch.testing.assert_close(torch.cat([first, rest], -2), whole)
    torch.testing.assert_close(rest_state, whole_state)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_based_step_token_by_token_equals_the_whole_sequence(normalize, inplace):
    q, k, v = inputs(n=40)
    whole = tk.based(q, k, v, normalize=normalize)
    prefix, state = tk.based(q[..., :25, :], k[..., :25, :], v[..., :25, :], normalize=normalize,
                             output_final_state=True)
    outs = [prefix]
    for t in range(25, 40):
        step = slice(t, t + 1)
        out, new_state = tk.based_step(q[..., step, :], k[..., step, :], v[..., step, :], state,
                                       normalize=normalize, inplace=inplace)
        assert (new_state is state) == inplace
        state = new_state
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, -2), whole)


def test_gradients_of_the_reference_path():
    q, k, v = inputs(b=1, h=2, n=21, f=4, dv=3, requires_grad=True)
    state0 = torch.randn(1, 2, 21, 4, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda q, k, v, s: tk.based(q, k, v, normalize=True, initial_state=s,
                                                         output_final_state=True),
                             (q, k, v, state0))


def test_empty_sequence():
    q, k, v = inputs(n=0)
    out, state = tk.based(q, k, v, output_final_state=True)
    assert out.shape == (2, 3, 0, 64) and torch.equal(state, torch.zeros(2, 3, 273, 65, dtype=torch.float64))


# ---- argument checks ----------------------------------------------------------------------


@pytest.mark.parametrize("change, error, text", [
    (lambda q, k, v: (q[0], k, v), ValueError, "q must be 4-D"),
    (lambda q, k, v: (q, k[..., :8], v), ValueError, "k must have q's shape"),
    (lambda q, k, v: (q, k, v[:, :, :5]), ValueError, "v must have q's batch, heads and length"),
    (lambda q, k, v: (q, k.float(), v), TypeError, "k dtype torch.float32 differs"),
    (lambda q, k, v: (q.long(), k.long(), v.long()), TypeError, "q must have a floating-point dtype"),
    (lambda q, k, v: (q, k, v.to("meta")), ValueError, "v is on meta"),
    (lambda q, k, v: (q, k, "v"), TypeError, "v must be a torch.Tensor"),
])
def test_bad_tensors(change, error, text):
    with pytest.raises(error, match=text):
        tk.based(*change(*inputs(n=8)))


@pytest.mark.parametrize("kwargs, error, text", [
    ({"scale": -1.0}, ValueError, "scale must be finite and positive"),
    ({"scale": float("nan")}, ValueError, "scale must be finite and positive"),
    ({"scale": "1"}, TypeError, "scale must be a float or None"),
    ({"eps": -1.0}, ValueError, "eps must be a finite number >= 0"),
    ({"normalize": 1}, TypeError, "normalize must be a bool"),
    ({"output_final_state": 1}, TypeError, "output_final_state must be a bool"),
    ({"initial_state": torch.zeros(2, 3, 273, 64)}, ValueError, r"initial_state must have shape .*\(2, 3, 273, 65\)"),
    ({"initial_state": torch.zeros(2, 3, 273, 65, dtype=torch.long)}, TypeError, "initial_state must have a floating"),
])
def test_bad_arguments(kwargs, error, text):
    with pytest.raises(error, match=text):
        tk.based(*inputs(n=8), **kwargs)


def test_based_step_checks_its_state():
    q, k, v = inputs(n=1)
    with pytest.raises(ValueError, match=r"tk.based_step: state must have shape"):
        tk.based_step(q, k, v, torch.zeros(2, 3, 273, 64))
    with pytest.raises(TypeError, match="inplace must be a bool"):
        tk.based_step(q, k, v, torch.zeros(2, 3, 273, 65, dtype=torch.float64), inplace=None)


def test_strict_mode_refuses_the_reference():
    with tk.strict(), pytest.raises(tk.FallbackError, match="tk.based would fall back to the PyTorch reference"):
        tk.based(*inputs(n=8))


# ---- the kernel path against a CPU stand-in -----------------------------------------------


class BasedStandIn:
    """CPU implementation of tk::based_fwd_sm80 / _sm90 (float64 quadratic reference), recording calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, scale, normalize, eps, initial_state, output_final_state):
        assert q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] == 16
        assert initial_state is None or (initial_state.dtype == torch.float32 and initial_state.is_contiguous())
        self.calls.append({"q": q, "k": k, "v": v, "scale": scale, "normalize": normalize,
                           "initial_state": initial_state})
        state = None if initial_state is None else initial_state.double()
        out, final = reference.quadratic(q.double(), k.double(), v.double(), scale, normalize, eps, state)
        final = final.float() if output_final_state else q.new_empty((0,), dtype=torch.float32)
        return out.to(q.dtype), final


# What explain says for each forward family, and the choice that picks it on (pretended) Hopper.
KERNEL_TEXT = {"sm90": "kernel tk.based_fwd_sm90 [sm90 wgmma+tma]", "sm80": "kernel tk.based_fwd_sm80 [sm80 mma.sync]"}
CHOICE = {"sm90": "auto", "sm80": "sm80"}


@pytest.fixture(params=["sm90", "sm80"])
def cpu_based(monkeypatch, request):
    """The stand-in as both families' op, with the family of the parameter picked; .family names it."""
    standin = BasedStandIn()
    standin.family = request.param
    with kernel_standins(monkeypatch, "based", {"based_fwd_sm90": standin, "based_fwd_sm80": standin}), \
            tk.use_kernel(CHOICE[request.param], op="based"):
        yield standin


def test_kernel_path_reads_a_transposed_layout_in_place(cpu_based):
    b, n, h = 2, 33, 4
    q = torch.randn(b, n, h, 16, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, n, h, 16, dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(b, n, h, 64, dtype=torch.bfloat16).transpose(1, 2)
    assert str(tk.explain_based(q, k, v)) == f"{KERNEL_TEXT[cpu_based.family]} bf16 dv=64"
    out = tk.based(q, k, v)
    (call,) = cpu_based.calls
    assert call["q"].data_ptr() == q.data_ptr() and call["v"].data_ptr() == v.data_ptr()
    assert call["scale"] == 0.25
    torch.testing.assert_close(out.double(), by_definition(q, k, v, 0.25), rtol=2e-2, atol=2e-2 * 40)


def test_kernel_path_copies_what_it_cannot_read(cpu_based):
    q, k, v = inputs(n=9, dtype=torch.float16)
    v_odd = torch.randn(2, 3, 9, 72, dtype=torch.float16)[..., 4:68]  # 8-byte aligned view
    assert "(copies v with .contiguous())" in str(tk.explain_based(q, k, v_odd))
    tk.based(q, k, v_odd)
    assert cpu_based.calls[0]["v"].is_contiguous()


def test_kernel_path_with_states_and_normalize(cpu_based):
    q, k, v = inputs(n=20, dtype=torch.bfloat16)
    state0 = torch.randn(2, 3, 273, 65, dtype=torch.float64)
    plan = str(tk.explain_based(q, k, v, normalize=True, initial_state=state0, output_final_state=True))
    assert plan == f"{KERNEL_TEXT[cpu_based.family]} bf16 dv=64 normalized + initial state -> final state"
    out, state = tk.based(q, k, v, normalize=True, initial_state=state0, output_final_state=True)
    assert state.dtype == torch.float32 and state.shape == (2, 3, 273, 65)
    assert cpu_based.calls[0]["initial_state"].dtype == torch.float32


@pytest.mark.parametrize("case, reason", [
    (lambda: inputs(n=8, f=8, dtype=torch.bfloat16), "feature dim 8 is not supported by the kernel (16 only)"),
    (lambda: inputs(n=8, dv=32, dtype=torch.bfloat16), "value dim 32 is not supported by the kernel (64 or 128 only)"),
    (lambda: inputs(n=8, dtype=torch.float32), "dtype torch.float32 is not supported by the kernel"),
])
def test_kernel_path_fallback_reasons(cpu_based, case, reason):
    q, k, v = case()
    assert reason in str(tk.explain_based(q, k, v))
    tk.based(q, k, v)
    assert cpu_based.calls == []


def test_kernel_path_under_torch_compile(cpu_based):
    q, k, v = inputs(n=24, dtype=torch.bfloat16)
    compiled = torch.compile(lambda q, k, v: tk.based(q, k, v, output_final_state=True), fullgraph=True)
    out, state = compiled(q, k, v)
    expected, expected_state = tk.based(q, k, v, output_final_state=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(state, expected_state)


@pytest.mark.parametrize("output_final_state", [False, True])
def test_opcheck(cpu_based, output_final_state):
    q, k, v = inputs(n=16, dtype=torch.bfloat16)
    state0 = torch.randn(2, 3, 273, 65)
    torch.library.opcheck(getattr(torch.ops.tk, f"based_fwd_{cpu_based.family}").default,
                          (q, k, v, 0.25, True, 1e-6, state0, output_final_state),
                          test_utils=("test_schema", "test_faketensor"))
