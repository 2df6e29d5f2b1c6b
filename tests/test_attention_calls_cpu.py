"""tk.attention's decision cache (thunderkittens/_attention/calls.py) on the CPU: a call of a
layout seen before skips plan.decide (a decoding step against a cache one row longer too),
and everything the decision depends on misses the cache: shapes, strides, dtypes, devices,
flags, gradient mode, the kernel choice and the process-wide facts. A stale hit would be a
silent wrong answer, so each change is checked against a fresh plan.decide."""

import math

import pytest
import torch

import thunderkittens as tk
from thunderkittens import _extension, _scaffold
from thunderkittens._attention import api, calls, decode, ops, plan
from thunderkittens.errors import FallbackError

from conftest import counting_decisions

DECIDE = plan.decide  # uncounted (the ``decides`` fixture counts the cache's calls of it)


def bf16(*shape, **kwargs):
    return torch.randn(*shape, dtype=torch.bfloat16, **kwargs)


def decode_step(len_kv=2048, batch=2, heads_q=8, heads_kv=2, head_dim=128, dtype=torch.bfloat16):
    """A transformers decoding call: q a transposed view of the projection, k/v the cache."""
    q = torch.randn(batch, 1, heads_q * head_dim, dtype=dtype).view(batch, 1, heads_q, head_dim).transpose(1, 2)
    k = torch.randn(batch, heads_kv, len_kv, head_dim, dtype=dtype)
    return q, k, torch.randn_like(k)


ARGS = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=0.125, enable_gqa=True)


@pytest.fixture
def decides(monkeypatch):
    """Counts plan.decide's calls (the cache's misses) from here on, on an empty cache."""
    yield counting_decisions(monkeypatch, calls, plan)
    calls.clear()


def prepared(q, k, v, **overrides):
    kwargs = dict(ARGS, **overrides)
    return calls.prepare(q, k, v, kwargs["attn_mask"], kwargs["dropout_p"], kwargs["is_causal"],
                         kwargs["scale"], kwargs["enable_gqa"])


def assert_fresh(call, q, k, v, **overrides):
    """``call`` carries the decision plan.decide makes for these arguments now."""
    assert call.decision == DECIDE(q, k, v, *dict(ARGS, **overrides).values())


def test_a_decoding_loop_decides_once(cpu_kernel, decides):
    """Layer after layer and step after step (the key cache one row longer each time): one
    decision, and every call reaches the op with the caller's own tensors."""
    for step in range(4):
        q, k, v = decode_step(len_kv=2048 + step)
        for _layer in range(3):
            out = tk.attention(q, k, v, scale=0.125, enable_gqa=True)
            call = cpu_kernel.decode_calls[-1]
            assert call["q"].data_ptr() == q.data_ptr() and call["k"].data_ptr() == k.data_ptr()
            assert call["scale"] == 0.125 and out.shape == q.shape
    assert decides["n"] == 1
    assert len(cpu_kernel.decode_calls) == 12


def test_the_op_gets_what_run_decided_gives_it(cpu_kernel, decides):
    q, k, v = decode_step()
    first = api.run_decided(DECIDE(q, k, v, None, 0.0, False, None, True), q, k, v, 0.0, None, True)
    second = tk.attention(q, k, v, enable_gqa=True)  # the op directly
    a, b = cpu_kernel.decode_calls
    for name in ("q", "k", "v"):
        assert a[name].data_ptr() == b[name].data_ptr()
        assert a[name].shape == b[name].shape and a[name].stride() == b[name].stride()
    assert (a["is_causal"], a["scale"], a["lower_right"]) == (b["is_causal"], b["scale"], b["lower_right"])
    assert a["scale"] == 1.0 / math.sqrt(128)
    torch.testing.assert_close(first, second)


