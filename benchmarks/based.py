"""Based linear attention: tk.based against flash-linear-attention's Triton kernels and a PyTorch
quadratic form; forward, forward + backward, and the decoding step tk.based_step.

Causal and unnormalised (normalize=False; fla's kernels get use_norm=False), feature dim 16,
scale 1/4, bf16 inputs from torch.randn, B=16 H=16, value dims 64 and 128: the setting of the
published Based figures (docs/performance.md). Passes and columns:

- "fwd": tk.based under torch.no_grad() in strict mode (a fallback to the PyTorch reference
  raises and shows as '-'), and "tk_sm80", the same with the mma.sync family forced (what an
  A100 or RTX 4090 runs; on Hopper "tk" is the wgmma family); "fla_parallel" (fla.ops.based.parallel_based) and
  "fla_fused_chunk" (fla.ops.based.fused_chunk_based), measured when flash-linear-attention is
  importable (else '-' with the import error in the JSON); "torch_quadratic", the N x N form in
  fp32 on fp32 copies of the inputs, up to N = QUADRATIC_MAX_N (its memory is quadratic).
  TFLOP/s by ThunderKittens' count, 2*B*N*H*E + 4*B*N*H*Dv*E with E = 273 features.
- "fwdbwd": o = f(q, k, v); o.backward(grad) with q, k, v requiring grad. Ours is tk.based as a
  training step calls it, in strict mode: the forward kernel with the backward kernels as its
  autograd formula (the record's "tk_path", tk.explain_based, names both); fla's two kernels
  with their own backward; "torch_chunked", the package's chunked PyTorch reference in fp32 on
  fp32 copies with its autograd (what tk.based runs where the kernels do not), up to
  N = CHUNKED_MAX_N (slow). TFLOP/s count FWDBWD_FLOP_FACTOR times the forward.
- "step": tk.based_step, T tokens (T <= 4: one pass) against a (B, H, 273, Dv + 1) fp32 state
  updated in place: GB/s of state traffic (the state read and written once per step). Ours in
  strict mode (the kernel), "torch_ops" (the same step by PyTorch ops, tk.based_step's fallback
  path) and "copy", a device-to-device copy of the same bytes (the ceiling), all in the same
  run; ours and the copy head to head. Each cycles through as many states (copy buffers) as
  make more than twice the L2 cache, so the state comes from HBM as in decoding with a state
  per layer; "fraction_of_copy" is ours / copy.

fla takes (B, T, H, K) tensors and transposes them to (B, H, T, K) inside; it gets transposed
views of the same contiguous (B, H, N, K) tensors ours reads, so neither side copies. Each
(pass, config) is first swept (every implementation timed one after the other), then ours and
the sweep's fastest peer are timed again in alternating rounds (timing.interleaved_median_ms)
and those two times are recorded, the sweep's kept as "sweep_ms" (as in attention.py). Every
implementation's answer (o, or the gradients of q, k and v) is compared with an fp32 chunked
reference computed from the same bf16 inputs ("relative_difference_vs_fp32", relative L2, the
largest over the gradients), so a fast wrong kernel cannot pass unnoticed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import thunderkittens as tk
from thunderkittens._based import reference
from thunderkittens._based.step import reference_step

from .report import error_record, relative_difference
from .timing import HEAD_TO_HEAD_MS, interleaved_median_ms, median_ms

# Where the inputs live: a module constant so a CPU smoke run can point it elsewhere.
DEVICE = "cuda"
OURS = "tk"
OURS_MMA_SYNC = "tk_sm80"  # ours, the mma.sync family forced (not a peer: names starting with OURS)
REFERENCE = "fla_parallel"  # flash-linear-attention's quadratic Triton kernel, the Based kernel users have
COPY = "copy"               # not a peer: the bandwidth ceiling of the step's bytes
TORCH_OPS = "torch_ops"     # the step by PyTorch ops (tk.based_step's fallback path)

FEATURE_DIM = 16
STATE_FEATURES = 1 + FEATURE_DIM + FEATURE_DIM * FEATURE_DIM  # E = 273
SCALE = FEATURE_DIM ** -0.5
QUADRATIC_MAX_N = 4096  # N x N fp32 scores and weights: 2 x 17 GB at N = 4096, B = H = 16
CHUNKED_MAX_N = 4096    # the chunked reference's forward + backward: about 60 ms at N = 4096
# The backward does twice the forward's state products (dq from the state; dk and dv from the
# gradient's state, and that state's update), so forward + backward counts 3 forwards.
FWDBWD_FLOP_FACTOR = 3.0
PASSES = {"fwd": 1.0, "fwdbwd": FWDBWD_FLOP_FACTOR}

# Ours against the fp32 reference: bf16 inputs and output rounding put a correct kernel near 5e-3
# (tests/test_based_kernel_gpu.py holds it to 2x PyTorch's own bf16 error); beyond this, a bug.
MAX_RELATIVE_DIFFERENCE = 2e-2


@dataclass(frozen=True)
class Config:
    batch: int
    heads: int
    length: int
    value_dim: int

    @property
    def name(self) -> str:
        return f"b{self.batch} h{self.heads} n{self.length} dv{self.value_dim}"

    @property
    def forward_flops(self) -> float:
        tokens = self.batch * self.heads * self.length
        return 2.0 * tokens * STATE_FEATURES + 4.0 * tokens * self.value_dim * STATE_FEATURES


@dataclass(frozen=True)
class StepConfig:
    batch: int
    heads: int
    value_dim: int
    tokens: int = 1

    @property
    def name(self) -> str:
        return f"b{self.batch} h{self.heads} dv{self.value_dim} t{self.tokens}"

    @property
    def state_bytes(self) -> int:
        return self.batch * self.heads * STATE_FEATURES * (self.value_dim + 1) * 4  # fp32

    @property
    def bytes_moved(self) -> int:
        return 2 * self.state_bytes  # read and written once per step


def _cfg(n: int, dv: int = 64) -> Config:
    return Config(16, 16, n, dv)


LENGTHS = (1024, 2048, 4096, 8192, 16384)
FWD_CONFIGS = [_cfg(n) for n in LENGTHS] + [_cfg(n, 128) for n in (1024, 4096, 16384)]
FWDBWD_CONFIGS = [_cfg(n) for n in LENGTHS] + [_cfg(4096, 128)]
STEP_CONFIGS = [StepConfig(16, 16, 64), StepConfig(16, 16, 128), StepConfig(16, 16, 64, tokens=4),
                StepConfig(1, 16, 64), StepConfig(64, 16, 128)]

QUICK_FWD_CONFIGS = [_cfg(1024), _cfg(4096)]
QUICK_FWDBWD_CONFIGS = [_cfg(2048)]
QUICK_STEP_CONFIGS = [StepConfig(16, 16, 64)]


def plan(quick: bool = False) -> list[tuple[str, Config | StepConfig]]:
    """The (pass, config) pairs a run measures, in order."""
    if quick:
        fwd, fwdbwd, step = QUICK_FWD_CONFIGS, QUICK_FWDBWD_CONFIGS, QUICK_STEP_CONFIGS
    else:
        fwd, fwdbwd, step = FWD_CONFIGS, FWDBWD_CONFIGS, STEP_CONFIGS
    return ([("fwd", c) for c in fwd] + [("fwdbwd", c) for c in fwdbwd] + [("step", c) for c in step])


# ---- implementations -----------------------------------------------------------------------
# Each maps (q, k, v) in (B, H, N, D) to o (B, H, N, Dv); `prepare` makes its own inputs from the
# bf16 ones outside the timed region; `context(pass)` is entered around every call.


@dataclass(frozen=True)
class Impl:
    call: Callable[..., torch.Tensor]
    context: Callable[[str], contextlib.AbstractContextManager] = lambda pass_name: contextlib.nullcontext()
    prepare: Callable[[tuple], tuple] = lambda inputs: inputs
    skip: Callable[[str, Config], str | None] = lambda pass_name, cfg: None  # why not run, or None


def _ours_context(pass_name: str) -> contextlib.AbstractContextManager:
    # Strict mode: a fallback raises (shown as '-'), never times the reference as ours.
    return tk.strict(pass_name in ("fwd", "fwdbwd"))


def _mma_sync_context(pass_name: str) -> contextlib.AbstractContextManager:
    """Ours with the mma.sync (sm80) family forced: what A100 / RTX 4090 users get, on Hopper."""
    stack = contextlib.ExitStack()
    stack.enter_context(_ours_context(pass_name))
    stack.enter_context(tk.use_kernel("sm80", "based"))
    return stack


def _quadratic(q, k, v):
    """o = (tril(1 + s + s^2 / 2)) @ v with s = scale * q k^T, in the inputs' dtype (fp32)."""
    s = (q @ k.transpose(-1, -2)).mul_(SCALE)
    weights = s.square().mul_(0.5).add_(s).add_(1.0).tril_()
    del s
    return weights @ v


