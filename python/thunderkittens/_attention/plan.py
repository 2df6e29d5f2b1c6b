"""Which path an attention call takes: one of the kernel families, or torch SDPA (and why); and
the AttentionPlan that explain() returns.

The families, in the order ``auto`` prefers them: ``sm90``, the TMA + wgmma + warp-specialised
kernels (forward and backward), needs exactly sm_90 (Hopper) and a 90a build; ``sm80``, the
mma.sync + cp.async forward kernel, runs on every GPU from sm_80 on (Hopper too, when forced
with ``use_kernel("sm80")``) and has no backward, so calls that need gradients go to SDPA when
it is the family picked. ``decode`` (decode.py), the short-query kernel (up to 64 query rows,
GQA groups packed, keys split over the GPU), sm_80 and newer, no backward: ``auto`` runs it
instead of either for the calls decode.py's rule names; ``use_kernel("decode")`` forces it. The
head dims each family is built for come from the C++ side.

Every decision here reads only shapes, dtypes, devices, flags and configuration, never tensor
data (see _scaffold).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.nn.attention import SDPBackend
from torch.nn.attention.bias import CausalBias, CausalVariant

from .. import _config, _scaffold
from .._extension import ATTENTION_HEAD_DIMS
from .._scaffold import KernelFamily, Plan
from . import decode
from .checks import as_causal_flag, check_types, check_values


@dataclass(frozen=True)
class AttentionFamily(KernelFamily):
    head_dims: tuple[int, ...] = ()  # E == Ev it is built for
    # The forward op a call that needs gradients runs (families with a backward): the same
    # kernel, also returning what the backward op reads beside out and lse.
    training_op_name: str | None = None


SM90 = AttentionFamily(op="attention", name="sm90", description="sm90 wgmma+tma",
                       op_name="attention_fwd_sm90", min_capability=(9, 0),
                       exact_capability=(9, 0), backward_op_name="attention_bwd_sm90",
                       training_op_name="attention_fwd_sm90_train",
                       head_dims=ATTENTION_HEAD_DIMS["sm90"])
SM80 = AttentionFamily(op="attention", name="sm80", description="sm80 mma.sync",
                       op_name="attention_fwd_sm80", min_capability=(8, 0),
                       head_dims=ATTENTION_HEAD_DIMS["sm80"])
# Short queries against long keys (decode.py says when auto picks it); no backward.
DECODE = AttentionFamily(op="attention", name=decode.NAME, description="decode mma.sync split-kv",
                         op_name="attention_fwd_decode", min_capability=(8, 0),
                         in_auto_order=False, head_dims=ATTENTION_HEAD_DIMS["decode"])
FAMILIES: tuple[AttentionFamily, ...] = (SM90, SM80, DECODE)
BY_NAME: dict[str, AttentionFamily] = _scaffold.register_families(*FAMILIES)

# Texts for the fallback reasons, made here, not in the traced path (torch 2.11's dynamo failed
# on generators over module constants there).
KERNEL_HEAD_DIMS = tuple(sorted({dim for family in FAMILIES for dim in family.head_dims}))
_KERNEL_HEAD_DIMS_TEXT = ", ".join(str(dim) for dim in KERNEL_HEAD_DIMS[:-1]) + f" or {KERNEL_HEAD_DIMS[-1]}"
_WITH_BACKWARD = ", ".join([family.name for family in FAMILIES if family.has_backward])
# Which kernels run a head dim, for calls of any length (not decode, which only takes short ones).
_FAMILIES_WITH_HEAD_DIM = {dim: ", ".join([family.name for family in (SM90, SM80) if dim in family.head_dims])
                           for dim in KERNEL_HEAD_DIMS}
_HEAD_DIMS_OF = {family.name: ", ".join([str(dim) for dim in family.head_dims]) for family in FAMILIES}


@dataclass(frozen=True, kw_only=True)
class AttentionPlan(Plan):
    """What thunderkittens.explain() returns: the path an attention call would take."""

    function = "tk.attention"
    fallback = "torch SDPA"

    head_dim: int
    causal: bool
    gqa_ratio: int
    backward_op: str | None = None  # e.g. "tk.attention_bwd_sm90" when gradients are needed
    # The backward would run in its deterministic mode (torch.use_deterministic_algorithms is on
    # now; the setting is read again when the backward runs).
    deterministic_backward: bool = False
    lower_right: bool = False       # causal diagonal bottom-right (causal_lower_right, Lq != Lk)

    def details(self) -> list[str]:
        parts = [f"d={self.head_dim}", _mask_name(self.causal, self.lower_right)]
        if self.gqa_ratio > 1:
            parts.append(f"gqa={self.gqa_ratio}")
        if self.backward_op:
            parts.append(f"+ backward {self.backward_op}"
                         + (" (deterministic)" if self.deterministic_backward else ""))
        return parts


def _mask_name(causal: bool, lower_right: bool) -> str:
    if not causal:
        return "full"
    return "causal lower-right" if lower_right else "causal"


# ---- the fallback reasons -----------------------------------------------------------------


def feature_fallback_reason(query, key, value, attn_mask, dropout_p, scale=None) -> str | None:
    """Why the call is outside what any attention kernel supports, or None."""
    reason = _scaffold.unsupported_input_reason("attention", query)
    if reason is not None:
        return reason
    head_dim = query.shape[-1]
    if head_dim not in KERNEL_HEAD_DIMS:
        return f"head dim {head_dim} is not supported by the kernel ({_KERNEL_HEAD_DIMS_TEXT} only)"
    if value.shape[-1] != head_dim:
        return (f"value head dim {value.shape[-1]} differs from query head dim {head_dim}; "
                "the kernel needs them equal")
    if attn_mask is not None:  # causal biases never get here: as_causal_flag made them flags
        return ("attn_mask is not supported by the kernel yet (only the causal biases "
                "causal_upper_left and causal_lower_right are)")
    if dropout_p > 0.0:
        return "dropout_p > 0 is not supported by the kernel yet"
    if scale is not None and scale <= 0.0:
        # The kernel takes the running max of raw scores, which is only the max of the
        # scaled scores for a positive scale.
        return f"scale {scale} <= 0 is not supported by the kernel (positive scales only)"
    return None


def needs_grad(query, key, value) -> bool:
    """Whether autograd will want gradients of query, key or value from this call."""
    return _name_requiring_grad(query, key, value) is not None


def _name_requiring_grad(query, key, value) -> str | None:
    """The first of query/key/value that autograd will want a gradient for, or None."""
    if not torch.is_grad_enabled():
        return None
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.requires_grad:
            return name
    return None


def head_dim_fallback_reason(family: AttentionFamily, head_dim: int) -> str | None:
    """Why ``family`` does not take ``head_dim`` (one of KERNEL_HEAD_DIMS), or None."""
    if head_dim in family.head_dims:
        return None
    return (f"{_scaffold.forced_prefix(family)}head dim {head_dim} runs on the "
            f"{_FAMILIES_WITH_HEAD_DIM[head_dim]} kernels only (the {family.name} kernels take "
            f"head dims {_HEAD_DIMS_OF[family.name]})")


def backward_fallback_reason(family: AttentionFamily, query, key, value) -> str | None:
    """Why the call cannot run on ``family`` when a gradient is needed, or None.

    Only the sm90 family has a backward kernel; with sm80 (auto on a non-Hopper GPU, or forced)
    a call that needs gradients goes to SDPA, so training works everywhere. (Under
    torch.use_deterministic_algorithms(True) the sm90 backward runs in its deterministic mode.)"""
    name = _name_requiring_grad(query, key, value)
    if name is None or family.has_backward:
        return None
    return (f"{_scaffold.forced_prefix(family)}{name} requires grad and the {family.name} kernels "
            f"have no backward (kernels with a backward: {_WITH_BACKWARD}); under "
            "torch.no_grad() or torch.inference_mode() the kernel runs")


# ---- the decision -------------------------------------------------------------------------


class Decision(NamedTuple):
    """The path of a call, with its arguments as that path takes them: a causal bias becomes the
    kernels' flags (is_causal=True, and lower_right=True for causal_lower_right with
    Lq != Lk). A fallback keeps the caller's lower-right bias: SDPA has no lower-right flag (for
    the other biases is_causal=True gives SDPA's same answer)."""

    family: AttentionFamily | None  # None: the SDPA fallback
    reason: str | None              # why it falls back
    attn_mask: object
    is_causal: bool
    lower_right: bool


