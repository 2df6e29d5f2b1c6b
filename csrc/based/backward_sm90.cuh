// What the two Hopper Based backward kernels share (backward_sm90.cu: dk and dv, backward_dq_sm90.cu:
// dq): the block's shape (a consumer warpgroup whose 64 rows are the value columns, a producer
// warpgroup that only issues TMA copies and gives its registers to the consumer), and the
// gradient through the state on wgmma: out += J_phi(x)^T (Y S16) for a row tile x, with Y the
// chunk's value-side rows (do for dq, v for dk) and S16 the state's scaled 16-bit copy
// (state_sm90.cuh), the Jacobian applied per pair tile as backward_common.cuh does it.
#pragma once
#include <cuda.h>

#include "kittens/kittens.cuh"
#include "kittens/hopper/hopper.cuh"
#include "kittens/hopper/tma_cache.cuh"
#include "based/backward_common.cuh"
#include "based/state_sm90.cuh"

namespace tk::based::backward::hopper {

namespace f = sm90;  // the feature rows and the state

inline constexpr int VALUE_DIM = 64;  // value columns per block: the consumer warpgroup's 64 rows
inline constexpr int RING = 2;        // chunks in flight
inline constexpr int THREADS = 2 * 4 * kt::WARP_THREADS;  // the consumer warpgroup, then the producer's
inline constexpr int PRODUCER_WARPGROUP = 1;
inline constexpr int CONSUMER_BARRIER = 1;  // named barrier of the consumer warpgroup
// Two blocks an SM start at 128 registers a thread; the producer gives its share to the
// consumer, whose state (80), products and Jacobian need them.
inline constexpr int PRODUCER_REGISTERS = 24;
inline constexpr int CONSUMER_REGISTERS = 232;
static_assert(PRODUCER_REGISTERS + CONSUMER_REGISTERS <= 2 * 128, "two blocks' registers must fit an SM");

// One (B, H, N, cols) operand of the call.
template <typename T>
kt::gl<T> operand(const BackwardParams& p, const void* data, int cols, int64_t stride_b, int64_t stride_h,
                  int64_t stride_l) {
    return kt::gl<T>(static_cast<T*>(const_cast<void*>(data)), p.batch, p.heads, p.len, cols, stride_b, stride_h,
                     stride_l);
}

// The TMA maps both kernels read: q and k in chunks of 64 rows, v and do in chunks of 64 rows by
// VALUE_DIM of their DV columns.
template <typename T, int DV>
cudaError_t make_operand_maps(const BackwardParams& p, CUtensorMap* q_map, CUtensorMap* k_map, CUtensorMap* v_map,
                              CUtensorMap* grad_map) {
    using qk_tile = kt::st<T, CHUNK, FEATURE_DIM>;
    using v_tile = kt::st<T, CHUNK, VALUE_DIM>;
    const kt::gl<T> q = operand<T>(p, p.q, FEATURE_DIM, p.q_stride_b, p.q_stride_h, p.q_stride_l);
    const kt::gl<T> k = operand<T>(p, p.k, FEATURE_DIM, p.k_stride_b, p.k_stride_h, p.k_stride_l);
    const kt::gl<T> v = operand<T>(p, p.v, DV, p.v_stride_b, p.v_stride_h, p.v_stride_l);
    const kt::gl<T> grad = operand<T>(p, p.grad_out, DV, p.grad_out_stride_b, p.grad_out_stride_h, p.grad_out_stride_l);
    if (kt::tma::cached_tensor_map<qk_tile>(q_map, q) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<qk_tile>(k_map, k) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<v_tile>(v_map, v) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<v_tile>(grad_map, grad) != CUDA_SUCCESS)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

// kernel<<<a block per (batch, head, VALUE_DIM value columns)>>>(g, the call's constants), with
// SMEM bytes of dynamic shared memory, of which two blocks must fit an SM (228 KiB, less 1 KiB
// reserved per block).
template <int DV, int SMEM, typename Kernel, typename G>
cudaError_t launch_blocks(Kernel kernel, const G& g, const BackwardParams& p, cudaStream_t stream) {
    static_assert(2 * (SMEM + 1024) <= 228 * 1024, "Based sm90 backward: two blocks must fit an SM");
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, SMEM)) return e;
    const int64_t blocks = int64_t(p.batch) * p.heads * (DV / VALUE_DIM);
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    kernel<<<unsigned(blocks), THREADS, SMEM, stream>>>(g, make_constants(p.scale));
    return cudaGetLastError();
}