def _fla_peers() -> tuple[dict[str, Impl], str | None]:
    """fla's two kernels if flash-linear-attention imports, else ({}, the import error)."""
    try:
        from fla.ops.based import fused_chunk_based, parallel_based
    except Exception as error:  # noqa: BLE001 - ImportError, or a missing dependency of fla's
        return {}, f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"

    def blhd(*tensors):
        return tuple(t.transpose(1, 2) for t in tensors)  # views; fla transposes them back

    def parallel(q, k, v):
        return parallel_based(*blhd(q, k, v), scale=SCALE, use_norm=False).transpose(1, 2)

    def fused_chunk(q, k, v):
        return fused_chunk_based(*blhd(q, k, v), scale=SCALE, use_norm=False).transpose(1, 2)

    return {"fla_parallel": Impl(parallel), "fla_fused_chunk": Impl(fused_chunk)}, None


def _skip_quadratic(pass_name: str, cfg: Config) -> str | None:
    if pass_name != "fwd":
        return "forward only"
    if cfg.length > QUADRATIC_MAX_N:
        return f"not run beyond N={QUADRATIC_MAX_N} (memory quadratic in N)"
    return None


def _chunked(q, k, v):
    """The package's chunked PyTorch reference (tk.based's fallback) on fp32 inputs."""
    return reference.chunked(q, k, v, SCALE)[0]


