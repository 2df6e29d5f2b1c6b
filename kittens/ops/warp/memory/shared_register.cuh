// Shared tile <-> register tile, one warp. 16-bit tiles load with ldmatrix
// (.trans for the col layout) and row-layout tiles store into 16-bit tiles with stmatrix
// (sm_90+); float tiles and the other stores move pairs directly.
#pragma once
#include "../../../types/register/rt.cuh"
#include "../../../types/shared/st.cuh"
#include "../../../types/shared/sv.cuh"

namespace kittens {

namespace detail {
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void store_shared(uint32_t addr, float2 x) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x.x), "f"(x.y) : "memory");
}
template <typename P>
    requires(sizeof(P) == 4)
__device__ __forceinline__ void store_shared(uint32_t addr, P x) {  // a pair of 16-bit values
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(*reinterpret_cast<const uint32_t*>(&x)) : "memory");
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
inline constexpr bool has_stmatrix = true;
#else
inline constexpr bool has_stmatrix = false;  // stmatrix is sm_90+; older targets store pairs
#endif
// The inverse of ldmatrix_x4 (no .trans): register q of every lane goes to 8x8 matrix q, whose
// rows are at the addresses named by lanes 8q..8q+7.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
#endif
}
// stmatrix_x4 with each 8x8 matrix transposed on its way: row i of matrix q in memory holds
// column i of the fragment's matrix q (its address from lane 8q + i).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
#endif
}
}  // namespace detail

// How the registers of a 16-bit tile will be consumed by mma. ldmatrix writes a
// tile's four quadrants into four consecutive registers, and mma wants an A operand
// as four consecutive registers in quadrant order (0,1,2,3) and each n8 half of a B
// operand as two consecutive registers: (0,1),(2,3) for a col tile, (0,2),(1,3) for a
// row tile (B^T). Loading quadrants in the order the consumer wants saves the
// register moves the compiler would otherwise insert before every mma. The choice
// changes only register allocation, never the tile's contents.
enum class mma_operand { a, b };

// The natural use: row tiles feed A (mma_AB/mma_ABt), col tiles feed B.
template <register_tile RT>
inline constexpr mma_operand natural_operand = std::same_as<typename RT::layout, row_l> ? mma_operand::a : mma_operand::b;

// dst = src (a shared tile or sub-tile view of the same shape). USE says which mma
// operand dst will be (see mma_operand); e.g. K in S = Q K^T is a row tile used as B.
template <mma_operand USE, register_tile RT, shared_tile ST>
__device__ __forceinline__ void load(RT& dst, const ST& src) {
    static_assert(RT::rows == ST::rows && RT::cols == ST::cols, "load: register and shared tile shapes differ");
    using T = typename RT::dtype;
    using S = typename ST::dtype;
    const int lane = lane_id();
    if constexpr (half_precision<T> && std::same_as<T, S>) {
        constexpr bool trans = std::same_as<typename RT::layout, col_l>;
        // Quadrant q (0..3) lands in register slot[q]. Slots follow the consumer's
        // grouping: A (and a col tile's B) want quadrants in order; a row tile's B and
        // a col tile's A want quadrants 1 and 2 swapped.
        constexpr bool swap_middle = (USE == mma_operand::b) != trans;
        const int quadrant_of_lane = lane / 8;
        const int q = swap_middle && (quadrant_of_lane == 1 || quadrant_of_lane == 2) ? 3 - quadrant_of_lane
                                                                                      : quadrant_of_lane;
        const int r = lane % 8 + 8 * (q % 2), c = 8 * (q / 2);
#pragma unroll
        for (int j = 0; j < RT::width; j++) {
            // Moving down 16 rows adds a lane-independent 16 * row_bytes (the swizzle
            // depends on the row only modulo 8), so one address per column of base
            // tiles is computed and the rest become immediate offsets of ldmatrix.
            const uint32_t column_base = src.address(r, j * TILE_DIM + c);
#pragma unroll
            for (int i = 0; i < RT::height; i++) {
                uint32_t regs[4];
                detail::ldmatrix_x4(regs, column_base + uint32_t(i * TILE_DIM * ST::row_bytes), trans);
                constexpr int slot[4] = {0, swap_middle ? 2 : 1, swap_middle ? 1 : 2, 3};
#pragma unroll
                for (int k = 0; k < 4; k++) dst.tiles[i][j].data[slot[k]] = *reinterpret_cast<packed<T>*>(&regs[k]);
            }
        }
    } else {
        for_each_element(dst, [&](int i, int j, int k, int h, T& e) {
            e = convert<T>(*src.ptr(i * TILE_DIM + RT::row_in_base(k, h), j * TILE_DIM + RT::col_in_base(k, h)));
        });
    }
}

