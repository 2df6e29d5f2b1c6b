// The quadratic features of Based, vec(x x^T) of a 16-dim x, as register fragments built on the
// fly from x's own fragments, for the sm80 forward (forward_sm80.cu).
//
// vec(x x^T) has 136 distinct entries x_a x_b (a <= b). The kernel covers each of them once with
// nine "pair tiles" of feature columns: tile d holds, in column b, the product x_{(b+d) mod 16} x_b.
//   d = 0      16 columns: the squares x_b^2                              (weight 1)
//   d = 1..7   16 columns: the pairs {b, b + d mod 16}                     (weight 2: x_a x_b and x_b x_a)
//   d = 8       8 columns: the pairs {b, b + 8}, b < 8 (a half tile)       (weight 2)
// so phi(q) . phi(k) over the 256 quadratic features is sum_d weight_d sum_b QQ_d[b] KK_d[b], and
// the kernel's products and state take 136 feature columns instead of 256.
//
// A pair tile's fragment is the elementwise product of x's fragment (the factor x_b, column b)
// and a "gathered" fragment holding x_{(b+d) mod 16} at the same positions. The gathered one is
// an ldmatrix whose eight row addresses per 8x8 matrix each lane chooses: from x^T in shared
// memory (features as rows), lane l points at feature row (l % 8 + 8 (l / 16) + d) mod 16, so
// the matrix it supplies a row of holds, column by column, the features (b + d) mod 16 of
// consecutive b. Non-transposed, that is the col-layout (B operand) fragment of the chunk rows x
// features tile; transposed, the row-layout (A operand) fragment of the same tile. For the half
// tile, only registers 0 and 1 (columns 0..7) exist.
#pragma once
#include "kittens/kittens.cuh"

namespace tk::based {

inline constexpr int PAIR_TILES = 9;
inline constexpr int HALF_TILE = 8;  // the pair tile with 8 columns

// Weight of pair tile d in phi(q) . phi(k) (see above).
__host__ __device__ constexpr float pair_weight(int d) { return d == 0 ? 1.f : 2.f; }

// Fragment registers a pair tile uses: all four of a 16x16 tile, or for the half tile the two of
// columns 0..7 (k / 2 == 0 in both layouts).
__host__ __device__ constexpr int pair_registers(int d) { return d == HALF_TILE ? 2 : 4; }

// First index of the product held by column b of pair tile d (the second is b).
__host__ __device__ constexpr int pair_partner(int b, int d) { return (b + d) % 16; }

// x^T of one 64-row chunk in shared memory: row a = feature a, column j = chunk row j. Rows 0..7
// are repeated as rows 16..23, so a gather's row (l % 8 + 8 (l / 16) + d) <= 23 never wraps and
// every (d, tile) gather is one lane-dependent base plus a compile-time offset. Rows are padded to
// 144 bytes: the eight consecutive rows that one 8x8 matrix reads start in eight different
// 16-byte bank groups.
template <kittens::half_precision T>
struct alignas(16) transposed_chunk {
    static constexpr int ROWS = 24, COLS = 64, PITCH = COLS + 8;  // PITCH in elements
    static constexpr int PITCH_BYTES = PITCH * int(sizeof(T));
    T data[ROWS * PITCH];
    __device__ uint32_t address(int row, int col) const {
        return kittens::shared_address(data) + uint32_t((row * PITCH + col) * int(sizeof(T)));
    }
};

namespace detail {
// ldmatrix of N (2 or 4) 8x8 matrices; lanes 8 i .. 8 i + 7 name the rows of matrix i.
template <int N, bool TRANS>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[4], uint32_t address) {
    if constexpr (N == 4 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
    else if constexpr (N == 4)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
    else if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(address));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(address));
}
__device__ __forceinline__ void store_shared_b32(uint32_t address, uint32_t x) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(x) : "memory");
}
}  // namespace detail

// Writes chunk rows [16 w, 16 w + 16) of x, held by this warp as a col-layout tile (rows = chunk
// rows, cols = features), into columns [16 w, 16 w + 16) of dst, rows 0..7 twice.
template <kittens::half_precision T>
__device__ __forceinline__ void store_transposed(transposed_chunk<T>& dst,
                                                 const kittens::rt<T, 16, 16, kittens::col_l>& x, int w) {
    using chunk = transposed_chunk<T>;
    const int lane = kittens::lane_id();
    // Register k holds rows 2 (lane % 4) + {0, 1} + 8 (k % 2) of column lane / 4 + 8 (k / 2): one
    // 4-byte pair of row `feature` of x^T.
    const uint32_t base = dst.address(lane / 4, 16 * w + 2 * (lane % 4));
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t pair = *reinterpret_cast<const uint32_t*>(&x.tiles[0][0].data[k]);
        const uint32_t at = base + uint32_t((k / 2) * 8 * chunk::PITCH_BYTES + (k % 2) * 8 * int(sizeof(T)));
        detail::store_shared_b32(at, pair);
        if (k / 2 == 0) detail::store_shared_b32(at + 16 * chunk::PITCH_BYTES, pair);
    }
}

