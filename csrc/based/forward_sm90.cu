// Based linear attention forward on Hopper (sm_90a): TMA + wgmma, a producer warp and a consumer
// warpgroup. The math and the state's layout are in params.h; the chunked algorithm is the sm80
// kernel's (forward_sm80.cu), with the products on wgmma.
//
// One block computes 64 value columns of one (batch, head) (Dv = 128 is two blocks). Its producer
// warp TMA-loads the chunks of 64 rows of q, k and v into a ring of STAGES; its consumer
// warpgroup walks them. Everything the consumer keeps is transposed, value columns as rows (warp
// w holds value columns 16 w .. 16 w + 15 of the block), so that the state is a wgmma
// accumulator and, converted to 16 bits, the register A operand of the output's product, with no
// transpose in between:
//
//   features  F_q, F_k (160 x 64, feature rows x chunk rows, shared memory): built per chunk
//   A^T       (64 x 160, fp32 accumulator): the state sum_j [features of k_j] v_j^T, transposed
//   O^T       = a0 + A^T[scaled, 16-bit] F_q + V^T P^T           (wgmma RS, then SS)
//   A^T      += V^T F_k^T                                         (wgmma SS)
// with P = mask_causal(1 + c1 S + c2 S^2), S = Q K^T (wgmma SS, 64 x 64), in shared memory.
//
// The 160 feature rows (state_sm90.cuh) take each product x_a x_b (a <= b) once; the constant
// row is 1 for keys and 0 for queries, so A^T's column 136 is a0 = sum of v, kept in fp32 and
// added to O^T as it is (as the sm80 kernel does), and phi(q) . phi(k) = 1 + sum_f scale_f
// F_q[f] F_k[f]. The products x_a x_b are rounded to 16 bits once, the state is rounded to 16
// bits (times its scale) only where it multiplies the queries, and the polynomial scores once:
// the sm80 kernel's rounding points.
//
// The consumer builds the features itself, into one buffer per chunk, and the block holds ~85 KiB
// of shared memory and ~170 registers a thread, so two blocks share an SM: one's feature building
// and epilogue run while the other's products keep the tensor cores busy. normalize: the
// denominators come from z (the v = 1 column of the state: Z2 = sum k k^T, sum k, rows) in shared
// memory, as in the sm80 kernel (forward_common.cuh).
// Partial last chunk: rows past the end arrive as zeros (TMA), add nothing to the state (their v
// is 0), are never seen by an earlier row (causal), and are not stored.
#include <cuda.h>

#include "kittens/kittens.cuh"
#include "kittens/hopper/hopper.cuh"
#include "kittens/hopper/tma_cache.cuh"
#include "based/forward_common.cuh"
#include "based/pair_features.cuh"
#include "based/state_sm90.cuh"
#include "based/params.h"

