"""The fixed cases of test_fallback_layouts_gpu.py (run in the test worker's case server,
differential.worker: SDPA has faulted with ``misaligned address`` on such views, which would
poison the test process's CUDA context).

  misaligned/...   plain views ``torch.randn(b, h, l, d + 8)[..., N:N + d]`` (N = 4: the issue's
                   view, 8 bytes off a 16-byte boundary in bf16/fp16; in float32 4 elements are
                   16 bytes, so N = 2 is the 8-byte case there), every dtype, head dims 64, 80,
                   96, 128, 256, causal or not, forward and backward, kernel choice auto and sm80
                   (sm80 with gradients or head dim 96 falls back): each against the float64
                   reference within PyTorch's own error (on contiguous copies).
  repro/...        the issue's repro: head dim 80 (a fallback), causal_lower_right(1000, 2048),
                   scale 0.3, GQA 16/8, a transposed q and a value view 8 bytes off.
  no_key_rows/...  causal_lower_right with Lq > Lk: the first Lq - Lk rows see no key and must
                   be 0 (and get 0 gradient) on every path, kernel or fallback.
"""

from __future__ import annotations

import torch

from .attention import AttentionCase, check_case
from .environment import Environment, PathCounts

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HEAD_DIMS = (64, 80, 96, 128, 256)


def _run(case: AttentionCase) -> None:
    check_case(case, Environment.cuda(), PathCounts("fixed"))


def _misaligned(dtype: str, head_dim: int, causal: bool, backward: bool, offset: int,
                kernel: str) -> AttentionCase:
    return AttentionCase(
        batch=(2,), heads_kv=8, gqa=1, enable_gqa=False, len_q=1000, len_kv=1000,
        head_dim=head_dim, head_dim_v=head_dim, dtype=DTYPES[dtype],
        mask="causal" if causal else "none", mask_shape="2d", empty_rows=False, scale=None,
        grad=(backward,) * 3, layout=(f"offset:{offset}",) * 3, kernel=kernel, seed=head_dim)


def misaligned_ids() -> list[str]:
    ids = []
    for dtype in DTYPES:
        offsets = (4, 2) if dtype == "fp32" else (4,)
        kernels = ("auto",) if dtype == "fp32" else ("auto", "sm80")
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                for direction in ("forward", "backward"):
                    for offset in offsets:
                        for kernel in kernels:
                            ids.append(f"misaligned/{dtype}-d{head_dim}-{'causal' if causal else 'full'}"
                                       f"-{direction}-offset{offset}-{kernel}")
    return ids


def _parse_misaligned(case_id: str) -> AttentionCase:
    dtype, dim, mask, direction, offset, kernel = case_id.split("/")[1].split("-")
    return _misaligned(dtype, int(dim[1:]), mask == "causal", direction == "backward",
                       int(offset.removeprefix("offset")), kernel)


def _repro(backward: bool) -> AttentionCase:
    return AttentionCase(
        batch=(1,), heads_kv=8, gqa=2, enable_gqa=True, len_q=1000, len_kv=2048, head_dim=80,
        head_dim_v=80, dtype=torch.bfloat16, mask="lower_right", mask_shape="2d",
        empty_rows=False, scale=0.3, grad=(backward,) * 3,
        layout=("transposed", "contiguous", "offset:4"), kernel="auto", seed=45)


REPRO_IDS = ["repro/forward", "repro/backward"]

# (dtype, head dim, kernel choice): fallbacks (float32, head dim 256 and 80, sm80 with
# gradients) and kernels (auto, sm80 forward).
NO_KEY_ROWS = [("fp32", 64, "auto"), ("bf16", 256, "auto"), ("fp16", 80, "auto"),
               ("bf16", 64, "auto"), ("fp16", 128, "auto"), ("bf16", 96, "auto"),
               ("bf16", 64, "sm80"), ("fp16", 128, "sm80"), ("bf16", 96, "sm80")]


def no_key_rows_ids() -> list[str]:
    return [f"no_key_rows/{dtype}-d{dim}-{kernel}-{direction}"
            for dtype, dim, kernel in NO_KEY_ROWS for direction in ("forward", "backward")]


def _no_key_rows(case_id: str) -> AttentionCase:
    dtype, dim, kernel, direction = case_id.split("/")[1].split("-")
    return AttentionCase(
        batch=(2,), heads_kv=2, gqa=4, enable_gqa=True, len_q=700, len_kv=300,
        head_dim=int(dim[1:]), head_dim_v=int(dim[1:]), dtype=DTYPES[dtype], mask="lower_right",
        mask_shape="2d", empty_rows=False, scale=None, grad=(direction == "backward",) * 3,
        layout=("contiguous",) * 3, kernel=kernel, seed=7)


def all_ids() -> list[str]:
    return misaligned_ids() + REPRO_IDS + no_key_rows_ids()


def _case(case_id: str) -> AttentionCase:
    if case_id.startswith("misaligned/"):
        return _parse_misaligned(case_id)
    if case_id.startswith("repro/"):
        return _repro(case_id == "repro/backward")
    return _no_key_rows(case_id)


CASES = {case_id: (lambda case_id=case_id: _run(_case(case_id))) for case_id in all_ids()}
