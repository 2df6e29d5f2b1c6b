// Conversions between register tiles: precision (copy), layout (swap_layout:
// same matrix, other fragment pattern) and transpose.
#pragma once
#include "../../../types/register/rt.cuh"

namespace kittens {

// dst = src in dst's element type (same shape and layout).
template <register_tile RD, register_tile RS>
__device__ __forceinline__ void copy(RD& dst, const RS& src) {
    static_assert(RD::rows == RS::rows && RD::cols == RS::cols, "copy: tiles must have the same shape");
    static_assert(std::same_as<typename RD::layout, typename RS::layout>,
                  "copy: tiles must have the same layout (use swap_layout to change it)");
    for_each_pair(dst, [&](int i, int j, int k, auto& pair) {
        pair = convert_pair<typename RD::dtype, typename RS::dtype>(src.tiles[i][j].data[k]);
    });
}

// Transpose one 8x8 quadrant of 16-bit values held in the row pattern into the
// col pattern (and back): each lane's packed pair becomes the transposed pair.
template <half_precision T>
__device__ __forceinline__ packed<T> transpose_8x8(packed<T> x) {
    uint32_t in = *reinterpret_cast<uint32_t*>(&x), out;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(out) : "r"(in));
    return *reinterpret_cast<packed<T>*>(&out);
}

// Same matrix, opposite fragment layout. For 16-bit tiles (the operand types).
template <register_tile RD, register_tile RS>
__device__ __forceinline__ void swap_layout(RD& dst, const RS& src) {
    static_assert(half_precision<typename RS::dtype> && std::same_as<typename RD::dtype, typename RS::dtype>,
                  "swap_layout: 16-bit tiles of one element type only (convert precision first)");
    static_assert(RD::rows == RS::rows && RD::cols == RS::cols, "swap_layout: tiles must have the same shape");
    static_assert(!std::same_as<typename RD::layout, typename RS::layout>, "swap_layout: layouts must differ");
    // Quadrant k holds the same 8x8 block in both layouts; movmatrix moves each
    // element to the lane that owns it in the other pattern.
    for_each_pair(dst, [&](int i, int j, int k, auto& pair) {
        pair = transpose_8x8<typename RS::dtype>(src.tiles[i][j].data[k]);
    });
}

// dst = src^T with the opposite layout. Free: the row pattern of X is the col
// pattern of X^T once the two off-diagonal quadrants trade places.
template <register_tile RD, register_tile RS>
__device__ __forceinline__ void transpose_sep(RD& dst, const RS& src) {
    static_assert(RD::rows == RS::cols && RD::cols == RS::rows, "transpose_sep: dst must be src's transpose shape");
    static_assert(std::same_as<typename RD::dtype, typename RS::dtype>, "transpose_sep: same element type");
    static_assert(!std::same_as<typename RD::layout, typename RS::layout>,
                  "transpose_sep: dst layout must be the opposite of src (use transpose for the same layout)");
#pragma unroll
    for (int i = 0; i < RS::height; i++)
#pragma unroll
        for (int j = 0; j < RS::width; j++) {
            dst.tiles[j][i].data[0] = src.tiles[i][j].data[0];
            dst.tiles[j][i].data[1] = src.tiles[i][j].data[2];
            dst.tiles[j][i].data[2] = src.tiles[i][j].data[1];
            dst.tiles[j][i].data[3] = src.tiles[i][j].data[3];
        }
}

// dst = src^T in the same layout as src (16-bit tiles).
template <register_tile RD, register_tile RS>
__device__ __forceinline__ void transpose(RD& dst, const RS& src) {
    static_assert(std::same_as<typename RD::layout, typename RS::layout>, "transpose: same layout (see transpose_sep)");
    rt<typename RS::dtype, RS::cols, RS::rows,
       std::conditional_t<std::same_as<typename RS::layout, row_l>, col_l, row_l>> tmp;
    transpose_sep(tmp, src);
    swap_layout(dst, tmp);
}

}  // namespace kittens

namespace kittens {

// dst = the columns [col0, col0 + dst.cols) of src, in src's element type or
// converted to dst's. col0 must be a multiple of 16 and known once the caller's
// loops are unrolled (a run-time index would move the tile to local memory); the
// move itself is only register renaming.
template <register_tile RD, register_tile RS>
__device__ __forceinline__ void slice_cols(RD& dst, const RS& src, int col0) {
    static_assert(RD::rows == RS::rows && RD::cols <= RS::cols, "slice_cols: dst must be a column slice of src");
    static_assert(std::same_as<typename RD::layout, typename RS::layout>, "slice_cols: same layout");
    for_each_pair(dst, [&](int i, int j, int k, auto& pair) {
        pair = convert_pair<typename RD::dtype, typename RS::dtype>(src.tiles[i][col0 / TILE_DIM + j].data[k]);
    });
}

}  // namespace kittens
