// The gradients of k and v (and of the initial state) for the Based backward
// (backward_params.h has the math), on mma.sync + cp.async, written in the tile core's warp ops;
// backward_common.cuh describes the layout. Also the entry point that runs both backward kernels.
//
// One block per (batch, head) walks the sequence backward in chunks of 64 rows, keeping the
// reverse running state R = dF + sum of later phi(q) do^T (value-column role). Per chunk:
//   dv    = R0 + c1 k R1 + c2 sum_d weight_d KK_d R_d       (later chunks: the forward's output
//         + sum_{i >= j} p(s_ij) do_i                         product with k for q, R for S; the
//                                                             p(s) blocks shared through shared memory)
//   dk_m  = J_phi(k_m)^T (R v_m)                              (row role, later chunks)
//         + sum_{i >= m} (dP_mi * (c1 + 2 c2 s_mi)) q_i       (this chunk: anti-causal blocks)
// with dP_mi = v_m do_i^T (+ g_i, the denominators' gradient, when given) and s = k q^T unscaled;
// then the chunk goes into R. After the first chunk R is the initial state's gradient.
#include "based/backward_common.cuh"

namespace tk::based {
namespace backward {

int dq_shared_bytes(int value_dim);
cudaError_t dq_sm80(const BackwardParams& p, cudaStream_t stream);

namespace {

// The chunk's 10 blocks on and above the diagonal of p(k q^T) (keys as rows), block (j, i) with
// j <= i at index i (i + 1) / 2 + j: every warp's dv needs all of them, so each is computed once
// (by warp index % warps) and read back by all.
inline constexpr int SCORE_BLOCKS = ROW_TILES * (ROW_TILES + 1) / 2;
__host__ __device__ constexpr int score_block(int j, int i) { return i * (i + 1) / 2 + j; }

template <typename T, int DV>
struct DkvShared {
    using dv_tile = kt::st<T, CHUNK, WARP_COLS>;  // one warp's dv columns, for coalesced stores
    using scores_tile = kt::st<T, SCORE_BLOCKS * kt::TILE_DIM, kt::TILE_DIM>;
    static constexpr int bytes =
        kt::shared_bytes_for<qk_tile<T>[STAGES], qk_tile<T>[STAGES], value_tile<T, DV>[STAGES], value_tile<T, DV>[STAGES],
                             transposed_chunk<T>, transposed_chunk<T>, state_copy<T, DV>[STATE_TILES],
                             permutation_tiles<T>, row_out_tile<T>, PartExchange, dv_tile[Shape<DV>::warps],
                             scores_tile>();
};

template <typename T>
struct DkvGlobals {
    kt::gl<T> grad_out, q, k, v, dk, dv;
    const float* grad_final_state;  // (B, H, 273, Dv + 1) or null
    float* grad_initial_state;      // (B, H, 273, Dv + 1) or null
    const float* grad_denominator;  // (B, H, N) or null
};

template <typename T, int DV>
__global__ void __launch_bounds__(Shape<DV>::threads, Shape<DV>::min_blocks)
    dkv_kernel(const __grid_constant__ DkvGlobals<T> g, const __grid_constant__ Constants c) {
    using shape = Shape<DV>;
    using group = kt::group<shape::warps>;
    using S = DkvShared<T, DV>;

    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    auto& q_smem = alloc.allocate<qk_tile<T>[STAGES]>();
    auto& k_smem = alloc.allocate<qk_tile<T>[STAGES]>();
    auto& v_smem = alloc.allocate<value_tile<T, DV>[STAGES]>();
    auto& do_smem = alloc.allocate<value_tile<T, DV>[STAGES]>();
    auto& q_t = alloc.allocate<transposed_chunk<T>>();
    auto& k_t = alloc.allocate<transposed_chunk<T>>();
    auto& copy = alloc.allocate<state_copy<T, DV>[STATE_TILES]>();
    auto& permutations = alloc.allocate<permutation_tiles<T>>();
    auto& staging = alloc.allocate<row_out_tile<T>>();
    auto& exchange = alloc.allocate<PartExchange>();
    auto& dv_staging = alloc.allocate<typename S::dv_tile[shape::warps]>();
    auto& scores = alloc.allocate<typename S::scores_tile>();

    const int bh = blockIdx.x;
    const int batch = bh / g.q.heads(), head = bh % g.q.heads();
    const int warp = kt::warp_id(), lane = kt::lane_id();
    const int value_col = warp * WARP_COLS;                                 // value-column role
    const int row_tile = warp % ROW_TILES, value_group = warp / ROW_TILES;  // row role
    const int len = g.q.rows();
    const int chunks = kt::ceil_div(len, CHUNK);

    auto load_chunk = [&](int chunk, int stage) {
        group::load_async(q_smem[stage], g.q, {batch, head, chunk, 0});
        group::load_async(k_smem[stage], g.k, {batch, head, chunk, 0});
        group::load_async(v_smem[stage], g.v, {batch, head, chunk, 0});
        group::load_async(do_smem[stage], g.grad_out, {batch, head, chunk, 0});
        kt::cp_async_commit();
    };
    load_chunk(chunks - 1, (chunks - 1) % STAGES);
    fill_permutations(permutations);  // visible after the first chunk's barrier

    const int64_t state_offset = (int64_t(batch) * g.q.heads() + head) * STATE_ROWS * (DV + 1);
    State st;  // R
    if (g.grad_final_state != nullptr) {
        read_state(st, StateRows{const_cast<float*>(g.grad_final_state) + state_offset, DV + 1}, value_col, c);
    } else {
        zero_state(st);
    }
    tile<T> ones;  // A operand of the column sums of do
    kt::one(ones);
    const uint32_t q_gather = gather_base(q_t), k_gather = gather_base(k_t);

    for (int chunk = chunks - 1; chunk >= 0; chunk--) {
        const int stage = chunk % STAGES;
        kt::cp_async_wait<0>();
        __syncthreads();  // the chunk visible to all warps; all done with the next one
        if (chunk > 0) load_chunk(chunk - 1, (chunk - 1) % STAGES);

        // q^T and k^T for the pair-feature gathers, and R's 16-bit copy (the later chunks).
#pragma unroll
        for (int t = warp; t < 2 * ROW_TILES; t += shape::warps) {
            col_tile<T> part;
            if (t < ROW_TILES) {
                kt::load(part, kt::subtile<16, 16>(q_smem[stage], t, 0));
                store_transposed(q_t, part, t);
            } else {
                kt::load(part, kt::subtile<16, 16>(k_smem[stage], t - ROW_TILES, 0));
                store_transposed(k_t, part, t - ROW_TILES);
            }
        }
        write_state_copy(copy, st, warp, c);
        // This chunk's p(s) blocks for dv (keys as rows), each by one warp.
#pragma unroll 1
        for (int block = warp; block < SCORE_BLOCKS; block += shape::warps) {
            const int i = block >= 6 ? 3 : block >= 3 ? 2 : block >= 1 ? 1 : 0, j = block - i * (i + 1) / 2;
            tile<T> k_rows, q_rows;  // q: B operand of k q^T
            kt::load(k_rows, kt::subtile<16, 16>(k_smem[stage], j, 0));
            kt::load<kt::mma_operand::b>(q_rows, kt::subtile<16, 16>(q_smem[stage], i, 0));
            acc_tile s;
            kt::zero(s);
            kt::mma_ABt(s, k_rows, q_rows, s);
            kt::for_each_element(s, [&](int, int, int, int, float& e) { e = fmaf(e, fmaf(e, c.c2, c.c1), 1.f); });
            if (j == i) kt::mask_cols_before(s, [](int row) { return row; }, 0.f);
            tile<T> p;
            kt::copy(p, s);
            kt::store(kt::subtile<16, 16>(scores, block, 0), p);
        }
        __syncthreads();  // q^T, k^T, the state copy and the scores complete

        // Value-column role: dv of this warp's 16 value columns, all 64 rows.
        {
            tile<T> k_rows[ROW_TILES];
#pragma unroll
            for (int m = 0; m < ROW_TILES; m++) kt::load(k_rows[m], kt::subtile<16, 16>(k_smem[stage], m, 0));
            acc_tile dv[ROW_TILES];
#pragma unroll
            for (int m = 0; m < ROW_TILES; m++)
#pragma unroll
                for (int k = 0; k < 4; k++) dv[m].tiles[0][0].data[k] = st.constant.half[k / 2];
            {
                tile<T> linear;  // c1 R1, the B operand of k R1
                kt::load<kt::mma_operand::b>(linear, kt::subtile<16, 16>(copy[LINEAR_TILE], warp, 0));
#pragma unroll
                for (int m = 0; m < ROW_TILES; m++) kt::mma_ABt(dv[m], k_rows[m], linear, dv[m]);
            }
            kt::static_for<PAIR_TILES>([&](auto d) {
                constexpr int D = decltype(d)::value;
                tile<T> state16;  // c2 weight_D R_D
                kt::load<kt::mma_operand::b>(state16, kt::subtile<16, 16>(copy[D], warp, 0));
#pragma unroll
                for (int m = 0; m < ROW_TILES; m++) {
                    tile<T> kk;
                    pair_tile<D>(kk, k_rows[m], k_gather, m);
                    if constexpr (D == HALF_TILE) mma_ABt_half(dv[m], kk, state16);
                    else kt::mma_ABt(dv[m], kk, state16, dv[m]);
                }
            });
            // This chunk: the p(s) blocks on and above the diagonal (keys as rows).
#pragma unroll
            for (int i = 0; i < ROW_TILES; i++) {
                col_tile<T> grad_cols;
                kt::load(grad_cols, kt::subtile<16, 16>(do_smem[stage], i, warp));
#pragma unroll
                for (int j = 0; j <= i; j++) {
                    tile<T> p;
                    kt::load(p, kt::subtile<16, 16>(scores, score_block(j, i), 0));
                    kt::mma_AB(dv[j], p, grad_cols, dv[j]);
                }
            }
#pragma unroll
            for (int m = 0; m < ROW_TILES; m++) {
                tile<T> out;
                kt::copy(out, dv[m]);
                kt::store(kt::subtile<16, 16>(dv_staging[warp], m, 0), out);
            }
            __syncwarp();
            kt::warp::store(g.dv, dv_staging[warp], {batch, head, chunk, warp});
        }

        // Row role: dk of row tile `row_tile` over value columns 64 value_group .. + 63.
        {
            group_rows<T> v_rows;
            kt::load(v_rows, kt::subtile<16, GROUP_COLS>(v_smem[stage], row_tile, value_group));
            tile<T> k_own;
            kt::load(k_own, kt::subtile<16, 16>(k_smem[stage], row_tile, 0));
            acc_tile dk;
            kt::zero(dk);
            add_state_gradient(dk, v_rows, copy, value_group, RowFactors<T>(k_own, k_gather, row_tile), permutations);
            const float* own_denominator_grad = value_group == 0 && g.grad_denominator != nullptr
                                                    ? g.grad_denominator + int64_t(bh) * len : nullptr;
#pragma unroll 1
            for (int i = row_tile; i < ROW_TILES; i++) {
                tile<T> q_rows;  // B operand of k q^T
                kt::load<kt::mma_operand::b>(q_rows, kt::subtile<16, 16>(q_smem[stage], i, 0));
                acc_tile s;
                kt::zero(s);
                kt::mma_ABt(s, k_own, q_rows, s);
                group_rows<T> grad_rows;  // B operand of v do^T
                kt::load<kt::mma_operand::b>(grad_rows, kt::subtile<16, GROUP_COLS>(do_smem[stage], i, value_group));
                acc_tile ds;
                kt::zero(ds);
                kt::mma_ABt(ds, v_rows, grad_rows, ds);
                acc_tile::row_vec denominator_grad;  // of queries i: once, by value group 0
                load_denominator_gradient(denominator_grad, own_denominator_grad, chunk * CHUNK + i * kt::TILE_DIM, len);
                kt::add_col(ds, ds, denominator_grad);
                scale_by_derivative(ds, s, c);
                if (i == row_tile) kt::mask_cols_before(ds, [](int row) { return row; }, 0.f);
                tile<T> ds_high, ds_low;
                split_high_low(ds_high, ds_low, ds);
                col_tile<T> q_cols;  // B operand of ds q
                kt::load(q_cols, kt::subtile<16, 16>(q_smem[stage], i, 0));
                kt::mma_AB(dk, ds_high, q_cols, dk);
                kt::mma_AB(dk, ds_low, q_cols, dk);
            }
            if (combine_groups<shape::groups>(dk, exchange, row_tile, value_group))
                store_row_tile(g.dk, staging, dk, batch, head, chunk, row_tile);
        }

        // Value-column role: the chunk into R (16 rows at a time).
        acc_tile column_total;
        kt::zero(column_total);
#pragma unroll
        for (int i = 0; i < ROW_TILES; i++) {
            col_tile<T> grad_cols, q_cols;
            // do^T is the A operand of the state's products: its registers in that order.
            kt::load<kt::mma_operand::a>(grad_cols, kt::subtile<16, 16>(do_smem[stage], i, warp));
            kt::load(q_cols, kt::subtile<16, 16>(q_smem[stage], i, 0));
            kt::static_for<PAIR_TILES>([&](auto d) {
                constexpr int D = decltype(d)::value;
                col_tile<T> qq;
                pair_tile<D>(qq, q_cols, q_gather, i);
                if constexpr (D == HALF_TILE) mma_AtB_half(st.pair[D], grad_cols, qq);
                else kt::mma_AtB(st.pair[D], grad_cols, qq, st.pair[D]);
            });
            kt::mma_AtB(st.linear, grad_cols, q_cols, st.linear);
            kt::mma_AB(column_total, ones, grad_cols, column_total);  // column sums: ones x do
        }
#pragma unroll
        for (int half = 0; half < 2; half++) {
            st.constant.half[half].x += column_total.tiles[0][0].data[2 * half].x;
            st.constant.half[half].y += column_total.tiles[0][0].data[2 * half].y;
        }
    }

    if (g.grad_initial_state != nullptr) {
        const StateRows out{g.grad_initial_state + state_offset, DV + 1};
        write_state(st, out, value_col, c);
        if (warp == 0) {  // the normaliser column: no gradient from the value columns
            for (int row = lane; row < STATE_ROWS; row += kt::WARP_THREADS) out(row, DV) = 0.f;
        }
    }
}

template <typename T, int DV>
cudaError_t launch(const BackwardParams& p, cudaStream_t stream) {
    auto operand = [&](const void* data, int cols, int64_t sb, int64_t sh, int64_t sl) {
        return kt::gl<T>(static_cast<T*>(const_cast<void*>(data)), p.batch, p.heads, p.len, cols, sb, sh, sl);
    };
    const DkvGlobals<T> g{operand(p.grad_out, DV, p.grad_out_stride_b, p.grad_out_stride_h, p.grad_out_stride_l),
                          operand(p.q, FEATURE_DIM, p.q_stride_b, p.q_stride_h, p.q_stride_l),
                          operand(p.k, FEATURE_DIM, p.k_stride_b, p.k_stride_h, p.k_stride_l),
                          operand(p.v, DV, p.v_stride_b, p.v_stride_h, p.v_stride_l),
                          operand(p.dk, FEATURE_DIM, p.dk_stride_b, p.dk_stride_h, p.dk_stride_l),
                          operand(p.dv, DV, p.dv_stride_b, p.dv_stride_h, p.dv_stride_l),
                          p.grad_final_state,
                          p.grad_initial_state,
                          p.grad_denominator};
    constexpr int smem = DkvShared<T, DV>::bytes;
    auto kernel = dkv_kernel<T, DV>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
    const int64_t blocks = int64_t(p.batch) * p.heads;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    kernel<<<unsigned(blocks), Shape<DV>::threads, smem, stream>>>(g, make_constants(p.scale));
    return cudaGetLastError();
}

}  // namespace

int dkv_shared_bytes(int value_dim) {
    return value_dim == 64 ? DkvShared<kt::bf16, 64>::bytes : DkvShared<kt::bf16, 128>::bytes;
}

cudaError_t dkv_sm80(const BackwardParams& p, cudaStream_t stream) {
    const bool bf16 = p.dtype == ElementType::bf16;
    if (p.value_dim == 64) return bf16 ? launch<kt::bf16, 64>(p, stream) : launch<kt::half, 64>(p, stream);
    return bf16 ? launch<kt::bf16, 128>(p, stream) : launch<kt::half, 128>(p, stream);
}

}  // namespace backward

int backward_sm80_shared_bytes(int value_dim) {
    const int dq = backward::dq_shared_bytes(value_dim), dkv = backward::dkv_shared_bytes(value_dim);
    return dq > dkv ? dq : dkv;
}

cudaError_t backward_sm80(const BackwardParams& p, cudaStream_t stream) {
    if (!backward_params_valid(p)) return cudaErrorInvalidValue;
    if (cudaError_t e = backward::dq_sm80(p, stream)) return e;
    return backward::dkv_sm80(p, stream);
}

}  // namespace tk::based
