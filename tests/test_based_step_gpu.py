"""tk.based_step's kernel (csrc/based/step.cu) on a GPU: explain names it and strict mode
forbids a fallback; outputs and states against a float64 reference for both dtypes, value dims
64 and 128, normalize on and off, 1 to 9 tokens (several passes over the state), in place and
not; states at every 4-byte offset from a 16-byte boundary and with padded (batch, head)
strides; q, k, v read in place whatever their strides; poisoned outputs fully written; a
prefix by tk.based then steps equal to the whole sequence; torch.compile; gradients on the
PyTorch path.

Tolerance: the float64 reference is the definition on the same 16-bit tokens and fp32 state;
the yardstick is tk.based_step's PyTorch path (the same math by PyTorch ops in fp32, output
rounded to the input dtype). Ours must be within 2x its max and relative L2 errors (plus 1e-6
relative slack), for o and for the new state.
"""

import re

import pytest
import torch

import thunderkittens as tk
from thunderkittens._based.step import reference_step
from gpu_support import (BASED_SCALE as DEFAULT_SCALE, assert_within_torch_error, based_in_dtype, based_reference,
                         based_state_from_prefix, based_state_in_dtype, feature_map, require_family_gpu, seeded,
                         with_ones)

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
DTYPE_IDS = ["bf16", "fp16"]
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
ERROR_FACTOR = 2.0
SLACK = 1e-6


@pytest.fixture(scope="module", autouse=True)
def gpu_with_the_based_kernel():
    require_family_gpu("based")


def make_tokens(batch, heads, count, value_dim, dtype):
    return tuple(torch.randn(batch, heads, count, dim, device="cuda").to(dtype) for dim in (16, 16, value_dim))


def expected(q, k, v, state, scale=DEFAULT_SCALE, normalize=False, eps=1e-6):
    """float64 (o, new state): the tokens as a sequence continued from ``state``."""
    out, _ = based_reference(q, k, v, scale, normalize, eps, initial_state=state, want_state=False)
    new_state = state.double() + feature_map(k.double(), scale).transpose(-1, -2) @ with_ones(v.double())
    return out, new_state


def plan_text(dtype, value_dim, count, normalize, inplace, copies=False):
    op = "based_step_inplace_sm80" if inplace and not copies else "based_step_sm80"
    text = f"kernel tk.{op} [sm80 CUDA cores] {DTYPE_NAMES[dtype]} dv={value_dim} tokens={count}"
    text += " normalized" if normalize else ""
    text += " in place" if inplace else " -> new state"
    return text + (" (copies state with .contiguous())" if copies else "")


def on_kernel(q, k, v, state, copies=False, **kwargs):
    """tk.based_step, which must take the kernel: explain says so, strict mode forbids a fallback."""
    plan = tk.explain_based_step(q, k, v, state, **kwargs)
    assert str(plan) == plan_text(q.dtype, v.shape[-1], q.shape[2], kwargs.get("normalize", False),
                                  kwargs.get("inplace", False), copies), str(plan)
    with tk.strict():
        return tk.based_step(q, k, v, state, **kwargs)


def assert_step_close(out, new_state, q, k, v, state_before, scale=DEFAULT_SCALE, normalize=False, eps=1e-6):
    ref_out, ref_state = expected(q, k, v, state_before, scale, normalize, eps)
    base_out, base_state = reference_step(q, k, v, state_before.clone(), scale, normalize, eps, False)
    assert out.dtype == q.dtype and out.shape == ref_out.shape, (out.dtype, out.shape)
    assert new_state.dtype == torch.float32 and new_state.shape == ref_state.shape
    assert_within_torch_error(out, base_out, ref_out, "output", ERROR_FACTOR, SLACK)
    assert_within_torch_error(new_state, base_state, ref_state, "state", ERROR_FACTOR, SLACK)


