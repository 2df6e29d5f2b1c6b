"""GPU unit tests of the tile core ops (kittens/), one op at a time against torch.

The kernels live in tests/core_kernels/ and are JIT-built (module fixture) for the present
GPU only. Every test uses fresh random data (never zeros) and compares exactly, except where
the op itself is approximate (__expf/__logf, float sums in another order, tensor-core
accumulation). Outputs are poisoned with NaN first, so a write outside the tile or outside
the tensor bounds shows up as a changed NaN, and a missing write as a leftover NaN.

Environment: TK_TEST_BUILD_DIR (build cache root, default <tmp>/tk_core_test),
TK_TEST_VERBOSE=1 (show the build), MAX_JOBS (parallel compile jobs).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "tests" / "core_kernels"
SOURCES = ["bindings.cpp", "memory_ops.cu", "tile_ops.cu", "conversion_ops.cu", "mma_ops.cu"]

pytestmark = pytest.mark.gpu  # tests/conftest.py skips these without CUDA

CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # launchers.h dtype_code
DTYPES = list(CODES)
HALF_TYPES = [torch.bfloat16, torch.float16]
NAN = float("nan")


# ---------------------------------------------------------------------------------------------
# Build and helpers
# ---------------------------------------------------------------------------------------------

def _gpu_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    # sm_90a / sm_100a ...: arch-specific targets from Hopper on, as the real build uses.
    return f"{major}{minor}" + ("a" if major >= 9 else "")


@pytest.fixture(scope="module")
def core():
    from torch.utils.cpp_extension import load

    arch = _gpu_arch()
    root = os.environ.get("TK_TEST_BUILD_DIR") or os.path.join(tempfile.gettempdir(), "tk_core_test")
    build_dir = Path(root) / f"sm_{arch}"
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name="tk_core_test",
        sources=[str(KERNELS / s) for s in SOURCES],
        extra_include_paths=[str(REPO)],
        extra_cflags=["-std=c++20", "-O2"],
        # An explicit -gencode stops torch from adding its own arch list.
        extra_cuda_cflags=["-std=c++20", "--expt-relaxed-constexpr", "-O3",
                           f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        build_directory=str(build_dir),
        verbose=os.environ.get("TK_TEST_VERBOSE") == "1",
    )


def gl(t: torch.Tensor) -> list[int]:
    """A tensor as a kittens::gl: [data_ptr, batch, heads, rows, cols, 3 strides] (4-D view)."""
    assert t.is_cuda and t.stride(-1) == 1
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return [t.data_ptr(), *t.shape, *t.stride()[:3]]


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def randn(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(dtype)


def nans(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, NAN, device="cuda", dtype=dtype)


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-for-bit equal values, NaN where NaN is expected."""
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def with_stride(base: torch.Tensor, cols: int) -> torch.Tensor:
    """View of the first `cols` columns: a global layout whose row stride exceeds its width."""
    return base[..., :cols]


def tile_region(expected: torch.Tensor, source: torch.Tensor, at, tile, rows: int, cols: int) -> None:
    """Copy the in-bounds part of tile `at` (b, h, r, c in tile units) from source."""
    b, h, r, c = at
    r0, c0 = r * tile[0], c * tile[1]
    r1, c1 = min(r0 + tile[0], rows), min(c0 + tile[1], cols)
    if r1 > r0 and c1 > c0:
        expected[b, h, r0:r1, c0:c1] = source[b, h, r0:r1, c0:c1]


def padded_tile(source: torch.Tensor, at, tile, rows: int, cols: int) -> torch.Tensor:
    """Tile `at` of source as a load must see it: zeros outside rows x cols."""
    b, h, r, c = at
    out = torch.zeros(tile, device=source.device, dtype=source.dtype)
    r0, c0 = r * tile[0], c * tile[1]
    r1, c1 = min(r0 + tile[0], rows), min(c0 + tile[1], cols)
    if r1 > r0 and c1 > c0:
        out[: r1 - r0, : c1 - c0] = source[b, h, r0:r1, c0:c1]
    return out


def dtype_id(d: torch.dtype) -> str:
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[d]


# ---------------------------------------------------------------------------------------------
# global <-> shared <-> register round trips
# ---------------------------------------------------------------------------------------------

TILE_SHAPES = [(16, 16), (32, 64), (64, 128), (128, 64), (16, 256)]
MODES = {0: "warp", 1: "warpgroup", 2: "warp_async", 3: "warpgroup_async"}  # bit0 group, bit1 cp.async
LAYOUTS = {0: "row", 1: "col"}