namespace tk::based {
namespace {

namespace kt = kittens;
using namespace sm90;  // the feature rows and the state (state_sm90.cuh)

constexpr int BLOCK_COLS = 64;       // value columns per block: the consumer warpgroup's 64 rows
constexpr int STAGES = 2;            // q, k, v chunks in flight (a third does not fit two blocks an SM)
constexpr int CONSUMER_THREADS = 4 * kt::WARP_THREADS;
constexpr int THREADS = CONSUMER_THREADS + kt::WARP_THREADS;  // and the producer warp
constexpr int PRODUCER_WARP = 4;
constexpr int CONSUMER_BARRIER = 1;  // named barrier of the consumer warpgroup

template <typename T>
struct Shared {
    using qk_tile = kt::st<T, CHUNK, FEATURE_DIM>;   // a chunk of q or k (64 x 16)
    using v_tile = kt::st<T, CHUNK, BLOCK_COLS>;     // the block's value columns of a chunk
    using feature_tile = kt::st<T, FEATURES, CHUNK>; // feature rows x chunk rows
    using square_tile = kt::st<T, CHUNK, CHUNK>;
    qk_tile q[STAGES], k[STAGES];
    v_tile v[STAGES];
    feature_tile fq, fk;
    kt::st<T, BLOCK_COLS, FEATURES> a;  // the state's 16-bit copy: the A operand of O^T += A^T F_q
    square_tile p;  // P (rows x keys)
    square_tile o;  // O's staging (rows x values)
    kt::semaphore full[STAGES], empty[STAGES];
    static constexpr uint32_t chunk_bytes =
        2 * kt::tma::tile_bytes<qk_tile>() + kt::tma::tile_bytes<v_tile>();
};

template <typename T>
struct Globals {
    CUtensorMap q_map, k_map, v_map;
    kt::gl<T> o;
    int heads, len, value_dim;
};

template <typename T, bool NORMALIZE, bool Z_STATE>
__global__ void __launch_bounds__(THREADS, 2)
    forward_kernel_sm90(const __grid_constant__ Globals<T> g, const __grid_constant__ Constants c) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Compiled for a GPU without sm_90a features: no body (the host launches it only on sm_90).
#else
    static_assert(!NORMALIZE || Z_STATE, "normalize needs the normaliser state");
    using S = Shared<T>;
    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    S& sh = alloc.allocate<S>();
    // Static, so that the compiler knows its accesses are to shared memory (32-bit addresses, LDS).
    __shared__ NormaliserState z;