@pytest.mark.parametrize("inplace", [False, True], ids=["new-state", "inplace"])
@pytest.mark.parametrize("count", [1, 3, 4, 9])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("value_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_step_matches_the_reference(dtype, value_dim, normalize, count, inplace):
    seeded("step", dtype, value_dim, normalize, count, inplace)
    batch, heads = 3, 5  # 15 slices: every 16-byte offset of a slice's start
    q, k, v = make_tokens(batch, heads, count, value_dim, dtype)
    state = based_state_from_prefix(batch, heads, value_dim)
    before = state.clone()
    out, new_state = on_kernel(q, k, v, state, normalize=normalize, inplace=inplace)
    assert (new_state is state) == inplace
    if not inplace:
        assert torch.equal(state, before), "inplace=False changed the state"
        assert new_state.is_contiguous()
    assert_step_close(out, new_state, q, k, v, before, normalize=normalize)


@pytest.mark.parametrize("scale, eps", [(0.05, 1e-6), (1.0, 1e-3)])
def test_explicit_scale_and_eps(scale, eps):
    seeded("scale", scale)
    q, k, v = make_tokens(2, 3, 2, 64, torch.bfloat16)
    state = based_state_from_prefix(2, 3, 64, scale=scale)
    out, new_state = on_kernel(q, k, v, state, scale=scale, eps=eps, normalize=True)
    assert_step_close(out, new_state, q, k, v, state, scale, True, eps)


@pytest.mark.parametrize("inplace", [False, True], ids=["new-state", "inplace"])
def test_outputs_are_fully_written(inplace):
    """The op's new allocations are handed memory just filled with NaN (the caching allocator
    reuses a freed block of the same size): every element must be written."""
    seeded("poison", inplace)
    batch, heads, count, value_dim = 4, 3, 2, 128
    q, k, v = make_tokens(batch, heads, count, value_dim, torch.float16)
    state = based_state_from_prefix(batch, heads, value_dim)
    before = state.clone()
    poison = [torch.full((batch, heads, count, value_dim), float("nan"), device="cuda", dtype=torch.float16),
              torch.full(state.shape, float("nan"), device="cuda")]
    del poison
    out, new_state = on_kernel(q, k, v, state, inplace=inplace)
    assert torch.isfinite(out).all() and torch.isfinite(new_state).all()
    assert_step_close(out, new_state, q, k, v, before)


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_states_off_a_16_byte_boundary(offset):
    """A contiguous state 4, 8 or 12 bytes past a 16-byte boundary: updated in place directly,
    copied for a new state; the same state as an aligned one."""
    seeded("offset", offset)
    q, k, v = make_tokens(2, 3, 1, 64, torch.bfloat16)
    aligned = based_state_from_prefix(2, 3, 64)
    buffer = torch.full((aligned.numel() + offset,), float("nan"), device="cuda")
    state = buffer[offset:].view(aligned.shape).copy_(aligned)
    assert state.data_ptr() % 16 == 4 * offset
    out, new_state = on_kernel(q, k, v, state, copies=True, normalize=True)
    assert torch.equal(state, aligned)
    out_aligned, state_aligned = on_kernel(q, k, v, aligned.clone(), normalize=True)
    assert torch.equal(out, out_aligned) and torch.equal(new_state, state_aligned)
    out_inplace, returned = on_kernel(q, k, v, state, normalize=True, inplace=True)
    # Each element's update is the same arithmetic wherever the slice starts (the output's sum
    # order follows the alignment).
    assert returned is state and torch.equal(state, state_aligned)
    assert_step_close(out_inplace, state, q, k, v, aligned, normalize=True)
    assert torch.isnan(buffer[:offset]).all(), "wrote before the state"


def test_padded_slices_in_place_through_the_op():
    """The in-place op updates a state whose (batch, head) slices are padded apart (any slice
    offset modulo 16 bytes) and leaves the padding alone."""
    seeded("padded")
    batch, heads, value_dim = 2, 5, 128
    q, k, v = make_tokens(batch, heads, 3, value_dim, torch.float16)
    dense = based_state_from_prefix(batch, heads, value_dim)
    slice_floats = dense[0, 0].numel()
    storage = torch.full((batch, heads, slice_floats + 3), float("nan"), device="cuda")
    state = storage[..., :slice_floats].view(batch, heads, 273, value_dim + 1)
    state.copy_(dense)
    out = torch.ops.tk.based_step_inplace_sm80(q, k, v, state, DEFAULT_SCALE, True, 1e-6)
    assert torch.isnan(storage[..., slice_floats:]).all(), "wrote into the padding"
    assert_step_close(out, state, q, k, v, dense, normalize=True)


def test_in_place_refuses_slices_that_share_memory():
    q, k, v = make_tokens(3, 2, 1, 64, torch.bfloat16)
    state = based_state_from_prefix(1, 2, 64).expand(3, 2, 273, 65)
    with pytest.raises(RuntimeError, match=r"tk::based_step_inplace_sm80: state's \(batch, head\) slices share memory"):
        torch.ops.tk.based_step_inplace_sm80(q, k, v, state, DEFAULT_SCALE, False, 1e-6)
    out, new_state = torch.ops.tk.based_step_sm80(q, k, v, state, DEFAULT_SCALE, False, 1e-6)  # reads it fine
    assert_step_close(out, new_state, q, k, v, state.contiguous())


def test_tokens_are_read_in_place_whatever_their_strides():
    seeded("strides")
    batch, count, heads = 2, 3, 4
    q = torch.randn(batch, count, heads, 32, device="cuda", dtype=torch.bfloat16).transpose(1, 2)[..., 1::2]
    k = torch.randn(batch, count, heads, 16, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(batch, heads, 64, count, device="cuda", dtype=torch.bfloat16).transpose(2, 3)
    state = based_state_from_prefix(batch, heads, 64)
    out, new_state = on_kernel(q, k, v, state, normalize=True)
    dense = on_kernel(q.contiguous(), k.contiguous(), v.contiguous(), state, normalize=True)
    assert torch.equal(out, dense[0]) and torch.equal(new_state, dense[1])
    assert_step_close(out, new_state, q, k, v, state, normalize=True)


def test_a_non_contiguous_state_in_place():
    seeded("non-contiguous")
    q, k, v = make_tokens(2, 3, 1, 64, torch.float16)
    dense = based_state_from_prefix(2, 3, 64)
    state = dense.transpose(0, 1).contiguous().transpose(0, 1)
    out, returned = on_kernel(q, k, v, state, copies=True, inplace=True)
    assert returned is state
    assert_step_close(out, state, q, k, v, dense)


@pytest.mark.parametrize("inplace", [False, True], ids=["new-state", "inplace"])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("dtype, value_dim", [(torch.bfloat16, 64), (torch.float16, 128), (torch.bfloat16, 128),
                                              (torch.float16, 64)], ids=["bf16-dv64", "fp16-dv128", "bf16-dv128",
                                                                         "fp16-dv64"])
def test_prefix_then_steps_equal_the_whole_sequence(dtype, value_dim, normalize, inplace):
    """tk.based over a prefix, then the step kernel one token at a time and a last step of five:
    outputs and final state within the tolerance of the whole sequence's float64 reference."""
    seeded("prefix", dtype, value_dim, normalize, inplace)
    prefix, total = 70, 90
    q, k, v = make_tokens(2, 3, total, value_dim, dtype)
    with tk.strict():
        _, state = tk.based(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], normalize=normalize,
                            output_final_state=True)
    outs = []
    for start, stop in [(t, t + 1) for t in range(prefix, total - 5)] + [(total - 5, total)]:
        out, new_state = on_kernel(q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop], state,
                                   normalize=normalize, inplace=inplace)
        assert (new_state is state) == inplace
        state = new_state
        outs.append(out)
    stepped = torch.cat(outs, 2)
    # The yardsticks of the whole sequence (as tests/test_based_gpu.py holds tk.based to them):
    # PyTorch's math in the input dtype, and phi(k) in the input dtype accumulated in fp32.
    ref_out, ref_state = based_reference(q, k, v, DEFAULT_SCALE, normalize)
    base_out = based_in_dtype(q, k, v, DEFAULT_SCALE, normalize)
    base_state = based_state_in_dtype(k, v, DEFAULT_SCALE)
    rows = slice(prefix, None)
    assert_within_torch_error(stepped, base_out[:, :, rows], ref_out[:, :, rows], "stepped output", ERROR_FACTOR,
                              SLACK)
    assert_within_torch_error(state, base_state, ref_state, "final state", ERROR_FACTOR, SLACK)


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    seeded("compile")
    q, k, v = make_tokens(2, 4, 1, 128, torch.bfloat16)
    state = based_state_from_prefix(2, 4, 128)
    eager_state = state.clone()

    def f(q, k, v, state):
        out, new_state = tk.based_step(q, k, v, state, normalize=True, inplace=True)
        return out * 2, new_state

    with torch.no_grad(), tk.strict():
        compiled = torch.compile(f, fullgraph=True)(q, k, v, state)
        eager = f(q, k, v, eager_state)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(state, eager_state)