def _roundtrip(core, dtype, tile, base, cols, at, mode, layout):
    """Run one round trip on base[..., :cols]; check the output tensor and the dump."""
    src = with_stride(base, cols)
    out_base = torch.full_like(base, NAN)
    dump = nans(*tile, dtype=dtype)
    core.roundtrip(CODES[dtype], tile[0], tile[1], gl(src), gl(with_stride(out_base, cols)), gl(dump),
                   list(at), mode, layout, stream())
    rows = base.shape[-2]
    expected = torch.full_like(base, NAN)  # includes the stride padding: never written
    tile_region(expected, base, at, tile, rows, cols)
    assert_same(out_base, expected)
    assert_same(dump, padded_tile(base, at, tile, rows, cols))  # zero fill on load


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUTS.values())
@pytest.mark.parametrize("mode", MODES, ids=MODES.values())
@pytest.mark.parametrize("tile", TILE_SHAPES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_roundtrip_full_tiles(core, dtype, tile, mode, layout):
    # Tile (1, 1) of head (1, 2) of a 2 x 3 x 2R x 2C tensor: batch, head, row and col offsets.
    base = randn(2, 3, 2 * tile[0], 2 * tile[1], dtype=dtype)
    _roundtrip(core, dtype, tile, base, base.shape[-1], (1, 2, 1, 1), mode, layout)


# (tile, rows, cols, row stride, coord). Row strides are multiples of 8 elements (16 bytes
# for 16-bit types) as the 16-byte copy paths require; the col counts are not multiples of
# the tile and (70, 250) not even of a 16-byte chunk, so partial chunks are zero-filled.
PARTIAL = [
    ((64, 128), 50, 70, 72, (0, 1, 0, 0)),     # one tile bigger than the tensor
    ((64, 128), 100, 200, 208, (0, 1, 1, 1)),  # last tile in both dims
    ((16, 256), 20, 250, 256, (0, 0, 1, 0)),   # 4 valid rows, partial last chunk
    ((32, 64), 50, 60, 64, (0, 1, 2, 0)),      # entirely below the tensor: all zero, no store
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUTS.values())
@pytest.mark.parametrize("mode", MODES, ids=MODES.values())
@pytest.mark.parametrize("case", PARTIAL, ids=lambda c: f"{c[0][0]}x{c[0][1]}-{c[1]}x{c[2]}-at{c[4][2]}{c[4][3]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_roundtrip_partial_tiles(core, dtype, case, mode, layout):
    tile, rows, cols, stride, at = case
    base = randn(1, 2, rows, stride, dtype=dtype)  # padding is random too: reading it would show
    _roundtrip(core, dtype, tile, base, cols, at, mode, layout)


# ---------------------------------------------------------------------------------------------
# global <-> register tiles and vectors (bounds-checked, no alignment requirement)
# ---------------------------------------------------------------------------------------------

REG_TILE = (32, 64)
# (global dtype, register dtype): same type, and conversions through float registers.
REG_TYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
             (torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.float32, torch.bfloat16),
             (torch.float32, torch.float16)]
# (batch, heads, rows, cols, row stride, coord): odd strides are fine for element accesses.
REG_CASES = [
    (2, 3, 64, 128, 128, (1, 2, 1, 1)),  # interior tile
    (1, 2, 40, 50, 53, (0, 1, 1, 0)),    # 8 valid rows, 50 valid cols
    (1, 1, 70, 100, 101, (0, 0, 2, 1)),  # 6 x 36 valid corner
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUTS.values())
@pytest.mark.parametrize("case", REG_CASES, ids=lambda c: f"{c[2]}x{c[3]}s{c[4]}")
@pytest.mark.parametrize("types", REG_TYPES, ids=lambda t: f"{dtype_id(t[0])}-via-{dtype_id(t[1])}")
def test_register_global(core, types, case, layout):
    g, r = types
    batch, heads, rows, cols, stride, at = case
    base = randn(batch, heads, rows, stride, dtype=g)
    out_base = torch.full_like(base, NAN)
    # store_transposed's target: the transpose of the output's shape, its own odd row stride.
    out_t_base = nans(batch, heads, cols, rows + 3, dtype=g)
    dump = nans(*REG_TILE, dtype=g)
    core.register_global(CODES[g], CODES[r], gl(with_stride(base, cols)), gl(with_stride(out_base, cols)),
                         gl(with_stride(out_t_base, rows)), gl(dump), list(at), layout, stream())
    rounded = base.to(r).to(g)  # what survives the register precision
    expected = torch.full_like(base, NAN)
    tile_region(expected, rounded, at, REG_TILE, rows, cols)
    assert_same(out_base, expected)
    expected_t = nans(batch, heads, cols, rows + 3, dtype=g)
    expected_t[..., :rows] = expected[..., :cols].transpose(-1, -2)
    assert_same(out_t_base, expected_t)
    assert_same(dump, padded_tile(rounded, at, REG_TILE, rows, cols))


VEC_LAYOUTS = {0: "pairs", 1: "quads"}
VEC_LEN = 64
# (rows, cols, row stride, coord): vector `c` of row `r`.
VEC_CASES = [(5, 200, 200, (0, 0, 2, 1)), (5, 100, 104, (0, 0, 3, 1)), (5, 100, 104, (0, 0, 5, 0))]


@pytest.mark.parametrize("through_shared", [False, True], ids=["direct", "via-shared"])
@pytest.mark.parametrize("layout", VEC_LAYOUTS, ids=VEC_LAYOUTS.values())
@pytest.mark.parametrize("case", VEC_CASES, ids=lambda c: f"{c[1]}cols-r{c[3][2]}c{c[3][3]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_vector_global(core, dtype, case, layout, through_shared):
    rows, cols, stride, at = case
    base = randn(1, 1, rows, stride, dtype=dtype)
    out_base = torch.full_like(base, NAN)
    dump = nans(1, VEC_LEN, dtype=dtype)
    core.vector_global(CODES[dtype], gl(with_stride(base, cols)), gl(with_stride(out_base, cols)), gl(dump),
                       list(at), layout, through_shared, stream())
    expected = torch.full_like(base, NAN)
    tile_region(expected, base, at, (1, VEC_LEN), rows, cols)
    assert_same(out_base, expected)
    assert_same(dump, padded_tile(base, at, (1, VEC_LEN), rows, cols))


ARRIVAL_WARPS = 4  # per block (memory_ops.cu)


@pytest.mark.parametrize("blocks", [1, 2, 132, 1000])
def test_arrive_last(core, blocks):
    """arrive_last: of the blocks' warps arriving at one counter, exactly one is last, and it
    reads every block's part (integer-valued floats, so the sum is exact in any order)."""
    values = torch.randint(-1000, 1000, (blocks, ARRIVAL_WARPS), device="cuda").float()
    parts = nans(blocks, ARRIVAL_WARPS)
    counters = torch.zeros(ARRIVAL_WARPS, dtype=torch.int32, device="cuda")
    lasts = torch.zeros(ARRIVAL_WARPS, dtype=torch.int32, device="cuda")
    sums = nans(ARRIVAL_WARPS)
    core.last_arrival(values.data_ptr(), parts.data_ptr(), counters.data_ptr(), sums.data_ptr(),
                      lasts.data_ptr(), blocks, stream())
    torch.cuda.synchronize()
    assert counters.tolist() == [blocks] * ARRIVAL_WARPS
    assert lasts.tolist() == [1] * ARRIVAL_WARPS
    assert_same(parts, values)
    assert_same(sums, values.sum(dim=0))


def test_store_part_and_load_part(core):
    """A float tile written as a part comes back exactly, and the part holds lane l's 16-byte
    chunk q at float4 index 32 q + l: lane 0's first chunk is its elements (0,0), (0,1), (8,0),
    (8,1) of the accumulator fragment, lane 1's (0,2), (0,3), (8,2), (8,3)."""
    rows, cols = ARRIVAL_WARPS * 32, 64
    tile = randn(1, 1, rows, cols, dtype=torch.float32)
    parts = nans(rows * cols)
    out = torch.full_like(tile, NAN)
    core.part_roundtrip(gl(tile), parts.data_ptr(), gl(out), stream())
    torch.cuda.synchronize()
    assert_same(out, tile)
    t = tile[0, 0]
    assert_same(parts[:8], torch.stack([t[0, 0], t[0, 1], t[8, 0], t[8, 1], t[0, 2], t[0, 3], t[8, 2], t[8, 3]]))
    assert_same(parts.sort().values, tile.flatten().sort().values)  # every element once


# ---------------------------------------------------------------------------------------------
# maps, broadcasts, masks, fills, reductions (ids: tests/core_kernels/tile_ops.cu)
# ---------------------------------------------------------------------------------------------

OP_ROWS, OP_COLS = 32, 64
SCALAR = 1.375  # exact in every type
BINARY = [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
          ("max", torch.maximum), ("min", torch.minimum)]
_rows = torch.arange(OP_ROWS).view(-1, 1)
_cols = torch.arange(OP_COLS).view(1, -1)


def _tile_ops():
    """id -> (name, reference(a, b, v, u) in float on the CPU, result kind, approximate)."""
    ops = {
        0: ("copy", lambda a, b, v, u: a, "tile", False),
        1: ("exp", lambda a, b, v, u: torch.exp(a), "tile", True),
        2: ("exp2", lambda a, b, v, u: torch.exp2(a), "tile", True),
        3: ("log", lambda a, b, v, u: torch.log(a), "tile", True),
        4: ("log2", lambda a, b, v, u: torch.log2(a), "tile", True),
        5: ("abs", lambda a, b, v, u: torch.abs(a), "tile", False),
        6: ("relu", lambda a, b, v, u: torch.relu(a), "tile", False),
        7: ("neg", lambda a, b, v, u: -a, "tile", False),
        32: ("broadcast_row", lambda a, b, v, u: v.view(-1, 1).expand(OP_ROWS, OP_COLS), "tile", False),
        33: ("broadcast_col", lambda a, b, v, u: u.view(1, -1).expand(OP_ROWS, OP_COLS), "tile", False),
        34: ("mask_causal", lambda a, b, v, u: torch.where(_cols <= _rows, a, -torch.inf), "tile", False),
        35: ("zero", lambda a, b, v, u: torch.zeros_like(a), "tile", False),
        36: ("one", lambda a, b, v, u: torch.ones_like(a), "tile", False),
        37: ("neg_infty", lambda a, b, v, u: torch.full_like(a, -torch.inf), "tile", False),
        38: ("mask_cols_after", lambda a, b, v, u: torch.where(_cols <= 2 * _rows - 5, a, -torch.inf), "tile", False),
        39: ("mask_cols_before", lambda a, b, v, u: torch.where(_cols >= 60 - 2 * _rows, a, -torch.inf), "tile",
             False),
    }
    for i, (name, f) in enumerate(BINARY):
        # Tensor right-hand sides everywhere: torch divides by a scalar as a multiply by
        # its reciprocal, the core divides.
        ops[8 + i] = (name, lambda a, b, v, u, f=f: f(a, b), "tile", False)
        ops[14 + i] = (f"{name}_scalar", lambda a, b, v, u, f=f: f(a, torch.full_like(a, SCALAR)), "tile", False)
        ops[20 + i] = (f"{name}_row", lambda a, b, v, u, f=f: f(a, v.view(-1, 1).expand_as(a)), "tile", False)
        ops[26 + i] = (f"{name}_col", lambda a, b, v, u, f=f: f(a, u.view(1, -1).expand_as(a)), "tile", False)
    reductions = [("row_max", lambda a: a.amax(1), torch.maximum), ("row_min", lambda a: a.amin(1), torch.minimum),
                  ("row_sum", lambda a: a.sum(1), torch.add), ("col_max", lambda a: a.amax(0), torch.maximum),
                  ("col_min", lambda a: a.amin(0), torch.minimum), ("col_sum", lambda a: a.sum(0), torch.add)]
    for i, (name, f, fold) in enumerate(reductions):
        kind = "row_vec" if name.startswith("row") else "col_vec"
        ops[40 + i] = (name, lambda a, b, v, u, f=f: f(a), kind, name.endswith("sum"))
        ops[46 + i] = (f"{name}_acc",
                       lambda a, b, v, u, f=f, fold=fold, kind=kind: fold(f(a), v if kind == "row_vec" else u),
                       kind, name.endswith("sum"))
        ops[52 + i] = (f"{name}_acc_from_identity", ops[46 + i][1], kind, name.endswith("sum"))
    return ops


TILE_OPS = _tile_ops()


@pytest.mark.parametrize("op", TILE_OPS, ids=[v[0] for v in TILE_OPS.values()])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUTS.values())
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_tile_op(core, dtype, layout, op):
    name, reference, kind, approximate = TILE_OPS[op]
    a = randn(OP_ROWS, OP_COLS, dtype=dtype)
    if name.startswith("log"):
        a = (a.float().abs() + 0.05).to(dtype)
    b = randn(OP_ROWS, OP_COLS, dtype=dtype)
    v, u = randn(1, OP_ROWS), randn(1, OP_COLS)  # register vectors are float
    out = nans(OP_ROWS, OP_COLS, dtype=dtype)
    vec_out = nans(1, OP_COLS)
    core.tile_op(CODES[dtype], layout, op, gl(a), gl(b), gl(v), gl(u), -torch.inf if name.startswith("mask") else SCALAR,
                 gl(out), gl(vec_out), stream())

    # Reference: float math on the rounded inputs, rounded like the core rounds.
    ref = reference(a.float().cpu(), b.float().cpu(), v.cpu().view(-1), u.cpu().view(-1))
    if kind == "tile":
        got, want = out.cpu(), ref.to(dtype)
        tol = {} if dtype != torch.float32 else {"rtol": 2e-6, "atol": 1e-6}  # __expf / __logf
        assert_same(vec_out, nans(1, OP_COLS))
    else:
        n = OP_ROWS if kind == "row_vec" else OP_COLS
        got, want = vec_out.cpu().view(-1), torch.full((OP_COLS,), NAN)
        want[:n] = ref  # the rest of vec_out must stay untouched
        tol = {"rtol": 1e-5, "atol": 1e-5}  # float sums in another order
        assert_same(out, nans(OP_ROWS, OP_COLS, dtype=dtype))
    if approximate:
        torch.testing.assert_close(got, want, equal_nan=True, **tol)
    else:
        assert_same(got, want)


# ---------------------------------------------------------------------------------------------
# conversions (ids: tests/core_kernels/conversion_ops.cu)
# ---------------------------------------------------------------------------------------------

CONVERSIONS = {0: "copy_row", 1: "copy_col", 2: "swap_row_to_col", 3: "swap_col_to_row",
               4: "transpose_sep_row", 5: "transpose_sep_col", 6: "transpose_row", 7: "transpose_col"}
CONVERSION_CASES = (
    [(op, ti, to) for op in (0, 1) for ti in DTYPES for to in DTYPES]
    + [(op, t, t) for op in (4, 5) for t in DTYPES]
    + [(op, t, t) for op in (2, 3, 6, 7) for t in HALF_TYPES])


@pytest.mark.parametrize("case", CONVERSION_CASES,
                         ids=lambda c: f"{CONVERSIONS[c[0]]}-{dtype_id(c[1])}-{dtype_id(c[2])}")
def test_conversion(core, case):
    op, ti, to = case
    x = randn(OP_ROWS, OP_COLS, dtype=ti)
    transposes = op >= 4
    out = nans(*((OP_COLS, OP_ROWS) if transposes else (OP_ROWS, OP_COLS)), dtype=to)
    core.convert(CODES[ti], CODES[to], op, gl(x), gl(out), stream())
    # Conversions round to nearest even, as torch's .to() does (16 <-> 16 bit via float).
    want = x.t().contiguous() if transposes else x.float().to(to) if ti != to else x
    assert_same(out, want)


# ---------------------------------------------------------------------------------------------
# mma
# ---------------------------------------------------------------------------------------------

MMA_SHAPES = [(16, 16, 16), (32, 64, 48), (64, 64, 128)]  # M, N, K
MMA_VARIANTS = {0: "AB", 1: "ABt", 2: "AtB", 3: "AtBt"}


@pytest.mark.parametrize("alias", [False, True], ids=["d", "d_is_c"])
@pytest.mark.parametrize("variant", MMA_VARIANTS, ids=MMA_VARIANTS.values())
@pytest.mark.parametrize("shape", MMA_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=dtype_id)
def test_mma(core, dtype, shape, variant, alias):
    m, n, k = shape
    a_t, b_t = variant in (2, 3), variant in (1, 3)
    a = randn(*((k, m) if a_t else (m, k)), dtype=dtype)  # stored as the op reads it
    b = randn(*((n, k) if b_t else (k, n)), dtype=dtype)
    c = randn(m, n)
    d = nans(m, n)
    core.mma(CODES[dtype], m, n, k, variant, alias, gl(a), gl(b), gl(c), gl(d), stream())
    op_a = (a.t() if a_t else a).double()
    op_b = (b.t() if b_t else b).double()
    want = (op_a @ op_b + c.double()).float()
    # Products are exact in fp32; only the accumulation order/rounding differs.
    torch.testing.assert_close(d, want, rtol=2e-4, atol=1e-3)
