"""What the GPU tests of tk.based and tk.fftconv share: when a module must run (its skips), seeds
(used by the decoding tests too), the float64 references the kernels are held to, and the
tolerance checks built on them; and, for the CPU tests, stand-in kernels on a pretended GPU.

The references here are written from the definitions, not taken from the package
(thunderkittens/_based/reference.py, _fftconv/reference.py), so the GPU tests do not compare the
package with itself.
"""

import contextlib
import math
import re
import zlib

import pytest
import torch

import thunderkittens as tk
from thunderkittens import _extension

# ---- when a module runs --------------------------------------------------------------------------


def build_runs_on(capability):
    """Whether tk.BUILT_ARCHS holds code for a GPU of ``capability`` (read here, not through the
    package's own check, so a wrong answer there fails the tests instead of skipping them)."""
    for arch in tk.BUILT_ARCHS:
        match = re.fullmatch(r"(\d+)(\d)([af]?)(\+PTX)?", arch)
        if match is None:
            continue
        target = int(match.group(1)), int(match.group(2))
        if match.group(3) == "a" and target == capability:
            return True
        if match.group(3) != "a" and target[0] == capability[0] and target[1] <= capability[1]:
            return True
        if match.group(4) and target <= capability:
            return True
    return False


def require_family_gpu(family):
    """Skips only where the sm_80 kernels of op ``family`` cannot be expected: no CUDA GPU, one
    older than sm_80, or a build without the family or without code for this GPU. (Anywhere else
    a call that misses the kernel is a failure.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    capability = torch.cuda.get_device_capability()
    if capability < (8, 0):
        pytest.skip(f"the {family} kernel needs sm_80 or newer, this GPU is sm_{capability[0]}{capability[1]}")
    if family not in tk.BUILT_OPS:
        pytest.skip(f"the {family} family was not compiled into this build ({tk.build_summary()})")
    if not build_runs_on(capability):
        pytest.skip(f"this build has no code for sm_{capability[0]}{capability[1]} ({tk.build_summary()})")


def require_kernel_op(family, op_name, probe):
    """Skips the op-level tests of ``torch.ops.tk.<op_name>`` without a GPU of sm_80 or newer, or
    where ``probe()`` (a tiny call of the op) says the family was not compiled."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the kernel needs sm_80 or newer")
    if not hasattr(torch.ops.tk, op_name):
        pytest.skip(f"this build has no tk::{op_name} schema")
    try:
        probe()
    except RuntimeError as error:
        if "not compiled" in str(error):
            pytest.skip(f"{family} family not built: {error}")
        raise


@contextlib.contextmanager
def kernel_standins(monkeypatch, family, standins):
    """``standins`` ({op name: callable}) as the CPU implementations of torch.ops.tk.<op name>,
    with the package believing that a build with ``family`` and sm_90a code runs on an sm_90 GPU
    (whatever this build's targets): CPU tests reach the kernel path and see what it hands the
    ops. Undone on exit."""
    from conftest import pretend_gpu, pretend_sm90_build

    library = torch.library.Library("tk", "IMPL")
    for op_name, standin in standins.items():
        library.impl(op_name, standin, "CPU")
    pretend_sm90_build(monkeypatch, family)
    pretend_gpu(monkeypatch, (9, 0))
    try:
        yield
    finally:
        library._destroy()
        torch._dynamo.reset()


@contextlib.contextmanager
def kernel_standin(monkeypatch, op_name, family, standin):
    """kernel_standins for one op; yields ``standin``."""
    with kernel_standins(monkeypatch, family, {op_name: standin}):
        yield standin


def seeded(*key):
    torch.manual_seed(zlib.crc32(repr(key).encode()))


# ---- error measures ------------------------------------------------------------------------------


def max_error(x, ref):
    return (x.double() - ref).abs().max().item()


