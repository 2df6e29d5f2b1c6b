"""Checks of bad input shared by test_bad_input.py's CPU tests and its GPU cases (the GPU cases
run in the test worker's case server, differential.worker: a hang or a fault costs one case).

NaN / Inf inputs: one element of query, key, value (or a, b) is NaN, +inf or -inf; the result
must be non-finite exactly where the float64 reference is (NaN exactly where it is NaN, for a
NaN input), or exactly where PyTorch's own function's result is (where that differs from the
reference, PyTorch's answer is the bar a drop-in has to meet). Only placements whose answer
does not depend on how masked positions are skipped: any element of query (full or causal: its
row), of key or of value without a mask (a key every query sees).

Large inputs: more than 2^31 elements, made with expanded views (no memory for the inputs) on
the GPU: the last elements must be as right as the first (no 32-bit index overflow).
"""

from __future__ import annotations

import math

import torch

import thunderkittens as tk

from .tolerance import assert_close

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
LEN_Q, LEN_KV = 37, 45
POISONED_ROW = 30  # a query row that sees 31 keys under causal masking (see poison_attention)


def attention_nonfinite_cases() -> list[tuple[str, str, bool]]:
    """(where, value, causal) placements with one answer on every path."""
    cases = []
    for where in ("query", "key", "value"):
        for value in VALUES:
            for causal in ((False, True) if where == "query" else (False,)):
                cases.append((where, value, causal))
    return cases


def poison_attention(device, dtype, head_dim, where, value, seed=0):
    """q (2, 4, 37, d), k/v (2, 4, 45, d) with one element set to ``value``: in query row 30
    (under causal masking it sees 31 keys, so it cannot happen that every key it sees scores
    -inf, which the paths would answer differently), or key/value row 5."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    q = torch.randn(2, 4, LEN_Q, head_dim, generator=gen, device=device, dtype=dtype)
    k = torch.randn(2, 4, LEN_KV, head_dim, generator=gen, device=device, dtype=dtype)
    v = torch.randn(2, 4, LEN_KV, head_dim, generator=gen, device=device, dtype=dtype)
    target, row = {"query": (q, POISONED_ROW), "key": (k, 5), "value": (v, 5)}[where]
    target[1, 2, row, 3] = VALUES[value]
    return q, k, v


def reference_attention64(q, k, v, causal):
    q64, k64, v64 = q.double(), k.double(), v.double()
    scores = (q64 @ k64.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        visible = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64


def _same_nonfinite(out, ref, value) -> bool:
    if not torch.equal(torch.isfinite(out), torch.isfinite(ref)):
        return False
    return value != "nan" or torch.equal(torch.isnan(out), torch.isnan(ref))


def assert_nonfinite_like(out, ref, theirs, value, what):
    """``out`` non-finite where the float64 ``ref`` is, or else where PyTorch's ``theirs`` is."""
    if _same_nonfinite(out, ref, value) or _same_nonfinite(out, theirs.double(), value):
        return
    wrong = torch.isfinite(out) != torch.isfinite(ref)
    if not wrong.any():
        wrong = torch.isnan(out) != torch.isnan(ref)
    index = tuple(wrong.nonzero()[0].tolist())
    raise AssertionError(f"{what}: {int(wrong.sum())} of {out.numel()} elements differ in being "
                         f"finite (or NaN) from the float64 reference, and the result is not "
                         f"PyTorch's either (first at {index}: ours {out[index].item()}, "
                         f"reference {ref[index].item()}, PyTorch {theirs[index].item()})")


def check_attention_nonfinite(device, dtype, head_dim, where, value, causal, kernel="auto") -> str:
    """Runs the case; returns tk.explain's line (the path it took)."""
    q, k, v = poison_attention(device, dtype, head_dim, where, value)
    with tk.use_kernel(kernel):
        plan = tk.explain(q, k, v, is_causal=causal)
        out = tk.attention(q, k, v, is_causal=causal)
    if out.is_cuda:
        torch.cuda.synchronize(out.device)
    ref = reference_attention64(q, k, v, causal)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert_nonfinite_like(out.double(), ref, theirs, value, f"{where}={value} causal={causal} [{plan}]")
    return str(plan)


def poison_matmul(device, dtype, where, value, m=64, k=40, n=48, seed=0):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device=device, dtype=dtype)
    b = torch.randn(k, n, generator=gen, device=device, dtype=dtype)
    (a if where == "a" else b)[5, 3] = VALUES[value]
    return a, b


def check_matmul_nonfinite(device, dtype, where, value, m=64, k=40, n=48) -> str:
    a, b = poison_matmul(device, dtype, where, value, m, k, n)
    plan = tk.explain_matmul(a, b)
    out = tk.matmul(a, b)
    if out.is_cuda:
        torch.cuda.synchronize(out.device)
    ref = a.double() @ b.double()
    assert_nonfinite_like(out.double(), ref, torch.matmul(a, b), value, f"{where}={value} [{plan}]")
    return str(plan)


# ---- GPU cases (the case server) --------------------------------------------------------------

# (dtype, head dim, kernel choice): sm90 (auto on Hopper), sm80 (forced), fallbacks.
ATTENTION_PATHS = [("bf16", 64, "auto"), ("fp16", 128, "auto"), ("bf16", 96, "auto"),
                   ("bf16", 64, "sm80"), ("fp16", 128, "sm80"), ("fp32", 64, "auto"),
                   ("bf16", 80, "auto")]
