// The gradients of k and v (and of the initial state) for the Based backward on Hopper (sm_90a):
// TMA + wgmma, a producer and a consumer warpgroup, as the wgmma forward (forward_sm90.cu) is
// built (backward_sm90.cuh: the block's shape and what the dq kernel shares); the math is in
// backward_params.h, the chunked walk in backward_sm80.cu. Also the entry point of the sm90
// backward: the dq kernel (backward_dq_sm90.cu), then this one.
//
// One block per (batch, head, 64 value columns: the consumer warpgroup's 64 rows) walks the
// sequence backward in chunks of 64 rows, keeping the reverse running state
// R = dF + sum of later phi(q) do^T transposed as a wgmma accumulator (state_sm90.cuh: warp w
// holds value columns 16 w .. 16 w + 15, the 160 feature columns). Per chunk, with F_q, F_k the
// chunk's feature rows, P^T = mask_anticausal(p(K Q^T)) (keys as rows) and R16 R's scaled
// 16-bit copy (the later chunks):
//   dv^T = r0 + R16 F_k + dO^T P^T            (wgmma; r0 = R's constant column, the sum of later do)
//   R^T += dO^T F_q^T                          (wgmma; F_q's constant row is 1: r0's update)
//   dk   = ds^T Q + J_phi(k)^T H,  H = V R16   (H on wgmma; ds^T Q and the Jacobian per warp on
//                                              mma.sync, as backward_common.cuh applies it)
// with ds^T = mask_anticausal((V dO^T + g) * (c1 + 2 c2 K Q^T)) (g: the denominators' gradient of
// the queries, when given), split into a 16-bit high part and its remainder before its product.
// After the first chunk R is the initial state's gradient.
//
// v is read only by the products that make dk, late in a chunk, so it has one stage of its own:
// with two stages like q, k and do, two blocks would not fit an SM (as two do: one block's
// feature building and epilogue overlap the other's products).
// Value dim 128 is two blocks per (batch, head); dk contracts over the value columns, so each
// writes its fp32 part (dk_parts) and the op adds the parts.
// Partial last chunk: rows past the end arrive as zeros (TMA): their do adds nothing to R and
// nothing to ds; their dk and dv are not stored.
#include "based/backward_sm90.cuh"

namespace tk::based {
namespace backward {

int dq_sm90_shared_bytes(int value_dim);
cudaError_t dq_sm90(const BackwardParams& p, cudaStream_t stream);

namespace {

using namespace hopper;

template <typename T>
struct Shared {
    using qk_tile = kt::st<T, CHUNK, FEATURE_DIM>;  // a chunk of q or k (64 x 16)
    using v_tile = kt::st<T, CHUNK, VALUE_DIM>;     // a chunk of v or do
    using feature_tile = kt::st<T, f::FEATURES, CHUNK>;
    using square_tile = kt::st<T, CHUNK, CHUNK>;
    qk_tile q[RING], k[RING];
    v_tile grad[RING];  // do
    v_tile v;
    feature_tile fq, fk;
    kt::st<T, VALUE_DIM, f::FEATURES> r;  // R16: A operand of R16 F_k, B operand of V R16
    square_tile pt;                       // P^T (keys x queries), then dv's staging (keys x values)
    kt::st<T, CHUNK, FEATURE_DIM> dk;     // dk's staging
    transposed_chunk<T> k_t;              // k^T, for the Jacobian's partner gathers
    permutation_tiles<T> permutations;
    kt::semaphore full[RING], empty[RING], v_full, v_empty;
    static constexpr uint32_t chunk_bytes = 2 * kt::tma::tile_bytes<qk_tile>() + kt::tma::tile_bytes<v_tile>();
    static constexpr uint32_t v_bytes = kt::tma::tile_bytes<v_tile>();
};

template <typename T>
struct Globals {
    CUtensorMap q_map, k_map, v_map, grad_map;
    kt::gl<T> dk, dv;
    float* dk_parts;                // (Dv / 64, B, H, N, 16) when Dv > 64: each column block's part of dk
    const float* grad_final_state;  // (B, H, 273, Dv + 1) or null
    float* grad_initial_state;      // (B, H, 273, Dv + 1) or null
    const float* grad_denominator;  // (B, H, N) or null
    int heads, len, batch_heads;
};

template <typename T, int DV>
__global__ void __launch_bounds__(THREADS, 2)
    dkv_kernel_sm90(const __grid_constant__ Globals<T> g, const __grid_constant__ Constants c) {
    constexpr int COL_BLOCKS = DV / VALUE_DIM;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Compiled for a GPU without sm_90a features: no body (the host launches it only on sm_90).
#else
    using S = Shared<T>;
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
        kt::init_semaphore(sh.v_full, 1);
        kt::init_semaphore(sh.v_empty, 4);
        kt::fence_semaphore_init();
    }
    fill_permutations(sh.permutations);
    __syncthreads();

