// The gradient of q for the Based backward (backward_params.h has the math), on mma.sync +
// cp.async, written in the tile core's warp ops; backward_common.cuh describes the layout.
//
// One block per (batch, head) walks the sequence forward in chunks of 64 rows, keeping the
// forward's running state S = S0 + sum of earlier phi(k) v^T (the value-column role; S's
// constant feature has no gradient and is not kept). Per chunk, for the row tile m of a warp:
//   dq_m  = J_phi(q_m)^T (S do_m)                            (earlier chunks, through the state)
//         + sum_{j <= m} (dP_mj * (c1 + 2 c2 s_mj)) k_j      (this chunk: causal 16x16 blocks)
// with dP = do v^T (+ g_m, the denominators' gradient, when given) and s = q k^T unscaled; then the
// chunk goes into S.
#include "based/backward_common.cuh"

namespace tk::based::backward {
namespace {

template <typename T, int DV>
struct DqShared {
    static constexpr int bytes =
        kt::shared_bytes_for<qk_tile<T>[STAGES], qk_tile<T>[STAGES], value_tile<T, DV>[STAGES], value_tile<T, DV>[STAGES],
                             transposed_chunk<T>, transposed_chunk<T>, state_copy<T, DV>[STATE_TILES],
                             permutation_tiles<T>, row_out_tile<T>, PartExchange>();
};

template <typename T>
struct DqGlobals {
    kt::gl<T> grad_out, q, k, v, dq;
    const float* initial_state;     // (B, H, 273, Dv + 1) or null
    const float* grad_denominator;  // (B, H, N) or null
};

template <typename T, int DV>
__global__ void __launch_bounds__(Shape<DV>::threads, Shape<DV>::min_blocks)
    dq_kernel(const __grid_constant__ DqGlobals<T> g, const __grid_constant__ Constants c) {
    using shape = Shape<DV>;
    using group = kt::group<shape::warps>;

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

    const int bh = blockIdx.x;
    const int batch = bh / g.q.heads(), head = bh % g.q.heads();
    const int warp = kt::warp_id();
    const int value_col = warp * WARP_COLS;                             // value-column role
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
    load_chunk(0, 0);
    fill_permutations(permutations);  // visible after the first chunk's barrier

    State st;
    if (g.initial_state != nullptr) {
        const int64_t offset = (int64_t(batch) * g.q.heads() + head) * STATE_ROWS * (DV + 1);
        read_state(st, StateRows{const_cast<float*>(g.initial_state) + offset, DV + 1}, value_col, c);
    } else {
        zero_state(st);
    }
    const uint32_t q_gather = gather_base(q_t), k_gather = gather_base(k_t);

    for (int chunk = 0; chunk < chunks; chunk++) {
        const int stage = chunk % STAGES;
        kt::cp_async_wait<0>();
        __syncthreads();  // the chunk visible to all warps; all done with the previous one
        if (chunk + 1 < chunks) load_chunk(chunk + 1, (chunk + 1) % STAGES);

        // q^T and k^T for the pair-feature gathers (16 rows of q or k per warp), and the state's
        // 16-bit copy (S of the earlier chunks) for the row role.
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
        __syncthreads();  // q^T, k^T and the state copy complete

        // Row role: dq of row tile `row_tile` over value columns 64 value_group .. + 63.
        {
            group_rows<T> grad_rows;
            kt::load(grad_rows, kt::subtile<16, GROUP_COLS>(do_smem[stage], row_tile, value_group));
            tile<T> q_rows;
            kt::load(q_rows, kt::subtile<16, 16>(q_smem[stage], row_tile, 0));
            acc_tile dq;
            kt::zero(dq);
            add_state_gradient(dq, grad_rows, copy, value_group, RowFactors<T>(q_rows, q_gather, row_tile),
                               permutations);
            // g of the row tile's queries, added to dP once (by value group 0: the groups' parts
            // of dP add up through dq).
            acc_tile::col_vec denominator_grad;
            load_denominator_gradient(denominator_grad,
                                      value_group == 0 && g.grad_denominator != nullptr
                                          ? g.grad_denominator + int64_t(bh) * len : nullptr,
                                      chunk * CHUNK + row_tile * kt::TILE_DIM, len);
#pragma unroll 1
            for (int j = 0; j <= row_tile; j++) {
                tile<T> k_rows;  // B operand of q k^T
                kt::load<kt::mma_operand::b>(k_rows, kt::subtile<16, 16>(k_smem[stage], j, 0));
                acc_tile s;
                kt::zero(s);
                kt::mma_ABt(s, q_rows, k_rows, s);
                group_rows<T> v_rows;  // B operand of do v^T
                kt::load<kt::mma_operand::b>(v_rows, kt::subtile<16, GROUP_COLS>(v_smem[stage], j, value_group));
                acc_tile ds;
                kt::zero(ds);
                kt::mma_ABt(ds, grad_rows, v_rows, ds);
                kt::add_row(ds, ds, denominator_grad);
                scale_by_derivative(ds, s, c);
                if (j == row_tile) kt::mask_cols_after(ds, [](int row) { return row; }, 0.f);
                tile<T> ds_high, ds_low;
                split_high_low(ds_high, ds_low, ds);
                col_tile<T> k_cols;  // B operand of ds k
                kt::load(k_cols, kt::subtile<16, 16>(k_smem[stage], j, 0));
                kt::mma_AB(dq, ds_high, k_cols, dq);
                kt::mma_AB(dq, ds_low, k_cols, dq);
            }
            if (combine_groups<shape::groups>(dq, exchange, row_tile, value_group))
                store_row_tile(g.dq, staging, dq, batch, head, chunk, row_tile);
        }

        // Value-column role: the chunk into S (16 rows at a time).
#pragma unroll
        for (int j = 0; j < ROW_TILES; j++) {
            col_tile<T> v_cols, k_cols;
            // V^T is the A operand of the state's products: its registers in that order.
            kt::load<kt::mma_operand::a>(v_cols, kt::subtile<16, 16>(v_smem[stage], j, warp));
            kt::load(k_cols, kt::subtile<16, 16>(k_smem[stage], j, 0));
            kt::static_for<PAIR_TILES>([&](auto d) {
                constexpr int D = decltype(d)::value;
                col_tile<T> kk;
                pair_tile<D>(kk, k_cols, k_gather, j);
                if constexpr (D == HALF_TILE) mma_AtB_half(st.pair[D], v_cols, kk);
                else kt::mma_AtB(st.pair[D], v_cols, kk, st.pair[D]);
            });
            kt::mma_AtB(st.linear, v_cols, k_cols, st.linear);
        }
    }
}

template <typename T, int DV>
cudaError_t launch(const BackwardParams& p, cudaStream_t stream) {
    auto operand = [&](const void* data, int cols, int64_t sb, int64_t sh, int64_t sl) {
        return kt::gl<T>(static_cast<T*>(const_cast<void*>(data)), p.batch, p.heads, p.len, cols, sb, sh, sl);
    };
    const DqGlobals<T> g{operand(p.grad_out, DV, p.grad_out_stride_b, p.grad_out_stride_h, p.grad_out_stride_l),
                         operand(p.q, FEATURE_DIM, p.q_stride_b, p.q_stride_h, p.q_stride_l),
                         operand(p.k, FEATURE_DIM, p.k_stride_b, p.k_stride_h, p.k_stride_l),
                         operand(p.v, DV, p.v_stride_b, p.v_stride_h, p.v_stride_l),
                         operand(p.dq, FEATURE_DIM, p.dq_stride_b, p.dq_stride_h, p.dq_stride_l),
                         p.initial_state,
                         p.grad_denominator};
    constexpr int smem = DqShared<T, DV>::bytes;
    auto kernel = dq_kernel<T, DV>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
    const int64_t blocks = int64_t(p.batch) * p.heads;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    kernel<<<unsigned(blocks), Shape<DV>::threads, smem, stream>>>(g, make_constants(p.scale));
    return cudaGetLastError();
}

}  // namespace

int dq_shared_bytes(int value_dim) {
    return value_dim == 64 ? DqShared<kt::bf16, 64>::bytes : DqShared<kt::bf16, 128>::bytes;
}

cudaError_t dq_sm80(const BackwardParams& p, cudaStream_t stream) {
    const bool bf16 = p.dtype == ElementType::bf16;
    if (p.value_dim == 64) return bf16 ? launch<kt::bf16, 64>(p, stream) : launch<kt::half, 64>(p, stream);
    return bf16 ? launch<kt::bf16, 128>(p, stream) : launch<kt::half, 128>(p, stream);
}

}  // namespace tk::based::backward
