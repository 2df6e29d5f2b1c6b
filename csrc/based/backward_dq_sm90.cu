// The gradient of q for the Based backward on Hopper (sm_90a): TMA + wgmma, a producer and a
// consumer warpgroup (backward_sm90.cuh); the math is in backward_params.h, the chunked walk in
// backward_dq_sm80.cu.
//
// One block per (batch, head, 64 value columns) walks the sequence forward in chunks of 64 rows,
// keeping the forward's running state S = S0 + sum of earlier phi(k) v^T transposed as a wgmma
// accumulator, exactly as the wgmma forward does (forward_sm90.cu). Per chunk, with S16 S's
// scaled 16-bit copy (the earlier chunks) and F_k the chunk's key features:
//   dq  = ds K + J_phi(q)^T (dO S16)      (dO S16 on wgmma; ds K and the Jacobian per warp on
//                                          mma.sync, as backward_common.cuh applies it)
//   S^T += V^T F_k^T                      (wgmma)
// with ds = mask_causal((dO V^T + g) * (c1 + 2 c2 Q K^T)) (g: the denominators' gradient of the
// rows, when given), split into a 16-bit high part and its remainder before its product.
// Value dim 128 is two blocks per (batch, head); dq contracts over the value columns, so each
// writes its fp32 part (dq_parts) and the op adds the parts.
// Partial last chunk: rows past the end arrive as zeros (TMA): their v adds nothing to S, and
// their dq is not stored.
#include "based/backward_sm90.cuh"

