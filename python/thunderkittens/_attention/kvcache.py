"""thunderkittens.attention_with_kvcache: a decoding step against preallocated key/value caches.

The kernel path is two ops (csrc/attention/decode_ops.cpp): ``tk::kvcache_append`` writes the
new keys/values into the caches in place, ``tk::attention_decode_kvcache`` runs the decode
kernel over each sequence's valid rows. Both read the lengths on the device, so a step has no
host sync and can be captured in a CUDA graph and replayed with other lengths. Everything else
(CPU tensors, other dtypes and head dims, more than 64 query rows, caches the kernels cannot
write in place, a GPU without decode code) takes the PyTorch path below, with the same
semantics.

Paged caches (a block table mapping each sequence's pages to rows of a shared pool) are not
supported: the kernels read each sequence's rows of a contiguous (per head) cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import _config, _scaffold
from .._scaffold import Plan
from . import decode
from .plan import DECODE

_WHO = "tk.attention_with_kvcache"

APPEND = torch.ops.tk.kvcache_append.default
ATTEND = torch.ops.tk.attention_decode_kvcache.default


@dataclass(frozen=True, kw_only=True)
class KVCachePlan(Plan):
    """What thunderkittens.explain_kvcache() returns: the path of an attention_with_kvcache call."""

    function = _WHO
    fallback = "PyTorch (cache update by index, SDPA with a length mask)"

    head_dim: int
    causal: bool
    gqa_ratio: int
    appends: bool

    def details(self) -> list[str]:
        parts = [f"d={self.head_dim}", "causal lower-right" if self.causal else "full"]
        if self.gqa_ratio > 1:
            parts.append(f"gqa={self.gqa_ratio}")
        if self.appends:
            parts.append("+ append tk.kvcache_append")
        return parts


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_seqlens: torch.Tensor, k_new: torch.Tensor | None = None,
                           v_new: torch.Tensor | None = None, is_causal: bool = True,
                           scale: float | None = None) -> torch.Tensor:
    """Attention of new query tokens against a preallocated key/value cache, for decoding.

    q (B, Hq, Lq, D); k_cache, v_cache (B, Hkv, S, D) with Hq a multiple of Hkv (GQA) and S the
    cache's capacity, any layout whose last dim is contiguous (e.g. a (B, S, Hkv, D) buffer
    viewed with .transpose(1, 2)); cache_seqlens (B,) int32 on the caches' device: the rows
    sequence b holds before this call. With k_new / v_new (B, Hkv, Lq, D), they are first
    written into rows cache_seqlens[b] .. cache_seqlens[b] + Lq - 1 of the caches, in place
    (cache_seqlens itself is not changed: the caller advances it), and attention runs over
    cache_seqlens[b] + Lq rows; without them, over cache_seqlens[b] rows. Rows that would fall
    outside the capacity are dropped (keep cache_seqlens[b] + Lq <= S). is_causal (the
    default): the Lq query tokens are the last Lq of those rows, query i seeing rows up to
    cache_seqlens[b] + i (lower-right); otherwise every query sees all of them. scale defaults
    to 1/sqrt(D). Returns (B, Hq, Lq, D) in q's dtype; a sequence with no rows gives zeros.

    No host sync on any path: CUDA-graph capturable, the lengths may change between replays.
    Runs the decode kernel for CUDA bf16/fp16 inputs with D in 64/96/128 and Lq <= 64 (sm_80 or
    newer); everything else is computed with PyTorch ops (see explain_kvcache). For inference:
    inputs that require grad are refused. Paged caches are not supported.
    """
    _check(q, k_cache, v_cache, cache_seqlens, k_new, v_new, is_causal, scale)
    softmax_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    reason = _fallback_reason(q, k_cache, v_cache, softmax_scale)
    if reason is not None:
        _scaffold.fallback_or_raise(KVCachePlan, reason)
        return _torch_path(q, k_cache, v_cache, cache_seqlens, k_new, v_new, is_causal, softmax_scale)
    added = 0
    if k_new is not None:
        APPEND(k_cache, v_cache, cache_seqlens, _scaffold.operand(k_new), _scaffold.operand(v_new))
        added = k_new.shape[2]
    out, _lse = ATTEND(_scaffold.operand(q), k_cache, v_cache, cache_seqlens, added, is_causal,
                       softmax_scale)
    return out


def explain_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    cache_seqlens: torch.Tensor, k_new: torch.Tensor | None = None,
                    v_new: torch.Tensor | None = None, is_causal: bool = True,
                    scale: float | None = None) -> KVCachePlan:
    """Which path ``attention_with_kvcache`` would take for these arguments, and why (one line
    as str()); raises its argument errors; runs nothing."""
    _check(q, k_cache, v_cache, cache_seqlens, k_new, v_new, is_causal, scale)
    softmax_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    reason = _fallback_reason(q, k_cache, v_cache, softmax_scale)
    kernel = reason is None
    copies = () if not kernel else tuple(
        name for name, t in (("q", q), ("k_new", k_new), ("v_new", v_new))
        if t is not None and not _scaffold.conforms(t))
    return KVCachePlan(uses_kernel=kernel, reason=reason, kernel=DECODE.name if kernel else None,
                       kernel_description=DECODE.description if kernel else None,
                       op="tk.attention_decode_kvcache" if kernel else None, dtype=q.dtype,
                       copies=copies, strict=_config.strict_enabled(), head_dim=int(q.shape[-1]),
                       causal=is_causal, gqa_ratio=q.shape[1] // k_cache.shape[1],
                       appends=k_new is not None)


# ---- checks ----------------------------------------------------------------------------------


def _check(q, k_cache, v_cache, cache_seqlens, k_new, v_new, is_causal, scale) -> None:
    """Arguments as the docstring says, or a TypeError / ValueError naming the argument. Reads
    shapes, dtypes, devices and flags only."""
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": cache_seqlens}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_WHO}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if (k_new is None) != (v_new is None):
        raise ValueError(f"{_WHO}: pass both k_new and v_new, or neither")
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{_WHO}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"{_WHO}: is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{_WHO}: scale must be a float or None, got {type(scale).__name__}")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"{_WHO}: scale must be a finite number, got {scale}")
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if k_new is not None:
        tensors.update(k_new=k_new, v_new=v_new)
    for name, t in tensors.items():
        if t.dim() != 4:
            raise ValueError(f"{_WHO}: {name} must be 4-D (batch, heads, length, head_dim), got "
                             f"shape {tuple(t.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{_WHO}: {name} is empty (shape {tuple(t.shape)})")
        if not t.is_floating_point():
            raise TypeError(f"{_WHO}: {name} must have a floating-point dtype, got {t.dtype}")
        if t.dtype != q.dtype:
            raise TypeError(f"{_WHO}: {name} dtype {t.dtype} differs from q dtype {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{_WHO}: {name} is on {t.device} but q is on {q.device}")
    batch, heads_q, len_q, head_dim = q.shape
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{_WHO}: k_cache {tuple(k_cache.shape)} and v_cache "
                         f"{tuple(v_cache.shape)} must have the same shape")
    if k_cache.shape[0] != batch or k_cache.shape[3] != head_dim:
        raise ValueError(f"{_WHO}: k_cache {tuple(k_cache.shape)} must be (batch, heads_kv, "
                         f"capacity, head_dim) with q's batch {batch} and head_dim {head_dim}")
    if heads_q % k_cache.shape[1] != 0:
        raise ValueError(f"{_WHO}: q heads ({heads_q}) must be a multiple of the caches' heads "
                         f"({k_cache.shape[1]})")
    if k_new is not None:
        expected = (batch, k_cache.shape[1], len_q, head_dim)
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            if tuple(t.shape) != expected:
                raise ValueError(f"{_WHO}: {name} must have shape (batch, heads_kv, len_q, "
                                 f"head_dim) = {expected}, got {tuple(t.shape)}")
    if k_new is not None:
        # The caches are written in place: an expanded view (stride 0 over a dim of size > 1)
        # would have several of its elements written through one memory location.
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            shared = [d for d in range(4) if t.shape[d] > 1 and t.stride(d) == 0]
            if shared:
                raise ValueError(f"{_WHO}: {name} is written in place (k_new / v_new are given) but "
                                 f"its dim {shared[0]} has stride 0 (an expanded view): pass a "
                                 "cache buffer of its own memory")
    if cache_seqlens.dtype != torch.int32:
        raise TypeError(f"{_WHO}: cache_seqlens must be int32, got {cache_seqlens.dtype} "
                        "(pass cache_seqlens.to(torch.int32))")
    if tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(f"{_WHO}: cache_seqlens must have shape (batch,) = ({batch},), got "
                         f"{tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != q.device:
        raise ValueError(f"{_WHO}: cache_seqlens is on {cache_seqlens.device} but q is on "
                         f"{q.device}")
    if torch.is_grad_enabled():
        for name, t in {**tensors, "k_cache": k_cache}.items():
            if t.requires_grad:
                raise ValueError(f"{_WHO}: {name} requires grad; attention_with_kvcache is for "
                                 "inference (no gradients): use tk.attention to train, or call "
                                 "it under torch.no_grad()")


# ---- the path ------------------------------------------------------------------------------


def _fallback_reason(q, k_cache, v_cache, scale: float) -> str | None:
    """Why the call takes the PyTorch path, or None for the kernels."""
    reason = _scaffold.unsupported_input_reason("attention", q)
    if reason is not None:
        return reason
    if q.shape[-1] not in DECODE.head_dims:
        dims = ", ".join(str(d) for d in DECODE.head_dims)
        return f"head dim {q.shape[-1]} is not supported by the decode kernel ({dims} only)"
    if q.shape[2] > decode.DECODE_MAX_LEN_Q:
        return (f"query length {q.shape[2]} > {decode.DECODE_MAX_LEN_Q} (the decode kernels take "
                f"up to {decode.DECODE_MAX_LEN_Q} query rows)")
    if scale <= 0.0:
        return f"scale {scale} <= 0 is not supported by the kernel (positive scales only)"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not _scaffold.conforms(t):
            return (f"{name} has a layout the kernels cannot write in place (last dim contiguous, "
                    "other strides multiples of 16 bytes, 16-byte aligned data)")
    if "attention" not in _scaffold._extension.BUILT_OPS:
        built = ",".join(sorted(_scaffold._extension.BUILT_OPS)) or "none"
        return (f"the attention op family was not compiled into this build (families built: "
                f"{built}); rebuild with TK_OPS unset")
    found = _scaffold._family_or_reason("attention", q.device.index, DECODE.name)
    if found.startswith(_scaffold._NO_FAMILY):
        return found[len(_scaffold._NO_FAMILY):].removeprefix(f"kernel {DECODE.name} was forced but ")
    return None


def _torch_path(q, k_cache, v_cache, cache_seqlens, k_new, v_new, is_causal, scale):
    """The same semantics in PyTorch ops, without a host sync: the caches are rewritten through
    a gather and a where (every row; fine off the kernels' path), and SDPA runs with a mask of
    each sequence's rows. Rows past a sequence's end are zeroed for SDPA (a cache's unused rows
    may hold NaN, which a masked score would still carry into the sum); query rows that see no
    key give 0."""
    batch, heads_kv, capacity, head_dim = k_cache.shape
    len_q = q.shape[2]
    positions = torch.arange(capacity, device=q.device)
    lengths = cache_seqlens.long()
    if k_new is not None:
        relative = positions[None, :] - lengths[:, None]                 # (B, S)
        inside = ((relative >= 0) & (relative < len_q))[:, None, :, None]
        index = relative.clamp(0, len_q - 1)[:, None, :, None].expand(batch, heads_kv, capacity, head_dim)
        for cache, new in ((k_cache, k_new), (v_cache, v_new)):
            cache.copy_(torch.where(inside, new.gather(2, index), cache))
        lengths = lengths + len_q
    keys = lengths.clamp(0, capacity)                                     # (B,)
    valid = positions[None, :] < keys[:, None]                            # (B, S)
    visible = valid[:, None, :].expand(batch, len_q, capacity)            # (B, Lq, S)
    if is_causal:
        last = torch.arange(len_q, device=q.device)[None, :, None] + (keys - len_q)[:, None, None]
        visible = visible & (positions[None, None, :] <= last)
    seen = visible.any(dim=-1, keepdim=True)                              # (B, Lq, 1)
    mask = (visible | ~seen)[:, None]                                     # (B, 1, Lq, S)
    rows = valid[:, None, :, None]
    k = torch.where(rows, k_cache, 0.0)
    v = torch.where(rows, v_cache, 0.0)
    call = lambda: F.scaled_dot_product_attention(  # noqa: E731
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != heads_kv)
    if scale <= 0:  # the fused backends assume a positive scale (api._sdpa)
        with sdpa_kernel(SDPBackend.MATH):
            out = call()
    else:
        out = call()
    return torch.where(seen[:, None], out, 0.0)


# ---- fake implementations ------------------------------------------------------------------
# For torch.compile, torch.export and FakeTensorMode: the outputs' shapes and dtypes; the
# append returns nothing (its schema marks the caches as written).


def _register() -> None:
    @torch.library.register_fake("tk::attention_decode_kvcache")
    def _attend_fake(q, k_cache, v_cache, cache_seqlens, seqlen_add, is_causal, scale):
        torch._check(q.dim() == 4 and k_cache.dim() == 4 and v_cache.dim() == 4,
                     lambda: "tk::attention_decode_kvcache: q and the caches must be 4-D")
        torch._check(q.shape[1] % k_cache.shape[1] == 0,
                     lambda: "tk::attention_decode_kvcache: q heads must be a multiple of the caches' heads")
        return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)

    @torch.library.register_fake("tk::kvcache_append")
    def _append_fake(k_cache, v_cache, cache_seqlens, k_new, v_new):
        torch._check(k_new.shape == v_new.shape,
                     lambda: "tk::kvcache_append: k_new and v_new must have the same shape")
        return None


_register()
