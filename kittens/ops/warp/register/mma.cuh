// Warp matrix multiply-accumulate on mma.sync (m16n8k16, bf16/fp16 in, fp32
// accumulate). d = a * b + c with any of a and b transposed; the operand layouts
// each form needs are checked at compile time:
//   mma_AB   : a row (M x K),  b col (K x N)
//   mma_ABt  : a row (M x K),  b row (N x K)
//   mma_AtB  : a col (K x M),  b col (K x N)
//   mma_AtBt : a col (K x M),  b row (N x K)
// d and c are float row-layout tiles (M x N); d may alias c.
#pragma once
#include "../../../types/register/rt.cuh"

namespace kittens {

namespace detail {

template <half_precision T>
__device__ __forceinline__ void mma_16x8x16(float2& d0, float2& d1, const packed<T> (&a)[4], packed<T> b0,
                                            packed<T> b1, const float2& c0, const float2& c1) {
    const uint32_t* A = reinterpret_cast<const uint32_t*>(a);
    const uint32_t B0 = *reinterpret_cast<const uint32_t*>(&b0), B1 = *reinterpret_cast<const uint32_t*>(&b1);
    if constexpr (std::same_as<T, bf16>) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d0.x), "=f"(d0.y), "=f"(d1.x), "=f"(d1.y)
            : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B0), "r"(B1), "f"(c0.x), "f"(c0.y), "f"(c1.x), "f"(c1.y));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d0.x), "=f"(d0.y), "=f"(d1.x), "=f"(d1.y)
            : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B0), "r"(B1), "f"(c0.x), "f"(c0.y), "f"(c1.x), "f"(c1.y));
    }
}

// Registers of operand a in the A-fragment order (quadrants (0,0),(1,0),(0,1),(1,1)
// of the M x K view): a row tile already is that; a col tile of A^T swaps 1 and 2.
template <typename Base>
__device__ __forceinline__ void a_fragment(packed<typename Base::dtype> (&out)[4], const Base& t) {
    constexpr bool transposed = std::same_as<typename Base::layout, col_l>;
    out[0] = t.data[0];
    out[1] = t.data[transposed ? 2 : 1];
    out[2] = t.data[transposed ? 1 : 2];
    out[3] = t.data[3];
}

// Registers of operand b for the two n8 halves: (k 0-7, k 8-15) of each half.
// A col tile (K x N) already holds B fragments; a row tile (N x K) holds B^T's.
template <typename Base>
__device__ __forceinline__ void b_fragment(packed<typename Base::dtype> (&out)[4], const Base& t) {
    constexpr bool col = std::same_as<typename Base::layout, col_l>;
    out[0] = t.data[0];                  // half 0, k 0-7
    out[1] = t.data[col ? 1 : 2];        // half 0, k 8-15
    out[2] = t.data[col ? 2 : 1];        // half 1, k 0-7
    out[3] = t.data[3];                  // half 1, k 8-15
}

// d (M x N) = op(a) * op(b) + c where a_tile(m, k) / b_tile(k, n) select the base
// tiles of the M x K and K x N operands.
template <typename D, typename A, typename B, typename C, typename ATile, typename BTile>
__device__ __forceinline__ void mma_tiles(D& d, const A& a, const B& b, const C& c, int k_tiles, ATile a_tile,
                                          BTile b_tile) {
    using T = typename A::dtype;
#pragma unroll
    for (int m = 0; m < D::height; m++)
#pragma unroll
        for (int n = 0; n < D::width; n++) {
            float2 acc[4] = {c.tiles[m][n].data[0], c.tiles[m][n].data[1], c.tiles[m][n].data[2],
                             c.tiles[m][n].data[3]};
#pragma unroll
            for (int kk = 0; kk < k_tiles; kk++) {
                packed<T> af[4], bf[4];
                a_fragment(af, a_tile(m, kk));
                b_fragment(bf, b_tile(kk, n));
                mma_16x8x16<T>(acc[0], acc[1], af, bf[0], bf[1], acc[0], acc[1]);
                mma_16x8x16<T>(acc[2], acc[3], af, bf[2], bf[3], acc[2], acc[3]);
            }
#pragma unroll
            for (int r = 0; r < 4; r++) d.tiles[m][n].data[r] = acc[r];
        }
}

