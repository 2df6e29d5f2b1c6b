"""CPU stand-ins of the Based and FFT-conv kernel ops, for the differential suite's CPU profile:
the ops' contracts (what they accept, what they return) in float64, rounded as the ops round
their outputs, so the properties reach the kernel path's Python side on a machine without a GPU
(path choice, operand preparation, padding and blocks, the autograd formulas, strict mode).

``kernel_stand_ins(monkeypatch, family)`` registers them on a pretended sm_90 GPU with a build
that has ``family`` (gpu_support.kernel_standins) and yields a StandIns whose ``calls`` lists
the forward ops' calls; ``environment(family)`` is the differential Environment that goes with
it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from thunderkittens import _scaffold
from thunderkittens._based import reference as based_reference
from thunderkittens._based.autograd import CHUNK as DENOMINATOR_BLOCK

from .environment import Environment

KERNEL_DTYPES = (torch.bfloat16, torch.float16)
FEATURES = 16
OPTIN_BYTES = 232448  # an H100's shared memory per block: every kernel of both families fits


@dataclasses.dataclass
class StandIns:
    calls: list = dataclasses.field(default_factory=list)          # forward ops: (op name, args)
    backward_calls: list = dataclasses.field(default_factory=list)

    # ---- Based ---------------------------------------------------------------------------------

    def based_forward(self, q, k, v, scale, normalize, eps, initial_state, output_final_state):
        for name, t in (("q", q), ("k", k), ("v", v)):
            assert t.dtype in KERNEL_DTYPES and t.dtype == q.dtype, (name, t.dtype)
            assert _scaffold.conforms(t), f"tk::based_fwd stand-in: {name} not readable in place"
        assert q.shape[-1] == FEATURES and v.shape[-1] in (64, 128), (q.shape, v.shape)
        assert initial_state is None or (initial_state.dtype == torch.float32
                                         and initial_state.is_contiguous()), initial_state
        self.calls.append(("based_fwd_sm80", q, k, v))
        state = None if initial_state is None else initial_state.double()
        out, final = based_reference.quadratic(q.double(), k.double(), v.double(), scale, normalize,
                                               eps, state)
        final = final.float() if output_final_state else q.new_empty((0,), dtype=torch.float32)
        return out.to(q.dtype), final

    def based_backward(self, grad_out, q, k, v, scale, initial_state, grad_final_state,
                       grad_initial_state, grad_denominator):
        """tk::based_bwd_sm80's and tk::based_bwd_sm90's contract: based_backward_contract."""
        assert grad_out.dtype == q.dtype and grad_out.shape == v.shape
        self.backward_calls.append(("based_bwd", grad_out, q, k, v))
        return based_backward_contract(grad_out, q, k, v, scale, initial_state, grad_final_state,
                                       grad_initial_state, grad_denominator)

    def _step(self, op, q, k, v, state, scale, normalize, eps):
        assert q.dtype in KERNEL_DTYPES and q.shape[-1] == FEATURES, (q.dtype, q.shape)
        assert state.dtype == torch.float32, state.dtype
        self.calls.append((op, q, k, v))
        out, new_state = based_reference.chunked(q.double(), k.double(), v.double(), scale,
                                                 normalize, eps, state.double())
        return out.to(q.dtype), new_state.float()

    def based_step(self, q, k, v, state, scale, normalize, eps):
        out, new_state = self._step("based_step_sm80", q, k, v, state, scale, normalize, eps)
        return out, new_state.contiguous()

    def based_step_inplace(self, q, k, v, state, scale, normalize, eps):
        assert state.is_contiguous(), state.stride()
        out, new_state = self._step("based_step_inplace_sm80", q, k, v, state, scale, normalize, eps)
        state.copy_(new_state)
        return out

    # ---- FFT conv ------------------------------------------------------------------------------

    def fftconv_forward(self, u, k_spectrum, pregate, postgate, fft_size, conjugate=False):
        n, heads = u.shape[-1], u.shape[1]
        assert u.dtype in KERNEL_DTYPES and n % 8 == 0 and n <= fft_size // 2, (u.dtype, n, fft_size)
        assert k_spectrum.dtype == torch.float32 and k_spectrum.shape == (heads, fft_size // 2 + 1, 2)
        for t in (u, pregate, postgate):
            assert t is None or (t.dtype == u.dtype and t.shape == u.shape and _scaffold.conforms(t))
        self.calls.append(("fftconv_fwd_sm80", u, pregate, postgate, fft_size, conjugate))
        w = u if pregate is None else u * pregate  # the kernel rounds u * pregate to 16 bits
        spectrum = torch.view_as_complex(k_spectrum.double())
        if conjugate:
            spectrum = spectrum.conj_physical()
        y = torch.fft.irfft(torch.fft.rfft(w.double(), n=fft_size) * spectrum, n=fft_size)[..., :n]
        if postgate is not None:
            y = y * postgate.double()
        return y.to(u.dtype)

    def fftconv_filter_grad(self, dy, u, fft_size, dy_gate=None, u_gate=None):
        n = u.shape[-1]
        assert u.dtype in KERNEL_DTYPES and n % 8 == 0 and n <= fft_size // 2
        for t in (dy, dy_gate, u_gate):
            assert t is None or (t.dtype == u.dtype and t.shape == u.shape and _scaffold.conforms(t))
        assert _scaffold.conforms(u)
        self.backward_calls.append(("fftconv_filter_grad_sm80", dy, u, fft_size))
        return fftconv_filter_grad_contract(dy, u, fft_size, dy_gate, u_gate)

    def ops(self, family: str) -> dict:
        if family == "based":
            # One stand-in for both forward families' ops (one contract; auto picks sm90 on the
            # pretended Hopper).
            return {"based_fwd_sm90": self.based_forward, "based_fwd_sm80": self.based_forward,
                    "based_bwd_sm80": self.based_backward, "based_bwd_sm90": self.based_backward,
                    "based_step_sm80": self.based_step,
                    "based_step_inplace_sm80": self.based_step_inplace}
        if family == "fftconv":
            return {"fftconv_fwd_sm80": self.fftconv_forward,
                    "fftconv_filter_grad_sm80": self.fftconv_filter_grad}
        raise ValueError(family)


def fftconv_filter_grad_contract(dy, u, fft_size, dy_gate=None, u_gate=None):
    """tk::fftconv_filter_grad_sm80's result (csrc/registration.cpp), computed in float64 and
    returned in float32: the correlation of dy * dy_gate and u * u_gate summed over the batch, each
    product rounded to 16 bits as the kernel does."""
    n = u.shape[-1]
    dy = dy if dy_gate is None else dy * dy_gate
    u = u if u_gate is None else u * u_gate
    products = (torch.fft.rfft(dy.double(), n=fft_size)
                * torch.fft.rfft(u.double(), n=fft_size).conj_physical())
    return torch.fft.irfft(products.sum(0), n=fft_size)[..., :n].float()


def based_backward_contract(grad_out, q, k, v, scale, initial_state, grad_final_state,
                            grad_initial_state, grad_denominator=None):
    """tk::based_bwd_sm80's outputs, computed in float64 and returned in its dtypes
    (csrc/based/backward_params.h): the gradients of the unnormalised forward; the final state's
    gradient seen through the symmetric part of its value columns; the initial state's gradient
    with a zero last column; with grad_denominator, its terms with the keys of each row's own
    block of DENOMINATOR_BLOCK rows. Written out: autograd does not run inside an op's
    implementation."""
    dv_dim = v.shape[-1]
    q, k, v, g = q.double(), k.double(), v.double(), grad_out.double()
    s = scale * (q @ k.transpose(-1, -2))
    causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    weights = torch.where(causal, 1 + s + s * s / 2, 0.0)
    dp = g @ v.transpose(-1, -2)
    if grad_denominator is not None:
        rows = torch.arange(s.shape[-1], device=s.device) // DENOMINATOR_BLOCK
        same_block = rows[:, None] == rows[None, :]
        dp = dp + torch.where(same_block, grad_denominator.double().unsqueeze(-1), 0.0)
    ds = torch.where(causal, dp * (1 + s), 0.0) * scale
    dq, dk, dv = ds @ k, ds.transpose(-1, -2) @ q, weights.transpose(-1, -2) @ g
    if initial_state is not None:  # o += phi(q) S0
        values = initial_state.double()[..., :dv_dim]
        dq = dq + _feature_map_vjp(q, g @ values.transpose(-1, -2), scale)
    final = None
    if grad_final_state is not None:  # final = S0 + phi(k)^T v
        final = _symmetric(grad_final_state.double()[..., :dv_dim])
        dv = dv + based_reference.feature_map(k, scale) @ final
        dk = dk + _feature_map_vjp(k, v @ final.transpose(-1, -2), scale)
    if grad_initial_state:
        d_state = torch.zeros(*q.shape[:2], based_reference.state_features(FEATURES), dv_dim + 1,
                              dtype=torch.float64)
        d_state[..., :dv_dim] = based_reference.feature_map(q, scale).transpose(-1, -2) @ g
        if final is not None:
            d_state[..., :dv_dim] += final
        d_state = d_state.float()
    else:
        d_state = grad_out.new_empty((0,), dtype=torch.float32)
    dtype = grad_out.dtype
    return dq.to(dtype), dk.to(dtype), dv.to(dtype), d_state


def _symmetric(values):
    """The state-shaped ``values`` with its quadratic block's rows made symmetric."""
    quad = values[..., 1 + FEATURES:, :].unflatten(-2, (FEATURES, FEATURES))
    quad = (quad + quad.transpose(-2, -3)) / 2
    return torch.cat([values[..., :1 + FEATURES, :], quad.flatten(-3, -2)], -2)


