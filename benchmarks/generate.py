"""End to end: greedy generation with Hugging Face transformers, attn_implementation=
"thunderkittens" (thunderkittens.integrations.transformers, "tk") against "sdpa", on a small
Llama built from a config (random weights, no downloads), in tokens/s.

The model: 4 layers of 16 query / 4 key-value heads of 128, hidden size 2048, MLP 8192, a tied
vocabulary of 128256 (Llama 3.2 1B's widths with heads of 128 and 4 layers), bf16. The run:
batch 8, a prompt of 2048 random tokens (attention mask of ones, as a tokenizer gives it), 256
new tokens (--quick: prompt 512, 64 new tokens).

Pass "generate": model.generate(ids, attention_mask=..., max_new_tokens=N, do_sample=False) with
no end-of-sequence token, so every call makes exactly N tokens; tokens/s = batch * N / time.
Pass "prefill": one forward of the prompt as generate's first step makes it (cache filled,
logits of the last position only); tokens/s = batch * prompt / time. Calls are timed whole (host
clock between CUDA synchronisations: a generate loop waits for the GPU every step) in alternating
rounds, each implementation first in turn, medians (timing.interleaved_wall_ms). Ours runs in
strict mode with the --kernel choice, so a fallback of tk.attention raises ('-' in the table).

Before the timing, one greedy generation per implementation (the warm-up too) checks:
  * our attention calls by path, from the integration's counters ("attention_calls"): every
    prefill and decoding call should be on a kernel (the forward kernel for the prompt, the
    decode kernel for each new token): "all_on_kernel";
  * our greedy tokens against sdpa's ("greedy"): sequences identical, or for each that is not,
    the step of the first difference and whether that token was a near tie in sdpa's scores
    (bit-different attention may break a near tie the other way, and the sequence diverges
    legitimately after it): "same_tokens", "differences_near_ties".

transformers is optional: without it the op is skipped with a message and records nothing.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import asdict, dataclass

import torch

import thunderkittens as tk

from .report import error_record

OURS = "tk"
REFERENCE = "sdpa"
ATTN_IMPLEMENTATION = {OURS: "thunderkittens", REFERENCE: "sdpa"}

# A first differing token counts as a near tie when sdpa preferred its own token by less than
# this fraction of the largest score magnitude of that step (tests/test_transformers_gpu.py).
NEAR_TIE = 0.05


@dataclass(frozen=True)
class Config:
    batch: int
    prompt: int
    new_tokens: int
    layers: int = 4
    heads_q: int = 16
    heads_kv: int = 4
    head_dim: int = 128
    hidden: int = 2048
    intermediate: int = 8192
    vocab: int = 128256

    @property
    def name(self) -> str:
        return (f"b{self.batch} prompt{self.prompt} new{self.new_tokens} "
                f"l{self.layers} hq{self.heads_q} hkv{self.heads_kv} d{self.head_dim}")

    def llama_config(self):
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads_q,
                           num_key_value_heads=self.heads_kv, head_dim=self.head_dim,
                           max_position_embeddings=self.prompt + self.new_tokens, rope_theta=500000.0,
                           tie_word_embeddings=True)


CONFIGS = [Config(8, 2048, 256)]
QUICK_CONFIGS = [Config(8, 512, 64)]
ROUNDS = {"generate": 11, "prefill": 20}
QUICK_ROUNDS = {"generate": 2, "prefill": 6}


def transformers_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def build_models(cfg: Config, device, dtype: torch.dtype) -> dict:
    """{name: model} for OURS and REFERENCE, with the same random weights, in eval mode."""
    from transformers import AutoModelForCausalLM

    import thunderkittens.integrations.transformers as tk_transformers

    tk_transformers.register()
    torch.manual_seed(0)
    models = {}
    for name, implementation in ATTN_IMPLEMENTATION.items():
        with torch.device(device):
            # Each its own copy of the config: a model keeps (and sets its attention in) the one it gets.
            models[name] = AutoModelForCausalLM.from_config(
                copy.deepcopy(cfg.llama_config()), attn_implementation=implementation, dtype=dtype
            ).to(device).eval()
    models[REFERENCE].load_state_dict(models[OURS].state_dict())
    return models


def prompt_inputs(cfg: Config, device) -> dict:
    generator = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.prompt), generator=generator).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def implementation_context(name: str, kernel: str, strict: bool):
    """Ours with the kernel choice, in strict mode where asked; sdpa as it is."""
    if name != OURS:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(tk.use_kernel(kernel))
    stack.enter_context(tk.strict(strict))
    return stack


def generate(model, inputs: dict, cfg: Config, **kwargs):
    return model.generate(**inputs, max_new_tokens=cfg.new_tokens, do_sample=False, eos_token_id=None, **kwargs)


def prefill(model, inputs: dict):
    return model(**inputs, logits_to_keep=1)


def compare_greedy(mine, reference, prompt: int) -> dict:
    """Our greedy sequences against sdpa's (generate outputs with scores); see the module doc."""
    tokens, expected = mine.sequences[:, prompt:], reference.sequences[:, prompt:]
    first_difference, near_ties = [], []
    for b in range(expected.shape[0]):
        differ = (tokens[b] != expected[b]).nonzero()
        if len(differ) == 0:
            first_difference.append(None)
            continue
        step = int(differ[0])
        first_difference.append(step)
        scores = reference.scores[step][b].float()
        margin = (scores[expected[b, step]] - scores[tokens[b, step]]).item()
        near_ties.append(margin < NEAR_TIE * scores.abs().max().item())
    return {"sequences": len(first_difference),
            "identical_sequences": sum(step is None for step in first_difference),
            "first_difference": first_difference,
            "same_tokens": all(step is None for step in first_difference),
            "differences_near_ties": all(near_ties)}


