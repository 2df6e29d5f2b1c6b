"""tk::based_fwd_sm90 (the TMA + wgmma Based forward, on Hopper) and tk::based_fwd_sm80 (the mma.sync
one), each in turn on a GPU that runs it, called as the op, against a float64
quadratic reference: both dtypes, value dims 64 and 128, normalize on and off, lengths around the
64-row chunk (1, 17, 63, 64, 65, 1000, 4097), initial and final state (a prefix, then the rest
from its state, equals the whole sequence), strided inputs read in place, outputs that must be
fully written, batch * heads beyond 65535, other scales, repeatability, and the op's checks.

Tolerance. The reference is the float64 quadratic form on the same 16-bit inputs. The kernel is
held to what PyTorch itself makes of the same math in the input dtype (scores, polynomial and
products rounded to bf16/fp16 as torch's bf16/fp16 ops round them, fp32 accumulation inside
matmuls):

    max |o - ref| <= 2 * max |o_torch - ref| + SLACK * max |ref|     (and the same for the
    relative L2 error),

as FlashAttention's tests hold attention. The kernel's own rounding points: the polynomial
scores of a chunk and the products q_a q_b, k_a k_b are rounded to 16 bits once (they are mma
operands), the fp32 state is rounded to 16 bits where it multiplies the queries (the constant
term stays fp32; the normaliser's quadratic term uses a 16 + 16-bit split), and the output once.
A float64 model of exactly that (not part of the suite) put its error at 0.3 .. 1.4x PyTorch's
over these shapes. The final state (fp32) accumulates the 16-bit products k_a k_b, as PyTorch
does when it builds phi(k) in the input dtype and multiplies in fp32; its relative (Frobenius)
error is held to 2x that computation's plus 1e-6. (For bf16 both are ~1e-3 at short lengths:
one rounding of k_a k_b, not averaged away yet.)

Run: pytest tests/test_based_kernel_gpu.py (GPU tests; skipped without one).
Benchmark (B=16, H=16, Dv=64 and 128, N=1k..16k, against flash-linear-attention if installed):
    python tests/test_based_kernel_gpu.py
"""

import pytest
import torch

import thunderkittens  # noqa: F401  (loads the extension: registers torch.ops.tk.*)
from gpu_support import (BASED_FEATURES as FEATURES, BASED_SCALE as DEFAULT_SCALE, BASED_STATE_ROWS as STATE_ROWS,
                         assert_within_torch_error, based_batch_heads_for as batch_heads_for, based_in_dtype,
                         based_reference as reference, based_state_from_prefix as state_from_prefix,
                         based_state_in_dtype as state_in_dtype, rel_l2_error, require_kernel_op,
                         seeded)

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
VALUE_DIMS = [64, 128]
LENGTHS = [1, 17, 63, 64, 65, 1000, 4097]
ERROR_FACTOR = 2.0
SLACK = 1e-6  # relative to max |ref|: fp32 accumulation noise
STATE_SLACK = 1e-6


# The op the module's tests call now (the fixture below sets it).
family = {"op": "based_fwd_sm80"}


def op(q, k, v, scale=DEFAULT_SCALE, normalize=False, eps=1e-6, initial_state=None, output_final_state=False):
    return getattr(torch.ops.tk, family["op"])(q, k, v, scale, normalize, eps, initial_state, output_final_state)


def runs_sm90():
    from thunderkittens import _extension

    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and _extension.has_arch_specific_code_for((9, 0)))


@pytest.fixture(scope="module", autouse=True, params=["based_fwd_sm90", "based_fwd_sm80"])
def kernel_must_run_here(request):
    """Every test once per forward op this GPU runs (based_fwd_sm90 on Hopper only)."""
    if request.param == "based_fwd_sm90" and not runs_sm90():
        pytest.skip("tk::based_fwd_sm90 needs an sm_90 GPU and a 90a build")
    family["op"] = request.param

    def probe():
        q = torch.zeros(1, 1, 1, FEATURES, device="cuda", dtype=torch.bfloat16)
        op(q, q, torch.zeros(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16))

    require_kernel_op("based", request.param, probe)
    return request.param


def make_inputs(batch, heads, length, value_dim, dtype, v_mean=0.0):
    q = torch.randn(batch, heads, length, FEATURES, device="cuda").to(dtype)
    k = torch.randn(batch, heads, length, FEATURES, device="cuda").to(dtype)
    v = (torch.randn(batch, heads, length, value_dim, device="cuda") + v_mean).to(dtype)
    return q, k, v


# ---- checks ----------------------------------------------------------------------------------


def symmetric_part(state):
    """The state with its quadratic block replaced by (P + P^T) / 2 (what the kernel keeps)."""
    quad = state[..., 1 + FEATURES:, :].unflatten(-2, (FEATURES, FEATURES))
    quad = (quad + quad.transpose(-2, -3)) / 2
    return torch.cat([state[..., : 1 + FEATURES, :], quad.flatten(-3, -2)], -2)


