"""Bad input to tk.based, tk.based_step, tk.fftconv, tk.FFTConv and tk.attention_with_kvcache
(and their explain functions), the categories of test_bad_input.py: 0-d, 1-d and wrong-rank
tensors, empty dims, NaN/Inf values, integer/complex/bool dtypes, tensors on different devices,
the meta device, requires_grad on integer tensors, more than 2^31 elements.

Each call gives the right answer (checked against a float64 reference) or a clear error: a
ValueError / TypeError whose message names the argument, raised by the explain function too.
NaN/Inf inputs are placed where the answer does not depend on how a path skips masked terms
(bad_input_cases.py says why): the result must be non-finite exactly where the float64
reference is (NaN where it is NaN, for a NaN input). On the CPU: the PyTorch paths, and the
kernel paths through the stand-ins of differential/standins.py.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import thunderkittens as tk
from differential import standins
from differential.bad_input_cases import assert_nonfinite_like
from test_bad_input import NON_FLOAT, non_float, raised, same_error
from thunderkittens._based import reference as based_reference

VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def assert_clear(error, names, kinds=(ValueError, TypeError)):
    assert error is not None, "no error"
    assert isinstance(error, kinds), f"{type(error).__name__}: {error}"
    assert any(name in str(error) for name in names), f"the message names none of {names}: {error}"


def clear_error_from_both(op, explain, args, kwargs=None, *, names, kinds=(ValueError, TypeError)):
    kwargs = kwargs or {}
    error = raised(op, *args, **kwargs)
    assert_clear(error, names, kinds)
    assert same_error(raised(explain, *args, **kwargs), error), "explain raised another error"
    return error


# ---- inputs --------------------------------------------------------------------------------------

def based_inputs(b=2, h=3, n=20, f=16, dv=64, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    make = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)  # noqa: E731
    return make(b, h, n, f), make(b, h, n, f), make(b, h, n, dv)


def a_state(b=2, h=3, f=16, dv=64, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(1)
    k = torch.randn(b, h, 30, f, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, 30, dv, generator=g, dtype=torch.float64)
    state = based_reference.feature_map(k, f ** -0.5).transpose(-1, -2) @ torch.cat([v, torch.ones_like(v[..., :1])], -1)
    return state.to(dtype).to(device)


def fftconv_inputs(b=2, h=3, n=40, nk=None, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(2)
    u = torch.randn(b, h, n, generator=g).to(dtype).to(device)
    k = torch.randn(h, nk or n, generator=g).to(device)
    return u, k, torch.randn(b, h, n, generator=g).to(dtype).to(device), torch.randn(b, h, n, generator=g).to(dtype).to(device)


def kvcache_inputs(b=2, hq=4, hkv=2, lq=3, s=32, d=64, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(3)
    make = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(device)  # noqa: E731
    q, kc, vc = make(b, hq, lq, d), make(b, hkv, s, d), make(b, hkv, s, d)
    kn, vn = make(b, hkv, lq, d), make(b, hkv, lq, d)
    return q, kc, vc, torch.tensor([5, 17][:b] + [3] * max(0, b - 2), dtype=torch.int32, device=device), kn, vn


def fftconv_module(u, k, pregate=None, postgate=None):
    return tk.FFTConv(max(1, u.shape[-1]) if torch.is_tensor(u) and u.dim() else 8)(u, k, pregate, postgate)


# ---- 0-d, 1-d and wrong-rank tensors -------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (16,), (5, 16), (1, 2, 5, 16, 1)], ids=["0d", "1d", "2d", "5d"])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_based_ranks(shape, which):
    args = list(based_inputs())
    args[which] = torch.randn(shape)
    clear_error_from_both(tk.based, tk.explain_based, args, names=(("q", "k", "v")[which],))
    step_args = list(based_inputs(n=1)) + [a_state()]
    step_args[which] = torch.randn(shape)
    clear_error_from_both(tk.based_step, tk.explain_based_step, step_args, names=(("q", "k", "v")[which],))


@pytest.mark.parametrize("shape", [(), (2,), (2, 3), (1, 2, 3, 273, 65)], ids=["0d", "1d", "2d", "5d"])
def test_based_state_ranks(shape):
    q, k, v = based_inputs()
    clear_error_from_both(tk.based, tk.explain_based, (q, k, v), {"initial_state": torch.randn(shape)},
                          names=("initial_state",))
    clear_error_from_both(tk.based_step, tk.explain_based_step, (q[:, :, :1], k[:, :, :1], v[:, :, :1],
                                                                 torch.randn(shape)), names=("state",))


@pytest.mark.parametrize("which, shape", [("u", ()), ("u", (40,)), ("u", (3, 40)), ("u", (1, 2, 3, 40)),
                                          ("k", ()), ("k", (40,)), ("k", (1, 3, 40))])
@pytest.mark.parametrize("op", [tk.fftconv, fftconv_module], ids=["fftconv", "FFTConv"])
def test_fftconv_ranks(op, which, shape):
    u, k, _, _ = fftconv_inputs()
    args = (torch.randn(shape), k) if which == "u" else (u, torch.randn(shape))
    error = raised(op, *args)
    assert_clear(error, (which,))
    assert same_error(raised(tk.explain_fftconv, *args), error)


@pytest.mark.parametrize("which", ["pregate", "postgate"])
@pytest.mark.parametrize("shape", [(), (40,), (1, 2, 3, 40)], ids=["0d", "1d", "4d"])
def test_fftconv_gate_ranks(which, shape):
    u, k, _, _ = fftconv_inputs()
    clear_error_from_both(tk.fftconv, tk.explain_fftconv, (u, k), {which: torch.randn(shape)}, names=(which,))


@pytest.mark.parametrize("which", ["q", "k_cache", "v_cache", "k_new", "v_new"])
@pytest.mark.parametrize("shape", [(), (64,), (3, 64), (1, 2, 3, 4, 64)], ids=["0d", "1d", "2d", "5d"])
def test_kvcache_ranks(which, shape):
    names = ("q", "k_cache", "v_cache", "cache_seqlens", "k_new", "v_new")
    args = dict(zip(names, kvcache_inputs()))
    args[which] = torch.randn(shape)
    error = clear_error_from_both(tk.attention_with_kvcache, tk.explain_kvcache, (), args,
                                  names=(which, "k_cache", "v_cache"))
    assert which in str(error) or which in ("k_cache", "v_cache"), error


@pytest.mark.parametrize("shape", [(), (2, 1), (3,)], ids=["0d", "2d", "wrong batch"])
def test_kvcache_seqlens_shape(shape):
    q, kc, vc, _, kn, vn = kvcache_inputs()
    clear_error_from_both(tk.attention_with_kvcache, tk.explain_kvcache,
                          (q, kc, vc, torch.zeros(shape, dtype=torch.int32), kn, vn), names=("cache_seqlens",))


# ---- empty dims ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, 3], ids=["batch", "heads", "dim"])
@pytest.mark.parametrize("which", [0, 2])
def test_based_empty_dims(dim, which):
    args = list(based_inputs())
    shape = list(args[which].shape)
    shape[dim] = 0
    args[which] = torch.randn(shape)
    clear_error_from_both(tk.based, tk.explain_based, args, names=("q", "k", "v"))


@pytest.mark.parametrize("stand_in", [False, True])
def test_based_empty_length_passes_the_state_through(monkeypatch, stand_in):
    """N = 0: o is empty, the final state is the initial one (also where the kernel would run)."""
    q, k, v = based_inputs(n=0, dtype=torch.bfloat16)
    state = a_state()
    if stand_in:
        with standins.kernel_stand_ins(monkeypatch, "based") as calls:
            out, final = tk.based(q, k, v, initial_state=state, output_final_state=True)
            step_out, step_state = tk.based_step(q, k, v, state)
        assert calls.calls == []
    else:
        out, final = tk.based(q, k, v, initial_state=state, output_final_state=True)
        step_out, step_state = tk.based_step(q, k, v, state)
    assert out.shape == (2, 3, 0, 64) and out.dtype == torch.bfloat16
    assert torch.equal(final, state) and torch.equal(step_state, state)
    assert step_out.shape == (2, 3, 0, 64)
    out = tk.based(q, k, v)
    assert out.shape == (2, 3, 0, 64)


@pytest.mark.parametrize("op", [tk.fftconv, fftconv_module], ids=["fftconv", "FFTConv"])
@pytest.mark.parametrize("u_shape, k_shape, which", [
    ((0, 3, 40), (3, 40), "u"), ((2, 0, 40), (0, 40), "u"), ((2, 3, 0), (3, 0), "u"),
    ((2, 3, 40), (3, 0), "k"),
])
def test_fftconv_empty_dims(op, u_shape, k_shape, which):
    u, k = torch.randn(u_shape), torch.randn(k_shape)
    error = raised(op, u, k)
    assert_clear(error, (which,))
    assert same_error(raised(tk.explain_fftconv, u, k), error)


@pytest.mark.parametrize("which", ["q", "k_cache", "k_new"])
@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_kvcache_empty_dims(which, dim):
    names = ("q", "k_cache", "v_cache", "cache_seqlens", "k_new", "v_new")
    args = dict(zip(names, kvcache_inputs()))
    shape = list(args[which].shape)
    shape[dim] = 0
    args[which] = torch.randn(shape)
    if which == "k_cache":
        args["v_cache"] = torch.randn(shape)
    if which == "k_new":
        args["v_new"] = torch.randn(shape)
    clear_error_from_both(tk.attention_with_kvcache, tk.explain_kvcache, (), args,
                          names=(which, "q", "k_cache", "cache_seqlens"))


# ---- NaN and Inf -------------------------------------------------------------------------------------

def by_definition(q, k, v, scale, normalize):
    """Based in float64 (the quadratic form, terms past the diagonal dropped, not multiplied
    by 0): o_i sees k_j, v_j for j <= i only."""
    return based_reference.quadratic(q.double(), k.double(), v.double(), scale, normalize)[0]


# (operand, row): any row of q (only its own output), a row of k (the rows from it on), the first
# row of v (every row; a later row of v meets masked products 0 * NaN, which paths skip
# differently).
BASED_PLACES = [("q", 0), ("q", 70), ("k", 5), ("k", 70), ("k", 79), ("v", 0)]


@pytest.mark.parametrize("path", ["pytorch", "stand-in"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("where, row", BASED_PLACES)
@pytest.mark.parametrize("value", list(VALUES))
def test_based_nonfinite(monkeypatch, path, dtype, normalize, where, row, value):
    q, k, v = based_inputs(n=80, dtype=dtype)  # two of the kernel's 64-row chunks
    {"q": q, "k": k, "v": v}[where][1, 2, row, 3] = VALUES[value]
    ref = by_definition(q, k, v, 0.25, normalize)
    if path == "stand-in":
        with standins.kernel_stand_ins(monkeypatch, "based") as calls:
            out = tk.based(q, k, v, normalize=normalize)
        assert len(calls.calls) == (1 if dtype == torch.bfloat16 else 0)
    else:
        out = tk.based(q, k, v, normalize=normalize)
    assert_nonfinite_like(out.double(), ref, ref, value, f"{where}[{row}]={value}")


@pytest.mark.parametrize("where", ["q", "k", "v", "state"])
@pytest.mark.parametrize("value", list(VALUES))
def test_based_step_nonfinite(where, value):
    q, k, v = based_inputs(n=2)
    state = a_state()
    target = {"q": q, "k": k, "v": v, "state": state}[where]
    target[1, 2, 0, 3] = VALUES[value]
    ref_out, ref_state = based_reference.chunked(q.double(), k.double(), v.double(), 0.25, False, 1e-6,
                                                 state.double())
    out, new_state = tk.based_step(q, k, v, state)
    assert_nonfinite_like(out.double(), ref_out, ref_out, value, f"{where}={value}: output")
    assert_nonfinite_like(new_state.double(), ref_state, ref_state, value, f"{where}={value}: state")


def fftconv_reference(u, k, pre=None, post=None):
    n = u.shape[-1]
    w = u.double() * (pre.double() if pre is not None else 1)
    y = torch.fft.irfft(torch.fft.rfft(w, n=2 * n) * torch.fft.rfft(k.double(), n=2 * n), n=2 * n)[..., :n]
    return y * (post.double() if post is not None else 1)


@pytest.mark.parametrize("path", ["pytorch", "stand-in"])
@pytest.mark.parametrize("where", ["u", "k", "pregate", "postgate"])
@pytest.mark.parametrize("value", list(VALUES))
def test_fftconv_nonfinite(monkeypatch, path, where, value):
    """A non-finite value anywhere spreads through the whole FFT (torch.fft's answer too);
    a postgate's only to its own element."""
    u, k, pre, post = fftconv_inputs(n=300, dtype=torch.bfloat16)
    if where == "k":
        k[2, 7] = VALUES[value]
    else:
        {"u": u, "pregate": pre, "postgate": post}[where][1, 2, 7] = VALUES[value]
    ref = fftconv_reference(u, k, pre, post)
    if path == "stand-in":
        with standins.kernel_stand_ins(monkeypatch, "fftconv") as calls:
            out = tk.fftconv(u, k, pre, post)
            cached = tk.FFTConv(300)(u, k, pre, post)
        assert calls.calls
    else:
        out = tk.fftconv(u, k, pre, post)
        cached = tk.FFTConv(300)(u, k, pre, post)
    assert_nonfinite_like(out.double(), ref, ref, value, f"{where}={value}")
    assert_nonfinite_like(cached.double(), ref, ref, value, f"{where}={value} (FFTConv)")


def kvcache_reference(q, kc, vc, lengths, kn, vn):
    """float64 attention of each sequence's query rows (causal, lower-right) over its rows."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    groups = q.shape[1] // kc.shape[1]
    for b in range(q.shape[0]):
        rows = int(lengths[b])
        keys = torch.cat([kc[b, :, :rows], kn[b]], 1).double().repeat_interleave(groups, 0)
        vals = torch.cat([vc[b, :, :rows], vn[b]], 1).double().repeat_interleave(groups, 0)
        scores = q[b].double() @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
        lq, lk = q.shape[2], keys.shape[1]
        visible = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        scores = scores.masked_fill(~visible, -math.inf)
        out[b] = torch.softmax(scores, -1) @ vals
    return out


@pytest.mark.parametrize("where", ["q", "k_cache", "v_cache", "k_new", "v_new", "unused rows"])
@pytest.mark.parametrize("value", list(VALUES))
def test_kvcache_nonfinite(where, value):
    """NaN/Inf in a row attention sees gives non-finite rows exactly as the float64 reference;
    in cache rows past a sequence's end (memory a server reuses) it must not leak."""
    q, kc, vc, lengths, kn, vn = kvcache_inputs()
    if where == "unused rows":
        kc[0, 1, 10:] = VALUES[value]
        vc[0, 1, 10:] = VALUES[value]
    else:
        row = {"q": 2, "k_cache": 1, "v_cache": 1, "k_new": 0, "v_new": 0}[where]
        {"q": q, "k_cache": kc, "v_cache": vc, "k_new": kn, "v_new": vn}[where][1, 1, row, 3] = VALUES[value]
    ref = kvcache_reference(q, kc, vc, lengths, kn, vn)
    out = tk.attention_with_kvcache(q, kc.clone(), vc.clone(), lengths, kn, vn)
    assert_nonfinite_like(out.double(), ref, ref, value, f"{where}={value}")
    if where == "unused rows":
        assert torch.isfinite(out).all()
        finite = torch.isfinite(ref)
        torch.testing.assert_close(out.double()[finite], ref[finite], rtol=1e-4, atol=1e-5)


# ---- dtypes --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NON_FLOAT, ids=str)
@pytest.mark.parametrize("which", ["q", "k", "v", "state"])
def test_based_non_float_dtypes(dtype, which):
    q, k, v = based_inputs()
    state = a_state()
    tensors = {"q": q, "k": k, "v": v, "state": state}
    tensors[which] = non_float(tensors[which].shape, dtype)
    kwargs = {"initial_state": tensors["state"]}
    error = clear_error_from_both(tk.based, tk.explain_based, (tensors["q"], tensors["k"], tensors["v"]), kwargs,
                                  names=(which if which != "state" else "initial_state",) + (("q",) if which != "q" else ()))
    assert isinstance(error, TypeError), error
    step = [t[:, :, :1] if name != "state" else t for name, t in tensors.items()]
    error = clear_error_from_both(tk.based_step, tk.explain_based_step, step, names=(which, "q"))
    assert isinstance(error, TypeError), error


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_based_mixed_float_dtypes(dtype):
    q, k, v = based_inputs()
    clear_error_from_both(tk.based, tk.explain_based, (q, k.to(dtype), v), names=("k dtype",))


@pytest.mark.parametrize("dtype", NON_FLOAT, ids=str)
@pytest.mark.parametrize("which", ["u", "k", "pregate", "postgate"])
@pytest.mark.parametrize("op", [tk.fftconv, fftconv_module], ids=["fftconv", "FFTConv"])
def test_fftconv_non_float_dtypes(op, dtype, which):
    u, k, pre, post = fftconv_inputs()
    tensors = {"u": u, "k": k, "pregate": pre, "postgate": post}
    tensors[which] = non_float(tensors[which].shape, dtype)
    error = raised(op, *tensors.values())
    assert_clear(error, (which,))
    assert isinstance(error, TypeError), error
    assert same_error(raised(tk.explain_fftconv, *tensors.values()), error)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_fftconv_any_float_filter(dtype):
    """k may be any float dtype (documented): the answer is the float64 reference's."""
    u, k, _, _ = fftconv_inputs(dtype=torch.float32)
    k = k.to(dtype)
    y = tk.fftconv(u, k)
    ref = fftconv_reference(u, k)
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


@pytest.mark.parametrize("dtype", NON_FLOAT + [torch.int64, torch.float32], ids=str)
@pytest.mark.parametrize("which", ["q", "k_cache", "v_cache", "k_new", "v_new", "cache_seqlens"])
def test_kvcache_dtypes(dtype, which):
    names = ("q", "k_cache", "v_cache", "cache_seqlens", "k_new", "v_new")
    args = dict(zip(names, kvcache_inputs()))
    if which == "cache_seqlens":
        if dtype == torch.int32:
            return
        args[which] = args[which].to(dtype) if not dtype.is_complex else args[which].to(dtype)
    elif dtype == torch.float32:
        args[which] = args[which].double()
    else:
        args[which] = non_float(args[which].shape, dtype)
    error = clear_error_from_both(tk.attention_with_kvcache, tk.explain_kvcache, (), args, names=(which,))
    assert isinstance(error, TypeError), error


# ---- requires_grad --------------------------------------------------------------------------------

def test_complex_tensors_requiring_grad_are_refused():
    """Integer tensors cannot require grad (torch refuses: test_bad_input.py); complex ones can,
    and every op here refuses them by dtype."""
    qc = non_float((2, 3, 4, 16), torch.complex64).requires_grad_()
    q, k, v = based_inputs(n=4)
    assert_clear(raised(tk.based, qc, k, v), ("q",), TypeError)
    u, kf, _, _ = fftconv_inputs()
    assert_clear(raised(tk.fftconv, u, kf.to(torch.complex64).requires_grad_()), ("k",), TypeError)
    args = list(kvcache_inputs())
    args[0] = non_float(args[0].shape, torch.complex64).requires_grad_()
    assert_clear(raised(tk.attention_with_kvcache, *args), ("q",), TypeError)


def test_kvcache_refuses_gradients():
    args = list(kvcache_inputs())
    args[0].requires_grad_()
    clear_error_from_both(tk.attention_with_kvcache, tk.explain_kvcache, args, names=("q requires grad",))
    with torch.no_grad():
        tk.attention_with_kvcache(*args)


# ---- devices --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["k", "v", "state"])
def test_based_cpu_and_meta(which):
    q, k, v = based_inputs()
    tensors = {"k": k, "v": v, "state": a_state()}
    tensors[which] = tensors[which].to("meta")
    name = which if which != "state" else "initial_state"
    clear_error_from_both(tk.based, tk.explain_based, (q, tensors["k"], tensors["v"]),
                          {"initial_state": tensors["state"]}, names=(name,))
    clear_error_from_both(tk.based_step, tk.explain_based_step,
                          (q[:, :, :1], tensors["k"][:, :, :1], tensors["v"][:, :, :1], tensors["state"]),
                          names=(which,))


@pytest.mark.parametrize("which", ["k", "pregate", "postgate"])
@pytest.mark.parametrize("op", [tk.fftconv, fftconv_module], ids=["fftconv", "FFTConv"])
def test_fftconv_cpu_and_meta(op, which):
    u, k, pre, post = fftconv_inputs()
    tensors = {"k": k, "pregate": pre, "postgate": post}
    tensors[which] = tensors[which].to("meta")
    error = raised(op, u, *tensors.values())
    assert_clear(error, (which,))
    assert same_error(raised(tk.explain_fftconv, u, *tensors.values()), error)


@pytest.mark.parametrize("which", ["k_cache", "v_cache", "cache_seqlens", "k_new"])
def test_kvcache_cpu_and_meta(which):
    names = ("q", "k_cache", "v_cache", "cache_seqlens", "k_new", "v_new")
    args = dict(zip(names, kvcache_inputs()))
    args[which] = args[which].to("meta")
    clear_error_from_both(tk.attention_with_kvcache, tk.explain_kvcache, (), args, names=(which,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_meta_device(dtype):
    """Every op on the meta device: a meta result of the right shape (and gradients)."""
    q, k, v = (t.to("meta").requires_grad_() for t in based_inputs(dtype=dtype))
    state = a_state().to("meta")
    out, final = tk.based(q, k, v, initial_state=state, output_final_state=True)
    assert out.device.type == "meta" and out.shape == v.shape and final.shape == state.shape
    out.sum().backward()
    assert q.grad.shape == q.shape and q.grad.device.type == "meta"
    step_out, new_state = tk.based_step(q.detach()[:, :, :1], k.detach()[:, :, :1], v.detach()[:, :, :1], state)
    assert step_out.shape == (2, 3, 1, 64) and new_state.shape == state.shape
    u, kf, pre, post = (t.to("meta") for t in fftconv_inputs(dtype=dtype))
    kf = kf.requires_grad_()
    y = tk.fftconv(u, kf, pre, post)
    assert y.device.type == "meta" and y.shape == u.shape and y.dtype == dtype
    y.sum().backward()
    assert kf.grad.shape == kf.shape
    assert tk.FFTConv(40)(u, kf.detach()).shape == u.shape
    args = [t.to("meta") for t in kvcache_inputs(dtype=dtype)]
    result = raised(tk.attention_with_kvcache, *args)
    if result is not None:  # no data on meta: a clear error is an answer too
        assert_clear(result, ("meta", "q", "cache"), (ValueError, TypeError, NotImplementedError))
    else:
        assert tk.attention_with_kvcache(*args).shape == args[0].shape


# ---- more than 2^31 elements ----------------------------------------------------------------------------

def test_more_than_2_31_elements_meta():
    q = torch.empty(2049, 16, 4096, 16, device="meta", dtype=torch.bfloat16)
    assert q.numel() > 2**31
    v = torch.empty(2049, 16, 4096, 64, device="meta", dtype=torch.bfloat16)
    assert tk.based(q, q, v).shape == v.shape
    assert not tk.explain_based(q, q, v).uses_kernel
    u = torch.empty(1, 2**16, 2**15 + 8, device="meta", dtype=torch.bfloat16)
    assert u.numel() > 2**31
    k = torch.empty(2**16, 100, device="meta")
    assert tk.fftconv(u, k).shape == u.shape


def test_more_than_2_31_elements_explain(monkeypatch):
    """explain on expanded CPU views of more than 2^31 elements answers without allocating,
    on the stand-ins' kernel path too."""
    q = torch.randn(1, 16, 4096, 16, dtype=torch.bfloat16).expand(2**15 + 1, 16, 4096, 16)
    v = torch.randn(1, 16, 4096, 64, dtype=torch.bfloat16).expand(2**15 + 1, 16, 4096, 64)
    assert q.numel() > 2**31
    u = torch.randn(1, 1, 4096, dtype=torch.bfloat16).expand(2**19 + 1, 1, 4096)
    k = torch.randn(1, 4096)
    assert u.numel() > 2**31
    assert not tk.explain_based(q, q, v).uses_kernel and not tk.explain_fftconv(u, k).uses_kernel
    with standins.kernel_stand_ins(monkeypatch, "based"):
        assert tk.explain_based(q, q, v).uses_kernel
    with standins.kernel_stand_ins(monkeypatch, "fftconv"):
        assert tk.explain_fftconv(u, k).uses_kernel


@pytest.mark.parametrize("stand_in", [False, True])
def test_kvcache_expanded_cache_written_in_place(request, stand_in):
    """Regression: with k_new / v_new the caches are written in place; an expanded cache (stride
    0 over the batch) used to reach PyTorch's internal-overlap RuntimeError on the PyTorch path
    and the decode kernel's in-place write on the kernel path (which reads the layout as
    writable). Now a ValueError naming the cache; without k_new / v_new (read only) it is the
    right answer."""
    if stand_in:
        request.getfixturevalue("cpu_kernel")
    q, kc, vc, lengths, kn, vn = kvcache_inputs(dtype=torch.bfloat16)
    for name in ("k_cache", "v_cache"):
        caches = {"k_cache": kc, "v_cache": vc}
        caches[name] = caches[name][:1].expand(2, -1, -1, -1)
        clear_error_from_both(tk.attention_with_kvcache, tk.explain_kvcache,
                              (q, caches["k_cache"], caches["v_cache"], lengths, kn, vn), names=(name,))
    kc, vc = kc[:1].expand(2, -1, -1, -1), vc[:1].expand(2, -1, -1, -1)
    if stand_in:  # read only: the kernel path takes it (what runs it: test_kvcache_gpu.py)
        assert tk.explain_kvcache(q, kc, vc, lengths).uses_kernel
        return
    out = tk.attention_with_kvcache(q, kc, vc, lengths)
    ref = kvcache_reference(q, kc, vc, lengths, kn[:, :, :0], vn[:, :, :0])
    assert torch.isfinite(out).all() and (out.double() - ref).abs().max() < 3e-2