// This lane's row address for the gathers (tile 0, pair tile 0): see the file comment.
template <kittens::half_precision T>
__device__ __forceinline__ uint32_t gather_base(const transposed_chunk<T>& src) {
    const int lane = kittens::lane_id();
    return src.address(lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2));
}

// dst = pair tile D of the 16 chunk rows [16 tile, 16 tile + 16) of x, given x's fragment of
// those rows in the same layout: element (row j, column b) = x[j][(b + D) mod 16] * x[j][b],
// rounded once to 16 bits. A row-layout dst is the A operand (the gather from ldmatrix.trans),
// a col-layout one the B operand (plain ldmatrix). The half tile sets registers 0 and 1 only.
template <int D, kittens::register_tile RT>
__device__ __forceinline__ void pair_tile(RT& dst, const RT& x, uint32_t base, int tile) {
    using T = typename RT::dtype;
    static_assert(RT::rows == 16 && RT::cols == 16 && kittens::half_precision<T>);
    static_assert(D >= 0 && D < PAIR_TILES);
    constexpr int N = pair_registers(D);
    uint32_t r[4];
    detail::ldmatrix<N, std::same_as<typename RT::layout, kittens::row_l>>(
        r, base + uint32_t(D * transposed_chunk<T>::PITCH_BYTES + tile * 16 * int(sizeof(T))));
#pragma unroll
    for (int k = 0; k < N; k++)
        dst.tiles[0][0].data[k] = __hmul2(*reinterpret_cast<kittens::packed<T>*>(&r[k]), x.tiles[0][0].data[k]);
}

namespace detail {
// d (16 x 8, fp32) = a (16 x 8) * b (8 x 8) + d: the m16n8k8 form, for the half tile's K = 8.
template <kittens::half_precision T>
__device__ __forceinline__ void mma_16x8x8(float2& d0, float2& d1, kittens::packed<T> a0, kittens::packed<T> a1,
                                           kittens::packed<T> b) {
    const uint32_t A0 = *reinterpret_cast<const uint32_t*>(&a0), A1 = *reinterpret_cast<const uint32_t*>(&a1);
    const uint32_t B = *reinterpret_cast<const uint32_t*>(&b);
    if constexpr (std::same_as<T, kittens::bf16>)
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                     "{%0, %1, %2, %3};\n"
                     : "+f"(d0.x), "+f"(d0.y), "+f"(d1.x), "+f"(d1.y)
                     : "r"(A0), "r"(A1), "r"(B));
    else
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                     "{%0, %1, %2, %3};\n"
                     : "+f"(d0.x), "+f"(d0.y), "+f"(d1.x), "+f"(d1.y)
                     : "r"(A0), "r"(A1), "r"(B));
}
}  // namespace detail

// The half tile's products (8 feature columns: registers 0 and 1 of its tiles).
// o (16 x 16) += a (16 x 8) * b^T with b (16 x 8): rows = o's columns. mma_ABt with K = 8.
template <kittens::half_precision T>
__device__ __forceinline__ void mma_ABt_half(kittens::rt_fl<16, 16>& o, const kittens::rt<T, 16, 16>& a,
                                             const kittens::rt<T, 16, 16>& b) {
    auto& d = o.tiles[0][0].data;
    const auto& A = a.tiles[0][0].data;
    const auto& B = b.tiles[0][0].data;
    detail::mma_16x8x8<T>(d[0], d[1], A[0], A[1], B[0]);  // o's columns 0..7: b's rows 0..7
    detail::mma_16x8x8<T>(d[2], d[3], A[0], A[1], B[1]);  // columns 8..15: rows 8..15
}
// t (16 x 8: registers 0 and 1 of an accumulator tile) += a^T * b with a (16 x 16, col layout,
// K x M) and b (16 x 8, col layout, K x N). mma_AtB with N = 8.
template <kittens::half_precision T>
__device__ __forceinline__ void mma_AtB_half(kittens::rt_fl<16, 16>& t, const kittens::rt<T, 16, 16, kittens::col_l>& a,
                                             const kittens::rt<T, 16, 16, kittens::col_l>& b) {
    auto& d = t.tiles[0][0].data;
    const auto& A = a.tiles[0][0].data;
    const auto& B = b.tiles[0][0].data;
    // A-operand registers of a^T: quadrants (0,0), (1,0), (0,1), (1,1) of the M x K view.
    const kittens::packed<T> a_frag[4] = {A[0], A[2], A[1], A[3]};
    kittens::detail::mma_16x8x16<T>(d[0], d[1], a_frag, B[0], B[1], d[0], d[1]);
}

}  // namespace tk::based