// An acc_tile view of a wgmma accumulator's base tile j (the same fragment layout).
template <typename RT>
__device__ __forceinline__ acc_tile base_tile(const RT& t, int j) {
    acc_tile x;
    x.tiles[0][0] = t.tiles[0][j];
    return x;
}

// out += J_phi(x)^T (Y S16) for this warp's 16 rows of the chunk (x: `factors`), Y (chunk rows x
// value columns) and S16 (value columns x features) in shared memory. Y S16 on wgmma in two
// groups of features, so that 48 and 32 accumulator registers beside the state's 80 suffice:
// pair tiles 0..3 with the last 32 features (the half pair tile and the linear features; the
// constant's column of S16 is 0), then pair tiles 4..7. All four warps call it.
template <typename T, typename SY, typename SS>
__device__ __forceinline__ void add_state_gradient(acc_tile& out, const SY& y, SS& s16, const RowFactors<T>& factors,
                                                   const permutation_tiles<T>& permutations) {
    constexpr int REST = f::FEATURES - f::PAIR_FEATURES;
    {
        kt::rt_fl<16, 64> g;
        kt::rt_fl<16, REST> g_rest;
        kt::wgmma::fence();
        kt::wgmma::mma_AB(g, y, kt::subtile<VALUE_DIM, 64>(s16, 0, 0), false);
        kt::wgmma::mma_AB(g_rest, y, kt::subtile<VALUE_DIM, REST>(s16, 0, f::PAIR_FEATURES / REST), false);
        kt::wgmma::commit();
        kt::wgmma::wait<0>();
        kt::wgmma::fence_operand(g);
        kt::wgmma::fence_operand(g_rest);
        kt::static_for<4>([&](auto d) {
            add_pair_jacobian<decltype(d)::value>(out, base_tile(g, decltype(d)::value), factors, permutations);
        });
        add_pair_jacobian<HALF_TILE>(out, base_tile(g_rest, 0), factors, permutations);
        // The linear features' Jacobian is the identity (c1 is in S16).
        const acc_tile linear = base_tile(g_rest, (f::LINEAR - f::PAIR_FEATURES) / 16);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            out.tiles[0][0].data[k].x += linear.tiles[0][0].data[k].x;
            out.tiles[0][0].data[k].y += linear.tiles[0][0].data[k].y;
        }
    }
    {
        kt::rt_fl<16, 64> g;
        kt::wgmma::fence();
        kt::wgmma::mma_AB(g, y, kt::subtile<VALUE_DIM, 64>(s16, 0, 1), false);
        kt::wgmma::commit();
        kt::wgmma::wait<0>();
        kt::wgmma::fence_operand(g);
        kt::static_for<4>([&](auto d) {
            constexpr int D = 4 + decltype(d)::value;
            add_pair_jacobian<D>(out, base_tile(g, D - 4), factors, permutations);
        });
    }
}

// The chunk's ds blocks as the A operand of out += ds X for this warp's 16 rows: ds (16 x 64,
// fp32) split into a 16-bit high part and its remainder per 16-column block, X's 16-row blocks
// (16 x 16 of the chunk's q or k) from shared memory; only the blocks `needed(j)` (the others
// are masked whole).
template <typename T, typename SX, typename Needed>
__device__ __forceinline__ void add_chunk_product(acc_tile& out, const kt::rt_fl<16, CHUNK>& ds, SX& x,
                                                  Needed&& needed) {
#pragma unroll
    for (int j = 0; j < CHUNK / 16; j++) {
        if (!needed(j)) continue;
        tile<T> high, low;
        split_high_low(high, low, base_tile(ds, j));
        col_tile<T> rows;  // B operand
        kt::load(rows, kt::subtile<16, 16>(x, j, 0));
        kt::mma_AB(out, high, rows, out);
        kt::mma_AB(out, low, rows, out);
    }
}

// A row tile's gradient (dq or dk) when the value columns are split over blocks (value dim 128:
// two blocks of 64): this block's fp32 part of this warp's 16 rows, straight from the fragment
// into `rows` (the (batch, head)'s (N, 16) rows of this part); rows past len are not stored.
__device__ __forceinline__ void store_part(float* rows, const acc_tile& x, int first_row, int len) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int row = first_row + acc_tile::row_in_base(k, 0), col = acc_tile::col_in_base(k, 0);
        if (row < len) *reinterpret_cast<float2*>(rows + int64_t(row) * FEATURE_DIM + col) = x.tiles[0][0].data[k];
    }
}

}  // namespace tk::based::backward::hopper