    if (kt::warpgroup_id() == PRODUCER_WARPGROUP) {  // one thread streams the chunks, last to first
        kt::decrease_registers<PRODUCER_REGISTERS>();
        if (threadIdx.x % (4 * kt::WARP_THREADS) == 0) {
            for (int step = 0; step < chunks; step++) {
                const int chunk = chunks - 1 - step, s = step % RING;
                if (step >= RING) kt::wait(sh.empty[s], (step / RING - 1) % 2);
                kt::expect_bytes(sh.full[s], S::chunk_bytes);
                kt::tma::load_async(sh.q[s], &g.q_map, kt::coord{batch, head, chunk, 0}, sh.full[s]);
                kt::tma::load_async(sh.k[s], &g.k_map, kt::coord{batch, head, chunk, 0}, sh.full[s]);
                kt::tma::load_async(sh.grad[s], &g.grad_map, kt::coord{batch, head, chunk, col_block}, sh.full[s]);
                if (step >= 1) kt::wait(sh.v_empty, (step - 1) % 2);
                kt::expect_bytes(sh.v_full, S::v_bytes);
                kt::tma::load_async(sh.v, &g.v_map, kt::coord{batch, head, chunk, col_block}, sh.v_full);
            }
        }
        return;
    }

    // ---- the consumer warpgroup ----
    kt::increase_registers<CONSUMER_REGISTERS>();
    const int warp = kt::warpgroup::warp(), lane = kt::lane_id();
    auto sync = [] { kt::warpgroup::sync(CONSUMER_BARRIER); };
    const int value_col = col_block * VALUE_DIM + 16 * warp;  // this warp's first value column
    const int64_t state_offset = int64_t(bh) * STATE_ROWS * (DV + 1);
    // g once: by the first column block (the blocks' parts of dk add up).
    const float* denominator_grad =
        g.grad_denominator != nullptr && col_block == 0 ? g.grad_denominator + int64_t(bh) * g.len : nullptr;

    f::State st;  // R
    if (g.grad_final_state != nullptr) {
        f::read_state(st, StateRows{const_cast<float*>(g.grad_final_state) + state_offset, DV + 1}, value_col, c);
    } else {
        kt::zero(st.pairs);
        kt::zero(st.rest);
    }
    const uint32_t k_gather = gather_base(sh.k_t);

