"""tk.attention cases: what the strategies draw, the float64 reference, PyTorch's yardstick, and
the checks of one case (path, output, gradients, rows that see no key, strict mode)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel

import thunderkittens as tk
from thunderkittens._attention import plan as attention_plan

from . import layouts
from .environment import Environment, PathCounts, run_on_stream
from .notes import note
from .tolerance import assert_close, gradient_floor, untouched

KERNEL_HEAD_DIMS = (64, 96, 128)
FALLBACK_HEAD_DIMS = (16, 80, 256)
EDGE_LENGTHS = (1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 1024, 2047, 2048)


@dataclass(frozen=True)
class AttentionCase:
    batch: tuple            # () for 3-D inputs, (B,) for 4-D, (B1, B2) for 5-D
    heads_kv: int
    gqa: int                # query heads per key/value head
    enable_gqa: bool
    len_q: int
    len_kv: int
    head_dim: int
    head_dim_v: int
    dtype: torch.dtype
    mask: str               # none, causal (is_causal=True), upper_left / lower_right (SDPA's
                            # causal biases as attn_mask), bool, float
    mask_shape: str         # bool/float masks: "2d", "heads1", "full", "expanded"
    empty_rows: bool        # bool/float masks: some query rows see no key
    scale: float | None
    grad: tuple             # (query, key, value) require grad
    layout: object          # (q, k, v) operand layouts, or "fused:N"
    kernel: str             # use_kernel: "auto", "sm90", "sm80"
    stream: str = "default"  # "side": the call runs on a side stream
    device_index: int = 0
    dropout_p: float = 0.0
    seed: int = 0

    @property
    def heads_q(self) -> int:
        return self.heads_kv * self.gqa

    @property
    def needs_grad(self) -> bool:
        return any(self.grad)

    @property
    def out_shape(self) -> tuple:
        return self.batch + (self.heads_q, self.len_q, self.head_dim_v)

    def recipe(self):
        return layouts.attention_recipe(self.layout, self.batch, self.heads_q, self.heads_kv,
                                        self.len_q, self.len_kv, self.head_dim, self.head_dim_v)

    def call_text(self) -> str:
        """The call, in words: what a failure report shows."""
        biases = {"upper_left": "causal_upper_left", "lower_right": "causal_lower_right"}
        if self.mask in biases:
            mask = f"{biases[self.mask]}({self.len_q}, {self.len_kv})"
        elif self.mask in ("bool", "float"):
            mask = f"<{self.mask} mask, {self.mask_shape}{', empty rows' if self.empty_rows else ''}>"
        else:
            mask = "None"
        q = self.batch + (self.heads_q, self.len_q, self.head_dim)
        k = self.batch + (self.heads_kv, self.len_kv, self.head_dim)
        v = self.batch + (self.heads_kv, self.len_kv, self.head_dim_v)
        return (f"with tk.use_kernel({self.kernel!r}): tk.attention(q{q}, k{k}, v{v}, "
                f"attn_mask={mask}, dropout_p={self.dropout_p}, is_causal={self.mask == 'causal'}, "
                f"scale={self.scale}, enable_gqa={self.enable_gqa}); "
                f"{str(self.dtype).removeprefix('torch.')}, layout {self.layout}, grad {self.grad}, "
                f"stream {self.stream}, device {self.device_index}, seed {self.seed}")


# ---- strategies --------------------------------------------------------------------------------

def _length(max_len: int):
    edges = [n for n in EDGE_LENGTHS if n <= max_len]
    return st.integers(1, max_len) | st.sampled_from(edges)


@st.composite
def attention_cases(draw, profile, env: Environment, *, misaligned: bool = False,
                    no_key_rows: bool = False, dropout: bool = False):
    """AttentionCase draws. misaligned: at least one operand starts off a 16-byte boundary (the
    views SDPA mishandles); otherwise every offset keeps a 16-byte start. no_key_rows: some
    query rows see no key (causal_lower_right with Lq > Lk, or bool/float masks with empty
    rows). dropout: dropout_p > 0 (path and shape checks only)."""
    # Two cases in three are built for a kernel (dtype, head dims, mask, scale it takes); the
    # forced family, grad and layouts still decide whether one runs.
    for_kernel = draw(st.sampled_from([True, True, False])) and not dropout
    if for_kernel:
        dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
        head_dim = head_dim_v = draw(st.sampled_from(KERNEL_HEAD_DIMS))
    else:
        dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
        head_dim = draw(st.sampled_from(KERNEL_HEAD_DIMS + FALLBACK_HEAD_DIMS))
        head_dim_v = draw(st.sampled_from([head_dim] * 4 + [32, 80]))
    rank = draw(st.sampled_from([4, 3, 5]))
    batch = tuple(draw(st.integers(1, 3)) for _ in range(rank - 3))
    heads_kv = draw(st.integers(1, 3))
    gqa = draw(st.sampled_from([1, 2, 4, 8]))
    enable_gqa = gqa > 1 or draw(st.booleans())
    heads_q = heads_kv * gqa
    bh = math.prod(batch) * heads_q
    # A few cases large, the others small; a draw that shrinks towards a small case.
    sizes = profile.large if draw(st.integers(0, 99)) >= 100 - profile.large_percent else profile.small
    max_len = sizes.max_len
    pair_budget = max(1, sizes.attention_work // (bh * max(head_dim, head_dim_v)))

    if no_key_rows:
        mask = draw(st.sampled_from(["lower_right", "bool", "float"]))
    elif dropout:
        mask = draw(st.sampled_from(["none", "causal", "bool"]))
    elif for_kernel:
        mask = draw(st.sampled_from(["none", "causal", "upper_left", "lower_right"]))
    else:
        mask = draw(st.sampled_from(["none", "causal", "upper_left", "lower_right", "bool", "float"]))
    if no_key_rows and mask == "lower_right":
        len_kv = draw(_length(max(1, min(max_len - 1, pair_budget // 2))))
        len_q = len_kv + draw(st.integers(1, max(1, min(max_len - len_kv,
                                                         pair_budget // len_kv - len_kv))))
    else:
        len_q = draw(_length(min(max_len, pair_budget)))
        len_kv = draw(_length(max(1, min(max_len, pair_budget // len_q))))
        if draw(st.integers(0, 9)) == 0:
            len_kv = len_q
    mask_shape = draw(st.sampled_from(["2d", "heads1", "full", "expanded"])) \
        if mask in ("bool", "float") else "2d"
    empty_rows = no_key_rows and mask in ("bool", "float")

    scale_kind = draw(st.sampled_from(["none", "none", "fixed", "any"]
                                      + ([] if for_kernel else ["nonpositive"])))
    if scale_kind == "fixed":
        scale = draw(st.sampled_from([0.125, 0.3, 1.0, 0.01]))
    elif scale_kind == "any":
        scale = draw(st.floats(0.01, 2.0))
    elif scale_kind == "nonpositive":  # the fallback pins SDPA's math backend for these
        scale = draw(st.sampled_from([-0.3, 0.0, -1.0]))
    else:
        scale = None

    grad = (False, False, False)
    if draw(st.sampled_from([False, False, True])):
        grad = draw(st.sampled_from([(True, True, True), (True, False, False), (False, True, True),
                                     (False, False, True), (True, True, False)]))

    offsets = layouts.misaligned_offsets(dtype) if misaligned else layouts.aligned_offsets(dtype)
    fused_ok = len_q == len_kv and head_dim == head_dim_v
    if fused_ok and draw(st.integers(0, 4)) == 0:
        layout = f"fused:{draw(st.sampled_from(offsets if misaligned else (0,) + offsets))}"
    else:
        def operand_layout():
            kind = draw(st.sampled_from(["contiguous", "contiguous", "transposed", "transposed"]
                                        + list(layouts.ATTENTION_LAYOUTS[2:])))
            if kind in ("offset", "projection"):
                kind = f"{kind}:{draw(st.sampled_from(offsets))}"
            return kind
        layout = [operand_layout() for _ in range(3)]
        if misaligned and not any(layouts.misaligned(l, dtype) for l in layout):
            which = draw(st.integers(0, 2))
            kind = draw(st.sampled_from(["offset", "projection"]))
            layout[which] = f"{kind}:{draw(st.sampled_from(offsets))}"
        layout = tuple(layout)

    kernel = draw(st.sampled_from(["auto", "sm90", "sm80"]))
    stream = draw(st.sampled_from(["default", "side"])) if env.side_streams else "default"
    device_index = draw(st.integers(0, min(env.device_count, 2) - 1)) if env.device_count > 1 else 0
    dropout_p = draw(st.sampled_from([0.1, 0.5, 0.9])) if dropout else 0.0
    seed = draw(st.integers(0, 2**31 - 1))
    return AttentionCase(batch=batch, heads_kv=heads_kv, gqa=gqa, enable_gqa=enable_gqa,
                         len_q=len_q, len_kv=len_kv, head_dim=head_dim, head_dim_v=head_dim_v,
                         dtype=dtype, mask=mask, mask_shape=mask_shape, empty_rows=empty_rows,
                         scale=scale, grad=grad, layout=layout, kernel=kernel, stream=stream,
                         device_index=device_index, dropout_p=dropout_p, seed=seed)


def coverage_cases(*, misaligned: bool = False, no_key_rows: bool = False,
                   dropout: bool = False) -> list[AttentionCase]:
    """Cases every run of a property includes (hypothesis's explicit examples, besides the
    random ones), so that each shard reaches every kernel family this GPU runs, and the sm90
    backward, whatever its random draws: auto, sm90 and sm80 forward, auto and sm90 with
    gradients. Small and cheap; of the property's kind (misaligned operands, rows that see no
    key, dropout)."""
    base = AttentionCase(batch=(2,), heads_kv=2, gqa=2, enable_gqa=True, len_q=70, len_kv=90,
                         head_dim=64, head_dim_v=64, dtype=torch.bfloat16, mask="causal",
                         mask_shape="2d", empty_rows=False, scale=None, grad=(False,) * 3,
                         layout=("transposed", "contiguous", "contiguous"), kernel="auto", seed=1)
    if dropout:
        return [dataclasses.replace(base, mask="none", dropout_p=0.1)]
    cases = [
        base,
        dataclasses.replace(base, kernel="sm90", dtype=torch.float16, head_dim=128, head_dim_v=128,
                            mask="none", seed=2),
        dataclasses.replace(base, kernel="sm80", head_dim=128, head_dim_v=128, mask="lower_right",
                            seed=3),
        dataclasses.replace(base, grad=(True, True, True), seed=4),
        dataclasses.replace(base, kernel="sm90", grad=(True, False, True), head_dim=96,
                            head_dim_v=96, mask="upper_left", dtype=torch.float16, seed=5),
    ]
    if misaligned:  # query, key or value in turn 8 bytes off a 16-byte boundary
        cases = [dataclasses.replace(case, layout=tuple("offset:4" if j == i % 3 else layout
                                                        for j, layout in enumerate(case.layout)))
                 for i, case in enumerate(cases)]
    if no_key_rows:  # causal_lower_right with Lq > Lk
        cases = [dataclasses.replace(case, mask="lower_right", len_q=90, len_kv=40) for case in cases]
    return cases


# ---- inputs --------------------------------------------------------------------------------------

def causal_bias(kind: str, len_q: int, len_kv: int):
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left
    with warnings.catch_warnings():
        # causal_lower_right warns that Lq > Lk "will produce NaNs": those rows must be 0.
        warnings.simplefilter("ignore", UserWarning)
        return (causal_lower_right if kind == "lower_right" else causal_upper_left)(len_q, len_kv)


def make_mask(case: AttentionCase, device, gen):
    """The attn_mask argument: None, a causal bias, or a bool/float tensor in which every query
    row sees at least one key (unless case.empty_rows)."""
    if case.mask in ("none", "causal"):
        return None
    if case.mask in ("upper_left", "lower_right"):
        return causal_bias(case.mask, case.len_q, case.len_kv)
    grid = (case.len_q, case.len_kv)
    full = case.batch + (case.heads_q,) + grid
    shape = {"2d": grid, "heads1": case.batch + (1,) + grid, "full": full,
             "expanded": grid}[case.mask_shape]
    keep = torch.rand(shape, generator=gen, device=device) < 0.7
    some_key = torch.randint(case.len_kv, shape[:-1] + (1,), generator=gen, device=device)
    keep.scatter_(-1, some_key, True)
    if case.empty_rows:
        rows = torch.rand(shape[:-1], generator=gen, device=device) < 0.25
        rows[..., 0] = True
        keep[rows] = False
    if case.mask == "bool":
        mask = keep
    else:
        values = torch.randn(shape, generator=gen, device=device) * 2
        # Half the float masks are purely additive; the others hide keys with -inf as well.
        if case.empty_rows or torch.rand((), generator=gen, device=device).item() < 0.5:
            values = values.masked_fill(~keep, float("-inf"))
        mask = values.to(case.dtype)
    if case.mask_shape == "expanded":
        mask = mask.expand(full)
    return mask


def make_inputs(case: AttentionCase, device):
    """(bases, make, mask, grad_out): the base tensors (leaves), the view recipe, the mask, and
    the gradient of the output (None without grad), all from case.seed."""
    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed)
    shapes, make = case.recipe()
    bases = [torch.randn(shape, generator=gen, device=device, dtype=case.dtype) for shape in shapes]
    requires = case.grad if len(bases) == 3 else (case.needs_grad,)
    for base, flag in zip(bases, requires):
        base.requires_grad_(flag)
    mask = make_mask(case, device, gen)
    grad_out = (torch.randn(case.out_shape, generator=gen, device=device, dtype=case.dtype)
                if case.needs_grad else None)
    return bases, make, mask, grad_out


def base_names(case: AttentionCase) -> tuple[str, ...]:
    return ("query", "key", "value") if isinstance(case.layout, tuple) else ("qkv",)


def call_kwargs(case: AttentionCase, mask) -> dict:
    return dict(attn_mask=mask, dropout_p=case.dropout_p, is_causal=case.mask == "causal",
                scale=case.scale, enable_gqa=case.enable_gqa)


# ---- the float64 reference and PyTorch's yardstick ------------------------------------------------

def reference_attention(q, k, v, case: AttentionCase, mask):
    """(out, empty) in float64: softmax(q k^T * scale + mask) v with k/v heads repeated for GQA,
    and ``empty`` (*batch, Hq, Lq), the query rows that see no key (their output is 0)."""
    if case.gqa > 1:
        k, v = (t.repeat_interleave(case.gqa, dim=-3) for t in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if case.scale is None else case.scale
    scores = (q @ k.transpose(-1, -2)) * scale
    visible = None
    if case.mask in ("causal", "upper_left", "lower_right"):
        offset = case.len_kv - case.len_q if case.mask == "lower_right" else 0
        visible = torch.ones(case.len_q, case.len_kv, dtype=torch.bool, device=q.device).tril(offset)
    elif case.mask == "bool":
        visible = mask
    elif case.mask == "float":
        scores = scores + mask.double()
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return probs @ v, empty.squeeze(-1)


def torch_attention(q, k, v, case: AttentionCase, mask, *, math_backend: bool = False):
    """PyTorch's own answer in the inputs' dtype (SDPA, default backend; the math backend for a
    scale <= 0, which the fused backends get wrong, or when asked), the call as tk.attention's
    fallback makes it: causal_lower_right with Lq > Lk as plain causal attention of the last Lk
    query rows, the rows that see no key apart as 0, and no flash backend where it may split the
    keys (its merge writes out of bounds: see thunderkittens/_attention/plan.py)."""
    gqa = case.heads_q != case.heads_kv
    if math_backend or (case.scale is not None and case.scale <= 0):
        backend = sdpa_kernel(SDPBackend.MATH)
    elif attention_plan.flash_may_split_keys(q, k, 0.0):
        backend = sdpa_kernel(attention_plan.SDPA_BACKENDS_WITHOUT_FLASH)
    else:
        backend = contextlib.nullcontext()
    with backend:
        if case.mask == "none":
            return F.scaled_dot_product_attention(q, k, v, scale=case.scale, enable_gqa=gqa)
        if case.mask in ("causal", "upper_left"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=case.scale,
                                                  enable_gqa=gqa)
        if case.mask == "lower_right":
            if case.len_q <= case.len_kv:
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=causal_bias("lower_right", case.len_q, case.len_kv),
                    scale=case.scale, enable_gqa=gqa)
            hidden = case.len_q - case.len_kv
            seen = F.scaled_dot_product_attention(q[..., hidden:, :], k, v, is_causal=True,
                                                  scale=case.scale, enable_gqa=gqa)
            return torch.cat([seen.new_zeros(seen.shape[:-2] + (hidden, seen.shape[-1])), seen],
                             dim=-2)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case.scale,
                                              enable_gqa=gqa)


def _yardstick(case, bases, make, mask, grad_out, empty, ref, math_backend):
    copies = [b.detach().clone().requires_grad_(b.requires_grad) for b in bases]
    q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in make(copies))
    theirs = torch_attention(q, k, v, case, mask, math_backend=math_backend)
    theirs = theirs.masked_fill(empty.unsqueeze(-1), 0.0)
    if grad_out is not None:
        theirs.backward(grad_out)
    grads = [c.grad for c in copies]
    return theirs.detach(), grads


FUSED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]


def fused_sdpa_backward(q, k, v, grad_out, causal: bool, scale, lower_right: bool = False) -> bool:
    """Runs F.scaled_dot_product_attention forward and backward (grad_out) on PyTorch's fused
    backends only (FlashAttention-2, memory-efficient, cuDNN) with q (..., Hq, Lq, D) and k/v
    (..., Hkv, Lk, D) made 4-D and k/v repeated over each GQA group, as those kernels need; the
    gradients reach whatever q, k, v were made from. False where no fused backend runs the call
    (lower-right with Lq > Lk included: its rows that see no key are NaN there)."""
    len_q, len_kv = q.shape[-2], k.shape[-2]
    if lower_right and len_q > len_kv:
        return False
    ratio = q.shape[-3] // k.shape[-3]
    k, v = (t.repeat_interleave(ratio, dim=-3) for t in (k, v))
    q4, k4, v4 = (t.reshape((-1,) + tuple(t.shape[-3:])) for t in (q, k, v))
    try:
        with sdpa_kernel(FUSED_BACKENDS), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if lower_right and len_q < len_kv:
                out = F.scaled_dot_product_attention(
                    q4, k4, v4, attn_mask=causal_bias("lower_right", len_q, len_kv), scale=scale)
            else:
                out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, scale=scale)
            out.reshape(tuple(q.shape[:-1]) + (v.shape[-1],)).backward(grad_out)
    except RuntimeError:
        return False
    return True


def _fused_yardstick_grads(case, bases, make, grad_out):
    """The gradients of PyTorch's own fused attention backward (fused_sdpa_backward) on the same
    inputs, or None where none can run the call (a tensor mask, the CPU, float32, a scale <= 0, a
    dtype or head dim they refuse). Our backward is one of that kind: it rounds P and dS to the
    dtype before its last products, where SDPA's math backend (the default for 3-D or GQA calls)
    does them in float32; on a peaked softmax that alone can be several times the math backend's
    error."""
    if (case.mask not in ("none", "causal", "upper_left", "lower_right") or case.dtype == torch.float32
            or bases[0].device.type != "cuda" or case.scale is not None and case.scale <= 0):
        return None
    copies = [b.detach().clone().requires_grad_(b.requires_grad) for b in bases]
    q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in make(copies))
    if not fused_sdpa_backward(q, k, v, grad_out, case.mask != "none", case.scale,
                               lower_right=case.mask == "lower_right"):
        return None
    return [c.grad for c in copies]


def relative_error(t, ref) -> float:
    """||t - ref|| / ||ref|| over the finite elements of ref (0 for a missing t)."""
    if t is None or ref is None:
        return 0.0
    finite = torch.isfinite(ref)
    ref_norm = ref[finite].norm().item()
    return (t.double() - ref)[finite].norm().item() / ref_norm if ref_norm > 0 else 0.0


def less_precise(theirs, fused, ref):
    """The less precise of two yardstick gradients against ``ref``: by relative L2 error, and by
    max-abs error where that ties (a gradient 0 by cancellation, e.g. one key: relative errors
    are undefined, and PyTorch's math backend returns exact zeros where a fused backward, like
    ours, leaves float32 noise). ``fused`` only where it is finite where ``ref`` is."""
    if fused is None or not _finite_where(fused, ref):
        return theirs
    def size(t):
        finite = torch.isfinite(ref)
        diff = (t.double() - ref)[finite]
        return relative_error(t, ref), diff.abs().max().item() if diff.numel() else 0.0
    return fused if size(fused) > size(theirs) else theirs


def _finite_where(t, ref):
    if t is None or bool(torch.isfinite(t).all()):
        return True
    return bool(torch.isfinite(t.double()[torch.isfinite(ref)]).all())


def yardstick(case, bases, make, mask, grad_out, empty, ref, ref_grads):
    """PyTorch's answer and gradients; the math backend where the default one is not finite
    where the reference is (SDPA's fused kernels and fully masked rows). A gradient's yardstick
    is the less precise of the default backend's and PyTorch's fused backward's
    (_fused_yardstick_grads), so that a fused backward is held to its own kind."""
    theirs, grads = _yardstick(case, bases, make, mask, grad_out, empty, ref, False)
    if not (_finite_where(theirs, ref) and all(_finite_where(g, r) for g, r in zip(grads, ref_grads)
                                               if r is not None)):
        note("yardstick: the default SDPA backend was not finite; the math backend instead")
        theirs, grads = _yardstick(case, bases, make, mask, grad_out, empty, ref, True)
    if grad_out is not None:
        fused = _fused_yardstick_grads(case, bases, make, grad_out)
        if fused is not None:
            grads = [g if r is None else less_precise(g, f, r) for g, f, r in zip(grads, fused, ref_grads)]
    return theirs, grads


# ---- one case ------------------------------------------------------------------------------------

def fallback_copies(case: AttentionCase) -> tuple[str, ...]:
    """The operands the fallback hands SDPA as copies on the kernels' device: those that start
    off a 16-byte boundary or have a strided last dim (the suite's head dims are multiples of 8,
    so a contiguous copy fixes both; its masks are fresh, expanded or of rows a copy would not
    align)."""
    if isinstance(case.layout, str):
        return ("query", "key", "value") if layouts.misaligned(case.layout, case.dtype) else ()
    return tuple(name for name, layout in zip(("query", "key", "value"), case.layout)
                 if layouts.misaligned(layout, case.dtype) or layout == "strided_dim")


def _storage(t):
    return t.untyped_storage().data_ptr()


def check_case(case: AttentionCase, env: Environment, counts: PathCounts, *, call_factory=None,
               stand_in=None) -> None:
    """Runs tk.attention on the case and checks everything: the path against the contract
    (tk.explain, and the stand-in's calls on the CPU), strict mode, the output and gradients
    against the float64 reference within PyTorch's error, rows that see no key exactly 0,
    non-finite values exactly where the reference has them. ``call_factory(case, mask)``: makes
    the function to run instead of tk.attention (a torch.compile'd one; strict mode and the
    stand-in's calls are then not checked)."""
    device = env.device(case.device_index)
    note(case.call_text())
    bases, make, mask, grad_out = make_inputs(case, device)
    q, k, v = make(bases)
    if q.requires_grad:
        q.retain_grad()  # its rows that see no key must get exactly 0
    kwargs = call_kwargs(case, mask)
    call = call_factory(case, mask) if call_factory is not None else None

    with tk.use_kernel(case.kernel):
        plan = tk.explain(q, k, v, **kwargs)
    note(f"tk.explain: {plan}")
    path = plan.kernel if plan.uses_kernel else "fallback"
    expected = env.expected_attention_family(
        kernel=case.kernel, dtype=case.dtype, head_dim=case.head_dim, head_dim_v=case.head_dim_v,
        mask=case.mask, dropout_p=case.dropout_p, scale=case.scale,
        needs_grad=case.needs_grad, len_q=case.len_q, len_kv=case.len_kv) or "fallback"
    assert path == expected, f"path {path} ({plan}), but the contract says {expected}"
    if not plan.uses_kernel and env.kernel_device:
        copies = fallback_copies(case)
        assert plan.copies == copies, f"the fallback should copy {copies} for SDPA: {plan}"
    counts.add(path + ("+backward" if case.needs_grad else ""))

    out = _run(case, env, device, plan, q, k, v, kwargs, grad_out, call, stand_in)

    assert out.shape == case.out_shape, f"output shape {tuple(out.shape)}, expected {case.out_shape}"
    assert out.dtype == case.dtype and out.device == device, (out.dtype, out.device)
    assert _storage(out) not in {_storage(b) for b in bases}, "the output aliases an input"
    if plan.uses_kernel:  # (the fallback returns SDPA's result, strided like its inputs)
        assert out.is_contiguous(), f"kernel output not contiguous: strides {out.stride()}"
    if case.dropout_p > 0:
        assert torch.isfinite(out).all(), "dropout: output not finite"
        return

    bases64 = [b.detach().double().requires_grad_(b.requires_grad) for b in bases]
    ref, empty = reference_attention(*make(bases64), case, mask)
    if grad_out is not None:
        ref.backward(grad_out.double())
    ref_grads = [b.grad for b in bases64]
    ref = ref.detach()
    theirs, their_grads = yardstick(case, bases, make, mask, grad_out, empty, ref, ref_grads)

    if empty.any():
        hidden = out.detach()[empty]
        assert torch.all(hidden == 0), (f"rows that see no key are not 0 on path {path}: "
                                        f"{int((hidden != 0).any(-1).sum())} rows")
        if q.requires_grad:
            hidden_dq = q.grad[empty]
            assert torch.all(hidden_dq == 0), (f"the gradient of query rows that see no key is not 0 "
                                               f"on path {path}: {int((hidden_dq != 0).any(-1).sum())} rows")
    assert_close("output", out.detach(), ref, theirs, case.dtype)
    for name, base, ref_grad, their_grad, zero in zip(base_names(case), bases, ref_grads, their_grads,
                                                      untouched(bases, make)):
        if not base.requires_grad:
            continue
        assert base.grad is not None, f"no gradient reached {name}"
        assert_close(f"gradient of {name}", base.grad, ref_grad, their_grad, case.dtype, zero,
                     floor=gradient_floor(max(case.len_q * case.gqa, case.len_kv)))


def _run(case, env, device, plan, q, k, v, kwargs, grad_out, call, stand_in):
    compiled = call is not None
    call = call or tk.attention

    def forward():
        with tk.use_kernel(case.kernel):
            if not compiled:
                with tk.strict():
                    if plan.uses_kernel:
                        return call(q, k, v, **kwargs)
                    try:
                        call(q, k, v, **kwargs)
                    except tk.FallbackError:
                        pass
                    else:
                        raise AssertionError("strict mode did not raise FallbackError on a fallback")
            return call(q, k, v, **kwargs)

    def run():
        if device.type == "cuda":  # any element the op forgets to write reads as NaN
            poison = torch.full(case.out_shape, math.nan, dtype=case.dtype, device=device)
            del poison
        calls_before = len(stand_in.calls) if stand_in is not None else 0
        out = forward()
        if stand_in is not None and not compiled:
            made = len(stand_in.calls) - calls_before
            assert made == (1 if plan.uses_kernel else 0), \
                f"the kernel ran {made} times but tk.explain said {plan}"
        if grad_out is not None:
            out.backward(grad_out)
        return out

    return run_on_stream(case.stream, device, run)


# ---- fake tensors ------------------------------------------------------------------------------

def check_fake(case: AttentionCase, env: Environment, counts: PathCounts) -> None:
    """Under FakeTensorMode (the fake implementation on the kernel path, SDPA's meta functions
    on the fallback) tk.attention gives the real call's shape, dtype and device (and, on the
    kernel path, its strides), and gradients of the bases' shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    device = env.device(case.device_index)
    bases, make, mask, grad_out = make_inputs(case, device)
    kwargs = call_kwargs(case, mask)
    with tk.use_kernel(case.kernel):
        plan = tk.explain(*make(bases), **kwargs)
        real = tk.attention(*make(bases), **kwargs)
    counts.add(("fake " + (plan.kernel or "fallback")) + ("+backward" if case.needs_grad else ""))
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fakes = [mode.from_tensor(b) for b in bases]
        fake_mask = mode.from_tensor(mask) if torch.is_tensor(mask) and type(mask) is torch.Tensor else mask
        with tk.use_kernel(case.kernel):
            fake = tk.attention(*make(fakes), **call_kwargs(case, fake_mask))
        if case.needs_grad:
            fake.backward(mode.from_tensor(grad_out))
    assert fake.shape == real.shape and fake.dtype == real.dtype and fake.device == real.device, \
        (fake.shape, fake.dtype, fake.device, real.shape, real.dtype, real.device)
    if plan.uses_kernel:
        assert fake.stride() == real.stride(), (fake.stride(), real.stride())
    for base, fake_base in zip(bases, fakes):
        if base.requires_grad:
            assert fake_base.grad is not None and fake_base.grad.shape == base.shape


def compiled_attention(case: AttentionCase, mask):
    """tk.attention under torch.compile(fullgraph=True, backend="aot_eager"), the non-tensor
    arguments (and a causal bias, which dynamo cannot take as an input) closed over."""
    torch._dynamo.reset()
    kwargs = call_kwargs(case, mask)
    tensor_mask = torch.is_tensor(mask) and type(mask) is torch.Tensor

    if tensor_mask:
        def fn(q, k, v, attn_mask):
            with tk.use_kernel(case.kernel):
                return tk.attention(q, k, v, **{**kwargs, "attn_mask": attn_mask})
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        return lambda q, k, v, **_: compiled(q, k, v, mask)

    def fn(q, k, v):
        with tk.use_kernel(case.kernel):
            return tk.attention(q, k, v, **kwargs)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    return lambda q, k, v, **_: compiled(q, k, v)