def _skip_chunked(pass_name: str, cfg: Config) -> str | None:
    if pass_name != "fwdbwd":
        return "forward + backward only"
    if cfg.length > CHUNKED_MAX_N:
        return f"not run beyond N={CHUNKED_MAX_N} (slow)"
    return None


def implementations() -> tuple[dict[str, Impl], str | None]:
    """The implementations in column order, and fla's import error (None when it imported)."""
    fla, fla_error = _fla_peers()
    impls = {OURS: Impl(lambda q, k, v: tk.based(q, k, v), context=_ours_context),
             OURS_MMA_SYNC: Impl(lambda q, k, v: tk.based(q, k, v), context=_mma_sync_context)}
    if fla:
        impls.update(fla)
    impls["torch_quadratic"] = Impl(_quadratic, prepare=lambda inputs: tuple(t.float() for t in inputs),
                                    skip=_skip_quadratic)
    impls["torch_chunked"] = Impl(_chunked, prepare=lambda inputs: tuple(t.float() for t in inputs),
                                  skip=_skip_chunked)
    return impls, fla_error


FLA_NAMES = ("fla_parallel", "fla_fused_chunk")


def _columns(impls: dict[str, Impl]) -> list[str]:
    """Column order: ours, fla's two (shown as '-' when fla is not importable), then the rest."""
    names = [name for name in impls if name not in FLA_NAMES]
    return names[:1] + list(FLA_NAMES) + names[1:]


# ---- passes --------------------------------------------------------------------------------


def _autograd(pass_name: str) -> contextlib.AbstractContextManager:
    return torch.no_grad() if pass_name == "fwd" else torch.enable_grad()


def _pass_callable(impl: Impl, pass_name: str, inputs: tuple, grad: torch.Tensor | None):
    """The pass as one callable that enters the implementation's contexts at every call, so that
    two implementations can be timed in alternating rounds. It returns o (fwd) or the gradients
    of q, k and v (fwdbwd)."""
    if pass_name == "fwd":
        def forward():
            with impl.context(pass_name), _autograd(pass_name):
                return impl.call(*inputs)
        return forward
    leaves = tuple(t.detach().requires_grad_() for t in inputs)
    grad = grad.to(leaves[2].dtype)

    def forward_backward():
        for t in leaves:
            t.grad = None  # fresh gradients each call: no accumulation kernels timed
        with impl.context(pass_name), _autograd(pass_name):
            impl.call(*leaves).backward(grad)
        return tuple(t.grad for t in leaves)
    return forward_backward


