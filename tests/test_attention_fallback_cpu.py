"""On a machine without a GPU every call falls back to F.scaled_dot_product_attention: the
answer must be SDPA's, explain() must say fallback and why, and strict mode must raise."""

import pytest
import torch
import torch.nn.functional as F

import thunderkittens as tk
from reference import lower_right_bias
from thunderkittens import _extension


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


CALLS = {
    "fp32 full": lambda: ((randn(2, 4, 17, 64), randn(2, 4, 17, 64), randn(2, 4, 17, 64)), {}),
    "bf16 causal": lambda: ((randn(2, 4, 33, 128, dtype=torch.bfloat16),
                             randn(2, 4, 33, 128, dtype=torch.bfloat16),
                             randn(2, 4, 33, 128, dtype=torch.bfloat16)), {"is_causal": True}),
    "fp16 gqa causal lq<lk": lambda: ((randn(1, 8, 5, 64, dtype=torch.float16),
                                       randn(1, 2, 19, 64, dtype=torch.float16),
                                       randn(1, 2, 19, 64, dtype=torch.float16)),
                                      {"is_causal": True, "enable_gqa": True}),
    "fp64 lq>lk scale": lambda: ((randn(2, 2, 19, 32, dtype=torch.float64),
                                  randn(2, 2, 7, 32, dtype=torch.float64),
                                  randn(2, 2, 7, 48, dtype=torch.float64)), {"scale": 0.3}),
    "rank 3": lambda: ((randn(3, 10, 64), randn(3, 12, 64), randn(3, 12, 64)), {}),
    "rank 5": lambda: ((randn(2, 3, 4, 9, 64), randn(2, 3, 4, 9, 64), randn(2, 3, 4, 9, 64)),
                       {"is_causal": True}),
    "bool mask": lambda: ((randn(2, 4, 6, 64), randn(2, 4, 9, 64), randn(2, 4, 9, 64)),
                          {"attn_mask": torch.rand(6, 9) > 0.3}),
    "float mask": lambda: ((randn(2, 4, 6, 64), randn(2, 4, 9, 64), randn(2, 4, 9, 64)),
                           {"attn_mask": randn(2, 1, 6, 9)}),
    # The fallback keeps a lower-right bias (SDPA has no lower-right flag to turn it into).
    "lower-right lq<lk": lambda: ((randn(2, 4, 6, 64), randn(2, 4, 9, 64), randn(2, 4, 9, 64)),
                                  {"attn_mask": lower_right_bias(6, 9)}),
    "lower-right lq>lk": lambda: ((randn(2, 4, 9, 64), randn(2, 4, 6, 64), randn(2, 4, 6, 64)),
                                  {"attn_mask": lower_right_bias(9, 6)}),
}



@pytest.mark.parametrize("name", list(CALLS))
def test_cpu_fallback_returns_sdpa_answer(name):
    args, kwargs = CALLS[name]()
    out = tk.attention(*args, **kwargs)
    expected = F.scaled_dot_product_attention(*args, **kwargs)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert torch.equal(out, expected)
    assert str(tk.explain(*args, **kwargs)) == "fallback torch SDPA: inputs are on cpu; the kernels need a CUDA GPU"


def test_cpu_fallback_with_dropout_matches_sdpa_with_same_seed():
    q, k, v = (randn(2, 4, 16, 64) for _ in range(3))
    torch.manual_seed(1234)
    out = tk.attention(q, k, v, dropout_p=0.25)
    torch.manual_seed(1234)
    expected = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25)
    assert torch.equal(out, expected)


def test_cpu_fallback_keeps_autograd():
    q, k, v = (randn(2, 4, 16, 64).requires_grad_() for _ in range(3))
    tk.attention(q, k, v, is_causal=True).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    for ours, theirs in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(ours, theirs)


