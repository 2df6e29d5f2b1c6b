// Based linear attention forward on mma.sync + cp.async (sm_80 and newer: A100, RTX 3090/4090,
// and Hopper when forced), written in the tile core's warp ops. The math and the state's layout
// are in params.h.
//
// One block computes 64 value columns of one (batch, head) with 4 warps; warp w owns value
// columns 16 w .. 16 w + 15 for the whole sequence (Dv = 128 is two blocks, each recomputing the
// chunk's scores). The sequence is walked in chunks of 64 rows through a two-stage cp.async ring;
// per chunk a warp computes, with s = q.k unscaled, c1 = scale, c2 = scale^2 / 2:
//   O  = a0                                   (sum of earlier v: the constant feature, fp32)
//      + c1 Q a1                              (a1 = sum of earlier k v^T)
//      + c2 sum_d weight_d QQ_d T_d           (T_d = sum of earlier KK_d^T v: pair tiles,
//                                              pair_features.cuh)
//      + mask_causal(1 + c1 S + c2 S^2) V_c   (S = Q K^T inside the chunk)
// then, if normalize, divides by the same sums with v replaced by 1 (the quadratic part from
// Z2 = sum k k^T as q^T Z2 q, in fp32 up to a two-term bf16/fp16 split of Z2), stores O, and
// adds the chunk to a0, a1, T_d (and z). The state lives in fp32 registers, transposed (value
// columns as rows): T_d is the accumulator of T_d^T += V^T KK_d and, converted to 16 bits,
// the B operand of O += QQ_d T_d, with no transpose in between. The normaliser state z (the
// v = 1 column) lives in shared memory, updated by warps 0 and 1 after each chunk: in every
// warp's registers it cost the main loop its last free registers (spills).
// Partial last chunk: rows past the end load as zeros (cp.async zero fill), add nothing to the
// state, are never seen by an earlier row (causal), and are not stored.
#include "kittens/kittens.cuh"
#include "based/forward_common.cuh"
#include "based/pair_features.cuh"
#include "based/params.h"