    const int col_blocks = g.value_dim / BLOCK_COLS;
    const int col_block = blockIdx.x % col_blocks;
    const int bh = blockIdx.x / col_blocks;
    const int batch = bh / g.heads, head = bh % g.heads;
    const int chunks = kt::ceil_div(g.len, CHUNK);

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            kt::init_semaphore(sh.full[s], 1);
            kt::init_semaphore(sh.empty[s], 4);  // one arrival per consumer warp
        }
        kt::fence_semaphore_init();
    }
    __syncthreads();

    if (kt::warp_id() == PRODUCER_WARP) {  // one thread streams the chunks through the ring
        if (kt::lane_id() == 0) {
            for (int chunk = 0; chunk < chunks; chunk++) {
                const int s = chunk % STAGES;
                if (chunk >= STAGES) kt::wait(sh.empty[s], (chunk / STAGES - 1) % 2);
                kt::expect_bytes(sh.full[s], S::chunk_bytes);
                kt::tma::load_async(sh.q[s], &g.q_map, kt::coord{batch, head, chunk, 0}, sh.full[s]);
                kt::tma::load_async(sh.k[s], &g.k_map, kt::coord{batch, head, chunk, 0}, sh.full[s]);
                kt::tma::load_async(sh.v[s], &g.v_map, kt::coord{batch, head, chunk, col_block}, sh.full[s]);
            }
        }
        return;
    }

    // ---- the consumer warpgroup ----
    const int warp = kt::warpgroup::warp(), lane = kt::lane_id();
    const int value_col = col_block * BLOCK_COLS + warp * 16;  // this warp's first value column
    auto sync = [] { kt::warpgroup::sync(CONSUMER_BARRIER); };
    // z: every block needs it to normalize; otherwise only the block that writes the state's last
    // column (the first of a head's column blocks) keeps it.
    const bool block_tracks_z = Z_STATE && (NORMALIZE || col_block == 0);

    const int64_t state_offset = (int64_t(batch) * g.heads + head) * STATE_ROWS * (g.value_dim + 1);
    const StateRows initial{c.initial_state ? const_cast<float*>(c.initial_state) + state_offset : nullptr,
                            g.value_dim + 1};
    State st;
    if (c.initial_state != nullptr) {
        read_state(st, initial, value_col, c);
    } else {
        kt::zero(st.pairs);
        kt::zero(st.rest);
    }
    if (block_tracks_z && warp == 0) read_normaliser(z, initial, c.initial_state != nullptr, g.value_dim, c);
    kt::rt<T, 16, 16> ones;  // A operand of the column sums of k (z's update)
    kt::one(ones);
    sync();  // z visible to all warps

    for (int chunk = 0; chunk < chunks; chunk++) {
        const int s = chunk % STAGES;
        kt::wait(sh.full[s], (chunk / STAGES) % 2);

        // The chunk's features: warps 0, 1 those of q, 2, 3 those of k, each half of the rows.
        // The last chunk's products have read the buffers (every warp's wait and the sync at its
        // end).
        if (warp == 0) build_features<T, 0, false>(sh.fq, sh.q[s]);
        else if (warp == 1) build_features<T, 1, false>(sh.fq, sh.q[s]);
        else if (warp == 2) build_features<T, 0, true>(sh.fk, sh.k[s]);
        else build_features<T, 1, true>(sh.fk, sh.k[s]);
        if constexpr (NORMALIZE) chunk_denominators<T>(z, sh.q[s], sh.k[s], warp, c);

        // This warp's rows of the state's 16-bit copy.
        {
            kt::rt<T, 16, FEATURES> a;
            state_operand(a, st, c);
            kt::store(kt::subtile<16, FEATURES>(sh.a, warp, 0), a);
        }
        // S = Q K^T, then P = mask_causal(1 + c1 S + c2 S^2) into shared memory (this warp's
        // 16 rows of it), the B operand of O^T += V^T P^T.
        {
            kt::rt_fl<16, CHUNK> scores;
            kt::wgmma::fence();
            kt::wgmma::mma_ABt(scores, sh.q[s], sh.k[s], false);
            kt::wgmma::commit();
            kt::wgmma::wait<0>();
            kt::wgmma::fence_operand(scores);
            kt::for_each_element(scores, [&](int, int, int, int, float& e) { e = fmaf(e, fmaf(e, c.c2, c.c1), 1.f); });
            kt::mask_cols_after(scores, [&](int row) { return 16 * warp + row; }, 0.f);
            kt::store(kt::subtile<16, CHUNK>(sh.p, warp, 0), scores);  // rounded to 16 bits
        }
        kt::fence_async_proxy();  // the generic stores (features, state copy, P), before wgmma reads them
        sync();  // features, state copy, P (and the denominators) complete

        // O^T = a0 + A^T F_q + V^T P^T, then A^T += V^T F_k^T: one group of products.
        kt::rt_fl<16, CHUNK> o;
        {
            const float2 a0 = constant_rows(st);
            kt::for_each_pair(o, [&](int, int, int k, float2& x) { x = k % 2 ? make_float2(a0.y, a0.y) : make_float2(a0.x, a0.x); });
        }
        kt::wgmma::fence();
        kt::wgmma::mma_AB(o, sh.a, sh.fq, true);
        kt::wgmma::mma_AtBt(o, sh.v[s], sh.p, true);
        kt::wgmma::mma_AtBt(st.pairs, sh.v[s], kt::subtile<PAIR_FEATURES, CHUNK>(sh.fk, 0, 0), true);
        kt::wgmma::mma_AtBt(st.rest, sh.v[s], kt::subtile<FEATURES - PAIR_FEATURES, CHUNK>(sh.fk, PAIR_FEATURES / 32, 0), true);
        kt::wgmma::commit();
        kt::wgmma::wait<0>();
        kt::wgmma::fence_operand(o);
        kt::wgmma::fence_operand(st.pairs);
        kt::wgmma::fence_operand(st.rest);

        if (block_tracks_z && warp < 2) {  // z's updates: every warp read this chunk's before the sync above
            kt::rt<T, 16, 16, kt::col_l> k_cols[4];
#pragma unroll
            for (int j = 0; j < 4; j++) kt::load(k_cols[j], kt::subtile<16, 16>(sh.k[s], j, 0));
            update_normaliser(z, k_cols, ones, warp, g.len, chunk);
        }
        __syncwarp();
        if (lane == 0) kt::arrive(sh.empty[s]);  // this warp is done with the stage
        sync();  // every warp's products are done: P's tile and the feature buffers are free

        // Out through the staging tile (rows x value columns), as whole rows; rows past the end
        // are not stored. (The last chunk's store read it before the syncs above.)
        if constexpr (NORMALIZE) {
            kt::for_each_pair(o, [&](int, int j, int k, float2& x) {
                const int row = 16 * j + kt::rt_fl<16, CHUNK>::col_in_base(k, 0);  // a chunk row (o's column)
                x = make_float2(x.x / z.denominator[row], x.y / z.denominator[row + 1]);
            });
        }
        {
            kt::rt<T, 16, CHUNK> o16;
            kt::rt<T, CHUNK, 16> o_rows;
            kt::copy(o16, o);
            kt::transpose(o_rows, o16);
            kt::store(kt::subtile<CHUNK, 16>(sh.o, 0, warp), o_rows);
        }
        sync();
        kt::warpgroup::store(g.o, sh.o, kt::coord{batch, head, chunk, col_block});
    }

    if (c.final_state != nullptr) {
        const StateRows out{c.final_state + state_offset, g.value_dim + 1};
        write_state(st, out, value_col, c);
        // The last chunk's z: updated before the syncs that ended it.
        if (Z_STATE && col_block == 0 && warp == 0) write_normaliser(z, out, g.value_dim, c);
    }