def test_explain_result_fields():
    q, k, v = (randn(2, 4, 16, 64) for _ in range(3))
    result = tk.explain(q, k, v)
    assert isinstance(result, tk.AttentionPlan)
    assert not result.uses_kernel and result.kernel is None
    assert "cpu" in result.reason


def test_meta_tensors_fall_back_too():
    q, k, v = (torch.empty(2, 4, 16, 64, device="meta", dtype=torch.bfloat16) for _ in range(3))
    assert tk.attention(q, k, v).shape == (2, 4, 16, 64)
    assert "inputs are on meta" in str(tk.explain(q, k, v))


# ---- strict mode --------------------------------------------------------------------------


def test_strict_context_manager_raises_with_reason():
    q, k, v = (randn(2, 4, 16, 64) for _ in range(3))
    with tk.strict():
        with pytest.raises(tk.FallbackError, match="inputs are on cpu"):
            tk.attention(q, k, v)
        assert tk.strict_enabled()
        assert "strict mode" in str(tk.explain(q, k, v))  # explain itself never raises
    assert not tk.strict_enabled()
    tk.attention(q, k, v)  # no longer strict


def test_fallback_error_is_a_runtime_error():
    assert issubclass(tk.FallbackError, RuntimeError)


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_strict_env_var_raises(monkeypatch, value):
    monkeypatch.setenv("TK_STRICT", value)
    q, k, v = (randn(2, 4, 16, 64) for _ in range(3))
    with pytest.raises(tk.FallbackError, match="fall back to torch SDPA: inputs are on cpu"):
        tk.attention(q, k, v)


@pytest.mark.parametrize("value", ["", "0", "false", "No", "off"])
def test_strict_env_var_off(monkeypatch, value):
    monkeypatch.setenv("TK_STRICT", value)
    q, k, v = (randn(2, 4, 16, 64) for _ in range(3))
    assert not tk.strict_enabled()
    tk.attention(q, k, v)


def test_strict_env_var_bad_value(monkeypatch):
    monkeypatch.setenv("TK_STRICT", "maybe")
    with pytest.raises(ValueError, match="TK_STRICT must be one of"):
        tk.strict_enabled()


def test_strict_false_overrides_env(monkeypatch):
    monkeypatch.setenv("TK_STRICT", "1")
    q, k, v = (randn(2, 4, 16, 64) for _ in range(3))
    with tk.strict(False):
        tk.attention(q, k, v)
    with pytest.raises(tk.FallbackError):
        tk.attention(q, k, v)


def test_strict_rejects_non_bool():
    with pytest.raises(TypeError, match="enabled must be a bool"):
        with tk.strict("yes"):
            pass


def test_strict_context_restored_after_exception():
    with pytest.raises(KeyError):
        with tk.strict():
            raise KeyError("boom")
    assert not tk.strict_enabled()


# ---- fallback reasons, with the CPU standing in for a capable GPU ---------------------------


def bf16(*shape, requires_grad=False):
    return torch.randn(*shape, dtype=torch.bfloat16, requires_grad=requires_grad)


def reason_of(*args, **kwargs):
    result = tk.explain(*args, **kwargs)
    assert not result.uses_kernel, str(result)
    return str(result)


def test_kernel_path_when_everything_is_supported(cpu_kernel):
    assert str(tk.explain(bf16(2, 8, 16, 128), bf16(2, 2, 16, 128), bf16(2, 2, 16, 128),
                          is_causal=True, enable_gqa=True)) == \
        "kernel tk.attention_fwd_sm90 [sm90 wgmma+tma] bf16 d=128 causal gqa=4"
    half = torch.randn(2, 4, 16, 64, dtype=torch.float16)
    assert str(tk.explain(half, half, half)) == "kernel tk.attention_fwd_sm90 [sm90 wgmma+tma] fp16 d=64 full"
    with tk.use_kernel("sm80"):
        assert str(tk.explain(half, half, half)) == \
            "kernel tk.attention_fwd_sm80 [sm80 mma.sync] fp16 d=64 full"


