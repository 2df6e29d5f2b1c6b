"""FFT convolution: tk.fftconv against torch.fft on the same causal computation, with the copy
bandwidth of the same bytes as the ceiling.

u (B=16, H=1024, N) bf16 from torch.randn, filter k (H, N) fp32, N = 256 .. 16384 (the kernel
lengths); with both gates (pregate, postgate, (B, H, N) bf16) at N = 1024, 4096 and 16384.
Passes and columns:

- "fwd": "tk" is tk.fftconv(u, k, pregate, postgate) under torch.no_grad() in strict mode;
  "tk_cached" is tk.FFTConv(N), which in inference caches the filter's spectrum (the filter of a
  trained model does not change between calls); "torch_fft" is

      y = irfft(rfft(u.float() * pregate, 2N) * rfft(k, 2N), 2N)[..., :N] * postgate  -> bf16

  in fp32; "copy" is a device-to-device copy of the pass's bytes (read + written), the bandwidth
  ceiling. Also TFLOP/s by ThunderKittens' count, 2 * (10 * N * log2(N) * H * B).
- "fwdbwd": y = f(u, k, pregate, postgate); y.backward(grad) with u, k and the gates requiring
  grad, ours in strict mode against torch.fft's autograd of the formula above.

The table and plot show GB/s: the (B, H, N) bf16 tensors a pass must move at least once,
divided by its time. Forward: u and the gates read, y written. Forward + backward: that, plus
grad_y, u and the gates read and the gradients of u and the gates written (the filter and its
gradient, (H, N), are left out). The speedup over torch.fft is the ratio of times, whatever the
unit. "tk" and "torch_fft" are timed in alternating rounds (timing.interleaved_median_ms), "tk_cached"
and "copy" on their own. Every implementation's answer (y, or all the gradients) is compared with
the same computation in fp32 from the same bf16 inputs ("relative_difference_vs_fp32", relative
L2, the largest over the gradients), so a fast wrong kernel cannot pass unnoticed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import thunderkittens as tk
from thunderkittens import _config

from .report import error_record, relative_difference
from .timing import HEAD_TO_HEAD_MS, interleaved_median_ms, median_ms

# Where the inputs live: a module constant so a CPU smoke run can point it elsewhere.
DEVICE = "cuda"
OURS = "tk"
CACHED = "tk_cached"
REFERENCE = "torch_fft"
COPY = "copy"  # not a peer: the bandwidth ceiling of the pass's bytes
IMPLEMENTATIONS = (OURS, CACHED, REFERENCE, COPY)

BATCH, HEADS = 16, 1024
ELEMENT_BYTES = 2  # bf16 u, gates and y

# Against the fp32 computation: the kernel's model error is 0.8 .. 1.3 bf16 eps (2^-8) of relative
# L2, held to 2 eps by tests/test_fftconv_kernel_gpu.py; the gradients multiply two such results.
MAX_RELATIVE_DIFFERENCE = {"fwd": 1e-2, "fwdbwd": 2e-2}


@dataclass(frozen=True)
class Config:
    batch: int
    heads: int
    length: int
    gated: bool = False

    @property
    def name(self) -> str:
        return f"b{self.batch} h{self.heads} n{self.length}" + (" gated" if self.gated else "")

    @property
    def flops(self) -> float:
        """ThunderKittens' count for the forward: 2 * (10 N log2(N) H B)."""
        return 2.0 * 10 * self.length * math.log2(self.length) * self.heads * self.batch

    def tensors_moved(self, pass_name: str) -> int:
        """How many (B, H, N) tensors the pass reads or writes at least once (see the module doc)."""
        gates = 2 if self.gated else 0
        forward = 2 + gates                # u and the gates read, y written
        backward = 2 + gates + 1 + gates   # grad_y, u and the gates read; their gradients written
        return forward if pass_name == "fwd" else forward + backward

    def bytes_moved(self, pass_name: str) -> int:
        return self.tensors_moved(pass_name) * self.batch * self.heads * self.length * ELEMENT_BYTES


def _cfg(n: int, gated: bool = False) -> Config:
    return Config(BATCH, HEADS, n, gated)


KERNEL_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
GATED = (1024, 4096, 16384)
FWD_CONFIGS = [_cfg(n) for n in KERNEL_LENGTHS] + [_cfg(n, True) for n in GATED]
FWDBWD_CONFIGS = [_cfg(n) for n in KERNEL_LENGTHS] + [_cfg(n, True) for n in GATED]

QUICK_FWD_CONFIGS = [_cfg(1024), _cfg(4096), _cfg(1024, True), _cfg(16384)]
QUICK_FWDBWD_CONFIGS = [_cfg(1024, True)]