#endif
}

template <typename T, bool NORMALIZE, bool Z_STATE>
cudaError_t launch(const ForwardParams& p, cudaStream_t stream) {
    using S = Shared<T>;
    auto operand = [&](const void* data, int cols, int64_t sb, int64_t sh, int64_t sl) {
        return kt::gl<T>(static_cast<T*>(const_cast<void*>(data)), p.batch, p.heads, p.len, cols, sb, sh, sl);
    };
    const kt::gl<T> q = operand(p.q, FEATURE_DIM, p.q_stride_b, p.q_stride_h, p.q_stride_l);
    const kt::gl<T> k = operand(p.k, FEATURE_DIM, p.k_stride_b, p.k_stride_h, p.k_stride_l);
    const kt::gl<T> v = operand(p.v, p.value_dim, p.v_stride_b, p.v_stride_h, p.v_stride_l);
    Globals<T> g{{}, {}, {}, operand(p.o, p.value_dim, p.o_stride_b, p.o_stride_h, p.o_stride_l), p.heads, p.len,
                 p.value_dim};
    if (kt::tma::cached_tensor_map<typename S::qk_tile>(&g.q_map, q) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename S::qk_tile>(&g.k_map, k) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename S::v_tile>(&g.v_map, v) != CUDA_SUCCESS)
        return cudaErrorInvalidValue;
    const Constants c = make_constants(p);
    constexpr int smem = kt::shared_bytes_for<S>();
    // Two blocks an SM: 228 KiB, less 1 KiB reserved per block and the static NormaliserState.
    static_assert(2 * (smem + 1024 + int(sizeof(NormaliserState))) <= 228 * 1024, "forward_sm90: two blocks must fit an SM");
    auto kernel = forward_kernel_sm90<T, NORMALIZE, Z_STATE>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
    const int64_t blocks = int64_t(p.batch) * p.heads * (p.value_dim / BLOCK_COLS);
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    kernel<<<unsigned(blocks), THREADS, smem, stream>>>(g, c);
    return cudaGetLastError();
}

}  // namespace

cudaError_t forward_sm90(const ForwardParams& p, cudaStream_t stream) {
    return dispatch_forward(p, BLOCK_COLS, [&]<typename T, bool NORMALIZE, bool Z_STATE>() {
        return launch<T, NORMALIZE, Z_STATE>(p, stream);
    });
}

}  // namespace tk::based
