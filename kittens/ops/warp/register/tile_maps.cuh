// Element-wise tile operations, destination first: initialisers, unary and
// binary maps, and broadcasts of a per-row or per-column vector across a tile.
// Arithmetic runs in float whatever the tile's element type.
#pragma once
#include "../../../types/register/rt.cuh"
#include "../../base_ops.cuh"

namespace kittens {

template <register_tile RT>
__device__ __forceinline__ void fill(RT& dst, float value) {
    using T = typename RT::dtype;
    for_each_element(dst, [&](int, int, int, int, T& e) { e = convert<T>(value); });
}
template <register_tile RT> __device__ __forceinline__ void zero(RT& dst) { fill(dst, 0.f); }
template <register_tile RT> __device__ __forceinline__ void one(RT& dst) { fill(dst, 1.f); }
template <register_tile RT> __device__ __forceinline__ void neg_infty(RT& dst) { fill(dst, neg_infinity()); }

template <typename A, typename B>
concept same_tile_shape = A::rows == B::rows && A::cols == B::cols && std::same_as<typename A::layout, typename B::layout>;

// dst = op(src)
template <typename Op, register_tile RT>
__device__ __forceinline__ void unary_map(RT& dst, const RT& src) {
    using T = typename RT::dtype;
    for_each_element(dst, [&](int i, int j, int k, int h, T& e) {
        const auto& p = src.tiles[i][j].data[k];
        e = convert<T>(Op::op(convert<float>(h ? p.y : p.x)));
    });
}

// dst = op(a, b), element by element
template <typename Op, register_tile RT>
__device__ __forceinline__ void bin_map(RT& dst, const RT& a, const RT& b) {
    using T = typename RT::dtype;
    for_each_element(dst, [&](int i, int j, int k, int h, T& e) {
        const auto& pa = a.tiles[i][j].data[k];
        const auto& pb = b.tiles[i][j].data[k];
        e = convert<T>(Op::op(convert<float>(h ? pa.y : pa.x), convert<float>(h ? pb.y : pb.x)));
    });
}

// dst = op(src, scalar)
template <typename Op, register_tile RT>
__device__ __forceinline__ void bin_map(RT& dst, const RT& src, float scalar) {
    using T = typename RT::dtype;
    for_each_element(dst, [&](int i, int j, int k, int h, T& e) {
        const auto& p = src.tiles[i][j].data[k];
        e = convert<T>(Op::op(convert<float>(h ? p.y : p.x), scalar));
    });
}

// dst[r][c] = op(src[r][c], v[r]) with v holding one value per row.
template <typename Op, register_tile RT>
__device__ __forceinline__ void row_map(RT& dst, const RT& src, const typename RT::col_vec& v) {
    using T = typename RT::dtype;
    for_each_element(dst, [&](int i, int j, int k, int h, T& e) {
        const auto& p = src.tiles[i][j].data[k];
        e = convert<T>(Op::op(convert<float>(h ? p.y : p.x), v.data[i][layout_math::row_slot(RT::frag, k, h)]));
    });
}

// dst[r][c] = op(src[r][c], v[c]) with v holding one value per column.
template <typename Op, register_tile RT>
__device__ __forceinline__ void col_map(RT& dst, const RT& src, const typename RT::row_vec& v) {
    using T = typename RT::dtype;
    for_each_element(dst, [&](int i, int j, int k, int h, T& e) {
        const auto& p = src.tiles[i][j].data[k];
        e = convert<T>(Op::op(convert<float>(h ? p.y : p.x), v.data[j][layout_math::col_slot(RT::frag, k, h)]));
    });
}

// Named forms. Scalar and tile right-hand sides both work.
#define KITTENS_TILE_UNARY(name, Op) \
    template <register_tile RT> __device__ __forceinline__ void name(RT& dst, const RT& src) { unary_map<Op>(dst, src); }
KITTENS_TILE_UNARY(exp, base_ops::exp)
KITTENS_TILE_UNARY(exp2, base_ops::exp2)
KITTENS_TILE_UNARY(log, base_ops::log)
KITTENS_TILE_UNARY(log2, base_ops::log2)
KITTENS_TILE_UNARY(abs, base_ops::abs)
KITTENS_TILE_UNARY(relu, base_ops::relu)
KITTENS_TILE_UNARY(neg, base_ops::neg)
#undef KITTENS_TILE_UNARY

#define KITTENS_TILE_BINARY(name, Op)                                                                          \
    template <register_tile RT> __device__ __forceinline__ void name(RT& dst, const RT& a, const RT& b) {      \
        bin_map<Op>(dst, a, b);                                                                                \
    }                                                                                                          \
    template <register_tile RT> __device__ __forceinline__ void name(RT& dst, const RT& a, float b) {          \
        bin_map<Op>(dst, a, b);                                                                                \
    }                                                                                                          \
    template <register_tile RT>                                                                                \
    __device__ __forceinline__ void name##_row(RT& dst, const RT& a, const typename RT::col_vec& v) {          \
        row_map<Op>(dst, a, v);                                                                                \
    }                                                                                                          \
    template <register_tile RT>                                                                                \
    __device__ __forceinline__ void name##_col(RT& dst, const RT& a, const typename RT::row_vec& v) {          \
        col_map<Op>(dst, a, v);                                                                                \
    }
