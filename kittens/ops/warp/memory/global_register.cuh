// Global <-> register tiles and vectors, one warp, bounds-checked: elements
// outside the global layout load as zero and are never stored.
#pragma once
#include "../../../types/global/gl.cuh"
#include "../../../types/register/rt.cuh"

namespace kittens {

// dst = the tile at tile coordinate `at` of src.
template <register_tile RT, global_layout GL>
__device__ __forceinline__ void load(RT& dst, const GL& src, coord at) {
    using T = typename RT::dtype;
    const int row0 = at.r * RT::rows, col0 = at.c * RT::cols;
    for_each_element(dst, [&](int i, int j, int k, int h, T& e) {
        const int r = row0 + i * TILE_DIM + RT::row_in_base(k, h), c = col0 + j * TILE_DIM + RT::col_in_base(k, h);
        e = (r < src.rows() && c < src.cols()) ? convert<T>(*src.ptr(at.b, at.h, r, c)) : convert<T>(0.f);
    });
}

template <global_layout GL, register_tile RT>
__device__ __forceinline__ void store(const GL& dst, const RT& src, coord at) {
    using G = typename GL::dtype;
    const int row0 = at.r * RT::rows, col0 = at.c * RT::cols;
    for_each_element(src, [&](int i, int j, int k, int h, const typename RT::dtype& e) {
        const int r = row0 + i * TILE_DIM + RT::row_in_base(k, h), c = col0 + j * TILE_DIM + RT::col_in_base(k, h);
        if (r < dst.rows() && c < dst.cols()) *dst.ptr(at.b, at.h, r, c) = convert<G>(e);
    });
}

// The tile into dst's transpose: element (r, c) of the tile at tile coordinate `at` (of the
// transpose) goes to row c, column r of dst. A narrow product computed as C^T = B^T A^T stores
// its tiles into C this way (only small outputs: each store writes 16-byte runs of a row).
template <global_layout GL, register_tile RT>
__device__ __forceinline__ void store_transposed(const GL& dst, const RT& src, coord at) {
    using G = typename GL::dtype;
    const int row0 = at.r * RT::rows, col0 = at.c * RT::cols;
    for_each_element(src, [&](int i, int j, int k, int h, const typename RT::dtype& e) {
        const int r = row0 + i * TILE_DIM + RT::row_in_base(k, h), c = col0 + j * TILE_DIM + RT::col_in_base(k, h);
        if (c < dst.rows() && r < dst.cols()) *dst.ptr(at.b, at.h, c, r) = convert<G>(e);
    });
}

// A register vector is stored along a row of the global layout: element n of the
// vector goes to column at.c * N + n of row at.r. Each index is held by several
// lanes; only the lowest of them writes.
template <global_layout GL, register_vector V>
__device__ __forceinline__ void store(const GL& dst, const V& src, coord at) {
    using G = typename GL::dtype;
    const int lane = lane_id();
    const bool writer = V::layout == vec_layout::pairs ? lane % 4 == 0 : lane < 4;
    if (!writer || at.r >= dst.rows()) return;
#pragma unroll
    for (int t = 0; t < V::tiles; t++)
#pragma unroll
        for (int s = 0; s < V::slots; s++) {
            const int c = at.c * V::length + V::index(t, s);
            if (c < dst.cols()) *dst.ptr(at.b, at.h, at.r, c) = convert<G>(src.data[t][s]);
        }
}

template <register_vector V, global_layout GL>
__device__ __forceinline__ void load(V& dst, const GL& src, coord at) {
    using T = typename V::dtype;
#pragma unroll
    for (int t = 0; t < V::tiles; t++)
#pragma unroll
        for (int s = 0; s < V::slots; s++) {
            const int c = at.c * V::length + V::index(t, s);
            dst.data[t][s] = (at.r < src.rows() && c < src.cols()) ? convert<T>(*src.ptr(at.b, at.h, at.r, c))
                                                                   : convert<T>(0.f);
        }
}

}  // namespace kittens