def test_the_key_length_misses_only_where_the_decision_reads_it(cpu_kernel, decides):
    """Below decode.AUTO_MIN_LEN_KV auto keeps the forward kernel: the length classes differ."""
    below, at, above = decode.AUTO_MIN_LEN_KV - 1, decode.AUTO_MIN_LEN_KV, decode.AUTO_MIN_LEN_KV + 5
    for len_kv, family in ((at, "decode"), (above, "decode"), (below, "sm90"), (1, "sm90"), (at, "decode")):
        q, k, v = decode_step(len_kv=len_kv)
        call = prepared(q, k, v)
        assert call.decision.family.name == family
        assert_fresh(call, q, k, v)
    assert decides["n"] == 2


@pytest.mark.parametrize("change", ["v length", "k length 0", "scale nan", "scale bool", "is_causal int",
                                    "k heads", "v head dim", "dtype", "rank"])
def test_bad_calls_of_a_cached_layout_still_raise(cpu_kernel, decides, change):
    q, k, v = decode_step()
    tk.attention(q, k, v, **{**ARGS})
    kwargs = dict(ARGS)
    if change == "v length":
        v = v[:, :, :-1]
    elif change == "k length 0":
        k, v = k[:, :, :0], v[:, :, :0]
    elif change == "scale nan":
        kwargs["scale"] = float("nan")
    elif change == "scale bool":
        kwargs["scale"] = True
    elif change == "is_causal int":
        kwargs["is_causal"] = 1
    elif change == "k heads":
        k = k[:, :1].expand(2, 3, *k.shape[2:])
    elif change == "v head dim":
        v = v[..., :64]
        kwargs["enable_gqa"] = False
    elif change == "dtype":
        v = v.half()
    elif change == "rank":
        v = v[0]
    with pytest.raises((ValueError, TypeError)):
        tk.attention(q, k, v, **kwargs)


# Each change of what the decision (or the in-place call) depends on, made to the base call
# (a decode step: q transposed view, contiguous caches). The cache must miss and give what a
# fresh plan.decide gives.
def _changes():
    def with_args(**overrides):
        return lambda q, k, v: ((q, k, v), overrides)

    return {
        "q strides": lambda q, k, v: ((torch.cat([q, q], dim=-1)[..., :128], k, v), {}),
        "q strides not multiples of 8": lambda q, k, v: ((bf16(2, 8, 1, 132)[..., :128], k, v), {}),
        "q length": lambda q, k, v: ((torch.cat([q, q], dim=2), k, v), {}),
        "q heads": lambda q, k, v: ((q[:, :4], k, v), {}),
        "batch": lambda q, k, v: ((q[:1], k[:1], v[:1]), {}),
        "k not contiguous": lambda q, k, v: ((q, k.transpose(0, 1).contiguous().transpose(0, 1), v), {}),
        "v not contiguous": lambda q, k, v: ((q, k, v.transpose(0, 1).contiguous().transpose(0, 1)), {}),
        "k short": lambda q, k, v: ((q, k[:, :, :100], v[:, :, :100]), {}),
        "dtype fp16": lambda q, k, v: ((q.half(), k.half(), v.half()), {}),
        "dtype fp32": lambda q, k, v: ((q.float(), k.float(), v.float()), {}),
        "device meta": lambda q, k, v: ((q.to("meta"), k.to("meta"), v.to("meta")), {}),
        "head dim 80": lambda q, k, v: ((q[..., :80], k[..., :80].contiguous(), v[..., :80].contiguous()), {}),
        "q requires grad": lambda q, k, v: ((q.detach().requires_grad_(), k, v), {}),
        "v requires grad": lambda q, k, v: ((q, k, v.detach().requires_grad_()), {}),
        "is_causal": with_args(is_causal=True),
        "scale": with_args(scale=0.25),
        "scale None": with_args(scale=None),
        "scale negative": with_args(scale=-0.125),
        "scale int": with_args(scale=2),
        "dropout": with_args(dropout_p=0.5),
        "causal bias": lambda q, k, v: ((q, k, v), {"attn_mask": torch.nn.attention.bias.causal_lower_right(1, k.shape[2])}),
        "bool mask": lambda q, k, v: ((q, k, v), {"attn_mask": torch.ones(1, k.shape[2], dtype=torch.bool)}),
    }


