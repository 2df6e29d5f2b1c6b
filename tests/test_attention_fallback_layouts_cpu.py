"""What the SDPA fallback hands SDPA, on the CPU standing in for a GPU (the cpu_kernel fixture
makes the CPU the kernels' device, so the fallback treats it as it treats a GPU).

Issue 45's two fallback defects, fixed in tk.attention (tests/test_fallback_layouts_gpu.py has
the GPU side):
  * SDPA's fused CUDA kernels misread views 8 bytes off a 16-byte boundary (garbage, or a
    ``misaligned address`` fault): on a GPU the fallback hands SDPA such operands (and any
    with strides that are not multiples of 16 bytes) as one fresh contiguous copy, gradients
    flow back through it, and explain says so;
  * causal_lower_right with Lq > Lk: the first Lq - Lk rows see no key. SDPA's fused backends
    gave NaN there; the fallback runs SDPA on the last Lk query rows only (plain is_causal) and
    puts zero rows in front: 0 out and 0 gradients on every path.
"""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import thunderkittens as tk
from thunderkittens._attention import api as attention_api
from reference import lower_right_bias

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class SdpaSpy:
    """Records every F.scaled_dot_product_attention call tk.attention makes (patched where
    tk.attention looks it up: a CausalBias dispatches on F.scaled_dot_product_attention itself)."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = F.scaled_dot_product_attention

        def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
            self.calls.append({"query": query, "key": key, "value": value, "attn_mask": attn_mask,
                               "is_causal": is_causal})
            return real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

        monkeypatch.setattr(attention_api, "F", SimpleNamespace(scaled_dot_product_attention=spy))


@pytest.fixture
def sdpa(monkeypatch):
    return SdpaSpy(monkeypatch)


def aligned_for_sdpa(t):
    """16-byte aligned data, contiguous last dim, other strides multiples of 16 bytes."""
    per_16 = 16 // t.element_size()
    return (t.data_ptr() % 16 == 0 and t.stride(-1) == 1
            and all(t.shape[d] == 1 or t.stride(d) % per_16 == 0 for d in range(t.dim() - 1)))


def misaligned_view(shape, dtype, offset=4, seed=0):
    """``torch.randn(*shape[:-1], d + 8)[..., offset:offset + d]`` (requires grad on the base):
    in bf16/fp16 offset 4 is 8 bytes off a 16-byte boundary, in float32 offset 2."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(*shape[:-1], shape[-1] + 8, generator=gen, dtype=dtype).requires_grad_()
    return base, base[..., offset:offset + shape[-1]]


# ---- defect 1: operands SDPA may misread get one fresh copy --------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("which", ["query", "key", "value", "all"])
def test_misaligned_views_reach_sdpa_as_aligned_copies(cpu_kernel, sdpa, dtype, head_dim, which):
    torch_dtype = DTYPES[dtype]
    offset = 2 if dtype == "fp32" else 4
    names = ("query", "key", "value")
    bases, views = {}, {}
    for i, name in enumerate(names):
        if which in (name, "all"):
            bases[name], views[name] = misaligned_view((2, 4, 33, head_dim), torch_dtype, offset, i)
        else:
            bases[name] = views[name] = torch.randn(2, 4, 33, head_dim, dtype=torch_dtype,
                                                    requires_grad=True)
    q, k, v = (views[name] for name in names)
    # Gradients: the call falls back (float32 or head dim 80/256, or sm80 forced with grad).
    with tk.use_kernel("sm80"):
        plan = tk.explain(q, k, v, is_causal=True)
        assert not plan.uses_kernel, str(plan)
        copied = tuple(name for name in names if which in (name, "all"))
        assert plan.copies == copied, str(plan)
        assert str(plan).endswith(f" (copies {', '.join(copied)} with .contiguous() for torch SDPA)")
        out = tk.attention(q, k, v, is_causal=True)
    (call,) = sdpa.calls
    for name in names:
        assert aligned_for_sdpa(call[name]), (name, call[name].stride())
        assert (call[name] is views[name]) == (name not in copied)
    grad_out = torch.randn(out.shape, dtype=torch_dtype)
    out.backward(grad_out)

    leaves = [views[name].detach().clone().requires_grad_() for name in names]
    expected = F.scaled_dot_product_attention(*leaves, is_causal=True)
    expected.backward(grad_out)
    assert torch.equal(out.detach(), expected.detach())
    for name, leaf in zip(names, leaves):
        grad = bases[name].grad
        if name in copied:  # back through the copy and the slice to the base tensor
            assert torch.equal(grad[..., offset:offset + head_dim], leaf.grad)
            grad = grad.clone()
            grad[..., offset:offset + head_dim] = 0
            assert torch.all(grad == 0)
        else:
            assert torch.equal(grad, leaf.grad)