def _feature_map_vjp(x, y, scale):
    """J_phi(x_i)^T y_i for every row i: x (..., N, F), y (..., N, 1 + F + F*F)."""
    quad = y[..., 1 + FEATURES:].unflatten(-1, (FEATURES, FEATURES))
    return (math.sqrt(scale) * y[..., 1:1 + FEATURES]
            + scale / math.sqrt(2) * ((quad + quad.transpose(-1, -2)) @ x.unsqueeze(-1)).squeeze(-1))


@contextlib.contextmanager
def kernel_stand_ins(monkeypatch, family: str):
    """The stand-ins of ``family`` ("based" or "fftconv") as its ops' CPU implementations, on a
    pretended sm_90 GPU whose blocks get an H100's shared memory."""
    from gpu_support import kernel_standins
    from thunderkittens._based import plan as based_plan
    from thunderkittens._fftconv import plan as fftconv_plan
    optin = torch.compiler.assume_constant_result(lambda index: OPTIN_BYTES)
    monkeypatch.setattr(based_plan if family == "based" else fftconv_plan, "_shared_memory_optin", optin)
    stand_ins = StandIns()
    with kernel_standins(monkeypatch, family, stand_ins.ops(family)):
        yield stand_ins


def environment(family: str) -> Environment:
    """The CPU as kernel_stand_ins shows it: an sm_90 GPU, a 90a build with ``family``."""
    env = Environment.cpu()
    return dataclasses.replace(env, kernel_device=True, capability=(9, 0),
                               built_archs=env.built_archs + ("90a",),
                               built_ops=env.built_ops | {family})