    for (int step = 0; step < chunks; step++) {
        const int chunk = chunks - 1 - step, s = step % RING;
        kt::wait(sh.full[s], (step / RING) % 2);

        // The chunk's features (warps 0, 1: q's halves, 2, 3: k's; the constant row 1 on both:
        // q's makes R's column sums of do, and R16's constant column, which k's meets, is 0),
        // this warp's 16 keys transposed for its own gathers, and R16 (the later chunks).
        if (warp == 0) f::build_features<T, 0, true>(sh.fq, sh.q[s]);
        else if (warp == 1) f::build_features<T, 1, true>(sh.fq, sh.q[s]);
        else if (warp == 2) f::build_features<T, 0, true>(sh.fk, sh.k[s]);
        else f::build_features<T, 1, true>(sh.fk, sh.k[s]);
        {
            col_tile<T> keys;
            kt::load(keys, kt::subtile<16, 16>(sh.k[s], warp, 0));
            store_transposed(sh.k_t, keys, warp);
        }
        {
            kt::rt<T, 16, f::FEATURES> a;
            f::state_operand(a, st, c);
            kt::store(kt::subtile<16, f::FEATURES>(sh.r, warp, 0), a);
        }
        // P^T = mask_anticausal(p(K Q^T)): keys j as rows see queries i >= j.
        {
            chunk_tile p;
            kt::wgmma::fence();
            kt::wgmma::mma_ABt(p, sh.k[s], sh.q[s], false);
            kt::wgmma::commit();
            kt::wgmma::wait<0>();
            kt::wgmma::fence_operand(p);
            kt::for_each_element(p, [&](int, int, int, int, float& e) { e = fmaf(e, fmaf(e, c.c2, c.c1), 1.f); });
            kt::mask_cols_before(p, [&](int row) { return 16 * warp + row; }, 0.f);
            kt::store(kt::subtile<16, CHUNK>(sh.pt, warp, 0), p);  // rounded to 16 bits
        }
        kt::fence_async_proxy();  // the generic stores (features, R16, P^T), before wgmma reads them
        sync();  // features, k^T, R16 and P^T complete

        // dv^T = r0 + R16 F_k + dO^T P^T, then R^T += dO^T F_q^T: one group of products.
        chunk_tile dv;
        {
            const float2 r0 = f::constant_rows(st);
            kt::for_each_pair(dv, [&](int, int, int k, float2& x) { x = k % 2 ? make_float2(r0.y, r0.y) : make_float2(r0.x, r0.x); });
        }
        kt::wgmma::fence();
        kt::wgmma::mma_AB(dv, sh.r, sh.fk, true);
        kt::wgmma::mma_AtBt(dv, sh.grad[s], sh.pt, true);
        kt::wgmma::mma_AtBt(st.pairs, sh.grad[s], kt::subtile<f::PAIR_FEATURES, CHUNK>(sh.fq, 0, 0), true);
        kt::wgmma::mma_AtBt(st.rest, sh.grad[s], kt::subtile<f::FEATURES - f::PAIR_FEATURES, CHUNK>(sh.fq, f::PAIR_FEATURES / 32, 0), true);
        kt::wgmma::commit();
        kt::wgmma::wait<0>();
        kt::wgmma::fence_operand(dv);
        kt::wgmma::fence_operand(st.pairs);
        kt::wgmma::fence_operand(st.rest);
        sync();  // every warp's products are done: P^T's tile is free for dv's staging
        {
            kt::rt<T, 16, CHUNK> dv16;
            kt::rt<T, CHUNK, 16> dv_rows;
            kt::copy(dv16, dv);
            kt::transpose(dv_rows, dv16);
            kt::store(kt::subtile<CHUNK, 16>(sh.pt, 0, warp), dv_rows);
        }
        sync();
        kt::warpgroup::store(g.dv, sh.pt, kt::coord{batch, head, chunk, col_block});

        // dk of this warp's 16 keys. First this chunk's terms, ds^T Q.
        kt::wait(sh.v_full, step % 2);
        tile<T> keys;
        kt::load(keys, kt::subtile<16, 16>(sh.k[s], warp, 0));
        const RowFactors<T> factors(keys, k_gather, warp);
        acc_tile dk;
        kt::zero(dk);
        {
            chunk_tile ds, scores;
            kt::wgmma::fence();
            kt::wgmma::mma_ABt(ds, sh.v, sh.grad[s], false);  // dP^T = V dO^T
            // K Q^T again (P^T's product above): kept from there, its 32 registers would sit
            // beside dv's and R's through the main group; this is a K = 16 product.
            kt::wgmma::mma_ABt(scores, sh.k[s], sh.q[s], false);
            kt::wgmma::commit();
            kt::wgmma::wait<0>();
            kt::wgmma::fence_operand(ds);
            kt::wgmma::fence_operand(scores);
            const float two_c2 = 2.f * c.c2;
#pragma unroll
            for (int j = 0; j < CHUNK / 16; j++) {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int query = chunk * CHUNK + 16 * j + chunk_tile::col_in_base(k, 0);
                    float2 gq = make_float2(0.f, 0.f);
                    if (denominator_grad != nullptr) {
                        if (query < g.len) gq.x = denominator_grad[query];
                        if (query + 1 < g.len) gq.y = denominator_grad[query + 1];
                    }
                    float2& e = ds.tiles[0][j].data[k];
                    const float2 x = scores.tiles[0][j].data[k];
                    e.x = (e.x + gq.x) * fmaf(two_c2, x.x, c.c1);
                    e.y = (e.y + gq.y) * fmaf(two_c2, x.y, c.c1);
                }
            }
            kt::mask_cols_before(ds, [&](int row) { return 16 * warp + row; }, 0.f);
            hopper::add_chunk_product<T>(dk, ds, sh.q[s], [&](int j) { return j >= warp; });  // the keys see later queries
        }
        // Then the later chunks' terms J_phi(k)^T H, H = V R16.
        hopper::add_state_gradient(dk, sh.v, sh.r, factors, sh.permutations);
        __syncwarp();
        if (lane == 0) {  // this warp is done with the stage and with v
            kt::arrive(sh.empty[s]);
            kt::arrive(sh.v_empty);
        }
        if constexpr (COL_BLOCKS == 1) {
            tile<T> x;
            kt::copy(x, dk);
            kt::store(kt::subtile<16, 16>(sh.dk, warp, 0), x);
        } else {
            const int64_t part = int64_t(col_block) * g.batch_heads + bh;
            hopper::store_part(g.dk_parts + part * g.len * FEATURE_DIM, dk, chunk * CHUNK + 16 * warp, g.len);
        }
        sync();  // dk staged; every warp is done with R16, the features and dv's staging
        if constexpr (COL_BLOCKS == 1) kt::warpgroup::store(g.dk, sh.dk, kt::coord{batch, head, chunk, 0});
    }