def assert_output_close(out, q, k, v, scale, normalize=False, eps=1e-6, initial_state=None):
    ref, _ = reference(q, k, v, scale, normalize, eps, initial_state, want_state=False)
    base = based_in_dtype(q, k, v, scale, normalize, eps, initial_state)
    assert out.dtype == q.dtype, out.dtype
    assert_within_torch_error(out, base, ref, "output", ERROR_FACTOR, SLACK)


def assert_state_close(state, q, k, v, scale, initial_state=None, expected=None):
    """state against the float64 final state (or `expected`, float64), to 2x PyTorch's error."""
    if expected is None:
        _, expected = reference(q, k, v, scale, initial_state=initial_state)
        if initial_state is not None:
            expected = symmetric_part(expected)
    base = state_in_dtype(k, v, scale, None if initial_state is None else symmetric_part(initial_state))
    assert state.dtype == torch.float32 and state.shape == expected.shape, (state.dtype, state.shape)
    assert torch.isfinite(state).all(), "non-finite state"
    ours, theirs = rel_l2_error(state, expected), rel_l2_error(base, expected)
    assert ours <= ERROR_FACTOR * theirs + STATE_SLACK, (
        f"state relative error {ours:.3e} > {ERROR_FACTOR} x PyTorch's {theirs:.3e}")


# ---- outputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_output_matches_reference(dtype, value_dim, normalize, length):
    seeded("output", dtype, value_dim, normalize, length)
    batch, heads = batch_heads_for(length)
    q, k, v = make_inputs(batch, heads, length, value_dim, dtype)
    out, state = op(q, k, v, DEFAULT_SCALE, normalize)
    assert state.numel() == 0 and state.dtype == torch.float32
    assert out.is_contiguous()
    assert_output_close(out, q, k, v, DEFAULT_SCALE, normalize)


@pytest.mark.parametrize("scale", [0.05, 0.5, 1.0])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
def test_other_scales_and_value_offsets(scale, normalize):
    seeded("scale", scale, normalize)
    q, k, v = make_inputs(2, 2, 300, 64, torch.bfloat16, v_mean=1.0)
    out, _ = op(q, k, v, scale, normalize, 1e-3)
    assert_output_close(out, q, k, v, scale, normalize, 1e-3)


# ---- state -----------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 17, 64, 65, 1000])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_final_state(dtype, value_dim, normalize, length):
    seeded("final", dtype, value_dim, normalize, length)
    q, k, v = make_inputs(2, 3, length, value_dim, dtype)
    out, state = op(q, k, v, DEFAULT_SCALE, normalize, output_final_state=True)
    assert state.shape == (2, 3, STATE_ROWS, value_dim + 1) and state.is_contiguous()
    assert_output_close(out, q, k, v, DEFAULT_SCALE, normalize)
    assert_state_close(state, q, k, v, DEFAULT_SCALE)