def plan(quick: bool = False) -> list[tuple[str, Config]]:
    """The (pass, config) pairs a run measures, in order."""
    fwd, fwdbwd = (QUICK_FWD_CONFIGS, QUICK_FWDBWD_CONFIGS) if quick else (FWD_CONFIGS, FWDBWD_CONFIGS)
    return [("fwd", c) for c in fwd] + [("fwdbwd", c) for c in fwdbwd]


# ---- implementations -----------------------------------------------------------------------


def torch_fft(u, k, pregate=None, postgate=None, out_dtype: torch.dtype | None = None):
    """The causal convolution in fp32 through torch.fft (FFT length 2N), in u's dtype unless
    ``out_dtype`` says otherwise."""
    n = u.shape[-1]
    w = u.float() if pregate is None else u.float() * pregate.float()
    y = torch.fft.irfft(torch.fft.rfft(w, n=2 * n) * torch.fft.rfft(k.float(), n=2 * n), n=2 * n)[..., :n]
    if postgate is not None:
        y = y * postgate.float()
    return y.to(out_dtype or u.dtype)


def _ours(n: int) -> Callable:
    return lambda u, k, pregate, postgate: tk.fftconv(u, k, pregate, postgate)


def _cached(n: int) -> Callable:
    module = tk.FFTConv(n)
    return lambda u, k, pregate, postgate: module(u, k, pregate, postgate)


def _reference(n: int) -> Callable:
    return torch_fft


CALLS: dict[str, Callable[[int], Callable]] = {OURS: _ours, CACHED: _cached, REFERENCE: _reference}


def _context(name: str, pass_name: str) -> contextlib.AbstractContextManager:
    """Strict mode around ours (a fallback raises, shown as '-'); no autograd for the forward."""
    stack = contextlib.ExitStack()
    if name.startswith(OURS):
        stack.enter_context(tk.strict())
    stack.enter_context(torch.no_grad() if pass_name == "fwd" else torch.enable_grad())
    return stack


def _pass_callable(name: str, pass_name: str, inputs: tuple, grad: torch.Tensor | None):
    """The pass as one callable (entering the contexts at every call); it returns y (fwd) or the
    gradients of u, k and the gates given (fwdbwd)."""
    call = CALLS[name](inputs[0].shape[-1])
    if pass_name == "fwd":
        def forward():
            with _context(name, pass_name):
                return call(*inputs)
        return forward
    leaves = tuple(None if t is None else t.detach().requires_grad_() for t in inputs)

    def forward_backward():
        for t in leaves:
            if t is not None:
                t.grad = None  # fresh gradients each call: no accumulation kernels timed
        with _context(name, pass_name):
            call(*leaves).backward(grad)
        return tuple(t.grad for t in leaves if t is not None)
    return forward_backward


def _fp32_expected(pass_name: str, inputs: tuple, grad: torch.Tensor | None):
    """y, or the gradients of every input given, of the fp32 computation (unrounded)."""
    leaves = tuple(None if t is None else t.detach().float().requires_grad_(pass_name == "fwdbwd")
                   for t in inputs)
    with torch.no_grad() if pass_name == "fwd" else torch.enable_grad():
        y = torch_fft(*leaves, out_dtype=torch.float32)
        if pass_name == "fwd":
            return y
        y.backward(grad.float())
    return tuple(t.grad for t in leaves if t is not None)


def _timing(ms: float, pass_name: str, cfg: Config) -> dict:
    timing = {"ms": ms, "gbps": cfg.bytes_moved(pass_name) / (ms * 1e-3) / 1e9}
    if pass_name == "fwd":
        timing["tflops"] = cfg.flops / (ms * 1e-3) / 1e12
    return timing


def _timing_budget(quick: bool, head_to_head: bool = False) -> dict:
    if quick:
        return {"measure_ms": 60, "min_reps": 5}
    return {"measure_ms": HEAD_TO_HEAD_MS if head_to_head else 200, "min_reps": 10}


# ---- running -------------------------------------------------------------------------------


