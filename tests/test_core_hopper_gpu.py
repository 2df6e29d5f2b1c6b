"""GPU unit tests of the Hopper layer of the tile core (kittens/hopper/): TMA loads, stores
and reduce-adds of partial tiles, wgmma against torch, a two-stage TMA pipeline driven by
mbarrier semaphores (also shared by a cluster's blocks through multicast copies and remote
arrivals), and blocks of a cluster reading each other's shared memory. sm_90 only;
the kernels live in tests/core_kernels/hopper_ops.cu and are JIT-built like the other core
tests (tests/test_core_gpu.py, whose helpers are reused)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from test_core_gpu import (CODES, KERNELS, NAN, REPO, assert_same, dtype_id, gl, nans, padded_tile,
                           randn, stream, tile_region, with_stride)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                       reason="needs an sm_90 (Hopper) GPU"),
]


def build_hopper_extension():
    """JIT-build (or load the cached build of) the Hopper core test kernels."""
    from torch.utils.cpp_extension import load

    root = os.environ.get("TK_TEST_BUILD_DIR") or os.path.join(tempfile.gettempdir(), "tk_core_test")
    build_dir = Path(root) / "hopper_sm_90a"
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name="tk_core_hopper_test",
        sources=[str(KERNELS / "hopper_bindings.cpp"), str(KERNELS / "hopper_ops.cu")],
        extra_include_paths=[str(REPO)],
        extra_cflags=["-std=c++20", "-O2"],
        extra_cuda_cflags=["-std=c++20", "--expt-relaxed-constexpr", "-O3",
                           "-gencode=arch=compute_90a,code=sm_90a"],
        build_directory=str(build_dir),
        verbose=os.environ.get("TK_TEST_VERBOSE") == "1",
    )


@pytest.fixture(scope="module")
def hopper():
    return build_hopper_extension()


# ---- TMA ------------------------------------------------------------------------------------

# (rows, cols, coord (b, h, r, c) in 64-row x 256-byte tiles): inside, partial in both dims,
# wholly outside.
TMA_CASES = [(100, 200, (1, 2, 0, 0)), (100, 200, (1, 2, 1, 1)), (100, 200, (0, 1, 2, 0))]


@pytest.mark.parametrize("hinted", [False, True], ids=["plain", "evict-first"])  # L2 cache policy: load, store
@pytest.mark.parametrize("case", TMA_CASES, ids=lambda c: f"{c[0]}x{c[1]}-at{c[2][2]}{c[2][3]}")
@pytest.mark.parametrize("dtype", list(CODES), ids=dtype_id)
def test_tma_load_store_reduce(hopper, dtype, case, hinted):
    rows, cols, at = case
    tile = (64, 256 // torch.empty((), dtype=dtype).element_size())
    stride = cols + 24  # row stride past the width: 48/96-byte padding keeps 16-byte alignment
    source = randn(2, 3, rows, stride, dtype=dtype)
    out_base = torch.full_like(source, NAN)
    acc_base = randn(2, 3, rows, stride, dtype=dtype)
    acc_before = acc_base.clone()
    dump = nans(*tile, dtype=dtype)
    hopper.tma_round_trip(CODES[dtype], gl(with_stride(source, cols)), gl(with_stride(out_base, cols)),
                          gl(with_stride(acc_base, cols)), gl(dump), list(at), hinted, stream())
    torch.cuda.synchronize()
    assert_same(dump, padded_tile(source, at, tile, rows, cols))  # zero fill outside
    expected_out = torch.full_like(source, NAN)
    tile_region(expected_out, source, at, tile, rows, cols)
    assert_same(out_base, expected_out)  # nothing written outside the tensor or the tile
    expected_acc = acc_before.clone()
    summed = (acc_before.float() + source.float()).to(dtype)
    tile_region(expected_acc, summed, at, tile, rows, cols)
    torch.testing.assert_close(acc_base, expected_acc, rtol=0, atol=0)


# ---- wgmma ----------------------------------------------------------------------------------

# (N, K), M = 64. Head dim 96 (attention): N = 96, and 96-wide operands, whose rows are 192 bytes
# and so take the 64-byte swizzle (three 32-column panels) instead of the 128-byte one.
WGMMA_SHAPES = [(16, 64), (32, 64), (64, 64), (128, 64), (256, 64), (128, 128), (96, 64), (128, 96), (96, 128)]
# bit0: b is K x N; bit1: a in registers; bit2: a given transposed (K x 64) in shared memory
WGMMA_VARIANTS = {0: "ss-abt", 1: "ss-ab", 2: "rs-abt", 3: "rs-ab", 4: "ss-atbt", 5: "ss-atb"}


@pytest.mark.parametrize("variant", WGMMA_VARIANTS, ids=WGMMA_VARIANTS.values())
@pytest.mark.parametrize("accumulate", [False, True], ids=["overwrite", "accumulate"])
@pytest.mark.parametrize("shape", WGMMA_SHAPES, ids=lambda s: f"n{s[0]}k{s[1]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_wgmma(hopper, dtype, shape, accumulate, variant):
    n, k = shape
    b_row_major, a_transposed = variant & 1, variant & 4
    a = randn(k, 64, dtype=dtype) if a_transposed else randn(64, k, dtype=dtype)
    b = randn(k, n, dtype=dtype) if b_row_major else randn(n, k, dtype=dtype)
    c = randn(64, n)
    d = nans(64, n)
    hopper.wgmma(CODES[dtype], n, k, accumulate, variant, gl(a), gl(b), gl(c), gl(d), stream())
    b_kn = b.double() if b_row_major else b.double().T
    a_mk = a.double().T if a_transposed else a.double()
    expected = a_mk @ b_kn + (c.double() if accumulate else 0)
    torch.testing.assert_close(d.double(), expected, rtol=2e-4, atol=1e-3)


# ---- semaphores -----------------------------------------------------------------------------

@pytest.mark.parametrize("tiles", [1, 2, 7, 32])
def test_semaphore_pipeline(hopper, tiles):
    source = randn(tiles * 64, 64)
    out = nans(64, 64)
    hopper.semaphore_pipeline(gl(source), tiles, gl(out), stream())
    expected = source.view(tiles, 64, 64).double().sum(0)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


# (tiles, blocks, cluster size): one block alone; pairs, one panel pair each; clusters of 4, a
# panel each; clusters of 3, block 0 copying two of the four panels; more tiles than stages.
MULTICAST_CASES = [(7, 1, 1), (1, 2, 2), (2, 4, 2), (33, 4, 2), (7, 8, 4), (32, 6, 3)]


@pytest.mark.parametrize("tiles, blocks, size", MULTICAST_CASES)
def test_multicast_pipeline(hopper, tiles, blocks, size):
    source = randn(tiles * 64, 128)
    out = nans(blocks * 64, 128)
    hopper.multicast_pipeline(gl(source), tiles, blocks, size, gl(out), stream())
    expected = source.view(tiles, 64, 128).double().sum(0).repeat(blocks, 1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


# (offset, count) in floats: the bulk copy needs 16-byte aligned addresses and sizes.
BULK_CASES = [(0, 4), (64, 64), (4, 1020), (1000, 1024)]


@pytest.mark.parametrize("offset, count", BULK_CASES)
def test_bulk_copy(hopper, offset, count):
    source = randn(2048)
    out = nans(1024)
    hopper.bulk_copy(source.data_ptr(), offset, count, out.data_ptr(), stream())
    torch.cuda.synchronize()
    assert torch.equal(out[:count], source[offset:offset + count])
    assert out[count:].isnan().all(), "bytes past the copy were written"


# ---- clusters -------------------------------------------------------------------------------

# (blocks, cluster size, shift): pairs, the portable maximum of 8, more clusters than fit at once
# (264 blocks of 2 and 4: later clusters wait for earlier ones to leave), no shift (its own).
CLUSTER_CASES = [(2, 2, 1), (8, 8, 3), (24, 4, 1), (264, 2, 1), (264, 4, 3), (16, 8, 0)]


@pytest.mark.parametrize("blocks, size, shift", CLUSTER_CASES)
def test_cluster_exchange(hopper, blocks, size, shift):
    source = randn(blocks, 1024)
    out = nans(blocks, 1024)
    ranks = torch.full((blocks, 2), -1, dtype=torch.int32, device="cuda")
    hopper.cluster_exchange(source.data_ptr(), blocks, size, shift, out.data_ptr(), ranks.data_ptr(), stream())
    torch.cuda.synchronize()
    block = torch.arange(blocks, device="cuda")
    rank = block % size
    assert torch.equal(ranks[:, 0], rank.int()) and (ranks[:, 1] == size).all()
    source_block = block - rank + (rank + shift) % size
    assert torch.equal(out, source[source_block])


# The load/compute/finish template is exercised through its real user, tk.matmul
# (tests/test_matmul_gpu.py): partial tiles, every operand layout, batches.