def test_the_issues_repro_in_small(cpu_kernel, sdpa):
    """The issue's repro (head dim 80: a fallback), at a tenth of its lengths: a transposed q,
    a value view 8 bytes off a 16-byte boundary, causal_lower_right, scale 0.3, GQA 16/8."""
    q = torch.randn(1, 100, 16, 80, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(1, 8, 205, 80, dtype=torch.bfloat16)
    v = torch.randn(1, 8, 205, 88, dtype=torch.bfloat16)[..., 4:84]
    bias = lower_right_bias(100, 205)
    kwargs = dict(attn_mask=bias, scale=0.3, enable_gqa=True)
    assert str(tk.explain(q, k, v, **kwargs)) == (
        "fallback torch SDPA: head dim 80 is not supported by the kernel (64, 96 or 128 only) "
        "(copies value with .contiguous() for torch SDPA)")
    out = tk.attention(q, k, v, **kwargs)
    (call,) = sdpa.calls
    assert call["query"] is q and call["key"] is k and call["value"] is not v
    assert aligned_for_sdpa(call["value"]) and torch.equal(call["value"], v)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)
    assert (out.double() - ref).abs().max() < 2e-2


@pytest.mark.parametrize("layout", ["transposed", "fused", "padded rows", "expanded heads"])
def test_views_sdpa_reads_well_are_not_copied(cpu_kernel, sdpa, layout):
    d = 80  # a fallback head dim
    if layout == "transposed":
        q, k, v = (torch.randn(2, 33, 4, d, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    elif layout == "fused":  # slices of one (B, L, 3, H, D) projection: 160-byte offsets
        q, k, v = torch.randn(2, 33, 3, 4, d, dtype=torch.bfloat16).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    elif layout == "padded rows":
        q, k, v = (torch.randn(2, 4, 33, d + 8, dtype=torch.bfloat16)[..., :d] for _ in range(3))
    else:
        q = torch.randn(2, 4, 33, d, dtype=torch.bfloat16)
        k, v = (torch.randn(2, 1, 33, d, dtype=torch.bfloat16).expand(2, 4, 33, d) for _ in range(2))
    plan = tk.explain(q, k, v)
    assert not plan.uses_kernel and plan.copies == (), str(plan)
    tk.attention(q, k, v)
    (call,) = sdpa.calls
    assert call["query"] is q and call["key"] is k and call["value"] is v


def test_strides_not_multiples_of_16_bytes_are_copied(cpu_kernel, sdpa):
    # Rows of 67 elements: a stride of 134 bytes, which a contiguous copy (rows of 64) fixes.
    q, k, v = (torch.randn(2, 4, 33, 67, dtype=torch.float32)[..., :64] for _ in range(3))
    plan = tk.explain(q, k, v)
    assert plan.copies == ("query", "key", "value"), str(plan)
    tk.attention(q, k, v)
    assert all(aligned_for_sdpa(sdpa.calls[0][name]) for name in ("query", "key", "value"))


def test_a_head_dim_whose_copy_is_no_better_is_not_copied(cpu_kernel, sdpa):
    # Head dim 36 in bf16: 72-byte rows even when contiguous (SDPA pads such tensors itself).
    # Only a misaligned start is worth a copy then.
    q = torch.randn(2, 4, 33, 40, dtype=torch.bfloat16)[..., :36]
    base = torch.randn(2 * 4 * 33 * 36 + 4, dtype=torch.bfloat16)
    k = base[4:].view(2, 4, 33, 36)
    assert tk.explain(q, k, q).copies == ("key",)


def test_a_mask_is_rebuilt_not_copied(cpu_kernel, sdpa):
    # A tensor mask on the GPU is rebuilt for SDPA anyway (rows that see no key: below), in a new
    # allocation: a misaligned one needs no copy of its own.
    q, k, v = (torch.randn(2, 4, 16, 80, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.randn(16, 16 + 8, dtype=torch.bfloat16)[:, 4:20]
    plan = tk.explain(q, k, v, attn_mask=mask)
    assert plan.copies == (), str(plan)
    out = tk.attention(q, k, v, attn_mask=mask)
    given = sdpa.calls[0]["attn_mask"]
    assert given is not mask and aligned_for_sdpa(given) and torch.equal(given, mask)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask.contiguous()))


def test_no_copies_off_the_kernels_device(sdpa):
    """Without the stand-in the CPU is not the kernels' device: CPU SDPA reads any view."""
    base, v = misaligned_view((2, 4, 33, 80), torch.bfloat16)
    q = torch.randn(2, 4, 33, 80, dtype=torch.bfloat16)
    assert tk.explain(q, q, v).copies == ()
    tk.attention(q, q, v)
    assert sdpa.calls[0]["value"] is v


def test_compiled_fallback_copies_by_strides(cpu_kernel):
    """Under torch.compile the data address is unknown while tracing: strides decide. A view
    with rows of 67 elements is copied; the answer and the gradient match eager's."""
    torch._dynamo.reset()
    base = torch.randn(2, 4, 33, 67, dtype=torch.float32, requires_grad=True)

    def f(x):
        q = x[..., :64]
        return tk.attention(q, q, q, is_causal=True)

    eager = f(base)
    eager.sum().backward()
    eager_grad = base.grad.clone()
    base.grad = None
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(base)
    compiled.sum().backward()
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(base.grad, eager_grad)


# ---- defect 2: rows that see no key --------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 80, 256])
@pytest.mark.parametrize("len_q, len_kv", [(40, 17), (17, 1), (300, 299), (5, 4)])
def test_rows_that_see_no_key_are_zero_on_the_fallback(cpu_kernel, sdpa, dtype, head_dim,
                                                       len_q, len_kv):
    torch_dtype = DTYPES[dtype]
    torch.manual_seed(len_q * 1000 + len_kv)
    q = torch.randn(2, 8, len_q, head_dim, dtype=torch_dtype, requires_grad=True)
    k, v = (torch.randn(2, 2, len_kv, head_dim, dtype=torch_dtype, requires_grad=True)
            for _ in range(2))
    bias = lower_right_bias(len_q, len_kv)
    with tk.use_kernel("sm80"):  # with grad: a fallback for every dtype and head dim
        plan = tk.explain(q, k, v, attn_mask=bias, enable_gqa=True)
        assert not plan.uses_kernel, str(plan)
        out = tk.attention(q, k, v, attn_mask=bias, enable_gqa=True)
    hidden = len_q - len_kv
    # SDPA saw the last Lk query rows with plain is_causal (square: lower-right is top-left).
    (call,) = sdpa.calls
    assert call["attn_mask"] is None and call["is_causal"] is True
    assert call["query"].shape[-2] == len_kv
    grad_out = torch.randn(out.shape, dtype=torch_dtype)
    out.backward(grad_out)
    assert torch.all(out[:, :, :hidden] == 0)
    assert torch.all(q.grad[:, :, :hidden] == 0)
    for t in (out, q.grad, k.grad, v.grad):
        assert torch.isfinite(t).all()
    # The other rows and the gradients: the float64 definition.
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kk, vv = (t.repeat_interleave(4, dim=1) for t in (k64, v64))
    scores = (q64 @ kk.mT) / math.sqrt(head_dim)
    visible = torch.ones(len_q, len_kv, dtype=torch.bool).tril(len_kv - len_q)
    probs = torch.softmax(scores[:, :, hidden:].masked_fill(~visible[hidden:], -math.inf), -1)
    ref = torch.cat([torch.zeros(2, 8, hidden, head_dim, dtype=torch.float64), probs @ vv], dim=2)
    ref.backward(grad_out.double())
    tol = 1e-5 if dtype == "fp32" else 3e-2
    for ours, theirs in ((out, ref), (q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        err = (ours.double() - theirs).abs().max().item()
        assert err <= tol * max(1.0, theirs.abs().max().item()), err


@pytest.mark.parametrize("rank", [3, 5])
def test_rows_that_see_no_key_on_the_fallback_any_rank(rank):
    shape_q, shape_kv = (4, 9, 80), (4, 6, 80)
    if rank == 5:
        shape_q, shape_kv = (2, 3) + shape_q, (2, 3) + shape_kv
    q, k, v = torch.randn(shape_q), torch.randn(shape_kv), torch.randn(shape_kv)
    out = tk.attention(q, k, v, attn_mask=lower_right_bias(9, 6))
    assert out.shape == shape_q[:-1] + (80,)
    assert torch.all(out[..., :3, :] == 0)
    # The last 6 rows: a square lower-right mask, i.e. plain is_causal.
    torch.testing.assert_close(out[..., 3:, :], F.scaled_dot_product_attention(
        q[..., 3:, :], k, v, is_causal=True))


def test_rows_that_see_no_key_under_compile(cpu_kernel):
    torch._dynamo.reset()
    bias = lower_right_bias(40, 17)  # dynamo cannot construct a CausalBias: closed over
    q = torch.randn(2, 4, 40, 80, requires_grad=True)
    k, v = torch.randn(2, 4, 17, 80), torch.randn(2, 4, 17, 80)

    def f(q, k, v):
        return tk.attention(q, k, v, attn_mask=bias)

    out = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    out.sum().backward()
    assert torch.all(out[:, :, :23] == 0) and torch.all(q.grad[:, :, :23] == 0)
    torch.testing.assert_close(out, f(q, k, v))


# ---- rows a boolean or additive mask leaves no key -------------------------------------------------

def naive_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    """softmax(q k^T * scale + mask) v, written out: NaN in a row the mask leaves no key, and NaN
    gradients, as SDPA's fused CUDA backends gave."""
    assert not is_causal and dropout_p == 0.0
    if enable_gqa:
        ratio = query.shape[-3] // key.shape[-3]
        key, value = (t.repeat_interleave(ratio, dim=-3) for t in (key, value))
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query @ key.mT) * scale
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool
                  else scores + attn_mask)
    return torch.softmax(scores.float(), dim=-1).to(query.dtype) @ value


def mask_with_empty_rows(kind, shape, empty_rows, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(shape, generator=gen) < 0.6
    keep[..., 0] = True
    keep[..., empty_rows, :] = False
    if kind == "bool":
        return keep
    return (torch.randn(shape, generator=gen) * 2).masked_fill(~keep, -math.inf).to(dtype)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("shape", ["2d", "heads", "expanded"])
def test_mask_rows_that_see_no_key_are_zero_with_zero_gradients(cpu_kernel, monkeypatch, kind,
                                                                shape):
    """Through an SDPA that gives NaN for such rows (as the fused CUDA backends did): 0 out,
    0 gradients, everything else the definition's answer."""
    monkeypatch.setattr(attention_api, "F", SimpleNamespace(scaled_dot_product_attention=naive_sdpa))
    torch.manual_seed(3)
    q = torch.randn(2, 4, 9, 32, requires_grad=True)
    k, v = (torch.randn(2, 2, 11, 32, requires_grad=True) for _ in range(2))
    empty = [0, 4, 8]
    if shape == "2d":
        mask = mask_with_empty_rows(kind, (9, 11), empty)
    elif shape == "heads":
        mask = mask_with_empty_rows(kind, (2, 4, 9, 11), empty)
    else:
        mask = mask_with_empty_rows(kind, (2, 1, 9, 11), empty).expand(2, 4, 9, 11)
    assert not tk.explain(q, k, v, attn_mask=mask, enable_gqa=True).uses_kernel
    out = tk.attention(q, k, v, attn_mask=mask, enable_gqa=True)
    grad_out = torch.randn(out.shape)
    out.backward(grad_out)
    assert torch.all(out[:, :, empty] == 0) and torch.all(q.grad[:, :, empty] == 0)
    for t in (out, q.grad, k.grad, v.grad):
        assert torch.isfinite(t).all()
    # The float64 definition, rows that see no key 0.
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    visible = mask if kind == "bool" else mask != -math.inf
    scores = (q64 @ k64.repeat_interleave(2, 1).mT) / math.sqrt(32)
    scores = scores + (0 if kind == "bool" else mask.double().masked_fill(~visible, 0))
    scores = scores.masked_fill(~visible, -math.inf)
    rows = visible.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~rows, 0), -1).masked_fill(~rows, 0)
    ref = probs @ v64.repeat_interleave(2, 1)
    ref.backward(grad_out.double())
    for ours, theirs in ((out, ref), (q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(ours.double(), theirs, atol=1e-5, rtol=1e-5)


def test_mask_rows_guard_keeps_nan_inputs_nan(cpu_kernel):
    """The guard zeroes rows that see no key only: a NaN in a query row still gives NaN."""
    q = torch.randn(1, 2, 5, 32)
    q[0, 1, 2, 7] = math.nan
    k = v = torch.randn(1, 2, 6, 32)
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[3] = False
    out = tk.attention(q, k, v, attn_mask=mask)
    assert torch.isnan(out[0, 1, 2]).all() and torch.all(out[:, :, 3] == 0)
    assert torch.isfinite(out[0, 0]).all()


def test_mask_rows_guard_under_compile(cpu_kernel):
    torch._dynamo.reset()
    q = torch.randn(2, 4, 9, 32, requires_grad=True)
    k = v = torch.randn(2, 4, 11, 32)
    mask = mask_with_empty_rows("bool", (9, 11), [2, 5])

    def f(q, k, v, mask):
        return tk.attention(q, k, v, attn_mask=mask)

    out = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, mask)
    out.sum().backward()
    assert torch.all(out[:, :, [2, 5]] == 0) and torch.all(q.grad[:, :, [2, 5]] == 0)
    torch.testing.assert_close(out, f(q, k, v, mask))