def check(models: dict, inputs: dict, cfg: Config, kernel: str = "auto", strict: bool = True) -> dict:
    """One greedy generation per implementation (with scores): our attention calls by path, and
    the greedy tokens compared with sdpa's. Returns {"attention_calls", "all_on_kernel",
    "greedy"} or {"error"} where ours raised."""
    import thunderkittens.integrations.transformers as tk_transformers

    outputs = {}
    for name, model in models.items():
        tk_transformers.reset_counts()
        try:
            with implementation_context(name, kernel, strict), torch.no_grad():
                outputs[name] = generate(model, inputs, cfg, output_scores=True, return_dict_in_generate=True)
        except Exception as error:  # noqa: BLE001 - reported in the record, not fatal
            return error_record(error)
        if name == OURS:
            calls = tk_transformers.counts()
    tk_transformers.reset_counts()
    return {"attention_calls": calls,
            "all_on_kernel": bool(calls) and all(path.startswith("kernel ") for path in calls),
            "greedy": compare_greedy(outputs[OURS], outputs[REFERENCE], cfg.prompt)}


def _timings(models: dict, inputs: dict, cfg: Config, kernel: str, rounds: dict) -> dict:
    from .timing import interleaved_wall_ms

    calls = {"generate": lambda model: generate(model, inputs, cfg), "prefill": lambda model: prefill(model, inputs)}
    tokens = {"generate": cfg.batch * cfg.new_tokens, "prefill": cfg.batch * cfg.prompt}
    results = {}
    for pass_name, call in calls.items():
        def timed(name, call=call):
            def run():
                with implementation_context(name, kernel, True), torch.no_grad():
                    call(models[name])
            return run
        times = interleaved_wall_ms({name: timed(name) for name in models}, rounds=rounds[pass_name])
        results[pass_name] = {name: {"ms": ms, "tokens_per_s": tokens[pass_name] / (ms * 1e-3)}
                              for name, ms in times.items()}
        if pass_name == "generate":
            for r in results[pass_name].values():
                r["ms_per_token"] = r["ms"] / cfg.new_tokens
    return results


def record(pass_name: str, cfg: Config, results: dict, checked: dict) -> dict:
    mine = results.get(OURS, {}).get("tokens_per_s")
    reference = results.get(REFERENCE, {}).get("tokens_per_s")
    ratio = mine / reference if mine and reference else None
    return {"op": "generate", "pass": pass_name, "config_name": cfg.name, "config": asdict(cfg),
            "dtype": "bfloat16", "metric": "tokens_per_s", "results": results,
            "best_peer": REFERENCE if reference else None,
            "ratio_vs_reference": ratio, "ratio_vs_best_peer": ratio, **checked}


def _summary(rec: dict) -> str:
    cells = " ".join(f"{n}={r['tokens_per_s']:.0f}tok/s" if "tokens_per_s" in r else f"{n}=-"
                     for n, r in rec["results"].items())
    ratio = f" ({rec['ratio_vs_reference']:.2f}x)" if rec["ratio_vs_reference"] else ""
    line = f"  {rec['pass']} {rec['config_name']}: {cells}{ratio}"
    if "error" in rec:
        return line + f"  [{OURS} failed: {rec['error']}]"
    calls = ", ".join(f"{path} {n}" for path, n in rec["attention_calls"].items())
    greedy = rec["greedy"]
    same = (f"{greedy['identical_sequences']}/{greedy['sequences']} sequences identical"
            + ("" if greedy["same_tokens"] else
               f", first differences at {greedy['first_difference']}, "
               f"{'all' if greedy['differences_near_ties'] else 'NOT all'} near ties"))
    return (line + f"\n    attention calls: {calls} ({'all' if rec['all_on_kernel'] else 'NOT all'} on kernels);"
            f" greedy tokens: {same}")


def run(kernel: str = "auto", quick: bool = False, log=print) -> tuple[list[dict], list[str]]:
    names = [OURS, REFERENCE]
    if not transformers_available():
        log("  generate skipped: transformers is not installed (pip install transformers)")
        return [], names
    records = []
    for cfg in QUICK_CONFIGS if quick else CONFIGS:
        models = build_models(cfg, "cuda", torch.bfloat16)
        inputs = prompt_inputs(cfg, "cuda")
        checked = check(models, inputs, cfg, kernel)
        if "error" in checked:  # ours raised: sdpa is timed alone
            models.pop(OURS)
        results = _timings(models, inputs, cfg, kernel, QUICK_ROUNDS if quick else ROUNDS)
        if "error" in checked:
            results = {p: {OURS: checked, **r} for p, r in results.items()}
        for pass_name in ("generate", "prefill"):
            records.append(record(pass_name, cfg, results[pass_name], checked))
            log(_summary(records[-1]))
        del models, inputs
        torch.cuda.empty_cache()
    return records, names