template <register_tile RT, shared_tile ST>
__device__ __forceinline__ void load(RT& dst, const ST& src) {
    load<natural_operand<RT>>(dst, src);
}

// dst = src, converting to the shared tile's element type.
// dst may be a tile or a temporary sub-tile view (hence the forwarding reference).
template <typename STRef, register_tile RT>
    requires shared_tile<std::remove_cvref_t<STRef>>
__device__ __forceinline__ void store(STRef&& dst, const RT& src) {
    using ST = std::remove_cvref_t<STRef>;
    static_assert(RT::rows == ST::rows && RT::cols == ST::cols, "store: register and shared tile shapes differ");
    using S = typename ST::dtype;
    using T = typename RT::dtype;
    if constexpr (std::same_as<typename RT::layout, row_l> && half_precision<S> && detail::has_stmatrix) {
        // A 16-bit destination: one stmatrix per base tile, where pair stores take four. Register k
        // of a row-layout base tile is quadrant (k % 2, k / 2) in exactly stmatrix's fragment
        // order, so lane l names row l % 8 of quadrant l / 8 (the addressing of load above).
        const int lane = lane_id(), q = lane / 8;
        const int r = lane % 8 + 8 * (q % 2), c = 8 * (q / 2);
#pragma unroll
        for (int j = 0; j < RT::width; j++) {
            const uint32_t column_base = dst.address(r, j * TILE_DIM + c);  // 16 rows down: + 16 * row_bytes
#pragma unroll
            for (int i = 0; i < RT::height; i++) {
                uint32_t regs[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const packed<S> pair = convert_pair<S, T>(src.tiles[i][j].data[k]);
                    regs[k] = *reinterpret_cast<const uint32_t*>(&pair);
                }
                detail::stmatrix_x4(column_base + uint32_t(i * TILE_DIM * ST::row_bytes), regs);
            }
        }
    } else if constexpr (std::same_as<typename RT::layout, row_l>) {
        // Pairs run along rows: one 4- or 8-byte st.shared each, at a 32-bit shared address
        // (through a generic pointer the compiler emits 64-bit ST.E with its own address
        // arithmetic: half the instructions of a step that stores a tile were addressing).
        for_each_pair(src, [&](int i, int j, int k, const packed<T>& pair) {
            const int r = i * TILE_DIM + RT::row_in_base(k, 0), c = j * TILE_DIM + RT::col_in_base(k, 0);
            detail::store_shared(dst.address(r, c), convert_pair<S, T>(pair));
        });
    } else {
        for_each_element(src, [&](int i, int j, int k, int h, const T& e) {
            *dst.ptr(i * TILE_DIM + RT::row_in_base(k, h), j * TILE_DIM + RT::col_in_base(k, h)) = convert<S>(e);
        });
    }
}

// Register vector <-> shared vector of the same length, one warp. Every lane reads
// the indices it holds; on store, each index is written by the lowest lane holding it.
template <register_vector V, typename SV>
    requires shared_vector<SV>
__device__ __forceinline__ void load(V& dst, const SV& src) {
    static_assert(V::length == SV::length, "load: register and shared vector lengths differ");
#pragma unroll
    for (int t = 0; t < V::tiles; t++)
#pragma unroll
        for (int s = 0; s < V::slots; s++) dst.data[t][s] = convert<typename V::dtype>(src[V::index(t, s)]);
}

template <typename SV, register_vector V>
    requires shared_vector<SV>
__device__ __forceinline__ void store(SV& dst, const V& src) {
    static_assert(V::length == SV::length, "store: register and shared vector lengths differ");
    const int lane = lane_id();
    if (V::layout == vec_layout::pairs ? lane % 4 != 0 : lane >= 4) return;
#pragma unroll
    for (int t = 0; t < V::tiles; t++)
#pragma unroll
        for (int s = 0; s < V::slots; s++) dst[V::index(t, s)] = convert<typename SV::dtype>(src.data[t][s]);
}

}  // namespace kittens
