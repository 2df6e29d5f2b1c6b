"""benchmarks/generate.py on the CPU: its model is the shape the end-to-end target names, the
greedy check runs through attn_implementation="thunderkittens" on a tiny model (where
tk.attention falls back) and reports the calls' paths and the tokens, strict mode shows a
fallback as an error, the greedy comparison finds differences and tells near ties from real
ones, and the records make a table. The timing itself needs a GPU (python -m benchmarks)."""

from types import SimpleNamespace

import pytest
import torch

from test_power import benchmarks_module

FALLBACK = "tk fallback: inputs are on cpu; the kernels need a CUDA GPU"


@pytest.fixture(scope="module")
def generate():
    return benchmarks_module("generate")


def tiny(generate):
    return generate.Config(batch=2, prompt=12, new_tokens=4, layers=2, heads_q=4, heads_kv=2, head_dim=16,
                           hidden=64, intermediate=128, vocab=97)


def test_the_timed_model_has_the_target_shape(generate):
    pytest.importorskip("transformers")
    (cfg,) = generate.CONFIGS
    assert (cfg.batch, cfg.prompt, cfg.new_tokens) == (8, 2048, 256)
    config = cfg.llama_config()
    assert config.num_hidden_layers == 4 and config.head_dim == 128
    assert (config.num_attention_heads, config.num_key_value_heads) == (16, 4)
    assert config.hidden_size == config.num_attention_heads * config.head_dim
    assert config.max_position_embeddings >= cfg.prompt + cfg.new_tokens
    for quick in generate.QUICK_CONFIGS:
        assert quick.prompt + quick.new_tokens <= quick.llama_config().max_position_embeddings


def test_greedy_check_through_the_registered_implementation(generate):
    pytest.importorskip("transformers")
    cfg = tiny(generate)
    models = generate.build_models(cfg, "cpu", torch.float32)
    inputs = generate.prompt_inputs(cfg, "cpu")
    checked = generate.check(models, inputs, cfg, strict=False)
    # A prefill and a step per further token, each layer once; the sdpa model never calls ours.
    assert checked["attention_calls"] == {FALLBACK: cfg.layers * cfg.new_tokens}
    assert checked["all_on_kernel"] is False
    assert checked["greedy"] == {"sequences": 2, "identical_sequences": 2, "first_difference": [None, None],
                                 "same_tokens": True, "differences_near_ties": True}
    with torch.no_grad():
        assert generate.prefill(models["tk"], inputs).logits.shape == (2, 1, cfg.vocab)
    # Strict mode, as the benchmark times ours: the CPU fallback is an error in the record.
    assert generate.check(models, inputs, cfg, strict=True)["error"].startswith("FallbackError")


def outputs(tokens, scores):
    """A generate output (sequences after a one-token prompt, per-step scores) for compare_greedy."""
    sequences = torch.tensor([[0] + row for row in tokens])
    return SimpleNamespace(sequences=sequences, scores=[torch.tensor(step) for step in scores])


def test_compare_greedy_finds_differences_and_near_ties(generate):
    reference = outputs([[1, 2, 0], [2, 2, 2]], [[[0.0, 1.0, 0.98], [0.0, 0.0, 1.0]],
                                                 [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]],
                                                 [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])
    same = generate.compare_greedy(outputs([[1, 2, 0], [2, 2, 2]], []), reference, prompt=1)
    assert same["same_tokens"] and same["identical_sequences"] == 2
    # Sequence 0 differs at step 0, where the reference preferred token 1 by 0.02 of 1.0: a near tie.
    tie = generate.compare_greedy(outputs([[2, 0, 0], [2, 2, 2]], []), reference, prompt=1)
    assert tie["first_difference"] == [0, None] and not tie["same_tokens"] and tie["differences_near_ties"]
    # Sequence 1 differs at step 1, where the reference preferred token 2 by the whole score.
    real = generate.compare_greedy(outputs([[2, 0, 0], [2, 0, 2]], []), reference, prompt=1)
    assert real["first_difference"] == [0, 1] and real["identical_sequences"] == 0
    assert not real["differences_near_ties"]


def test_records_make_a_table(generate):
    report = benchmarks_module("report")
    cfg = tiny(generate)
    checked = {"attention_calls": {"kernel sm90": 2, "kernel decode": 6}, "all_on_kernel": True,
               "greedy": {"sequences": 2, "identical_sequences": 2, "first_difference": [None, None],
                          "same_tokens": True, "differences_near_ties": True}}
    results = {"tk": {"ms": 10.0, "tokens_per_s": 800.0}, "sdpa": {"ms": 12.5, "tokens_per_s": 640.0}}
    record = generate.record("generate", cfg, results, checked)
    assert record["ratio_vs_reference"] == pytest.approx(1.25)
    table = report.format_table([record], ["tk", "sdpa"], generate.REFERENCE, generate.OURS)
    assert "800" in table and "640" in table and "1.25" in table
    assert report.table_units([record]) == "tokens/s"
    assert "all on kernels" in generate._summary(record)


def test_without_transformers_the_op_is_skipped(generate, monkeypatch):
    monkeypatch.setattr(generate, "transformers_available", lambda: False)
    lines = []
    assert generate.run(log=lines.append) == ([], ["tk", "sdpa"])
    assert "transformers is not installed" in lines[0]