def test_gradients_take_the_pytorch_path():
    seeded("grad")
    q, k, v = (t.requires_grad_() for t in make_tokens(1, 2, 2, 64, torch.bfloat16))
    state = based_state_from_prefix(1, 2, 64).requires_grad_()
    plan = tk.explain_based_step(q, k, v, state)
    assert not plan.uses_kernel and "q requires grad and the based_step kernel has no backward" in str(plan)
    with tk.strict(), pytest.raises(tk.FallbackError, match=re.escape("q requires grad")):
        tk.based_step(q, k, v, state)
    out, new_state = tk.based_step(q, k, v, state, normalize=True)
    (out.float().sum() + new_state.sum()).backward()
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, state)]
    ref_out, _ = based_reference(*leaves[:3], normalize=True, initial_state=leaves[3], want_state=False)
    ref_state = leaves[3] + feature_map(leaves[1], DEFAULT_SCALE).transpose(-1, -2) @ with_ones(leaves[2])
    (ref_out.sum() + ref_state.sum()).backward()
    for name, t, leaf in zip("q k v state".split(), (q, k, v, state), leaves):
        error = ((t.grad.double() - leaf.grad).norm() / leaf.grad.norm()).item()
        assert error < 2e-2, (name, error)  # the PyTorch path in fp32, gradients rounded to bf16