# (dtype, M, K, N): the kernel (bf16/fp16, TMA-friendly) and the fallback (fp32).
MATMUL_PATHS = [("bf16", 128, 64, 96), ("fp16", 200, 72, 136), ("fp32", 64, 40, 48)]


def gpu_nonfinite_ids() -> list[str]:
    ids = [f"nonfinite/attention-{dtype}-d{dim}-{kernel}-{where}-{value}-{'causal' if causal else 'full'}"
           for dtype, dim, kernel in ATTENTION_PATHS
           for where, value, causal in attention_nonfinite_cases()]
    ids += [f"nonfinite/matmul-{dtype}-{m}x{k}x{n}-{where}-{value}"
            for dtype, m, k, n in MATMUL_PATHS for where in ("a", "b") for value in VALUES]
    return ids


def _nonfinite_case(case_id: str) -> None:
    parts = case_id.split("/", 1)[1].split("-")
    # "-inf" splits into an empty part and "inf"
    if "" in parts:
        i = parts.index("")
        parts[i:i + 2] = ["-" + parts[i + 1]]
    if parts[0] == "attention":
        _, dtype, dim, kernel, where, value, mask = parts
        check_attention_nonfinite(torch.device("cuda"), DTYPES[dtype], int(dim[1:]), where, value,
                                  mask == "causal", kernel)
    else:
        _, dtype, sizes, where, value = parts
        m, k, n = (int(x) for x in sizes.split("x"))
        check_matmul_nonfinite(torch.device("cuda"), DTYPES[dtype], where, value, m, k, n)


LARGE_IDS = ["large/attention-auto", "large/attention-sm80", "large/attention-fallback-d80",
             "large/matmul-2d", "large/matmul-batched"]


def _large_attention(kernel: str, head_dim: int) -> None:
    """(B, 8, 128, d) expanded from (1, 8, 128, d): more than 2^31 elements per operand and in
    the output, no memory for the inputs. Every batch entry has the same answer."""
    heads, length = 8, 128
    batch = 2**31 // (heads * length * head_dim) + 1
    gen = torch.Generator(device="cuda")
    gen.manual_seed(31)
    q0, k0, v0 = (torch.randn(1, heads, length, head_dim, generator=gen, device="cuda",
                              dtype=torch.bfloat16) for _ in range(3))
    q, k, v = (t.expand(batch, heads, length, head_dim) for t in (q0, k0, v0))
    assert q.numel() > 2**31
    with tk.use_kernel(kernel):
        plan = tk.explain(q, k, v, is_causal=True)
        out = tk.attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    assert out.shape == q.shape, (out.shape, plan)
    ref = reference_attention64(q0, k0, v0, True)
    theirs = torch.nn.functional.scaled_dot_product_attention(q0, k0, v0, is_causal=True)
    assert_close(f"batch entry 0 [{plan}]", out[:1], ref, theirs)
    for start in range(0, batch, 2048):
        chunk = out[start:start + 2048]
        same = (chunk == out[:1]).all(dim=(1, 2, 3))
        if not bool(same.all()):
            bad = start + int((~same).nonzero()[0])
            raise AssertionError(f"batch entry {bad} of {batch} differs from entry 0 (32-bit "
                                 f"index overflow?) [{plan}]")


def _large_matmul(batched: bool) -> None:
    """More than 2^31 output elements from small operands; rows at the end checked against
    the float64 product."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(32)
    if batched:
        m, k, n = 32769, 64, 32768
        a = torch.randn(2, m, k, generator=gen, device="cuda", dtype=torch.bfloat16)
    else:
        m, k, n = 46341, 64, 46344
        a = torch.randn(m, k, generator=gen, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, generator=gen, device="cuda", dtype=torch.bfloat16)
    plan = tk.explain_matmul(a, b)
    out = tk.matmul(a, b)
    torch.cuda.synchronize()
    assert out.numel() > 2**31, out.shape
    rows = [0, 1, m // 2, m - 2, m - 1]
    a_last = a[-1] if batched else a
    for row in rows:
        ref = a_last[row].double() @ b.double()
        got = out[-1, row] if batched else out[row]
        theirs = (a_last[row:row + 1] @ b)[0]
        err = (got.double() - ref).abs().max().item()
        err_theirs = (theirs.double() - ref).abs().max().item()
        assert err <= 2 * err_theirs + 1e-2, \
            f"row {row}: max abs error {err:.3e} vs torch.matmul {err_theirs:.3e} [{plan}]"


def _large_case(case_id: str) -> None:
    name = case_id.split("/", 1)[1]
    if name == "attention-auto":
        _large_attention("auto", 64)
    elif name == "attention-sm80":
        _large_attention("sm80", 64)
    elif name == "attention-fallback-d80":
        _large_attention("auto", 80)
    elif name == "matmul-2d":
        _large_matmul(False)
    else:
        _large_matmul(True)


def gpu_ids() -> list[str]:
    return gpu_nonfinite_ids() + LARGE_IDS


CASES = {**{case_id: (lambda case_id=case_id: _nonfinite_case(case_id)) for case_id in gpu_nonfinite_ids()},
         **{case_id: (lambda case_id=case_id: _large_case(case_id)) for case_id in LARGE_IDS}}
