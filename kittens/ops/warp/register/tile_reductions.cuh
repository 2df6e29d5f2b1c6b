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

// dst[r] = op over c of src[r][c]  (op folded with accum[r] when given)
template <typename Op, bool Accumulate, register_tile RT>
__device__ __forceinline__ void row_reduce(typename RT::col_vec& dst, const RT& src, const typename RT::col_vec& accum) {
    using V = typename RT::col_vec;
    V partial;
    fill(partial, Op::identity());
    for_each_element(src, [&](int i, int, int k, int h, const typename RT::dtype& e) {
        const int s = layout_math::row_slot(RT::frag, k, h);
        partial.data[i][s] = Op::op(partial.data[i][s], convert<float>(e));
    });
    reduce_across_lanes<Op>(partial);
#pragma unroll
    for (int t = 0; t < V::tiles; t++)
#pragma unroll
        for (int s = 0; s < V::slots; s++)
            dst.data[t][s] = Accumulate ? Op::op(partial.data[t][s], accum.data[t][s]) : partial.data[t][s];
}

// dst[c] = op over r of src[r][c]  (op folded with accum[c] when given)
template <typename Op, bool Accumulate, register_tile RT>
__device__ __forceinline__ void col_reduce(typename RT::row_vec& dst, const RT& src, const typename RT::row_vec& accum) {
    using V = typename RT::row_vec;
    V partial;
    fill(partial, Op::identity());
    for_each_element(src, [&](int, int j, int k, int h, const typename RT::dtype& e) {
        const int s = layout_math::col_slot(RT::frag, k, h);
        partial.data[j][s] = Op::op(partial.data[j][s], convert<float>(e));
    });
    reduce_across_lanes<Op>(partial);
#pragma unroll
    for (int t = 0; t < V::tiles; t++)
#pragma unroll
        for (int s = 0; s < V::slots; s++)
            dst.data[t][s] = Accumulate ? Op::op(partial.data[t][s], accum.data[t][s]) : partial.data[t][s];
}

#define KITTENS_REDUCTION(name, Op, dir, vec)                                                                     \
    template <register_tile RT> __device__ __forceinline__ void name(typename RT::vec& dst, const RT& src) {     \
        dir##_reduce<Op, false>(dst, src, dst);                                                                  \
    }                                                                                                            \
    template <register_tile RT>                                                                                  \
    __device__ __forceinline__ void name(typename RT::vec& dst, const RT& src, const typename RT::vec& accum) {  \
        dir##_reduce<Op, true>(dst, src, accum);                                                                 \
    }
KITTENS_REDUCTION(row_max, base_ops::max, row, col_vec)
KITTENS_REDUCTION(row_min, base_ops::min, row, col_vec)
KITTENS_REDUCTION(row_sum, base_ops::add, row, col_vec)
KITTENS_REDUCTION(col_max, base_ops::max, col, row_vec)
KITTENS_REDUCTION(col_min, base_ops::min, col, row_vec)
KITTENS_REDUCTION(col_sum, base_ops::add, col, row_vec)
#undef KITTENS_REDUCTION

}  // namespace kittens