    if (g.grad_initial_state != nullptr) {
        const StateRows out{g.grad_initial_state + state_offset, DV + 1};
        f::write_state(st, out, value_col, c);
        if (col_block == 0 && warp == 0) {  // the normaliser column: no gradient from the value columns
            for (int row = lane; row < STATE_ROWS; row += kt::WARP_THREADS) out(row, DV) = 0.f;
        }
    }
#endif
}

template <typename T, int DV>
cudaError_t launch(const BackwardParams& p, cudaStream_t stream) {
    if (DV > VALUE_DIM && p.dk_parts == nullptr) return cudaErrorInvalidValue;
    Globals<T> g{{}, {}, {}, {},
                 operand<T>(p, p.dk, FEATURE_DIM, p.dk_stride_b, p.dk_stride_h, p.dk_stride_l),
                 operand<T>(p, p.dv, DV, p.dv_stride_b, p.dv_stride_h, p.dv_stride_l),
                 p.dk_parts, p.grad_final_state, p.grad_initial_state, p.grad_denominator, p.heads, p.len,
                 p.batch * p.heads};
    if (cudaError_t e = make_operand_maps<T, DV>(p, &g.q_map, &g.k_map, &g.v_map, &g.grad_map)) return e;
    return launch_blocks<DV, kt::shared_bytes_for<Shared<T>>()>(dkv_kernel_sm90<T, DV>, g, p, stream);
}

cudaError_t dkv_sm90(const BackwardParams& p, cudaStream_t stream) {
    const bool bf16 = p.dtype == ElementType::bf16;
    if (p.value_dim == 64) return bf16 ? launch<kt::bf16, 64>(p, stream) : launch<kt::half, 64>(p, stream);
    return bf16 ? launch<kt::bf16, 128>(p, stream) : launch<kt::half, 128>(p, stream);
}

}  // namespace
}  // namespace backward

int backward_sm90_shared_bytes(int value_dim) {
    // The same for both value dims: a block takes 64 value columns.
    const int dkv = kittens::shared_bytes_for<backward::Shared<kittens::bf16>>();
    const int dq = backward::dq_sm90_shared_bytes(value_dim);
    return dq > dkv ? dq : dkv;
}

cudaError_t backward_sm90(const BackwardParams& p, cudaStream_t stream) {
    if (!backward_params_valid(p)) return cudaErrorInvalidValue;
    if (cudaError_t e = backward::dq_sm90(p, stream)) return e;
    return backward::dkv_sm90(p, stream);
}

}  // namespace tk::based