def _measure_config(pass_name: str, cfg: Config, dtype: torch.dtype, quick: bool) -> dict:
    torch.manual_seed(0)
    shape = (cfg.batch, cfg.heads, cfg.length)
    u = torch.randn(shape, device=DEVICE, dtype=dtype)
    k = torch.randn(cfg.heads, cfg.length, device=DEVICE)
    pregate = torch.randn(shape, device=DEVICE, dtype=dtype) if cfg.gated else None
    postgate = torch.randn(shape, device=DEVICE, dtype=dtype) if cfg.gated else None
    inputs = (u, k, pregate, postgate)
    grad = torch.randn(shape, device=DEVICE, dtype=dtype) if pass_name == "fwdbwd" else None
    with _context(OURS, pass_name):
        path = str(tk.explain_fftconv(*inputs))

    results: dict[str, dict] = {}
    if pass_name != "fwd":
        results[CACHED] = {"skipped": "inference only: the spectrum is cached without gradients"}
    want = _fp32_expected(pass_name, inputs, grad)
    fns, differences = {}, {}
    for name in CALLS:
        if name in results:
            continue
        try:
            fn = _pass_callable(name, pass_name, inputs, grad)
            differences[name] = relative_difference(fn(), want)  # also the first call (caches)
        except Exception as error:  # noqa: BLE001 - a fallback in strict mode: reported, not fatal
            torch.cuda.synchronize()
            results[name] = error_record(error)
            continue
        fns[name] = fn
    del want
    torch.cuda.empty_cache()

    # Ours against torch.fft head to head; the cached module on its own (same kernel, no spectrum).
    pair = {name: fns[name] for name in (OURS, REFERENCE) if name in fns}
    times = dict(interleaved_median_ms(pair, **_timing_budget(quick, head_to_head=True)))
    if CACHED in fns:
        try:
            times[CACHED] = median_ms(fns[CACHED], **_timing_budget(quick))
        except Exception as error:  # noqa: BLE001
            times[CACHED] = error
    # The copy ceiling: the pass's bytes, half read and half written.
    source = torch.empty(cfg.bytes_moved(pass_name) // 2, device=DEVICE, dtype=torch.uint8)
    target = torch.empty_like(source)
    times[COPY] = median_ms(lambda: target.copy_(source), **_timing_budget(quick))
    del source, target
    for name, ms in times.items():
        results[name] = error_record(ms) if isinstance(ms, Exception) else _timing(ms, pass_name, cfg)
    results[COPY].pop("tflops", None)
    results = {name: results[name] for name in IMPLEMENTATIONS if name in results}
    return _record(pass_name, cfg, dtype, results, path, differences)


def run(kernel: str = "auto", quick: bool = False, dtype: torch.dtype = torch.bfloat16,
        log=print) -> tuple[list[dict], list[str]]:
    """Measure every (pass, config); returns (records, implementation names in column order).
    ``kernel``: an fftconv family to force for ours (e.g. "sm90", the wgmma kernels), or "auto";
    a family of another op only is ignored."""
    records = []
    families = _config.KNOWN_KERNELS["fftconv"]
    forced = tk.use_kernel(kernel, op="fftconv") if kernel in families else contextlib.nullcontext()
    with forced:
        for pass_name, cfg in plan(quick):
            records.append(_measure_config(pass_name, cfg, dtype, quick))
            torch.cuda.empty_cache()
            log(_progress_line(records[-1]))
    return records, list(IMPLEMENTATIONS)


def _record(pass_name: str, cfg: Config, dtype: torch.dtype, results: dict, path: str,
            differences: dict) -> dict:
    ours, reference, copy = (results.get(name, {}).get("gbps") for name in (OURS, REFERENCE, COPY))
    speedup = ours / reference if ours and reference else None
    return {
        "op": "fftconv", "pass": pass_name, "config_name": cfg.name, "config": asdict(cfg),
        "dtype": str(dtype).removeprefix("torch."), "metric": "gbps",
        "flops": cfg.flops if pass_name == "fwd" else None, "bytes": cfg.bytes_moved(pass_name),
        "results": results, "tk_path": path, "relative_difference_vs_fp32": differences,
        "fraction_of_copy": ours / copy if ours and copy else None,
        "best_peer": REFERENCE if reference else None,
        "ratio_vs_reference": speedup, "ratio_vs_best_peer": speedup,
    }


def _progress_line(record: dict) -> str:
    cells = [f"{name}={r['gbps']:.0f}" if "gbps" in r else f"{name}=-" for name, r in record["results"].items()]
    line = f"  {record['pass']} {record['config_name']}: " + " ".join(cells) + " GB/s"
    ours = record["results"].get(OURS, {})
    if "ms" in ours:
        line += f"  (tk {ours['ms']:.3f} ms"
        if "tflops" in ours:
            line += f", {ours['tflops']:.0f} TFLOP/s"
        if record["ratio_vs_reference"] is not None:
            line += f", {record['ratio_vs_reference']:.2f}x torch.fft"
        if record["fraction_of_copy"] is not None:
            line += f", {record['fraction_of_copy']:.0%} of copy"
        line += ")"
    if "error" in ours:
        line += f"  [{OURS} failed: {ours['error']}]"
    limit = MAX_RELATIVE_DIFFERENCE[record["pass"]]
    for name, difference in record["relative_difference_vs_fp32"].items():
        if difference > limit:
            line += f"  [WRONG: {name} relative difference to fp32 {difference:.2e}]"
    return line