namespace tk::based {
namespace {

namespace kt = kittens;

constexpr int WARPS = 4;
constexpr int WARP_COLS = kt::TILE_DIM;                // value columns per warp
constexpr int BLOCK_COLS = WARPS * WARP_COLS;          // value columns per block
constexpr int ROW_TILES = CHUNK / kt::TILE_DIM;        // 16-row tiles per chunk
constexpr int STAGES = 2;
static_assert(WARPS == ROW_TILES, "each warp transposes one 16-row tile of the chunk");

template <typename T>
struct SharedTiles {
    using qk_tile = kt::st<T, CHUNK, FEATURE_DIM>;
    using v_tile = kt::st<T, CHUNK, BLOCK_COLS>;
    using o_tile = kt::st<T, CHUNK, WARP_COLS>;  // one warp's output columns, for coalesced stores
    static constexpr int bytes = kt::shared_bytes_for<qk_tile[STAGES], qk_tile[STAGES], v_tile[STAGES],
                                                      transposed_chunk<T>, transposed_chunk<T>, o_tile[WARPS]>();
};

template <typename T>
struct Globals {
    kt::gl<T> q, k, v, o;
};

// dst = src * factor in dst's 16-bit type, for the first REGISTERS registers (a half tile: 2).
template <int REGISTERS = 4, typename RT>
__device__ __forceinline__ void scaled_copy(RT& dst, const acc_tile& src, float factor) {
#pragma unroll
    for (int k = 0; k < REGISTERS; k++) {
        const float2 x = src.tiles[0][0].data[k];
        dst.tiles[0][0].data[k] = kt::convert_pair<typename RT::dtype, float>(make_float2(x.x * factor, x.y * factor));
    }
}

// The per-(batch, head) state but z: in fp32 registers, rows = this warp's 16 value columns.
struct State {
    acc_tile pair[PAIR_TILES];  // T_d^T: column b = feature (pair_partner(b, d), b); the half tile's registers 0, 1
    acc_tile linear;            // a1^T: column a = feature a
    column_values constant;     // a0 = sum of v, at this lane's value columns
};

__device__ __forceinline__ void read_state(State& s, const StateRows& in, int value_col, const Constants& c) {
    const int lane_col = 2 * (kt::lane_id() % 4);  // column of half 0's x; +1 for y, +8 for half 1
#pragma unroll
    for (int half = 0; half < 2; half++)
        s.constant.half[half] =
            make_float2(in(0, value_col + lane_col + 8 * half), in(0, value_col + lane_col + 8 * half + 1));
    kt::for_each_element(s.linear, [&](int, int, int k, int h, float& e) {
        e = in(1 + acc_tile::col_in_base(k, h), value_col + acc_tile::row_in_base(k, h)) * c.inv_sqrt_scale;
    });
    kt::static_for<PAIR_TILES>([&](auto d) {
        kt::for_each_element(s.pair[d], [&](int, int, int k, int h, float& e) {
            const int b = acc_tile::col_in_base(k, h);
            if (k < pair_registers(d)) e = in.quad(pair_partner(b, d), b, value_col + acc_tile::row_in_base(k, h), c);
        });
    });
}

__device__ __forceinline__ void write_state(const State& s, const StateRows& out, int value_col, const Constants& c) {
    const int lane = kt::lane_id(), lane_col = 2 * (lane % 4);
    if (lane < 4) {  // one writer per column of the column sums
#pragma unroll
        for (int half = 0; half < 2; half++) {
            out(0, value_col + lane_col + 8 * half) = s.constant.half[half].x;
            out(0, value_col + lane_col + 8 * half + 1) = s.constant.half[half].y;
        }
    }
    kt::for_each_element(s.linear, [&](int, int, int k, int h, const float& e) {
        out(1 + acc_tile::col_in_base(k, h), value_col + acc_tile::row_in_base(k, h)) = e * c.sqrt_scale;
    });
    kt::static_for<PAIR_TILES>([&](auto d) {
        kt::for_each_element(s.pair[d], [&](int, int, int k, int h, const float& e) {
            if (k >= pair_registers(d)) return;
            const int b = acc_tile::col_in_base(k, h), a = pair_partner(b, d);
            const int col = value_col + acc_tile::row_in_base(k, h);
            out(17 + 16 * a + b, col) = e * c.kappa;
            // Tiles 1..8 hold each unordered pair once: both halves of the symmetric block.
            if (d != 0) out(17 + 16 * b + a, col) = e * c.kappa;
        });
    });
}

template <typename T, bool NORMALIZE, bool Z_STATE>
__global__ void __launch_bounds__(WARPS * kt::WARP_THREADS, 2)
    forward_kernel(const __grid_constant__ Globals<T> g, const __grid_constant__ Constants c) {
    static_assert(!NORMALIZE || Z_STATE, "normalize needs the normaliser state");
    using S = SharedTiles<T>;
    using tile = kt::rt<T, 16, 16>;                 // row layout: A operands, and B of A B^T
    using col_tile = kt::rt<T, 16, 16, kt::col_l>;  // B operands, and A of A^T B

    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    auto& q_smem = alloc.allocate<typename S::qk_tile[STAGES]>();
    auto& k_smem = alloc.allocate<typename S::qk_tile[STAGES]>();
    auto& v_smem = alloc.allocate<typename S::v_tile[STAGES]>();
    auto& q_t = alloc.allocate<transposed_chunk<T>>();
    auto& k_t = alloc.allocate<transposed_chunk<T>>();
    auto& o_smem = alloc.allocate<typename S::o_tile[WARPS]>();
    // Static, so that the compiler knows its accesses are to shared memory (32-bit addresses, LDS).
    __shared__ NormaliserState z;

    const int value_dim = g.v.cols();
    const int col_blocks = value_dim / BLOCK_COLS;
    const int col_block = blockIdx.x % col_blocks;
    const int bh = blockIdx.x / col_blocks;
    const int batch = bh / g.q.heads(), head = bh % g.q.heads();
    const int warp = kt::warp_id(), lane = kt::lane_id();
    const int value_col = col_block * BLOCK_COLS + warp * WARP_COLS;  // this warp's first value column
    const int len = g.q.rows();
    const int chunks = kt::ceil_div(len, CHUNK);
    // z: every block needs it to normalize; otherwise only the block that writes the state's last
    // column (the first of a head's column blocks) keeps it.
    const bool block_tracks_z = Z_STATE && (NORMALIZE || col_block == 0);

    auto load_chunk = [&](int chunk, int stage) {
        kt::warpgroup::load_async(q_smem[stage], g.q, {batch, head, chunk, 0});
        kt::warpgroup::load_async(k_smem[stage], g.k, {batch, head, chunk, 0});
        kt::warpgroup::load_async(v_smem[stage], g.v, {batch, head, chunk, col_block});
        kt::cp_async_commit();
    };
    load_chunk(0, 0);

    const int64_t state_offset = (int64_t(batch) * g.q.heads() + head) * STATE_ROWS * (value_dim + 1);
    const StateRows initial{c.initial_state ? const_cast<float*>(c.initial_state) + state_offset : nullptr,
                            value_dim + 1};
    State st;
    if (c.initial_state != nullptr) {
        read_state(st, initial, value_col, c);
    } else {
        kt::static_for<PAIR_TILES>([&](auto d) { kt::zero(st.pair[d]); });
        kt::zero(st.linear);
        st.constant = {};
    }
    if (block_tracks_z && warp == 0) {  // visible to all warps after the first chunk's barrier
        read_normaliser(z, initial, c.initial_state != nullptr, value_dim, c);
    }

    tile ones;  // A operand of the column sums (sum of v, sum of k) in the accumulator's layout
    kt::one(ones);
    const uint32_t q_gather = gather_base(q_t), k_gather = gather_base(k_t);

    for (int chunk = 0; chunk < chunks; chunk++) {
        const int stage = chunk % STAGES;
        kt::cp_async_wait<0>();
        __syncthreads();  // the chunk visible to all warps; all done with the previous one
        if (chunk + 1 < chunks) load_chunk(chunk + 1, (chunk + 1) % STAGES);

        // q^T and k^T for the pair-feature gathers: warp w transposes chunk rows 16 w .. 16 w + 15.
        {
            col_tile part;
            kt::load(part, kt::subtile<16, 16>(q_smem[stage], warp, 0));
            store_transposed(q_t, part, warp);
            kt::load(part, kt::subtile<16, 16>(k_smem[stage], warp, 0));
            store_transposed(k_t, part, warp);
        }
        if constexpr (NORMALIZE) {
            // The denominators: warp w those of row tile w, for all warps after the barrier below.
            chunk_denominators<T>(z, q_smem[stage], k_smem[stage], warp, c);
        }
        tile q[ROW_TILES];
#pragma unroll
        for (int m = 0; m < ROW_TILES; m++) kt::load(q[m], kt::subtile<16, 16>(q_smem[stage], m, 0));
        __syncthreads();  // q^T, k^T and the denominators complete

        // Earlier chunks, through the state: constant, linear, then the pair tiles.
        acc_tile o[ROW_TILES];
#pragma unroll
        for (int m = 0; m < ROW_TILES; m++)
#pragma unroll
            for (int k = 0; k < 4; k++) o[m].tiles[0][0].data[k] = st.constant.half[k / 2];
        {
            tile linear;
            scaled_copy(linear, st.linear, c.c1);
#pragma unroll
            for (int m = 0; m < ROW_TILES; m++) kt::mma_ABt(o[m], q[m], linear, o[m]);
        }
        kt::static_for<PAIR_TILES>([&](auto d) {
            constexpr int D = decltype(d)::value;
            tile state16;
            scaled_copy<pair_registers(D)>(state16, st.pair[D], c.c2 * pair_weight(D));
#pragma unroll
            for (int m = 0; m < ROW_TILES; m++) {
                tile qq;
                pair_tile<D>(qq, q[m], q_gather, m);
                if constexpr (D == HALF_TILE) mma_ABt_half(o[m], qq, state16);
                else kt::mma_ABt(o[m], qq, state16, o[m]);
            }
        });

        // This chunk: the causally masked polynomial scores, 16 x 16 blocks on and below the diagonal.
#pragma unroll
        for (int j = 0; j < ROW_TILES; j++) {
            tile k_rows;  // K is the B operand of Q K^T
            kt::load<kt::mma_operand::b>(k_rows, kt::subtile<16, 16>(k_smem[stage], j, 0));
            col_tile v_rows;
            kt::load(v_rows, kt::subtile<16, 16>(v_smem[stage], j, warp));
#pragma unroll
            for (int i = j; i < ROW_TILES; i++) {
                acc_tile s;
                kt::zero(s);
                kt::mma_ABt(s, q[i], k_rows, s);
                kt::for_each_element(s, [&](int, int, int, int, float& e) { e = fmaf(e, fmaf(e, c.c2, c.c1), 1.f); });
                if (i == j) kt::mask_cols_after(s, [](int row) { return row; }, 0.f);
                tile p;
                kt::copy(p, s);
                kt::mma_AB(o[i], p, v_rows, o[i]);
            }
        }

        if constexpr (NORMALIZE) {
#pragma unroll
            for (int m = 0; m < ROW_TILES; m++) {
                typename acc_tile::col_vec denominator;
#pragma unroll
                for (int slot = 0; slot < 2; slot++)
                    denominator.data[0][slot] = z.denominator[kt::TILE_DIM * m + acc_tile::row_in_base(slot, 0)];
                kt::div_row(o[m], o[m], denominator);
            }
        }

        // Out through this warp's staging tile, as 16-byte stores of whole rows; rows past the
        // end are not stored.
#pragma unroll
        for (int m = 0; m < ROW_TILES; m++) {
            tile out;
            kt::copy(out, o[m]);
            kt::store(kt::subtile<16, 16>(o_smem[warp], m, 0), out);
        }
        __syncwarp();
        kt::warp::store(g.o, o_smem[warp], {batch, head, chunk, value_col / WARP_COLS});

        // The chunk into the state, 16 rows at a time.
        col_tile v_cols[ROW_TILES], k_cols[ROW_TILES];
#pragma unroll
        for (int j = 0; j < ROW_TILES; j++) {
            // V^T is the A operand of the state's products: its registers in that order.
            kt::load<kt::mma_operand::a>(v_cols[j], kt::subtile<16, 16>(v_smem[stage], j, warp));
            kt::load(k_cols[j], kt::subtile<16, 16>(k_smem[stage], j, 0));
            kt::static_for<PAIR_TILES>([&](auto d) {
                constexpr int D = decltype(d)::value;
                col_tile kk;
                pair_tile<D>(kk, k_cols[j], k_gather, j);
                if constexpr (D == HALF_TILE) mma_AtB_half(st.pair[D], v_cols[j], kk);
                else kt::mma_AtB(st.pair[D], v_cols[j], kk, st.pair[D]);
            });
            kt::mma_AtB(st.linear, v_cols[j], k_cols[j], st.linear);
        }
        add_column_sums(st.constant, ones, v_cols);
        if (block_tracks_z) {  // z's updates: every warp read this chunk's before the barrier above
            update_normaliser(z, k_cols, ones, warp, len, chunk);
        }
    }

    if (c.final_state != nullptr) {
        const StateRows out{c.final_state + state_offset, value_dim + 1};
        write_state(st, out, value_col, c);
        if constexpr (Z_STATE) {
            __syncthreads();  // the last chunk's z
            if (col_block == 0 && warp == 0) write_normaliser(z, out, value_dim, c);
        }
    }
}

template <typename T, bool NORMALIZE, bool Z_STATE>
cudaError_t launch(const ForwardParams& p, cudaStream_t stream) {
    auto operand = [&](const void* data, int cols, int64_t sb, int64_t sh, int64_t sl) {
        return kt::gl<T>(static_cast<T*>(const_cast<void*>(data)), p.batch, p.heads, p.len, cols, sb, sh, sl);
    };
    const Globals<T> g{operand(p.q, FEATURE_DIM, p.q_stride_b, p.q_stride_h, p.q_stride_l),
                       operand(p.k, FEATURE_DIM, p.k_stride_b, p.k_stride_h, p.k_stride_l),
                       operand(p.v, p.value_dim, p.v_stride_b, p.v_stride_h, p.v_stride_l),
                       operand(p.o, p.value_dim, p.o_stride_b, p.o_stride_h, p.o_stride_l)};
    const Constants c = make_constants(p);
    constexpr int smem = SharedTiles<T>::bytes;
    auto kernel = forward_kernel<T, NORMALIZE, Z_STATE>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
    const int64_t blocks = int64_t(p.batch) * p.heads * (p.value_dim / BLOCK_COLS);
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    kernel<<<unsigned(blocks), WARPS * kt::WARP_THREADS, smem, stream>>>(g, c);
    return cudaGetLastError();
}

}  // namespace

cudaError_t forward_sm80(const ForwardParams& p, cudaStream_t stream) {
    return dispatch_forward(p, BLOCK_COLS, [&]<typename T, bool NORMALIZE, bool Z_STATE>() {
        return launch<T, NORMALIZE, Z_STATE>(p, stream);
    });
}

}  // namespace tk::based
