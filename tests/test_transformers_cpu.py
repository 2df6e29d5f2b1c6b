"""thunderkittens.integrations.transformers on the CPU, on a tiny Llama built from a config (no
downloads): registration, logits and greedy tokens equal to attn_implementation="sdpa", the
paths calls take (tk.attention, transformers' SDPA function for masks, eager for softcap) and
their counts, and the kernel path with the CPU standing in for a GPU. transformers is optional:
without it the module is skipped."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import thunderkittens.integrations.transformers as tk_transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

LAYERS = 2


def tiny_llama_config(**overrides):
    config = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config.update(overrides)
    return LlamaConfig(**config)


def twin_models(config, dtype=torch.float32):
    """(thunderkittens model, sdpa model) with the same weights, in eval mode."""
    torch.manual_seed(0)
    name = tk_transformers.register()
    # Each its own copy of the config: a model keeps (and sets its attention in) the one it gets.
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=name, dtype=dtype).eval()
    theirs = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa", dtype=dtype).eval()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.fixture(autouse=True)
def fresh_counts():
    tk_transformers.reset_counts()
    yield


def test_register_adds_the_attention_and_mask_functions():
    assert tk_transformers.register() == "thunderkittens"
    assert AttentionInterface._global_mapping["thunderkittens"] is tk_transformers.attention_forward
    assert "thunderkittens" in AttentionMaskInterface._global_mapping
    model, _ = twin_models(tiny_llama_config())
    assert model.config._attn_implementation == "thunderkittens"


def test_import_thunderkittens_does_not_import_transformers():
    from fresh_process import run_in_fresh_process
    assert run_in_fresh_process(
        "import sys, thunderkittens; print('transformers' in sys.modules)").stdout.strip() == "False"


def test_logits_and_greedy_tokens_equal_sdpa_on_the_fallback():
    ours, theirs = twin_models(tiny_llama_config())
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-5, rtol=1e-5)
    assert tk_transformers.counts() == {
        "tk fallback: inputs are on cpu; the kernels need a CUDA GPU": LAYERS}
    tokens = ours.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(tokens, theirs.generate(ids, max_new_tokens=8, do_sample=False))
    assert sum(tk_transformers.counts().values()) == LAYERS * (1 + 8)  # prefill, then a step per token
    assert "tk fallback: inputs are on cpu" in tk_transformers.report()


def test_padding_masks_go_to_transformers_sdpa():
    ours, theirs = twin_models(tiny_llama_config())
    ids = torch.randint(0, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, attention_mask=mask).logits,
                                   theirs(ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)
    assert tk_transformers.counts() == {"sdpa: attention mask": LAYERS}


def test_sliding_window_masks_go_to_transformers_sdpa():
    from transformers import MistralConfig
    config = MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=4)
    ours, theirs = twin_models(config)
    ids = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-5, rtol=1e-5)
    assert tk_transformers.counts() == {"sdpa: attention mask": LAYERS}


class Module(torch.nn.Module):
    is_causal = True


def attention_inputs(len_q=5, len_kv=5):
    torch.manual_seed(1)
    return (torch.randn(2, 4, len_q, 16), torch.randn(2, 2, len_kv, 16), torch.randn(2, 2, len_kv, 16))


def test_softcap_takes_the_eager_path():
    q, k, v = attention_inputs()
    out, weights = tk_transformers.attention_forward(Module().eval(), q, k, v, None, scaling=0.25, softcap=2.0)
    assert weights is None and out.shape == (2, 5, 4, 16)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = torch.tanh(q @ kk.transpose(2, 3) * 0.25 / 2.0) * 2.0
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    expected = (torch.softmax(scores, -1) @ vv).transpose(1, 2)
    torch.testing.assert_close(out, expected)
    assert tk_transformers.counts() == {"eager: softcap": 1}


@pytest.mark.parametrize("len_q, len_kv, causal", [(5, 5, True), (1, 7, False), (3, 8, True)])
def test_flags_match_transformers_sdpa(len_q, len_kv, causal):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    module = Module()
    module.num_key_value_groups = 2
    q, k, v = attention_inputs(len_q, len_kv)
    ours, _ = tk_transformers.attention_forward(module, q, k, v, None, scaling=0.3)
    theirs, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.3)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)


def test_dropout_goes_to_transformers_sdpa():
    q, k, v = attention_inputs()
    module = Module().train()
    module.num_key_value_groups = 2
    tk_transformers.attention_forward(module, q, k, v, None, dropout=0.1)
    assert tk_transformers.counts() == {"sdpa: dropout": 1}


def test_kernel_path_on_the_cpu_stand_in(cpu_kernel):
    # The CPU is an sm_90 GPU here (conftest.cpu_kernel): every unmasked call runs the sm90
    # stand-in, and the logits are the sdpa model's.
    ours, theirs = twin_models(tiny_llama_config(head_dim=64), dtype=torch.bfloat16)
    ids = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits.float(), theirs(ids).logits.float(), atol=5e-2, rtol=5e-2)
    assert tk_transformers.counts() == {"kernel sm90": LAYERS}
    assert len(cpu_kernel.calls) == LAYERS
    call = cpu_kernel.calls[0]
    assert call["is_causal"] is True and call["k"].shape[1] == 2  # GQA: the kv heads, not copies