def test_sm90_family_needs_exactly_sm90(cpu_kernel, monkeypatch):
    monkeypatch.setattr(_extension, "has_kernel_image_for", lambda capability: True)  # any build
    half = torch.randn(2, 4, 16, 64, dtype=torch.float16)
    cpu_kernel.set_capability((8, 9))
    assert str(tk.explain(half, half, half)).startswith("kernel tk.attention_fwd_sm80 [sm80 mma.sync]")
    with tk.use_kernel("sm90"):
        assert ("kernel sm90 was forced but the sm90 kernels need an sm_90 GPU, this one is sm_89"
                in str(tk.explain(half, half, half)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reason_dtype(cpu_kernel, dtype):
    q = torch.randn(2, 4, 16, 64, dtype=dtype)
    assert reason_of(q, q, q) == (f"fallback torch SDPA: dtype {dtype} is not supported by the "
                                  "kernel (bfloat16 and float16 only)")


@pytest.mark.parametrize("head_dim", [16, 32, 80, 112, 256])
def test_reason_head_dim(cpu_kernel, head_dim):
    q = bf16(2, 4, 16, head_dim)
    assert f"head dim {head_dim} is not supported by the kernel (64, 96 or 128 only)" in reason_of(q, q, q)


def test_reason_value_head_dim(cpu_kernel):
    q = bf16(2, 4, 16, 64)
    assert "value head dim 128 differs from query head dim 64" in reason_of(q, q, bf16(2, 4, 16, 128))


def test_reason_attn_mask(cpu_kernel):
    q = bf16(2, 4, 16, 64)
    assert reason_of(q, q, q, attn_mask=torch.ones(16, 16, dtype=torch.bool)) == \
        ("fallback torch SDPA: attn_mask is not supported by the kernel yet (only the causal "
         "biases causal_upper_left and causal_lower_right are)")


def test_reason_dropout(cpu_kernel):
    q = bf16(2, 4, 16, 64)
    assert "dropout_p > 0 is not supported by the kernel yet" in reason_of(q, q, q, dropout_p=0.1)
    assert tk.explain(q, q, q, dropout_p=0.0).uses_kernel


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_requires_grad_takes_the_sm90_kernel(cpu_kernel, which):
    tensors = {name: bf16(2, 4, 16, 64, requires_grad=(name == which))
               for name in ("query", "key", "value")}
    assert str(tk.explain(**tensors)) == ("kernel tk.attention_fwd_sm90 [sm90 wgmma+tma] bf16 "
                                          "d=64 full + backward tk.attention_bwd_sm90")
    with torch.no_grad():
        assert str(tk.explain(**tensors)) == "kernel tk.attention_fwd_sm90 [sm90 wgmma+tma] bf16 d=64 full"


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_reason_requires_grad_on_sm80(cpu_kernel, monkeypatch, which):
    monkeypatch.setattr(_extension, "has_kernel_image_for", lambda capability: True)  # any build
    tensors = {name: bf16(2, 4, 16, 64, requires_grad=(name == which))
               for name in ("query", "key", "value")}
    cpu_kernel.set_capability((8, 6))  # auto picks sm80, which has no backward
    assert reason_of(**tensors) == (
        f"fallback torch SDPA: {which} requires grad and the sm80 kernels have no backward "
        "(kernels with a backward: sm90); under torch.no_grad() or torch.inference_mode() "
        "the kernel runs")
    for no_grad in (torch.no_grad, torch.inference_mode):
        with no_grad():
            assert str(tk.explain(**tensors)) == \
                "kernel tk.attention_fwd_sm80 [sm80 mma.sync] bf16 d=64 full"


def test_reason_requires_grad_with_sm80_forced(cpu_kernel):
    q, k, v = (bf16(2, 4, 16, 64, requires_grad=True) for _ in range(3))
    with tk.use_kernel("sm80"):
        assert reason_of(q, k, v).startswith(
            "fallback torch SDPA: kernel sm80 was forced but query requires grad and the sm80 "
            "kernels have no backward")
        with torch.no_grad():
            assert tk.explain(q, k, v).uses_kernel
        with tk.strict(), pytest.raises(tk.FallbackError, match="sm80 kernels have no backward"):
            tk.attention(q, k, v)


def test_requires_grad_fallback_on_sm80_gives_gradients(cpu_kernel):
    q, k, v = (bf16(2, 4, 16, 64, requires_grad=True) for _ in range(3))
    with tk.use_kernel("sm80"):
        tk.attention(q, k, v).float().sum().backward()
    assert not cpu_kernel.calls and not cpu_kernel.backward.calls  # SDPA ran, not the ops
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))