CHANGES = _changes()


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_misses_the_cache(cpu_kernel, decides, change):
    q, k, v = decode_step()
    base = prepared(q, k, v)
    assert base.decision.family.name == "decode" and base.op is not None
    assert prepared(q, k, v) is base and decides["n"] == 1
    (q2, k2, v2), overrides = CHANGES[change](q, k, v)
    call = prepared(q2, k2, v2, **overrides)
    assert decides["n"] == 2, "the changed call was served from the cache"
    assert_fresh(call, q2, k2, v2, **overrides)
    if change in ("q strides not multiples of 8", "k not contiguous", "v not contiguous"):
        assert call.op is None  # the kernel path through run_decided, which copies the operand
    key = calls.cache_key(q2, k2, v2, *dict(ARGS, **overrides).values())
    if key is not None:  # cached: a second call hits
        assert prepared(q2, k2, v2, **overrides) is call and decides["n"] == 2
    # The same call runs (or falls back) as before the cache: what tk.attention gives.
    if change != "device meta":
        out = tk.attention(q2, k2, v2, **dict(ARGS, **overrides))
        assert out.shape == q2.shape[:-1] + (v2.shape[-1],)


@pytest.mark.parametrize("changed", ["no_grad", "inference_mode"])
def test_gradient_mode_is_in_the_key(cpu_kernel, decides, changed):
    q, k, v = decode_step()
    q.requires_grad_()
    with_grad = prepared(q, k, v)
    assert with_grad.decision.family.name == "sm90" and with_grad.op is ops.TRAINING_FORWARD["sm90"]
    with (torch.no_grad() if changed == "no_grad" else torch.inference_mode()):
        without = prepared(q, k, v)
        assert_fresh(without, q, k, v)
    assert without.decision.family.name == "decode" and decides["n"] == 2


def test_use_kernel_and_the_env_var_are_in_the_key(cpu_kernel, decides, monkeypatch):
    q, k, v = decode_step()
    assert prepared(q, k, v).decision.family.name == "decode"
    with tk.use_kernel("sm80"):
        assert prepared(q, k, v).decision.family.name == "sm80"
        with tk.use_kernel("auto"):
            assert prepared(q, k, v).decision.family.name == "decode"
    monkeypatch.setenv("TK_ATTENTION_KERNEL", "sm90")
    assert prepared(q, k, v).decision.family.name == "sm90"
    monkeypatch.setenv("TK_ATTENTION_KERNEL", "bogus")
    with pytest.raises(ValueError, match="TK_ATTENTION_KERNEL"):
        prepared(q, k, v)
    monkeypatch.delenv("TK_ATTENTION_KERNEL")
    assert prepared(q, k, v).decision.family.name == "decode"
    # Misses: unset, sm80, auto (the same decision as unset, under another key), sm90, bogus
    # (raised); unset again hits.
    assert decides["n"] == 5


def test_strict_mode_is_read_on_every_call(cpu_kernel, decides):
    q, k, v = decode_step(dtype=torch.float32)  # a fallback: the kernels take bf16/fp16 only
    tk.attention(q, k, v, **ARGS)
    with tk.strict():
        with pytest.raises(FallbackError, match="float32"):
            tk.attention(q, k, v, **ARGS)
    assert decides["n"] == 1


def test_a_misaligned_view_is_copied_on_a_hit(cpu_kernel, decides):
    """Alignment is not in the key (data pointers change every call): checked per call."""
    q, k, v = decode_step()
    tk.attention(q, k, v, **ARGS)
    buffer = torch.randn(k.numel() + 4, dtype=torch.bfloat16)
    k_off = buffer[4:].view(k.shape)  # 8 bytes past a 16-byte boundary, same strides
    assert k_off.is_contiguous() and k_off.data_ptr() % 16 == 8
    out = tk.attention(q, k_off, v, **ARGS)
    assert decides["n"] == 1
    call = cpu_kernel.decode_calls[-1]
    assert call["k"].data_ptr() % 16 == 0 and call["k"].data_ptr() != k_off.data_ptr()
    torch.testing.assert_close(out, tk.attention(q, k_off.clone(), v, **ARGS))