def decide(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> Decision:
    """Checks the arguments (raising as tk.attention does) and picks the path."""
    check_types(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if query.is_nested or key.is_nested or value.is_nested:  # SDPA validates nested inputs itself
        return Decision(None, "nested tensors are not supported by the kernel", attn_mask,
                        is_causal, False)
    check_values(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    flag_mask, flag_causal, lower_right = as_causal_flag(query, key, attn_mask, is_causal)
    family, reason = _family_or_reason(query, key, value, flag_mask, dropout_p, scale)
    if family is None and lower_right:
        return Decision(None, reason, attn_mask, is_causal, False)
    return Decision(family, reason, flag_mask, flag_causal, lower_right)


def _family_or_reason(query, key, value, attn_mask, dropout_p, scale):
    reason = feature_fallback_reason(query, key, value, attn_mask, dropout_p, scale)
    if reason is not None:
        return None, reason
    family, reason = _scaffold.choose_family("attention", query.device)
    if family is None:
        return None, reason
    if _decode_instead(family, query, key, value):
        family = DECODE
    reason = (head_dim_fallback_reason(family, query.shape[-1])
              or decode.length_fallback_reason(family, query.shape[-2])
              or backward_fallback_reason(family, query, key, value))
    if reason is not None:
        return None, reason
    return family, None


def _decode_instead(family, query, key, value) -> bool:
    """Whether ``auto`` runs the call on the decode kernel instead of ``family`` (decode.py)."""
    return (family is not DECODE and _scaffold.kernel_choice("attention") == "auto"
            and decode.prefers_decode(query.shape[-2], key.shape[-2])
            and query.shape[-1] in DECODE.head_dims and not needs_grad(query, key, value)
            and decode.runs_here(query.device))


# ---- operands and the explanation ---------------------------------------------------------


def softmax_scale(head_dim: int, scale: float | None) -> float:
    """The scale the kernel op is given: SDPA's default 1 / sqrt(E) when ``scale`` is None."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def to_4d(t: torch.Tensor) -> torch.Tensor:
    """(..., H, L, E) -> (B, H, L, E): a 3-D input gets B=1, leading dims of higher ranks are
    flattened into B (a view whenever torch can make one)."""
    if t.dim() == 4:
        return t
    return t.reshape((-1,) + tuple(t.shape[-3:]))


def kernel_operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the (B, H, L, E) tensor the op is given: a view, or one contiguous copy where the
    kernels cannot read it in place (see _scaffold.conforms)."""
    return _scaffold.operand(to_4d(t))


def _read_in_place(t: torch.Tensor) -> bool:
    t4 = to_4d(t)
    if t4.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
        return False  # flattening the batch dims already had to copy
    return _scaffold.conforms(t4)


# ---- the fallback --------------------------------------------------------------------------
# SDPA computes the calls the kernels do not take, with two changes to what the caller wrote:
#  * on the kernels' device an operand whose layout SDPA's fused kernels may misread gets one
#    fresh contiguous copy first (_scaffold.peer_needs_copy); autograd takes the gradient back
#    through the copy to the caller's tensor;
#  * causal_lower_right with Lq > Lk: the first Lq - Lk query rows see no key. SDPA's fused
#    backends return NaN there (and NaN gradients); SDPA runs on the last Lk query rows only,
#    for which the mask is plain is_causal on a square problem, and zero rows go in front: 0 out
#    and 0 gradients, the kernels' answer;
#  * a boolean or additive attn_mask on the kernels' device: a query row it leaves no key (all
#    False, or all -inf) is given every key for SDPA (so nothing is NaN, forward or backward),
#    and its output row is set to 0 after: 0 out and 0 gradients, as SDPA's math backend gives
#    (its fused CUDA backends gave NaN);
#  * a call that SDPA's flash backend (FlashAttention-2) may compute with its keys split over
#    thread blocks runs without that backend: the kernel that merges the pieces writes softmax
#    statistics past the end of their buffer (torch 2.11 on an H100, compute-sanitizer memcheck:
#    fp16, one batch and head, 1 to 7 query rows, 1000 keys; plain calls and causal_lower_right
#    alike). FlashAttention-2 splits when batch x heads x 64-row query blocks are fewer than
#    about 0.8 x the GPU's multiprocessors, never with dropout; the test here is looser (fewer
#    than the multiprocessors). SDPA's other backends take these calls.


class Fallback(NamedTuple):
    """How the fallback calls SDPA."""

    hidden_rows: int        # leading query rows that see no key: 0 in the result, not computed
    attn_mask: object
    is_causal: bool
    copies: tuple[str, ...]  # operands handed to SDPA as fresh contiguous copies
    guard_mask_rows: bool = False  # mask rows that see no key: every key for SDPA, 0 after
    without_flash: bool = False    # SDPA may not use its flash backend (it may split the keys)


# The note explain() adds to a fallback that leaves SDPA's flash backend out.
WITHOUT_FLASH_NOTE = "without SDPA's flash backend: it may split the keys, and its merge writes out of bounds"
SDPA_BACKENDS_WITHOUT_FLASH = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_FLASH_BLOCK = 64  # FlashAttention-2's query block; its key blocks are no shorter
_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def flash_may_split_keys(query, key, dropout_p) -> bool:
    """Whether SDPA's flash backend could compute this call with its keys split (see above)."""
    # One key block (or fewer): nothing to split.
    if (query.device.type != "cuda" or query.dtype not in _FLASH_DTYPES or dropout_p > 0
            or query.is_nested or key.shape[-2] <= _FLASH_BLOCK):
        return False
    rows = query.shape[-2]
    blocks = math.prod(query.shape[:-2]) * -(-rows // _FLASH_BLOCK)
    return blocks < torch.cuda.get_device_properties(query.device).multi_processor_count


def fallback_call(query, key, value, attn_mask, dropout_p, is_causal) -> Fallback:
    """The SDPA call for the fallback of a call whose (checked) arguments these are."""
    if query.is_nested or key.is_nested or value.is_nested:
        return Fallback(0, attn_mask, is_causal, ())
    hidden = 0
    if (isinstance(attn_mask, CausalBias) and attn_mask.variant == CausalVariant.LOWER_RIGHT
            and query.shape[-2] > key.shape[-2]):
        hidden = query.shape[-2] - key.shape[-2]
        attn_mask, is_causal = None, True
    computed = query[..., hidden:, :] if hidden else query  # the query rows SDPA computes
    operands = [("query", computed), ("key", key), ("value", value)]
    # A boolean or additive mask (a CausalBias is a Tensor subclass too, with no data). A
    # guarded mask is rebuilt in a new allocation anyway: it needs no copy.
    tensor_mask = isinstance(attn_mask, torch.Tensor) and not isinstance(attn_mask, CausalBias)
    guard = tensor_mask and attn_mask.device.type == _scaffold.KERNEL_DEVICE_TYPE
    if tensor_mask and not guard:
        operands.append(("attn_mask", attn_mask))
    copies = tuple(name for name, t in operands if _scaffold.peer_needs_copy(t))
    # SDPA's flash backend takes no mask tensor, so a call with one never reaches it.
    without_flash = not tensor_mask and flash_may_split_keys(computed, key, dropout_p)
    return Fallback(hidden, attn_mask, is_causal, copies, guard, without_flash)


def explain(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> AttentionPlan:
    decision = decide(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    family = decision.family
    peer_note = None
    if family is not None:
        copies = tuple(name for name, t in (("query", query), ("key", key), ("value", value))
                       if not _read_in_place(t))
    else:
        call = fallback_call(query, key, value, decision.attn_mask, dropout_p, decision.is_causal)
        copies = call.copies
        peer_note = WITHOUT_FLASH_NOTE if call.without_flash else None
    nested = query.is_nested or key.is_nested or value.is_nested
    gqa = 1 if nested else max(1, query.shape[-3] // key.shape[-3])
    backward_op = (f"tk.{family.backward_op_name}"
                   if family is not None and needs_grad(query, key, value) else None)
    return AttentionPlan(
        uses_kernel=family is not None, reason=decision.reason,
        kernel=family.name if family else None,
        kernel_description=family.description if family else None,
        op=f"tk.{family.op_name}" if family else None,
        dtype=query.dtype, copies=copies, peer_note=peer_note, strict=_config.strict_enabled(),
        head_dim=int(query.shape[-1]), causal=decision.is_causal,
        lower_right=decision.lower_right, gqa_ratio=gqa, backward_op=backward_op,
        deterministic_backward=backward_op is not None and torch.are_deterministic_algorithms_enabled())