@pytest.mark.parametrize("length", [1, 17, 65, 1000])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_initial_state(dtype, value_dim, normalize, length):
    seeded("initial", dtype, value_dim, normalize, length)
    q, k, v = make_inputs(2, 3, length, value_dim, dtype)
    s0 = state_from_prefix(2, 3, value_dim, DEFAULT_SCALE)
    out, state = op(q, k, v, DEFAULT_SCALE, normalize, initial_state=s0, output_final_state=True)
    assert_output_close(out, q, k, v, DEFAULT_SCALE, normalize, initial_state=s0)
    assert_state_close(state, q, k, v, DEFAULT_SCALE, initial_state=s0)
    # Without asking for the final state, the same output.
    alone, none = op(q, k, v, DEFAULT_SCALE, normalize, initial_state=s0)
    assert none.numel() == 0
    assert torch.equal(alone, out)


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
def test_asymmetric_initial_state(normalize):
    """Any initial state gives the reference's outputs (phi(q)^T S0 only sees S0's symmetric
    part); the final state carries that symmetric part."""
    seeded("asymmetric", normalize)
    q, k, v = make_inputs(1, 2, 100, 64, torch.bfloat16)
    s0 = state_from_prefix(1, 2, 64, DEFAULT_SCALE)
    s0[..., 1 + FEATURES:, :-1] += 30 * torch.randn_like(s0[..., 1 + FEATURES:, :-1])  # z stays a real one
    out, state = op(q, k, v, DEFAULT_SCALE, normalize, initial_state=s0, output_final_state=True)
    assert_output_close(out, q, k, v, DEFAULT_SCALE, normalize, initial_state=s0)
    assert_state_close(state, q, k, v, DEFAULT_SCALE, initial_state=s0)
    quad = state[..., 1 + FEATURES:, :].unflatten(-2, (FEATURES, FEATURES))
    assert torch.equal(quad[..., :-1], quad.transpose(-2, -3)[..., :-1]), "the value columns' block is symmetric"
    torch.testing.assert_close(quad[..., -1], quad.transpose(-2, -3)[..., -1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("split", [1, 64, 100, 999])
@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_prefix_then_rest_equals_whole(dtype, value_dim, normalize, split):
    seeded("prefix", dtype, value_dim, normalize, split)
    length = 1000
    q, k, v = make_inputs(2, 2, length, value_dim, dtype)
    head, middle = op(q[:, :, :split], k[:, :, :split], v[:, :, :split], DEFAULT_SCALE, normalize,
                      output_final_state=True)
    rest, state = op(q[:, :, split:], k[:, :, split:], v[:, :, split:], DEFAULT_SCALE, normalize,
                     initial_state=middle, output_final_state=True)
    assert_output_close(torch.cat([head, rest], 2), q, k, v, DEFAULT_SCALE, normalize)
    assert_state_close(state, q, k, v, DEFAULT_SCALE)
    whole, whole_state = op(q, k, v, DEFAULT_SCALE, normalize, output_final_state=True)
    assert_state_close(state, q, k, v, DEFAULT_SCALE, expected=whole_state.double())


# ---- layouts and sizes -----------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
def test_strided_inputs_read_in_place(value_dim, normalize):
    """(B, N, H, D) memory viewed as (B, H, N, D), and rows padded past their last column: the
    same bits as contiguous inputs."""
    seeded("strided", value_dim, normalize)
    batch, heads, length = 2, 3, 333
    q = torch.randn(batch, length, heads, FEATURES, device="cuda").to(torch.bfloat16).transpose(1, 2)
    k = torch.randn(batch, length, heads, FEATURES + 8, device="cuda").to(torch.bfloat16)[..., :FEATURES]
    k = k.transpose(1, 2)
    v = torch.randn(batch, length, heads, value_dim + 16, device="cuda").to(torch.bfloat16)[..., 8 : 8 + value_dim]
    v = v.transpose(1, 2)
    assert not q.is_contiguous() and not k.is_contiguous() and not v.is_contiguous()
    out, state = op(q, k, v, DEFAULT_SCALE, normalize, output_final_state=True)
    dense, dense_state = op(q.contiguous(), k.contiguous(), v.contiguous(), DEFAULT_SCALE, normalize,
                            output_final_state=True)
    assert torch.equal(out, dense)
    assert torch.equal(state, dense_state)
    assert_output_close(out, q, k, v, DEFAULT_SCALE, normalize)


def poison_free_blocks(*shapes_dtypes):
    """Fills freed allocator blocks of these sizes with NaN, so that an op allocating outputs of
    those sizes next gets them back: an element the kernel does not write stays NaN. Returns the
    blocks' addresses."""
    torch.cuda.empty_cache()
    blocks = [torch.full(shape, float("nan"), device="cuda", dtype=dtype) for shape, dtype in shapes_dtypes]
    pointers = [b.data_ptr() for b in blocks]
    del blocks
    return pointers


@pytest.mark.parametrize("length", [17, 65, 1000])
@pytest.mark.parametrize("value_dim", VALUE_DIMS)
def test_outputs_fully_written(value_dim, length):
    seeded("poison", value_dim, length)
    q, k, v = make_inputs(2, 3, length, value_dim, torch.float16)
    pointers = poison_free_blocks((v.shape, v.dtype), ((2, 3, STATE_ROWS, value_dim + 1), torch.float32))
    out, state = op(q, k, v, DEFAULT_SCALE, True, output_final_state=True)
    if out.data_ptr() not in pointers or state.data_ptr() not in pointers:
        pytest.skip("the caching allocator did not hand the poisoned blocks back")
    assert torch.isfinite(out).all() and torch.isfinite(state).all()
    assert_output_close(out, q, k, v, DEFAULT_SCALE, True)
    assert_state_close(state, q, k, v, DEFAULT_SCALE)


@pytest.mark.parametrize("value_dim", VALUE_DIMS)
def test_batch_times_heads_beyond_65535(value_dim):
    """70000 (batch, head) pairs: 70000 blocks (Dv = 64) or 140000 (Dv = 128, two per head)."""
    seeded("many", value_dim)
    q, k, v = make_inputs(70000, 1, 17, value_dim, torch.bfloat16)
    out, state = op(q, k, v, DEFAULT_SCALE, True, output_final_state=True)
    assert_output_close(out, q, k, v, DEFAULT_SCALE, True)
    for part in (slice(0, 64), slice(34000, 34064), slice(-64, None)):  # the state's reference is large
        assert_state_close(state[part], q[part], k[part], v[part], DEFAULT_SCALE)


def test_repeatable_and_on_the_current_stream():
    seeded("repeat")
    q, k, v = make_inputs(2, 4, 1000, 128, torch.bfloat16)
    first = op(q, k, v, DEFAULT_SCALE, True, output_final_state=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        second = op(q, k, v, DEFAULT_SCALE, True, output_final_state=True)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


# ---- the op's checks -------------------------------------------------------------------------


def test_checks_name_the_argument():
    q, k, v = make_inputs(1, 2, 70, 64, torch.bfloat16)
    cases = [
        ((q[..., :8], k[..., :8], v), "feature dim"),
        ((q, k, v[..., :32]), "value_dim"),
        ((q, k.half(), v), "k has dtype"),
        ((q.float(), k.float(), v.float()), "bfloat16 or float16"),
        ((q, k.cpu(), v), "k must be a CUDA tensor"),
        ((q, k, v[:, :1]), "v must be"),
        ((q, k[:, :, :69], v), "k must have q's shape"),
    ]
    for (qq, kk, vv), message in cases:
        with pytest.raises(RuntimeError, match=message):
            op(qq, kk, vv)
    odd_rows = torch.randn(1, 2, 70, 20, device="cuda").to(torch.bfloat16)[..., :FEATURES]
    with pytest.raises(RuntimeError, match="q: every stride"):
        op(odd_rows, k, v)
    with pytest.raises(RuntimeError, match="scale must be finite and positive"):
        op(q, k, v, 0.0)
    with pytest.raises(RuntimeError, match="initial_state must have shape"):
        op(q, k, v, initial_state=torch.zeros(1, 2, STATE_ROWS, 64, device="cuda"))
    with pytest.raises(RuntimeError, match="initial_state must be float32"):
        op(q, k, v, initial_state=torch.zeros(1, 2, STATE_ROWS, 65, device="cuda", dtype=torch.float64))


# ---- benchmark -------------------------------------------------------------------------------


def based_flops(batch, heads, length, value_dim):
    """ThunderKittens' count: 2 B N H E + 4 B N H Dv E with E = 273 features."""
    return 2 * batch * length * heads * STATE_ROWS + 4 * batch * length * heads * value_dim * STATE_ROWS


def benchmark(value_dims=(64, 128), lengths=(1024, 2048, 4096, 8192, 16384), batch=16, heads=16, rounds=5):
    """Times the op against flash-linear-attention's Triton kernels (if importable) on the same
    (B, T, H, D) tensors (ours reads them in place as (B, H, T, D) views), unnormalised, interleaved
    rounds of CUDA-event timings; prints ms and TFLOP/s (median over rounds)."""
    peers = {}
    try:
        from fla.ops.based import fused_chunk_based, parallel_based

        peers["fla parallel_based"] = lambda q, k, v: parallel_based(q, k, v, DEFAULT_SCALE, use_norm=False)
        peers["fla fused_chunk_based"] = lambda q, k, v: fused_chunk_based(q, k, v, DEFAULT_SCALE, use_norm=False)
    except ImportError as error:
        print(f"flash-linear-attention not importable ({error}): timing ours only")

    def timed(fn, repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / repeats

    device = torch.cuda.get_device_name()
    print(f"Based forward on {device}, bf16, B={batch} H={heads}, unnormalised; TFLOP/s by the TK count")
    for value_dim in value_dims:
        for length in lengths:
            q = torch.randn(batch, length, heads, FEATURES, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(batch, length, heads, FEATURES, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(batch, length, heads, value_dim, device="cuda", dtype=torch.bfloat16)
            ops = ["based_fwd_sm90", "based_fwd_sm80"] if runs_sm90() else ["based_fwd_sm80"]
            runs = {f"tk {name}": lambda name=name: getattr(torch.ops.tk, name)(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), DEFAULT_SCALE, False, 1e-6, None, False)
                for name in ops}
            for name, peer in peers.items():
                runs[name] = lambda peer=peer: peer(q, k, v)
            times = {name: [] for name in runs}
            for name, fn in list(runs.items()):
                try:
                    fn()  # warm-up (Triton compiles here)
                except Exception as error:  # a peer that cannot run this shape
                    print(f"  {name}: {type(error).__name__}: {error}")
                    del runs[name], times[name]
            torch.cuda.synchronize()
            for _ in range(rounds):
                for name, fn in runs.items():
                    repeats = max(1, int(200e6 / (batch * heads * length * value_dim)))
                    times[name].append(timed(fn, repeats))
            flops = based_flops(batch, heads, length, value_dim)
            line = [f"Dv={value_dim:3} N={length:5}"]
            for name, samples in times.items():
                ms = sorted(samples)[len(samples) // 2]
                line.append(f"{name} {ms:7.3f} ms {flops / ms / 1e9:6.1f} TF")
            print("  " + " | ".join(line))


if __name__ == "__main__":
    benchmark()