def _fp32_reference(pass_name: str, inputs: tuple, grad: torch.Tensor | None):
    """o, or the gradients of q, k, v, by the chunked PyTorch reference in fp32 from the same
    bf16 inputs."""
    leaves = tuple(t.detach().float().requires_grad_(pass_name == "fwdbwd") for t in inputs)
    with _autograd(pass_name):
        out, _ = reference.chunked(*leaves, SCALE)
        if pass_name == "fwd":
            return out
        out.backward(grad.float())
    return tuple(t.grad for t in leaves)


def _timing(ms: float, pass_name: str, cfg: Config) -> dict:
    return {"ms": ms, "tflops": cfg.forward_flops * PASSES[pass_name] / (ms * 1e-3) / 1e12}


def _timing_budget(quick: bool, head_to_head: bool = False) -> dict:
    if quick:
        return {"measure_ms": 60, "min_reps": 5}
    return {"measure_ms": HEAD_TO_HEAD_MS if head_to_head else 200, "min_reps": 10}


def _best_peer(results: dict) -> str | None:
    peers = {name: r["tflops"] for name, r in results.items()
             if not name.startswith(OURS) and name != COPY and "tflops" in r}
    return max(peers, key=peers.get) if peers else None


def _measure_config(impls: dict[str, Impl], fla_error: str | None, pass_name: str, cfg: Config,
                    dtype: torch.dtype, quick: bool) -> dict:
    torch.manual_seed(0)
    shape = (cfg.batch, cfg.heads, cfg.length)
    q = torch.randn(*shape, FEATURE_DIM, device=DEVICE, dtype=dtype)
    k = torch.randn(*shape, FEATURE_DIM, device=DEVICE, dtype=dtype)
    v = torch.randn(*shape, cfg.value_dim, device=DEVICE, dtype=dtype)
    grad = torch.randn_like(v) if pass_name == "fwdbwd" else None
    with _ours_context(pass_name), _autograd(pass_name):
        leaves = (q, k, v) if pass_name == "fwd" else tuple(t.detach().requires_grad_() for t in (q, k, v))
        path = str(tk.explain_based(*leaves))

    results: dict[str, dict] = {}
    if fla_error is not None:
        results.update({name: {"error": f"flash-linear-attention not importable: {fla_error}"}
                        for name in FLA_NAMES})
    want = _fp32_reference(pass_name, (q, k, v), grad)
    fns, differences = {}, {}
    for name, impl in impls.items():
        reason = impl.skip(pass_name, cfg)
        if reason is not None:
            results[name] = {"skipped": reason}
            continue
        try:
            fn = _pass_callable(impl, pass_name, impl.prepare((q, k, v)), grad)
            differences[name] = relative_difference(fn(), want)  # also the first (compiling) call
        except Exception as error:  # noqa: BLE001 - a fallback in strict mode, or a peer that cannot run
            torch.cuda.synchronize()
            results[name] = error_record(error)
            continue
        fns[name] = fn
    del want
    torch.cuda.empty_cache()

    for name, fn in fns.items():  # the sweep
        try:
            ms = median_ms(fn, **_timing_budget(quick))
        except Exception as error:  # noqa: BLE001 - e.g. out of memory: reported, not fatal
            torch.cuda.synchronize()
            results[name] = error_record(error)
            continue
        results[name] = _timing(ms, pass_name, cfg)
    best_peer = _best_peer(results)
    if "tflops" in results.get(OURS, {}) and best_peer is not None:
        pair = {name: fns[name] for name in (OURS, best_peer)}
        for name, ms in interleaved_median_ms(pair, **_timing_budget(quick, head_to_head=True)).items():
            if not isinstance(ms, Exception):  # ran in the sweep; on a surprise keep the sweep's time
                results[name] = {**_timing(ms, pass_name, cfg), "sweep_ms": results[name]["ms"]}
    results = {name: results[name] for name in _columns(impls) if name in results}
    return _record(pass_name, cfg, dtype, results, path, differences)


# ---- the decoding step ---------------------------------------------------------------------


def _feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = [1, sqrt(scale) x, scale / sqrt(2) vec(x x^T)] in fp32, written out here so the
    step is checked against something other than the package's own reference."""
    x = x.float()
    outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
    return torch.cat([torch.ones_like(x[..., :1]), math.sqrt(SCALE) * x, SCALE / math.sqrt(2.0) * outer], dim=-1)


