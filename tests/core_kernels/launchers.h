// Host entry points of the core-op test extension (tests/test_core_gpu.py).
//
// Plain C++ with no torch or CUDA types, so bindings.cpp compiles in seconds: Python
// passes raw device pointers and strides (see `gl_args`) and the CUDA stream as ints.
// Every launcher checks the launch and throws std::runtime_error on failure.
#pragma once
#include <cstdint>
#include <vector>

namespace tk_test {

// Element types, as tests/test_core_gpu.py numbers them.
enum dtype_code : int { F32 = 0, BF16 = 1, F16 = 2 };

// A global layout: {data_ptr, batch, heads, rows, cols, batch_stride, head_stride,
// row_stride} (strides in elements, unit column stride).
using gl_args = std::vector<int64_t>;
// A tile coordinate: {b, h, r, c} (r, c in tile units).
using coord_args = std::vector<int>;

// global -> shared -> register -> shared -> global round trip of one rows x cols
// tile at `at`. mode: bit 0 = warpgroup (else one warp) copies, bit 1 = cp.async
// load (else synchronous). layout: 0 row, 1 col register tiles. `dump` (rows x cols)
// receives the register tiles unbounded (shows the zero fill).
void roundtrip(int dtype, int rows, int cols, const gl_args& in, const gl_args& out, const gl_args& dump,
               const coord_args& at, int mode, int layout, int64_t stream);

// global -> register -> global (bounded) for a 32x64 tile; registers of reg_dtype. out_t
// (the transpose of out's shape) gets the tile through store_transposed.
void register_global(int dtype, int reg_dtype, const gl_args& in, const gl_args& out, const gl_args& out_t,
                     const gl_args& dump, const coord_args& at, int layout, int64_t stream);

// Register vector (float, length 64, layout 0 pairs / 1 quads) load + store, directly or
// through shared vectors (through_shared).
void vector_global(int dtype, const gl_args& in, const gl_args& out, const gl_args& dump, const coord_args& at,
                   int layout, bool through_shared, int64_t stream);

// One map / broadcast / mask / fill / reduction (op ids in tile_ops.cu) on 32x64
// tiles a, b with per-row vector v (32), per-col vector u (64) and scalar s.
void tile_op(int dtype, int layout, int op, const gl_args& a, const gl_args& b, const gl_args& v, const gl_args& u,
             float s, const gl_args& out, const gl_args& vec_out, int64_t stream);

// arrive_last on `blocks` blocks of 4 warps: values/parts (blocks x 4 floats), counters and
// lasts (4 zeroed ints), sums (4 floats); pointers as ints.
void last_arrival(int64_t values, int64_t parts, int64_t counters, int64_t sums, int64_t lasts, int blocks,
                  int64_t stream);

// store_part then (a second launch) load_part of 4 row tiles of 32 x 64 floats: in and out are
// 128 x 64, parts 128 * 64 floats (a pointer as an int).
void part_roundtrip(const gl_args& in, int64_t parts, const gl_args& out, int64_t stream);

// Register tile conversion (op ids in conversion_ops.cu) of a 32x64 tile.
void convert(int in_dtype, int out_dtype, int op, const gl_args& in, const gl_args& out, int64_t stream);

// d = op(a) op(b) + c on an M x N x K problem. variant: 0 AB, 1 ABt, 2 AtB, 3 AtBt.
// alias: accumulate in place (d is c).
void mma(int dtype, int m, int n, int k, int variant, bool alias, const gl_args& a, const gl_args& b,
         const gl_args& c, const gl_args& d, int64_t stream);

}  // namespace tk_test