def test_reason_op_family_not_built(cpu_kernel, monkeypatch):
    monkeypatch.setattr(_extension, "BUILT_OPS", frozenset())
    q = bf16(2, 4, 16, 64)
    assert "attention op family was not compiled into this build" in reason_of(q, q, q)


def test_reason_old_gpu(cpu_kernel):
    cpu_kernel.set_capability((7, 5))
    q = bf16(2, 4, 16, 64)
    assert reason_of(q, q, q) == (
        "fallback torch SDPA: the sm90 kernels need an sm_90 GPU, this one is sm_75; "
        "the sm80 kernels need sm_80 or newer, this GPU is sm_75")
    with tk.use_kernel("sm80"):
        assert "kernel sm80 was forced but the sm80 kernels need sm_80 or newer" in reason_of(q, q, q)


def test_reason_gpu_not_in_build(cpu_kernel, monkeypatch):
    monkeypatch.setattr(_extension, "_TARGETS", ((9, 0, "a", False),))
    cpu_kernel.set_capability((8, 6))
    q = bf16(2, 4, 16, 64)
    assert "this build has no code for sm_86" in reason_of(q, q, q)
    assert "TK_CUDA_ARCHS=86" in reason_of(q, q, q)


def test_strict_raises_on_kernel_capable_device_too(cpu_kernel):
    q = bf16(2, 4, 16, 64)
    with tk.strict():
        tk.attention(q, q, q)  # kernel path: no error
        with pytest.raises(tk.FallbackError, match="attn_mask is not supported"):
            tk.attention(q, q, q, attn_mask=torch.ones(16, 16, dtype=torch.bool))


# ---- SDPA's causal biases (torch.nn.attention.bias) ------------------------------------------