def rel_l2_error(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def assert_within_torch_error(ours, theirs, ref, what, factor, slack):
    """``ours`` against float64 ``ref``, within ``factor`` x the error of ``theirs`` (PyTorch in the
    input dtype) plus ``slack`` (times max |ref| for the max error), in max and relative L2 error."""
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    assert torch.isfinite(ours).all(), f"{what}: non-finite values"
    magnitude = ref.abs().max().item()
    mine, torch_err = max_error(ours, ref), max_error(theirs, ref)
    assert mine <= factor * torch_err + slack * magnitude, (
        f"{what}: max error {mine:.3e} > {factor} x PyTorch's {torch_err:.3e} (max |ref| {magnitude:.3e})")
    mine, torch_err = rel_l2_error(ours, ref), rel_l2_error(theirs, ref)
    assert mine <= factor * torch_err + slack, (
        f"{what}: relative L2 error {mine:.3e} > {factor} x PyTorch's {torch_err:.3e}")


# ---- Based ---------------------------------------------------------------------------------------

BASED_FEATURES = 16
BASED_STATE_ROWS = 1 + BASED_FEATURES + BASED_FEATURES * BASED_FEATURES  # 273
BASED_SCALE = BASED_FEATURES**-0.5


def feature_map(x, scale):
    """phi(x) = [1, sqrt(scale) x, (scale / sqrt(2)) vec(x x^T)] in x's dtype (273 features)."""
    quad = (x[..., :, None] * x[..., None, :]).flatten(-2)
    return torch.cat([torch.ones_like(x[..., :1]), math.sqrt(scale) * x, scale / math.sqrt(2) * quad], -1)


def with_ones(v):
    return torch.cat([v, torch.ones_like(v[..., :1])], -1)


def based_reference(q, k, v, scale=BASED_SCALE, normalize=False, eps=1e-6, initial_state=None, want_state=True):
    """float64 quadratic form (differentiable): o_i = sum_{j<=i} p(s_ij) v_j (+ phi(q_i)^T S0),
    optionally over sum_j p(s_ij) (+ phi(q_i) . z0) + eps; the final state
    S0 + sum_j phi(k_j) [v_j, 1]^T."""
    q, k, v = q.double(), k.double(), v.double()
    s = scale * (q @ k.transpose(-1, -2))
    p = (1 + s + s * s / 2).tril()
    numerator, denominator = p @ v, p.sum(-1)
    state = feature_map(k, scale).transpose(-1, -2) @ with_ones(v) if want_state else None
    if initial_state is not None:
        s0 = initial_state.double()
        phi_q = feature_map(q, scale)
        numerator = numerator + phi_q @ s0[..., :-1]
        denominator = denominator + (phi_q @ s0[..., -1:])[..., 0]
        state = state + s0 if want_state else None
    out = numerator / (denominator + eps)[..., None] if normalize else numerator
    return out, state


def based_in_dtype(q, k, v, scale=BASED_SCALE, normalize=False, eps=1e-6, initial_state=None):
    """The same math as PyTorch computes it in the inputs' dtype (the output's yardstick)."""
    s = (q @ k.transpose(-1, -2)) * scale
    p = (1 + s + s * s / 2).tril()
    out = p @ v
    denominator = p.sum(-1)
    if initial_state is not None:
        phi_q = feature_map(q, scale)
        s0 = initial_state.to(q.dtype)
        out = out + phi_q @ s0[..., :-1]
        denominator = denominator + (phi_q @ s0[..., -1:])[..., 0]
    return out / (denominator + eps)[..., None] if normalize else out


def based_state_in_dtype(k, v, scale=BASED_SCALE, initial_state=None):
    """phi(k) built in the inputs' dtype, accumulated in fp32 (the state's yardstick)."""
    state = feature_map(k, scale).float().transpose(-1, -2) @ with_ones(v.float())
    return state + initial_state if initial_state is not None else state


def based_state_from_prefix(batch, heads, value_dim, scale=BASED_SCALE, length=300, v_mean=0.0):
    """A state as a sequence leaves it (its quadratic block symmetric), in fp32."""
    k = torch.randn(batch, heads, length, BASED_FEATURES, device="cuda", dtype=torch.float64)
    v = torch.randn(batch, heads, length, value_dim, device="cuda", dtype=torch.float64) + v_mean
    return (feature_map(k, scale).transpose(-1, -2) @ with_ones(v)).float()


def based_batch_heads_for(length):
    """Enough (batch, head) pairs to exercise the grid, few enough for the quadratic reference."""
    return (2, 3) if length <= 1000 else (1, 2)


# ---- FFT convolution -----------------------------------------------------------------------------


def kernel_length(n):
    """The fftconv kernel a length-n call runs: the next power of two, at least 256."""
    return max(256, 1 << (n - 1).bit_length())


def make_filter(heads, length, dtype=torch.float32):
    """Hyena-like filters: noise under an exponential decay."""
    decay = torch.exp(-torch.arange(length, device="cuda") / max(1.0, length / 8))
    return (torch.randn(heads, length, device="cuda") * decay).to(dtype)


def make_gates(shape, dtype, gates):
    """(pregate, postgate) for ``gates`` one of "none", "pre", "post", "both"."""
    pre = torch.randn(shape, device="cuda", dtype=dtype) if gates in ("pre", "both") else None
    post = torch.randn(shape, device="cuda", dtype=dtype) if gates in ("post", "both") else None
    return pre, post


def fftconv_inputs(batch, heads, n, dtype, gates="none", filter_length=None, filter_dtype=torch.float32):
    """(u, k, pregate, postgate): u (batch, heads, n) from torch.randn, a make_filter of
    ``filter_length`` (default n) per head, and make_gates(u.shape, dtype, gates)."""
    u = torch.randn(batch, heads, n, device="cuda", dtype=dtype)
    k = make_filter(heads, n if filter_length is None else filter_length, filter_dtype)
    pre, post = make_gates(u.shape, dtype, gates)
    return u, k, pre, post


def fftconv_reference(u, k, pregate=None, postgate=None):
    """float64 causal convolution y[t] = sum_{s <= t} u[s] k[t - s] (times the gates), by FFT of
    length 2N, in chunks of heads to bound memory; differentiable."""
    n = u.shape[-1]
    fft_size = 2 * n
    step = max(1, (1 << 24) // (u.shape[0] * fft_size))
    pieces = []
    for h0 in range(0, u.shape[1], step):
        h1 = min(h0 + step, u.shape[1])
        x = u[:, h0:h1].double()
        if pregate is not None:
            x = x * pregate[:, h0:h1].double()
        y = torch.fft.irfft(torch.fft.rfft(x, n=fft_size) * torch.fft.rfft(k[h0:h1].double(), n=fft_size),
                            n=fft_size)[..., :n]
        if postgate is not None:
            y = y * postgate[:, h0:h1].double()
        pieces.append(y)
    return torch.cat(pieces, 1)