def _step_expected(q, k, v, state):
    """(o, new state) in fp32, token by token: S += phi(k_t)^T [v_t, 1], o_t = (phi(q_t) S)[:Dv]."""
    vo = torch.cat([v.float(), torch.ones_like(v[..., :1], dtype=torch.float32)], dim=-1)
    phi_q, phi_k = _feature_map(q), _feature_map(k)
    outs = []
    for t in range(q.shape[2]):
        state = state + phi_k[:, :, t, :, None] * vo[:, :, t, None, :]
        outs.append((phi_q[:, :, t, None, :] @ state)[:, :, 0, :-1])
    return torch.stack(outs, 2), state


def _state_pool(cfg: StepConfig) -> int:
    """How many states (and copy buffers) a step measurement cycles through: together more than
    twice the L2 cache, so every call reads its state from HBM, as decoding does with a state per
    layer (one state, updated again and again, would stay in L2)."""
    l2_bytes = getattr(torch.cuda.get_device_properties(DEVICE), "L2_cache_size", 50 << 20)
    return max(2, -(-2 * l2_bytes // cfg.state_bytes))


def _cycling(fn: Callable[[int], object], count: int) -> Callable[[], object]:
    """fn(0), fn(1), ..., fn(count - 1), fn(0), ... on successive calls."""
    calls = iter(range(1 << 62))
    return lambda: fn(next(calls) % count)


def _measure_step(cfg: StepConfig, dtype: torch.dtype, quick: bool) -> dict:
    torch.manual_seed(0)
    shape = (cfg.batch, cfg.heads, cfg.tokens)
    q = torch.randn(*shape, FEATURE_DIM, device=DEVICE, dtype=dtype)
    k = torch.randn(*shape, FEATURE_DIM, device=DEVICE, dtype=dtype)
    v = torch.randn(*shape, cfg.value_dim, device=DEVICE, dtype=dtype)
    pool = _state_pool(cfg)
    first = torch.randn(cfg.batch, cfg.heads, STATE_FEATURES, cfg.value_dim + 1, device=DEVICE)
    states = [first] + [first.clone() for _ in range(pool - 1)]
    torch_states = [first.clone() for _ in range(pool)]
    sources = [torch.empty(cfg.state_bytes, device=DEVICE, dtype=torch.uint8) for _ in range(pool)]
    targets = [torch.empty_like(source) for source in sources]

    def ours(i):
        with torch.no_grad(), tk.strict():
            return tk.based_step(q, k, v, states[i], inplace=True)

    def torch_ops(i):
        with torch.no_grad():
            return reference_step(q, k, v, torch_states[i], SCALE, False, 1e-6, True)

    with torch.no_grad():
        path = str(tk.explain_based_step(q, k, v, first, inplace=True))
    results, differences = {}, {}
    want_out, want_state = _step_expected(q, k, v, first)
    checked = {}
    for name, fn in ((OURS, ours), (TORCH_OPS, torch_ops)):
        try:
            out, new_state = fn(0)
            differences[name] = max(relative_difference(out, want_out), relative_difference(new_state, want_state))
            checked[name] = _cycling(fn, pool)
        except Exception as error:  # noqa: BLE001 - a fallback in strict mode: reported, not fatal
            torch.cuda.synchronize()
            results[name] = error_record(error)
    del want_out, want_state

    def record(name, ms):
        results[name] = (error_record(ms) if isinstance(ms, Exception) else
                         {"ms": ms, "us": ms * 1e3, "gbps": cfg.bytes_moved / (ms * 1e-3) / 1e9})

    if TORCH_OPS in checked:  # the old path, timed on its own (it is an order of magnitude slower)
        try:
            record(TORCH_OPS, median_ms(checked.pop(TORCH_OPS), **_timing_budget(quick)))
        except Exception as error:  # noqa: BLE001
            torch.cuda.synchronize()
            record(TORCH_OPS, error)
    # Ours and the copy of the same bytes head to head, in alternating rounds.
    pair = {**checked, COPY: _cycling(lambda i: targets[i].copy_(sources[i]), pool)}
    for name, ms in interleaved_median_ms(pair, **_timing_budget(quick, head_to_head=True)).items():
        record(name, ms)
    results = {name: results[name] for name in (OURS, TORCH_OPS, COPY) if name in results}
    ours_gbps = results.get(OURS, {}).get("gbps")
    copy_gbps = results.get(COPY, {}).get("gbps")
    torch_gbps = results.get(TORCH_OPS, {}).get("gbps")
    return {
        "op": "based", "pass": "step", "config_name": cfg.name, "config": asdict(cfg),
        "dtype": str(dtype).removeprefix("torch."), "metric": "gbps", "bytes": cfg.bytes_moved,
        "states_cycled": pool, "results": results, "tk_path": path,
        "relative_difference_vs_fp32": differences,
        "fraction_of_copy": ours_gbps / copy_gbps if ours_gbps and copy_gbps else None,
        "best_peer": TORCH_OPS if torch_gbps else None, "ratio_vs_reference": None,
        "ratio_vs_best_peer": ours_gbps / torch_gbps if ours_gbps and torch_gbps else None,
    }


# ---- running -------------------------------------------------------------------------------


def run(kernel: str = "auto", quick: bool = False, dtype: torch.dtype = torch.bfloat16,
        log=print) -> tuple[list[dict], list[str]]:
    """Measure every (pass, config); returns (records, implementation names in column order).
    ``kernel`` is accepted for the runner's sake: both Based families are columns ("tk", "tk_sm80")."""
    impls, fla_error = implementations()
    if fla_error is not None:
        log(f"  flash-linear-attention not importable ({fla_error}): its columns are '-'")
    records = []
    for pass_name, cfg in plan(quick):
        if pass_name == "step":
            records.append(_measure_step(cfg, dtype, quick))
        else:
            records.append(_measure_config(impls, fla_error, pass_name, cfg, dtype, quick))
        torch.cuda.empty_cache()
        log(_progress_line(records[-1]))
    return records, _columns(impls) + [TORCH_OPS, COPY]


def _record(pass_name: str, cfg: Config, dtype: torch.dtype, results: dict, path: str,
            differences: dict) -> dict:
    ours = results[OURS].get("tflops")
    best_peer = _best_peer(results)
    reference_tflops = results.get(REFERENCE, {}).get("tflops")
    return {
        "op": "based", "pass": pass_name, "config_name": cfg.name, "config": asdict(cfg),
        "dtype": str(dtype).removeprefix("torch."), "metric": "tflops",
        "flops": cfg.forward_flops * PASSES[pass_name], "results": results, "tk_path": path,
        "relative_difference_vs_fp32": differences, "best_peer": best_peer,
        "ratio_vs_reference": ours / reference_tflops if ours and reference_tflops else None,
        "ratio_vs_best_peer": ours / results[best_peer]["tflops"] if ours and best_peer else None,
    }


def _progress_line(record: dict) -> str:
    metric = record["metric"]
    cells = [f"{name}={r[metric]:.0f}" if metric in r else f"{name}=-" for name, r in record["results"].items()]
    line = f"  {record['pass']} {record['config_name']}: " + " ".join(cells)
    line += " GB/s" if metric == "gbps" else " TFLOP/s"
    ours = record["results"].get(OURS, {})
    notes = []
    if "ms" in ours:
        notes.append(f"{OURS} {ours['ms'] * 1e3:.1f} us" if metric == "gbps" else f"{OURS} {ours['ms']:.3f} ms")
    if record.get("fraction_of_copy") is not None:
        notes.append(f"{record['fraction_of_copy']:.0%} of copy")
    if record["ratio_vs_reference"] is not None:
        notes.append(f"{record['ratio_vs_reference']:.2f}x {REFERENCE}")
    if record["pass"] == "step" and record["ratio_vs_best_peer"] is not None:
        notes.append(f"{record['ratio_vs_best_peer']:.1f}x {TORCH_OPS}")
    if notes:
        line += f"  ({', '.join(notes)})"
    if "error" in ours:
        line += f"  [{OURS} failed: {ours['error']}]"
    elif not record["tk_path"].startswith("kernel"):
        line += f"  [{OURS}: {record['tk_path']}]"
    for name, difference in record["relative_difference_vs_fp32"].items():
        if difference > MAX_RELATIVE_DIFFERENCE:
            line += f"  [WRONG: {name} relative difference to fp32 {difference:.2e}]"
    return line
