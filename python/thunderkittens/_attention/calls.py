"""tk.attention's decisions, kept per layout of a call: the path it takes (plan.decide) and, on
the kernel path, the op to call with the caller's own tensors.

A model makes the same few calls over and over (a decoding step: one per layer, then again for
the next token), and plan.decide with its checks cost more host time per call than the kernel
launch. prepare() decides a call once per distinct key (below) and hands the same answer to the
calls after it; the C++ op re-checks every call cheaply as always.

The key holds everything plan.decide reads, so a cached answer is the one decide would give:

* query: shape, strides (whether the kernel reads it in place), dtype, device, requires_grad;
* key and value: dtype, device, requires_grad, every dim but the length, whether both are
  contiguous (whether the kernel reads them in place: the kernels' head dims are multiples of 8),
  and of the length only what the decision reads of it: whether it is 0, whether key's and
  value's agree, and whether it reaches decode.AUTO_MIN_LEN_KV (decode.prefers_decode). Keyed
  on the length itself, every decoding step would miss: the cache grows by a row per token;
* dropout_p, is_causal, scale, enable_gqa (calls of other types than float/int, bool and
  None are not cached: check_types rejects a True that would equal 1), torch.is_grad_enabled(),
  and the kernel choice (use_kernel's innermost block, else TK_ATTENTION_KERNEL as set now);
* the process-wide facts the decision reads (the kernels' device type, the GPU's capability, the
  build's ops and targets, the families, the decode thresholds): fixed while a process runs, but
  the CPU suite patches them, and any change empties the cache (_decisions.DecisionCache).

A call with an attn_mask, inputs other than 4-D plain tensors (FakeTensor, nested, ...) and
everything under torch.compile (dynamo traces plan.decide itself and guards on what it reads)
are decided afresh each time. Read on every call, never cached: strict mode (a fallback raises
when it is on) and the operands' data pointers (a view that is not 16-byte aligned is copied).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch._ops import OpOverload

from .. import _scaffold
from .._decisions import DecisionCache
from . import decode, plan
from .ops import forward_op


class Call(NamedTuple):
    """How tk.attention runs a call: its decision, and on the kernel path the op and its flags.
    ``op`` is set when the kernel reads the caller's 4-D tensors in place (their data 16-byte
    aligned, which the caller checks per call); otherwise api.run_decided runs the decision."""

    decision: plan.Decision
    op: OpOverload | None = None
    is_causal: bool = False
    scale: float = 0.0
    lower_right: bool = False


def _decode_thresholds() -> tuple:
    return decode.AUTO_MAX_LEN_Q, decode.AUTO_MIN_LEN_KV, decode.DECODE_MAX_LEN_Q


_cache = DecisionCache("attention", _decode_thresholds)
#: Forget every cached decision.
clear = _cache.clear


# Bound once: this runs on every call (dynamo knows is_compiling by identity).
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_is_grad_enabled = torch.is_grad_enabled


def cache_key(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> tuple | None:
    """The key of a call (see the module's docstring), or None for a call that is not cached."""
    if (attn_mask is not None or type(query) is not _Tensor or type(key) is not _Tensor
            or type(value) is not _Tensor or type(is_causal) is not bool
            or type(enable_gqa) is not bool
            or (type(dropout_p) is not float and type(dropout_p) is not int)
            or (scale is not None and type(scale) is not float and type(scale) is not int)
            or _is_compiling()):
        return None
    try:
        q_shape, k_shape, v_shape = query.shape, key.shape, value.shape
        if len(q_shape) != 4 or len(k_shape) != 4 or len(v_shape) != 4:
            return None
        len_kv = k_shape[2]
        return (q_shape, query.stride(), query.dtype, query.device, query.requires_grad,
                k_shape[0], k_shape[1], k_shape[3], key.dtype, key.device, key.requires_grad,
                v_shape[0], v_shape[1], v_shape[3], value.dtype, value.device, value.requires_grad,
                len_kv == v_shape[2],
                # What decide reads of the key length: empty, and decode.prefers_decode's bound.
                0 if len_kv < 1 else 1 if len_kv < decode.AUTO_MIN_LEN_KV else 2,
                key.is_contiguous() and value.is_contiguous(),
                _is_grad_enabled(), is_causal, enable_gqa, dropout_p, scale,
                _cache.choice())
    except RuntimeError:  # tensors without sizes or strides (nested, sparse): decided afresh
        return None


def prepare(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> Call:
    """The Call for these arguments (raising as tk.attention does for bad ones): cached, or
    decided now (and cached when the call has a key)."""
    found_key = cache_key(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _cache.decided(found_key, _decide, query, key, value, attn_mask, dropout_p, is_causal, scale,
                          enable_gqa, found_key is not None)


def _decide(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, keyed: bool) -> Call:
    decision = plan.decide(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _call(decision, query, key, value, scale, keyed)


def _call(decision: plan.Decision, query, key, value, scale, keyed: bool) -> Call:
    family = decision.family
    # Only keyed calls (4-D plain tensors, not traced) call the op directly: the others go
    # through api.run_decided, as every call did before this cache.
    if family is None or not keyed:
        return Call(decision)
    head_dim = query.shape[-1]
    in_place = (_scaffold.strides_conform(query) and key.is_contiguous() and value.is_contiguous()
                and head_dim % _scaffold.ELEMENTS_PER_16_BYTES == 0)
    if not in_place:
        return Call(decision)
    return Call(decision, forward_op(family, query, key, value), decision.is_causal,
                plan.softmax_scale(head_dim, scale), decision.lower_right)