KITTENS_TILE_BINARY(add, base_ops::add)
KITTENS_TILE_BINARY(sub, base_ops::sub)
KITTENS_TILE_BINARY(mul, base_ops::mul)
KITTENS_TILE_BINARY(mul_rn, base_ops::mul_rn)
KITTENS_TILE_BINARY(div, base_ops::div)
KITTENS_TILE_BINARY(max, base_ops::max)
KITTENS_TILE_BINARY(min, base_ops::min)
#undef KITTENS_TILE_BINARY

// dst[r][c] = v[r] (resp. v[c]): a vector repeated along the other dim.
template <register_tile RT>
__device__ __forceinline__ void broadcast_row(RT& dst, const typename RT::col_vec& v) {
    using T = typename RT::dtype;
    for_each_element(dst, [&](int i, int, int k, int h, T& e) {
        e = convert<T>(v.data[i][layout_math::row_slot(RT::frag, k, h)]);
    });
}
template <register_tile RT>
__device__ __forceinline__ void broadcast_col(RT& dst, const typename RT::row_vec& v) {
    using T = typename RT::dtype;
    for_each_element(dst, [&](int, int j, int k, int h, T& e) {
        e = convert<T>(v.data[j][layout_math::col_slot(RT::frag, k, h)]);
    });
}

// Replace elements where keep(row, col) is false (coordinates within the tile)
// by `value`. Used for causal and out-of-range masks.
template <register_tile RT, typename Keep>
__device__ __forceinline__ void mask(RT& dst, Keep&& keep, float value) {
    using T = typename RT::dtype;
    for_each_element(dst, [&](int i, int j, int k, int h, T& e) {
        const int r = i * TILE_DIM + RT::row_in_base(k, h);
        const int c = j * TILE_DIM + RT::col_in_base(k, h);
        if (!keep(r, c)) e = convert<T>(value);
    });
}

// Replace elements whose column is past last(row) (resp. before first(row)) by `value`: the
// causal and sequence-end masks of attention, where the bound is one number per row. A lane's
// columns are its first column plus compile-time offsets, so each element costs one compare
// with an immediate and one select (kittens::mask's general predicate needs about three).
// last / first depend only on the row: they are evaluated once per row this lane holds.
namespace detail {
// The per-row bound relative to the lane's first column, hidden from the optimiser: otherwise it
// folds the subtraction back into every compare (one more instruction per element).
__device__ __forceinline__ int opaque(int x) {
    asm("" : "+r"(x));
    return x;
}
template <register_tile RT, typename Bound, typename Outside>
__device__ __forceinline__ void mask_cols_by_row(RT& dst, Bound&& bound, Outside outside, float value) {
    using T = typename RT::dtype;
    // A lane holds rows that vary with k % 2 in each 16-row base tile, and with h too in the
    // column-major fragment: one bound per (k % 2, h) slot.
    constexpr bool ROWS_VARY_WITH_H = RT::frag == layout_math::frag_layout::col;
    constexpr int SLOTS = ROWS_VARY_WITH_H ? 4 : 2;
    auto slot_of = [](int k, int h) { return k % 2 + (ROWS_VARY_WITH_H ? 2 * h : 0); };
    const int lane_col = RT::col_in_base(0, 0);
    int relative[RT::height][SLOTS];
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int slot = 0; slot < SLOTS; slot++)
            relative[i][slot] = opaque(bound(i * TILE_DIM + RT::row_in_base(slot % 2, slot / 2)) - lane_col);
    for_each_element(dst, [&](int i, int j, int k, int h, T& e) {
        const int offset = j * TILE_DIM + RT::col_in_base(k, h) - lane_col;  // a constant
        if (outside(offset, relative[i][slot_of(k, h)])) e = convert<T>(value);
    });
}
}  // namespace detail
template <register_tile RT, typename Last>
__device__ __forceinline__ void mask_cols_after(RT& dst, Last&& last, float value) {
    detail::mask_cols_by_row(dst, last, [](int offset, int bound) { return offset > bound; }, value);
}
template <register_tile RT, typename First>
__device__ __forceinline__ void mask_cols_before(RT& dst, First&& first, float value) {
    detail::mask_cols_by_row(dst, first, [](int offset, int bound) { return offset < bound; }, value);
}

}  // namespace kittens