def test_causal_upper_left_bias_runs_the_kernel_as_is_causal(cpu_kernel):
    from torch.nn.attention.bias import causal_upper_left
    q, k = bf16(2, 4, 16, 64), bf16(2, 4, 24, 64)
    bias = causal_upper_left(16, 24)
    assert str(tk.explain(q, k, k, attn_mask=bias)) == \
        "kernel tk.attention_fwd_sm90 [sm90 wgmma+tma] bf16 d=64 causal"
    out = tk.attention(q, k, k, attn_mask=bias)
    assert cpu_kernel.calls[-1]["is_causal"] is True
    expected = F.scaled_dot_product_attention(q.float(), k.float(), k.float(), attn_mask=bias)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_causal_lower_right_bias_with_equal_lengths_runs_the_kernel(cpu_kernel):
    from torch.nn.attention.bias import causal_lower_right
    q = bf16(2, 4, 20, 64)
    bias = causal_lower_right(20, 20)
    assert tk.explain(q, q, q, attn_mask=bias).uses_kernel
    out = tk.attention(q, q, q, attn_mask=bias)
    assert cpu_kernel.calls[-1]["is_causal"] is True
    expected = F.scaled_dot_product_attention(q.float(), q.float(), q.float(), attn_mask=bias)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("family, plan_prefix", [
    ("auto", "kernel tk.attention_fwd_sm90 [sm90 wgmma+tma]"),
    ("sm80", "kernel tk.attention_fwd_sm80 [sm80 mma.sync]"),
])
@pytest.mark.parametrize("len_q, len_kv", [(16, 24), (24, 16), (1, 40), (40, 3)])
def test_causal_lower_right_bias_with_unequal_lengths_runs_the_kernel(cpu_kernel, family,
                                                                      plan_prefix, len_q, len_kv):
    q, k, v = bf16(2, 8, len_q, 64), bf16(2, 2, len_kv, 64), bf16(2, 2, len_kv, 64)
    bias = lower_right_bias(len_q, len_kv)
    with tk.use_kernel(family):
        assert str(tk.explain(q, k, v, attn_mask=bias, enable_gqa=True)) == \
            f"{plan_prefix} bf16 d=64 causal lower-right gqa=4"
        with tk.strict():
            out = tk.attention(q, k, v, attn_mask=bias, enable_gqa=True)
    call = cpu_kernel.calls[-1]
    assert call["is_causal"] is True and call["lower_right"] is True
    # SDPA on the CPU (math backend) gives the rows that see no key (Lq > Lk: the first
    # Lq - Lk) exactly 0, as the kernels do.
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias,
                                              enable_gqa=True)
    hidden = max(0, len_q - len_kv)
    assert torch.all(expected[:, :, :hidden] == 0)
    assert torch.isfinite(out).all()
    assert torch.all(out[:, :, :hidden] == 0)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_causal_upper_left_bias_with_unequal_lengths_is_not_lower_right(cpu_kernel):
    from torch.nn.attention.bias import causal_upper_left
    q, k = bf16(2, 4, 24, 64), bf16(2, 4, 16, 64)
    tk.attention(q, k, k, attn_mask=causal_upper_left(24, 16))
    assert cpu_kernel.calls[-1]["lower_right"] is False


def test_causal_lower_right_bias_fallback_keeps_the_bias(cpu_kernel):
    # float32 is not a kernel dtype: SDPA must get the lower-right bias itself, not is_causal
    # (top-left, a different mask when Lq != Lk).
    q, k = randn(2, 4, 16, 64), randn(2, 4, 24, 64)
    bias = lower_right_bias(16, 24)
    assert "dtype torch.float32 is not supported" in reason_of(q, k, k, attn_mask=bias)
    out = tk.attention(q, k, k, attn_mask=bias)
    assert not cpu_kernel.calls
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, k, attn_mask=bias))
    assert not torch.allclose(out, F.scaled_dot_product_attention(q, k, k, is_causal=True))


def test_causal_bias_for_other_lengths_is_an_error(cpu_kernel):
    from torch.nn.attention.bias import causal_upper_left
    q = bf16(2, 4, 16, 64)
    with pytest.raises(ValueError, match=r"causal bias for \(Lq, Lk\) = \(8, 16\) but query and key "
                                         r"have lengths \(16, 16\)"):
        tk.attention(q, q, q, attn_mask=causal_upper_left(8, 16))


@pytest.mark.parametrize("mask", ["none", "bool", "additive", "lower_right"])
def test_flash_avoided_only_where_sdpa_could_pick_it(monkeypatch, mask):
    """The fallback runs without SDPA's flash backend where flash could split the keys, but a
    call with a mask tensor never reaches flash (it takes none): no note, no changed backends."""
    from thunderkittens._attention import plan
    monkeypatch.setattr(plan, "flash_may_split_keys", lambda query, key, dropout_p: True)
    q, k, v = (torch.randn(1, 2, n, 80) for n in (4, 1000, 1000))
    masks = {"none": None, "bool": torch.rand(4, 1000) > 0.5, "additive": torch.randn(4, 1000),
             "lower_right": lower_right_bias(4, 1000)}
    call = plan.fallback_call(q, k, v, masks[mask], 0.0, False)
    assert call.without_flash == (mask in ("none", "lower_right")), call
