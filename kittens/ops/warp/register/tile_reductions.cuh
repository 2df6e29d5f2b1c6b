// Reductions of a register tile along its rows (one result per row, a col_vec)
// or its columns (one result per column, a row_vec). Each has a plain form and an
// accumulating form that folds in a previous vector (for online softmax).
#pragma once
#include "../../../types/register/rt.cuh"
#include "../../base_ops.cuh"
#include "vec_ops.cuh"

namespace kittens {

// Combine a vector's partial values across the lanes that share each index:
// pairs are shared by the 4 lanes of a quad, quads by the 8 lanes with equal lane%4.
template <typename Op, register_vector V>
__device__ __forceinline__ void reduce_across_lanes(V& v) {
#pragma unroll
    for (int t = 0; t < V::tiles; t++)
#pragma unroll
        for (int s = 0; s < V::slots; s++) {
            float x = v.data[t][s];
            if constexpr (V::layout == vec_layout::pairs) {
                x = Op::op(x, __shfl_xor_sync(FULL_MASK, x, 1));
                x = Op::op(x, __shfl_xor_sync(FULL_MASK, x, 2));
            } else {
                x = Op::op(x, __shfl_xor_sync(FULL_MASK, x, 4));
                x = Op::op(x, __shfl_xor_sync(FULL_MASK, x, 8));
                x = Op::op(x, __shfl_xor_sync(FULL_MASK, x, 16));
            }
            v.data[t][s] = x;
        }
}

// Where a reduction's per-lane partials start (one partial per base tile and slot).
// first_element: as the first element folded in. identity: as Op's identity, which costs an
// instruction per partial (ptxas keeps max(-inf, x), and 0 + x under FTZ: 32 per 16 x 128
// softmax tile); the result is the same but for NaN and denormal inputs. For kernels whose
// measured schedule or register allocation is better with those instructions in them
// (forward_sm90.cu's serial steps, forward_sm80.cu).
enum class reduce_start { first_element, identity };

// Folds src along its rows (ALONG_ROWS: one value per row, into a col_vec) or its
// columns (one value per column, into a row_vec), then combines lanes. Each base
// tile along the reduced dim gets its own partial, and the partials meet in a
// tree: the dependency chain is 4 + log2(tiles) ops long, not 4 * tiles.
template <typename Op, bool ALONG_ROWS, bool Accumulate, register_tile RT, register_vector V, bool ACROSS_LANES = true,
          reduce_start START = reduce_start::first_element>
__device__ __forceinline__ void tile_reduce(V& dst, const RT& src, const V& accum) {
    constexpr int outer = ALONG_ROWS ? RT::height : RT::width;  // one result tile each
    constexpr int inner = ALONG_ROWS ? RT::width : RT::height;  // reduced over
    // `started` is known at compile time (the loops unroll), so the choice costs nothing.
    float partial[outer][inner][V::slots];
    bool started[outer][inner][V::slots] = {};
#pragma unroll
    for (int o = 0; o < outer; o++)
#pragma unroll
        for (int n = 0; n < inner; n++)
#pragma unroll
            for (int s = 0; s < V::slots; s++) partial[o][n][s] = Op::identity();
    for_each_element(src, [&](int i, int j, int k, int h, const typename RT::dtype& e) {
        const int o = ALONG_ROWS ? i : j, n = ALONG_ROWS ? j : i;
        const int s = ALONG_ROWS ? layout_math::row_slot(RT::frag, k, h) : layout_math::col_slot(RT::frag, k, h);
        const float x = convert<float>(e);
        const bool fold = started[o][n][s] || START == reduce_start::identity;
        partial[o][n][s] = fold ? Op::op(partial[o][n][s], x) : x;
        started[o][n][s] = true;
    });
#pragma unroll
    for (int stride = 1; stride < inner; stride *= 2)
#pragma unroll
        for (int n = 0; n + stride < inner; n += 2 * stride)
#pragma unroll
            for (int o = 0; o < outer; o++)
#pragma unroll
                for (int s = 0; s < V::slots; s++) partial[o][n][s] = Op::op(partial[o][n][s], partial[o][n + stride][s]);
    V result;
#pragma unroll
    for (int o = 0; o < outer; o++)
#pragma unroll
        for (int s = 0; s < V::slots; s++) result.data[o][s] = partial[o][0][s];
    if constexpr (ACROSS_LANES) reduce_across_lanes<Op>(result);
#pragma unroll
    for (int t = 0; t < V::tiles; t++)
#pragma unroll
        for (int s = 0; s < V::slots; s++)
            dst.data[t][s] = Accumulate ? Op::op(result.data[t][s], accum.data[t][s]) : result.data[t][s];
}

// dst[r] = op over c of src[r][c]  (op folded with accum[r] when given)
template <typename Op, bool Accumulate, reduce_start START, register_tile RT>
__device__ __forceinline__ void row_reduce(typename RT::col_vec& dst, const RT& src, const typename RT::col_vec& accum) {
    tile_reduce<Op, true, Accumulate, RT, typename RT::col_vec, true, START>(dst, src, accum);
}

// dst[c] = op over r of src[r][c]  (op folded with accum[c] when given)
template <typename Op, bool Accumulate, reduce_start START, register_tile RT>
__device__ __forceinline__ void col_reduce(typename RT::row_vec& dst, const RT& src, const typename RT::row_vec& accum) {
    tile_reduce<Op, false, Accumulate, RT, typename RT::row_vec, true, START>(dst, src, accum);
}

// Per-lane share of a row sum, accumulated into accum: each of the lanes that hold a
// row keeps the sum of its own elements. Cheaper inside a loop (no shuffles); finish
// with reduce_across_lanes<base_ops::add>(v) before using the totals.
template <reduce_start START = reduce_start::first_element, register_tile RT>
__device__ __forceinline__ void row_sum_lane_partial(typename RT::col_vec& dst, const RT& src,
                                                     const typename RT::col_vec& accum) {
    tile_reduce<base_ops::add, true, true, RT, typename RT::col_vec, false, START>(dst, src, accum);
}

#define KITTENS_REDUCTION(name, Op, dir, vec)                                                                     \
    template <reduce_start START = reduce_start::first_element, register_tile RT>                               \
    __device__ __forceinline__ void name(typename RT::vec& dst, const RT& src) {                                 \
        dir##_reduce<Op, false, START>(dst, src, dst);                                                           \
    }                                                                                                            \
    template <reduce_start START = reduce_start::first_element, register_tile RT>                               \
    __device__ __forceinline__ void name(typename RT::vec& dst, const RT& src, const typename RT::vec& accum) {  \
        dir##_reduce<Op, true, START>(dst, src, accum);                                                          \
    }
KITTENS_REDUCTION(row_max, base_ops::max, row, col_vec)
KITTENS_REDUCTION(row_min, base_ops::min, row, col_vec)
KITTENS_REDUCTION(row_sum, base_ops::add, row, col_vec)
KITTENS_REDUCTION(col_max, base_ops::max, col, row_vec)
KITTENS_REDUCTION(col_min, base_ops::min, col, row_vec)
KITTENS_REDUCTION(col_sum, base_ops::add, col, row_vec)
#undef KITTENS_REDUCTION

}  // namespace kittens