namespace tk::based::backward {

namespace {

using namespace hopper;

template <typename T>
struct DqShared {
    using qk_tile = kt::st<T, CHUNK, FEATURE_DIM>;  // a chunk of q or k (64 x 16)
    using v_tile = kt::st<T, CHUNK, VALUE_DIM>;     // a chunk of v or do
    qk_tile q[RING], k[RING];
    v_tile v[RING], grad[RING];
    kt::st<T, f::FEATURES, CHUNK> fk;
    kt::st<T, VALUE_DIM, f::FEATURES> s16;  // B operand of dO S16
    kt::st<T, CHUNK, FEATURE_DIM> dq;       // dq's staging
    transposed_chunk<T> q_t;                // q^T, for the Jacobian's partner gathers
    permutation_tiles<T> permutations;
    kt::semaphore full[RING], empty[RING];
    static constexpr uint32_t chunk_bytes =
        2 * kt::tma::tile_bytes<qk_tile>() + 2 * kt::tma::tile_bytes<v_tile>();
};

template <typename T>
struct DqGlobals {
    CUtensorMap q_map, k_map, v_map, grad_map;
    kt::gl<T> dq;
    float* dq_parts;                // (Dv / 64, B, H, N, 16) when Dv > 64: each column block's part of dq
    const float* initial_state;     // (B, H, 273, Dv + 1) or null
    const float* grad_denominator;  // (B, H, N) or null
    int heads, len, batch_heads;
};

template <typename T, int DV>
__global__ void __launch_bounds__(THREADS, 2)
    dq_kernel_sm90(const __grid_constant__ DqGlobals<T> g, const __grid_constant__ Constants c) {
    constexpr int COL_BLOCKS = DV / VALUE_DIM;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Compiled for a GPU without sm_90a features: no body (the host launches it only on sm_90).
#else
    using S = DqShared<T>;
    using chunk_tile = kt::rt_fl<16, CHUNK>;
    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    S& sh = alloc.allocate<S>();

    const int col_block = blockIdx.x % COL_BLOCKS, bh = blockIdx.x / COL_BLOCKS;
    const int batch = bh / g.heads, head = bh % g.heads;
    const int chunks = kt::ceil_div(g.len, CHUNK);

    if (threadIdx.x == 0) {
        for (int s = 0; s < RING; s++) {
            kt::init_semaphore(sh.full[s], 1);
            kt::init_semaphore(sh.empty[s], 4);  // one arrival per consumer warp
        }
        kt::fence_semaphore_init();
    }
    fill_permutations(sh.permutations);
    __syncthreads();

    if (kt::warpgroup_id() == PRODUCER_WARPGROUP) {  // one thread streams the chunks
        kt::decrease_registers<PRODUCER_REGISTERS>();
        if (threadIdx.x % (4 * kt::WARP_THREADS) == 0) {
            for (int chunk = 0; chunk < chunks; chunk++) {
                const int s = chunk % RING;
                if (chunk >= RING) kt::wait(sh.empty[s], (chunk / RING - 1) % 2);
                kt::expect_bytes(sh.full[s], S::chunk_bytes);
                kt::tma::load_async(sh.q[s], &g.q_map, kt::coord{batch, head, chunk, 0}, sh.full[s]);
                kt::tma::load_async(sh.k[s], &g.k_map, kt::coord{batch, head, chunk, 0}, sh.full[s]);
                kt::tma::load_async(sh.v[s], &g.v_map, kt::coord{batch, head, chunk, col_block}, sh.full[s]);
                kt::tma::load_async(sh.grad[s], &g.grad_map, kt::coord{batch, head, chunk, col_block}, sh.full[s]);
            }
        }
        return;
    }

    // ---- the consumer warpgroup ----
    kt::increase_registers<CONSUMER_REGISTERS>();
    const int warp = kt::warpgroup::warp(), lane = kt::lane_id();
    auto sync = [] { kt::warpgroup::sync(CONSUMER_BARRIER); };
    // g once: by the first column block (the blocks' parts of dq add up).
    const float* denominator_grad =
        g.grad_denominator != nullptr && col_block == 0 ? g.grad_denominator + int64_t(bh) * g.len : nullptr;

    f::State st;  // S
    if (g.initial_state != nullptr) {
        const int64_t offset = int64_t(bh) * STATE_ROWS * (DV + 1);
        f::read_state(st, StateRows{const_cast<float*>(g.initial_state) + offset, DV + 1},
                      col_block * VALUE_DIM + 16 * warp, c);
    } else {
        kt::zero(st.pairs);
        kt::zero(st.rest);
    }
    const uint32_t q_gather = gather_base(sh.q_t);

    for (int chunk = 0; chunk < chunks; chunk++) {
        const int s = chunk % RING;
        kt::wait(sh.full[s], (chunk / RING) % 2);

        // The chunk's key features (warps 0, 1; S16's constant column, which they meet, is 0),
        // this warp's 16 queries transposed for its own gathers, and S16 (the earlier chunks).
        if (warp == 0) f::build_features<T, 0, false>(sh.fk, sh.k[s]);
        else if (warp == 1) f::build_features<T, 1, false>(sh.fk, sh.k[s]);
        {
            col_tile<T> queries;
            kt::load(queries, kt::subtile<16, 16>(sh.q[s], warp, 0));
            store_transposed(sh.q_t, queries, warp);
        }
        {
            kt::rt<T, 16, f::FEATURES> a;
            f::state_operand(a, st, c);
            kt::store(kt::subtile<16, f::FEATURES>(sh.s16, warp, 0), a);
        }
        kt::fence_async_proxy();  // the generic stores (features, S16), before wgmma reads them
        sync();  // features, q^T and S16 complete

        // This chunk's terms, ds K, with S's update in the same group of products.
        tile<T> queries;
        kt::load(queries, kt::subtile<16, 16>(sh.q[s], warp, 0));
        const RowFactors<T> factors(queries, q_gather, warp);
        acc_tile dq;
        kt::zero(dq);
        {
            chunk_tile ds, scores;
            kt::wgmma::fence();
            kt::wgmma::mma_ABt(ds, sh.grad[s], sh.v[s], false);  // dP = dO V^T
            kt::wgmma::mma_ABt(scores, sh.q[s], sh.k[s], false);
            kt::wgmma::mma_AtBt(st.pairs, sh.v[s], kt::subtile<f::PAIR_FEATURES, CHUNK>(sh.fk, 0, 0), true);
            kt::wgmma::mma_AtBt(st.rest, sh.v[s], kt::subtile<f::FEATURES - f::PAIR_FEATURES, CHUNK>(sh.fk, f::PAIR_FEATURES / 32, 0), true);
            kt::wgmma::commit();
            kt::wgmma::wait<0>();
            kt::wgmma::fence_operand(ds);
            kt::wgmma::fence_operand(scores);
            kt::wgmma::fence_operand(st.pairs);
            kt::wgmma::fence_operand(st.rest);
            // g of this lane's two rows (registers k % 2 == 0: row lane / 4, else lane / 4 + 8).
            float2 row_grad = make_float2(0.f, 0.f);
            if (denominator_grad != nullptr) {
                const int row = chunk * CHUNK + 16 * warp + chunk_tile::row_in_base(0, 0);
                if (row < g.len) row_grad.x = denominator_grad[row];
                if (row + 8 < g.len) row_grad.y = denominator_grad[row + 8];
            }
            const float two_c2 = 2.f * c.c2;
#pragma unroll
            for (int j = 0; j < CHUNK / 16; j++) {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float gr = k % 2 ? row_grad.y : row_grad.x;
                    float2& e = ds.tiles[0][j].data[k];
                    const float2 x = scores.tiles[0][j].data[k];
                    e.x = (e.x + gr) * fmaf(two_c2, x.x, c.c1);
                    e.y = (e.y + gr) * fmaf(two_c2, x.y, c.c1);
                }
            }
            kt::mask_cols_after(ds, [&](int row) { return 16 * warp + row; }, 0.f);
            hopper::add_chunk_product<T>(dq, ds, sh.k[s], [&](int j) { return j <= warp; });  // the rows see earlier keys
        }
        // Then the earlier chunks' terms J_phi(q)^T (dO S16).
        hopper::add_state_gradient(dq, sh.grad[s], sh.s16, factors, sh.permutations);
        __syncwarp();
        if (lane == 0) kt::arrive(sh.empty[s]);  // this warp is done with the stage
        if constexpr (COL_BLOCKS == 1) {
            tile<T> x;
            kt::copy(x, dq);
            kt::store(kt::subtile<16, 16>(sh.dq, warp, 0), x);
        } else {
            const int64_t part = int64_t(col_block) * g.batch_heads + bh;
            hopper::store_part(g.dq_parts + part * g.len * FEATURE_DIM, dq, chunk * CHUNK + 16 * warp, g.len);
        }
        sync();  // dq staged; every warp is done with S16 and the features
        if constexpr (COL_BLOCKS == 1) kt::warpgroup::store(g.dq, sh.dq, kt::coord{batch, head, chunk, 0});
    }
#endif
}

template <typename T, int DV>
cudaError_t launch(const BackwardParams& p, cudaStream_t stream) {
    if (DV > VALUE_DIM && p.dq_parts == nullptr) return cudaErrorInvalidValue;
    DqGlobals<T> g{{}, {}, {}, {}, operand<T>(p, p.dq, FEATURE_DIM, p.dq_stride_b, p.dq_stride_h, p.dq_stride_l),
                   p.dq_parts, p.initial_state, p.grad_denominator, p.heads, p.len, p.batch * p.heads};
    if (cudaError_t e = make_operand_maps<T, DV>(p, &g.q_map, &g.k_map, &g.v_map, &g.grad_map)) return e;
    return launch_blocks<DV, kt::shared_bytes_for<DqShared<T>>()>(dq_kernel_sm90<T, DV>, g, p, stream);
}

}  // namespace

// The same for both value dims: a block takes 64 value columns.
int dq_sm90_shared_bytes(int) { return kt::shared_bytes_for<DqShared<kt::bf16>>(); }

cudaError_t dq_sm90(const BackwardParams& p, cudaStream_t stream) {
    const bool bf16 = p.dtype == ElementType::bf16;
    if (p.value_dim == 64) return bf16 ? launch<kt::bf16, 64>(p, stream) : launch<kt::half, 64>(p, stream);
    return bf16 ? launch<kt::bf16, 128>(p, stream) : launch<kt::half, 128>(p, stream);
}

}  // namespace tk::based::backward
