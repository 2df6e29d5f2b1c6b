"""The decode family of tk.attention (csrc/attention/decode.cu): short queries against long keys.

Its kernel packs the query rows of each GQA group into one tile, so every key/value tile is read
once per group, and splits the keys over the GPU when batch x kv heads cannot fill it; it takes
up to DECODE_MAX_LEN_Q query rows. Under ``auto`` it replaces the family the GPU would run
(sm90 or sm80) for calls of at most AUTO_MAX_LEN_Q query rows against at least AUTO_MIN_LEN_KV
keys that need no gradient (the family has no backward: calls that need gradients keep the
sm90 family and its backward, or SDPA). ``use_kernel("decode")`` forces it for any call it
takes. docs/performance.md has the measurements behind the two constants.

Every function here reads shapes, flags and configuration, never tensor data.
"""

from __future__ import annotations

import torch

from .. import _scaffold

#: Query rows the decode kernels take (csrc/attention/decode_params.h, kDecodeMaxLenQ).
DECODE_MAX_LEN_Q = 64
#: auto: the decode kernel for calls with at most this many query rows ...
AUTO_MAX_LEN_Q = 16
#: ... against at least this many keys: at 512 keys the forward kernel was faster (12 us against
#: 15 us, b1 hq32 hkv8 d128, H200), from 2048 on the decode kernel by far (docs/performance.md).
AUTO_MIN_LEN_KV = 2048

NAME = "decode"


def prefers_decode(len_q: int, len_kv: int) -> bool:
    """Whether ``auto`` runs a call with these lengths on the decode kernel (when it can)."""
    return len_q <= AUTO_MAX_LEN_Q and len_kv >= AUTO_MIN_LEN_KV


def runs_here(device: torch.device) -> bool:
    """Whether this build has decode code for ``device``'s GPU (and the attention family)."""
    if "attention" not in _scaffold._extension.BUILT_OPS:
        return False
    found = _scaffold._family_or_reason("attention", device.index, NAME)
    return not found.startswith(_scaffold._NO_FAMILY)


def length_fallback_reason(family, len_q: int) -> str | None:
    """Why ``family`` (the decode family, forced) cannot take ``len_q`` query rows, or None."""
    if family.name != NAME or len_q <= DECODE_MAX_LEN_Q:
        return None
    return (f"{_scaffold.forced_prefix(family)}query length {len_q} > {DECODE_MAX_LEN_Q} (the "
            f"decode kernels take up to {DECODE_MAX_LEN_Q} query rows)")