@pytest.mark.parametrize("patch", ["device type", "capability", "built ops", "targets", "min len kv"])
def test_the_process_wide_facts_empty_the_cache(cpu_kernel, decides, monkeypatch, patch):
    q, k, v = decode_step()
    assert prepared(q, k, v).decision.family.name == "decode"
    if patch == "device type":
        monkeypatch.setattr(_scaffold, "KERNEL_DEVICE_TYPE", "cuda")
        expected = None
    elif patch == "capability":
        cpu_kernel.set_capability((7, 5))
        expected = None
    elif patch == "built ops":
        monkeypatch.setattr(_extension, "BUILT_OPS", frozenset())
        expected = None
    elif patch == "targets":
        monkeypatch.setattr(_extension, "_TARGETS", ((9, 0, "", False),))
        expected = "decode"  # plain sm_90 code: no sm90 family, the same decision re-made
    else:
        monkeypatch.setattr(decode, "AUTO_MIN_LEN_KV", 4096)
        expected = "sm90"
    call = prepared(q, k, v)
    assert decides["n"] == 2
    assert_fresh(call, q, k, v)
    assert (call.decision.family.name if call.decision.family else None) == expected


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_uncached_calls(cpu_kernel):
    """No key: masks, 3-D inputs, tensor subclasses, nested tensors, odd argument types."""
    q, k, v = decode_step()
    assert calls.cache_key(q, k, v, None, 0.0, False, 0.125, True) is not None
    mask = torch.ones(1, k.shape[2], dtype=torch.bool)
    assert calls.cache_key(q, k, v, mask, 0.0, False, 0.125, True) is None
    assert calls.cache_key(q[0], k[0], v[0], None, 0.0, False, 0.125, True) is None
    assert calls.cache_key(q, k, v, None, 0.0, False, 0.125, 1) is None
    assert calls.cache_key(q, k, v, None, False, False, 0.125, True) is None
    assert calls.cache_key(q, k, v, None, 0.0, False, torch.tensor(0.1), True) is None
    nested = torch.nested.nested_tensor([torch.randn(2, 3, 8), torch.randn(2, 5, 8)])
    assert calls.cache_key(nested, nested, nested, None, 0.0, False, None, False) is None
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        assert calls.cache_key(fq, fk, fv, None, 0.0, False, 0.125, True) is None


def test_compiled_calls_are_traced_not_cached(cpu_kernel, decides):
    q, k, v = decode_step()

    @torch.compile(fullgraph=True, backend="eager")
    def step(q, k, v):
        return tk.attention(q, k, v, scale=0.125, enable_gqa=True)

    out = step(q, k, v)
    assert len(calls._cache) == 0
    torch.testing.assert_close(out, tk.attention(q, k, v, scale=0.125, enable_gqa=True))


def test_explain_agrees_with_the_cached_call(cpu_kernel, decides):
    q, k, v = decode_step()
    tk.attention(q, k, v, **ARGS)
    with tk.use_kernel("sm80"):
        assert tk.explain(q, k, v, **ARGS).kernel == "sm80"
        tk.attention(q, k, v, **ARGS)
        assert cpu_kernel.calls[-1] is not cpu_kernel.decode_calls[-1]  # ran sm80, not decode
    assert tk.explain(q, k, v, **ARGS).kernel == "decode"


def test_the_cache_is_bounded(cpu_kernel, decides, monkeypatch):
    monkeypatch.setattr(calls._cache, "max_entries", 4)
    q, k, v = decode_step()
    for scale in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
        prepared(q, k, v, scale=scale)
        assert len(calls._cache) <= 4
