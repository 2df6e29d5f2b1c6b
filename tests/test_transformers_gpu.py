"""attn_implementation="thunderkittens" against "sdpa" on a GPU, on a tiny Llama built from a
config (4 layers, head dim 128, 16 query / 4 key-value heads, bf16): logits of a prefill, the
gradients of a training step, 32 greedy tokens, and every prefill and decoding attention call on
a kernel (the counts of thunderkittens.integrations.transformers). transformers is optional:
without it the module is skipped."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import thunderkittens.integrations.transformers as tk_transformers  # noqa: E402
from thunderkittens._attention.decode import AUTO_MIN_LEN_KV  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

pytestmark = pytest.mark.gpu

LAYERS = 4
PROMPT = AUTO_MIN_LEN_KV  # every decoding step sees more keys: auto picks the decode kernel
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def models():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the training step's backward runs on sm_90 (elsewhere it is SDPA's)")
    config = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=LAYERS,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                         max_position_embeddings=4096)
    torch.manual_seed(0)
    name = tk_transformers.register()
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=name,
                                            dtype=torch.bfloat16).cuda()
    theirs = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa",
                                              dtype=torch.bfloat16).cuda()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def relative(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def prompt(batch=2):
    torch.manual_seed(1)
    return torch.randint(0, 1000, (batch, PROMPT), device="cuda")


def test_prefill_logits(models):
    ours, theirs = (m.eval() for m in models)
    ids = prompt()
    tk_transformers.reset_counts()
    with torch.no_grad():
        mine, reference = ours(ids).logits, theirs(ids).logits
    assert tk_transformers.counts() == {"kernel sm90": LAYERS}
    assert relative(mine, reference) < 1e-2


def test_training_step_gradients(models):
    ours, theirs = (m.train() for m in models)
    ids = prompt()
    grads = []
    tk_transformers.reset_counts()
    for model in (ours, theirs):
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
        grads.append({name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None})
    assert tk_transformers.counts() == {"kernel sm90": LAYERS}
    assert grads[0].keys() == grads[1].keys()
    worst = max(relative(grads[0][name], grads[1][name]) for name in grads[1])
    assert worst < 5e-2, worst


def test_greedy_generation(models):
    ours, theirs = (m.eval() for m in models)
    ids = prompt()
    tk_transformers.reset_counts()
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True, return_dict_in_generate=True)
    mine = ours.generate(ids, **kwargs)
    assert tk_transformers.counts() == {"kernel sm90": LAYERS, "kernel decode": LAYERS * (NEW_TOKENS - 1)}
    reference = theirs.generate(ids, **kwargs)
    tokens, expected = mine.sequences[:, PROMPT:], reference.sequences[:, PROMPT:]
    for b in range(tokens.shape[0]):
        differ = (tokens[b] != expected[b]).nonzero()
        if len(differ) == 0:
            continue
        # Bit-different kernels may break a near tie the other way; after that the sequences
        # diverge legitimately. The first differing token must have been a near tie for SDPA.
        step = int(differ[0])
        scores = reference.scores[step][b].float()
        margin = (scores[expected[b, step]] - scores[tokens[b, step]]).item()
        assert margin < 0.05 * scores.abs().max().item(), (b, step, margin)
