"""Invalid calls: a random valid call with one thing broken. Each must raise a ValueError or
TypeError whose message names the broken argument, the same from tk.explain /
tk.explain_matmul; where PyTorch's function rejects the call too, it must (so the check is of
the call, not of our guess), and tk.matmul's error must also be of torch.matmul's exception type
(its documented contract: code written against torch.matmul still catches it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

import thunderkittens as tk

from .attention import causal_bias
from .environment import PathCounts
from .notes import note

# mutation -> (the argument the message must name, whether SDPA / torch.matmul rejects it too)
ATTENTION_MUTATIONS = {
    "heads_without_gqa": ("enable_gqa", True),
    "heads_not_multiple": ("heads", True),
    "key_head_dim": ("key", True),
    "value_length": ("value", False),  # SDPA's CPU kernel takes a value longer than the key
    "value_heads": ("value", False),  # SDPA's enable_gqa repeats key and value heads apart
    "key_rank": ("key", False),     # SDPA broadcasts the batch dims; ours takes none
    "key_dtype": ("key", True),
    "value_dtype": ("value", True),
    "key_on_meta": ("key", True),
    # SDPA documents the rule, but torch 2.11's CPU kernel accepted some such calls.
    "mask_with_is_causal": ("attn_mask", False),
    "dropout_negative": ("dropout_p", False),
    "dropout_above_one": ("dropout_p", False),
    "scale_nan": ("scale", False),
    "scale_inf": ("scale", False),
    "bias_lengths": ("attn_mask", False),
    "is_causal_int": ("is_causal", False),
    "enable_gqa_int": ("enable_gqa", False),
    "dropout_string": ("dropout_p", True),
    "scale_string": ("scale", True),
    "query_not_tensor": ("query", True),
    "query_integer": ("query", True),
    "query_complex": ("query", True),
    "query_bool": ("query", True),
    "query_rank_2": ("query", False),
    "batch_mismatch": ("key", False),
    "empty_query": ("query", False),
    "empty_key": ("key", False),
}

MATMUL_MUTATIONS = {
    "inner_mismatch": ("b.shape", True),
    "dtype_mismatch": ("b dtype", True),
    "b_on_meta": ("b is on meta", False),  # torch.matmul(cpu, meta) returns a CPU tensor
    "a_zero_dim": ("a", True),
    "b_zero_dim": ("b", True),
    "batch_mismatch": ("batch dims", True),
    "a_not_tensor": ("a", True),
    "b_not_tensor": ("b", True),
}


@dataclass(frozen=True)
class InvalidCall:
    op: str           # "attention" or "matmul"
    mutation: str
    dtype: torch.dtype
    sizes: tuple      # attention: (B, Hkv, gqa, Lq, Lk, D); matmul: (B, M, K, N)


def mutations_of(op: str) -> list[str]:
    return sorted(ATTENTION_MUTATIONS if op == "attention" else MATMUL_MUTATIONS)


@st.composite
def invalid_calls(draw, op: str, mutation: str):
    """Calls of ``op`` broken by ``mutation``, of random sizes and dtypes."""
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
    if op == "attention":
        sizes = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4])),
                 draw(st.integers(1, 40)), draw(st.integers(1, 40)),
                 draw(st.sampled_from([64, 128, 80, 16])))
    else:
        sizes = (draw(st.integers(2, 3)), draw(st.integers(1, 40)), draw(st.integers(1, 40)),
                 draw(st.integers(1, 40)))
    return InvalidCall(op=op, mutation=mutation, dtype=dtype, sizes=sizes)


def _attention_args(call: InvalidCall):
    batch, heads_kv, gqa, len_q, len_kv, dim = call.sizes
    heads_q = heads_kv * gqa
    dtype = call.dtype
    q = torch.randn(batch, heads_q, len_q, dim, dtype=dtype)
    k = torch.randn(batch, heads_kv, len_kv, dim, dtype=dtype)
    v = torch.randn(batch, heads_kv, len_kv, dim, dtype=dtype)
    kwargs = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=gqa > 1)
    m = call.mutation
    if m == "heads_without_gqa":  # 2 key heads: SDPA would broadcast a single one
        q = torch.randn(batch, 4, len_q, dim, dtype=dtype)
        k = torch.randn(batch, 2, len_kv, dim, dtype=dtype)
        v = torch.randn(batch, 2, len_kv, dim, dtype=dtype)
        kwargs["enable_gqa"] = False
    elif m == "heads_not_multiple":
        k = torch.randn(batch, 2, len_kv, dim, dtype=dtype)
        v = torch.randn(batch, 2, len_kv, dim, dtype=dtype)
        q = torch.randn(batch, 3, len_q, dim, dtype=dtype)
        kwargs["enable_gqa"] = True
    elif m == "key_head_dim":
        k = torch.randn(batch, heads_kv, len_kv, dim + 8, dtype=dtype)
    elif m == "value_length":  # no length-1 key, which broadcasting could explain away
        k = torch.randn(batch, heads_kv, len_kv + 1, dim, dtype=dtype)
        v = torch.randn(batch, heads_kv, len_kv + 2, dim, dtype=dtype)
    elif m == "value_heads":  # 2 and 3 heads: SDPA would broadcast a single one
        q = torch.randn(batch, 6, len_q, dim, dtype=dtype)
        k = torch.randn(batch, 2, len_kv, dim, dtype=dtype)
        v = torch.randn(batch, 3, len_kv, dim, dtype=dtype)
        kwargs["enable_gqa"] = True
    elif m == "key_rank":
        k = k[0]
    elif m == "key_dtype":
        k = k.to(torch.float64)
    elif m == "value_dtype":
        v = v.to(torch.float16 if dtype != torch.float16 else torch.bfloat16)
    elif m == "key_on_meta":
        k = k.to("meta")
    elif m == "mask_with_is_causal":
        kwargs.update(attn_mask=torch.ones(len_q, len_kv, dtype=torch.bool), is_causal=True)
    elif m == "dropout_negative":
        kwargs["dropout_p"] = -0.1
    elif m == "dropout_above_one":
        kwargs["dropout_p"] = 1.5
    elif m == "scale_nan":
        kwargs["scale"] = float("nan")
    elif m == "scale_inf":
        kwargs["scale"] = float("inf")
    elif m == "bias_lengths":
        kwargs["attn_mask"] = causal_bias("lower_right", len_q + 1, len_kv)
    elif m == "is_causal_int":
        kwargs["is_causal"] = 1
    elif m == "enable_gqa_int":
        kwargs["enable_gqa"] = int(gqa > 1)
    elif m == "dropout_string":
        kwargs["dropout_p"] = "0.1"
    elif m == "scale_string":
        kwargs["scale"] = "0.1"
    elif m == "query_not_tensor":
        q = q.tolist()
    elif m == "query_integer":
        q, k, v = (t.to(torch.int32) for t in (q, k, v))
    elif m == "query_complex":
        q, k, v = (torch.complex(t.float(), t.float()) for t in (q, k, v))
    elif m == "query_bool":
        q, k, v = (t > 0 for t in (q, k, v))
    elif m == "query_rank_2":
        q, k, v = q[0, 0], k[0, 0], v[0, 0]
    elif m == "batch_mismatch":
        k = torch.randn(batch + 1, heads_kv, len_kv, dim, dtype=dtype)
        v = torch.randn(batch + 1, heads_kv, len_kv, dim, dtype=dtype)
    elif m == "empty_query":
        q = q[:, :, :0]
    elif m == "empty_key":
        k, v = k[:, :, :0], v[:, :, :0]
    return (q, k, v), kwargs


def _matmul_args(call: InvalidCall):
    batch, m_, k_, n_ = call.sizes
    a = torch.randn(batch, m_, k_, dtype=call.dtype)
    b = torch.randn(batch, k_, n_, dtype=call.dtype)
    m = call.mutation
    if m == "inner_mismatch":
        b = torch.randn(batch, k_ + 1, n_, dtype=call.dtype)
    elif m == "dtype_mismatch":
        b = b.to(torch.float64)
    elif m == "b_on_meta":
        b = b.to("meta")
    elif m == "a_zero_dim":
        a = a[0, 0, 0]
    elif m == "b_zero_dim":
        b = b[0, 0, 0]
    elif m == "batch_mismatch":
        b = torch.randn(batch + 1, k_, n_, dtype=call.dtype)
    elif m == "a_not_tensor":
        a = a.tolist()
    elif m == "b_not_tensor":
        b = b.tolist()
    return (a, b), {}


def _raised(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001  (what is raised is the subject)
        return error
    return None


def check_invalid(call: InvalidCall, counts: PathCounts) -> None:
    note(repr(call))
    if call.op == "attention":
        args, kwargs = _attention_args(call)
        ours, explain, theirs = tk.attention, tk.explain, F.scaled_dot_product_attention
        name, peer_rejects = ATTENTION_MUTATIONS[call.mutation]
    else:
        args, kwargs = _matmul_args(call)
        ours, explain, theirs = tk.matmul, tk.explain_matmul, torch.matmul
        name, peer_rejects = MATMUL_MUTATIONS[call.mutation]
    counts.add(call.mutation)
    error = _raised(ours, *args, **kwargs)
    assert error is not None, f"{call.op} accepted {call.mutation}"
    assert isinstance(error, (ValueError, TypeError)), \
        f"{call.mutation}: raised {type(error).__name__}: {error} (want ValueError/TypeError)"
    assert name in str(error), f"{call.mutation}: the message does not name {name!r}: {error}"
    explained = _raised(explain, *args, **kwargs)
    assert type(explained) is type(error) and str(explained) == str(error), \
        f"{call.mutation}: explain raised {type(explained).__name__}: {explained}; the op {error}"
    if call.op == "attention" and not peer_rejects:
        return  # nothing to ask SDPA (which torch 2.11 killed with SIGFPE on an empty key)
    peer_error = _raised(theirs, *args, **kwargs)
    if peer_rejects:
        assert peer_error is not None, \
            f"{call.mutation}: PyTorch's own function accepts it, ours rejects it: {error}"
    if call.op == "matmul" and peer_error is not None:
        assert isinstance(error, type(peer_error)), (
            f"{call.mutation}: tk.matmul raised {type(error).__name__}, which "
            f"`except {type(peer_error).__name__}` (torch.matmul's error) does not catch: {error}")