template <typename D, typename C>
constexpr void check_accumulators() {
    static_assert(std::same_as<typename D::dtype, float> && std::same_as<typename C::dtype, float>,
                  "mma: d and c must be float tiles");
    static_assert(std::same_as<typename D::layout, row_l> && std::same_as<typename C::layout, row_l>,
                  "mma: d and c must be row-layout tiles");
    static_assert(D::rows == C::rows && D::cols == C::cols, "mma: d and c must have the same shape");
}

template <typename A, typename B>
constexpr void check_operands() {
    static_assert(half_precision<typename A::dtype> && std::same_as<typename A::dtype, typename B::dtype>,
                  "mma: a and b must both be bf16 or both fp16");
}

}  // namespace detail

template <register_tile D, register_tile A, register_tile B, register_tile C>
__device__ __forceinline__ void mma_AB(D& d, const A& a, const B& b, const C& c) {
    detail::check_accumulators<D, C>();
    detail::check_operands<A, B>();
    static_assert(std::same_as<typename A::layout, row_l>, "mma_AB: a must be a row-layout tile");
    static_assert(std::same_as<typename B::layout, col_l>, "mma_AB: b must be a col-layout tile");
    static_assert(A::rows == D::rows && B::cols == D::cols && A::cols == B::rows, "mma_AB: shapes (MxK)(KxN)");
    detail::mma_tiles(d, a, b, c, A::width, [&](int m, int k) -> const auto& { return a.tiles[m][k]; },
                      [&](int k, int n) -> const auto& { return b.tiles[k][n]; });
}

template <register_tile D, register_tile A, register_tile B, register_tile C>
__device__ __forceinline__ void mma_ABt(D& d, const A& a, const B& b, const C& c) {
    detail::check_accumulators<D, C>();
    detail::check_operands<A, B>();
    static_assert(std::same_as<typename A::layout, row_l>, "mma_ABt: a must be a row-layout tile");
    static_assert(std::same_as<typename B::layout, row_l>, "mma_ABt: b must be a row-layout tile");
    static_assert(A::rows == D::rows && B::rows == D::cols && A::cols == B::cols, "mma_ABt: shapes (MxK)(NxK)");
    detail::mma_tiles(d, a, b, c, A::width, [&](int m, int k) -> const auto& { return a.tiles[m][k]; },
                      [&](int k, int n) -> const auto& { return b.tiles[n][k]; });
}

template <register_tile D, register_tile A, register_tile B, register_tile C>
__device__ __forceinline__ void mma_AtB(D& d, const A& a, const B& b, const C& c) {
    detail::check_accumulators<D, C>();
    detail::check_operands<A, B>();
    static_assert(std::same_as<typename A::layout, col_l>, "mma_AtB: a must be a col-layout tile");
    static_assert(std::same_as<typename B::layout, col_l>, "mma_AtB: b must be a col-layout tile");
    static_assert(A::cols == D::rows && B::cols == D::cols && A::rows == B::rows, "mma_AtB: shapes (KxM)(KxN)");
    detail::mma_tiles(d, a, b, c, A::height, [&](int m, int k) -> const auto& { return a.tiles[k][m]; },
                      [&](int k, int n) -> const auto& { return b.tiles[k][n]; });
}

template <register_tile D, register_tile A, register_tile B, register_tile C>
__device__ __forceinline__ void mma_AtBt(D& d, const A& a, const B& b, const C& c) {
    detail::check_accumulators<D, C>();
    detail::check_operands<A, B>();
    static_assert(std::same_as<typename A::layout, col_l>, "mma_AtBt: a must be a col-layout tile");
    static_assert(std::same_as<typename B::layout, row_l>, "mma_AtBt: b must be a row-layout tile");
    static_assert(A::cols == D::rows && B::rows == D::cols && A::rows == B::cols, "mma_AtBt: shapes (KxM)(NxK)");
    detail::mma_tiles(d, a, b, c, A::height, [&](int m, int k) -> const auto& { return a.tiles[k][m]; },
                      [&](int k, int n) -> const auto& { return b.tiles[n][k]; });
}

}  // namespace kittens
