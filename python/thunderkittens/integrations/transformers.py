"""``attn_implementation="thunderkittens"`` for Hugging Face transformers.

    import thunderkittens.integrations.transformers as tk_transformers
    tk_transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="thunderkittens")
    ...
    print(tk_transformers.report())   # how many attention calls took which path

register() adds an attention function to transformers' AttentionInterface and, under the same
name, SDPA's mask function to its AttentionMaskInterface (so the model builds the masks SDPA
would get: none where a causal flag is enough, which is what lets the kernels run). Every
attention call of the model then comes here:

  * no mask, no dropout, no softcap: tk.attention with SDPA's flags (is_causal for prefill,
    none for a single decoding token), GQA through enable_gqa (no repeated key/value copies).
    tk.attention runs its kernels (the decode kernel for short queries against long caches,
    the sm90 kernels and their backward for training) or, where they cannot (CPU, other
    dtypes or head dims), SDPA; see tk.explain;
  * an attention mask (padding, sliding windows, packed sequences), dropout, position biases,
    output_attentions: transformers' own SDPA attention function, unchanged;
  * a logit softcap (SDPA has none): the eager computation (scores, tanh cap, mask, softmax).

Each call is counted under its path ("kernel <family>", "tk fallback: <reason>",
"sdpa: <reason>", "eager: softcap"): counts(), report(), reset_counts().

transformers is imported when this module is, never by ``import thunderkittens``.
"""

from __future__ import annotations

import collections
import math

import torch

from thunderkittens._attention import api as _api
from thunderkittens._attention import calls as _calls
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "thunderkittens"

_counts: collections.Counter[str] = collections.Counter()


def register(name: str = NAME) -> str:
    """Registers the attention function (and SDPA's mask function) as ``name``; returns the name
    to pass as ``attn_implementation``. Registering again is harmless."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def counts() -> dict[str, int]:
    """Attention calls since the last reset_counts(), by path."""
    return dict(_counts)


def reset_counts() -> None:
    _counts.clear()


def report() -> str:
    """One line per path, most calls first."""
    total = sum(_counts.values())
    lines = [f"thunderkittens attention: {total} calls"]
    lines += [f"  {n:8d}  {path}" for path, n in _counts.most_common()]
    return "\n".join(lines)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function signature: query (B, Hq, L, D), key/value
    (B, Hkv, S, D); returns ((B, L, Hq, D), None)."""
    softcap = kwargs.get("softcap")
    if softcap is not None:
        _counts["eager: softcap"] += 1
        return _eager_softcap(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                              softcap), None
    reason = _sdpa_reason(attention_mask, dropout, kwargs)
    if reason is not None:
        _counts[f"sdpa: {reason}"] += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    causal = _causal(module, query, is_causal)
    if causal and key.shape[2] > query.shape[2]:
        # As transformers' SDPA function: no mask with more keys than queries in a causal call is
        # a prefill into an empty static cache, whose later rows are not filled yet.
        key, value = key[:, :, :query.shape[2]], value[:, :, :query.shape[2]]
    gqa = query.shape[1] != key.shape[1]
    call = _calls.prepare(query, key, value, None, 0.0, causal, scaling, gqa)  # cached per layout
    family = call.decision.family
    path = f"kernel {family.name}" if family is not None else f"tk fallback: {call.decision.reason}"
    _counts[path] += 1
    out = _api.run_prepared(call, query, key, value, 0.0, scaling, gqa)
    return out.transpose(1, 2).contiguous(), None


def _sdpa_reason(attention_mask, dropout, kwargs) -> str | None:
    """Why the call goes to transformers' SDPA function, or None."""
    if attention_mask is not None:
        return "attention mask"
    if dropout > 0.0:
        return "dropout"
    if kwargs.get("position_bias") is not None:
        return "position bias"
    if kwargs.get("output_attentions", False):
        return "output_attentions"
    return None


def _causal(module, query, is_causal) -> bool:
    """SDPA's flag as transformers' SDPA function sets it: causal only with more than one query
    (one decoding token sees the whole cache)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return bool(query.shape[2] > 1 and causal)


def _eager_softcap(module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap):
    """scores = softcap * tanh(q k^T * scale / softcap), masked, softmax in fp32, times v."""
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    len_q, len_kv = query.shape[2], key.shape[2]
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :len_kv]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    elif _causal(module, query, is_causal):
        # Keys beyond the queries are an empty static cache's unfilled rows (see above).
        visible = torch.ones(len_q, len_kv, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous()
