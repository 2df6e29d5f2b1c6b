// Attention forward on mma.sync + cp.async (sm_80 and newer: A100, RTX 3090/4090,
// and Hopper when forced), written in the tile core's warp ops.
//
// One block computes BLOCK_Q = 128 query rows of one (batch, head) with 4 warps,
// 32 rows each, streaming the head's keys and values in tiles of BLOCK_KV rows
// (128 for d=64, 64 for d=128: the score tile and O then take the same registers)
// through a two-stage cp.async ring. Per key tile a warp computes
//   S = Q K^T                    (fp32 accumulators)
//   m = max(m, rowmax(S))        (online softmax in base 2)
//   P = exp2(S * c - m * c)      (c = scale * log2(e) > 0: the op layer sends scale <= 0 to SDPA)
//   l = l * alpha + rowsum(P),   O = O * alpha + P V
// and at the end O / l and the natural-log log-sum-exp m * c * ln2 + ln(l).
// Partial tiles: Q/K/V rows past the sequence end load as zeros (cp.async zero
// fill), scores of keys past the end are masked, output rows past the end are
// not stored. Causal: key j visible to query i iff j <= i + causal_offset (0: SDPA's
// top-left rule, Lk - Lq: lower-right); a negative offset leaves rows (even whole
// blocks) with no visible key, which store O = 0 and lse = -inf.
#include "kittens/kittens.cuh"
#include "attention/dispatch.h"
#include "attention/attention_params.h"
#include "attention/softmax_rows.cuh"

namespace tk::attention {
namespace {

namespace kt = kittens;

constexpr int WARPS = 4;
constexpr int ROWS_PER_WARP = 32;
constexpr int BLOCK_Q = WARPS * ROWS_PER_WARP;
// Key/value rows per tile: S (32 x BLOCK_KV fp32) plus O (32 x D fp32) must fit with
// room to spare in 255 registers; a longer tile halves the per-tile overhead (barrier,
// O rescale, softmax bookkeeping).
template <int D> constexpr int BLOCK_KV = D <= 64 ? 128 : 64;
constexpr int STAGES = 2;
constexpr float LOG2E = 1.4426950408889634f;

template <typename T, int D>
struct SharedTiles {
    using q_tile = kt::st<T, BLOCK_Q, D>;
    using kv_tile = kt::st<T, BLOCK_KV<D>, D>;
    static constexpr int bytes = kt::shared_bytes_for<q_tile, kv_tile[STAGES], kv_tile[STAGES]>();
};

template <typename T>
struct Globals {
    kt::gl<T> q, k, v, o;
    kt::gl<float> lse;  // (B, Hq, 1, Lq)
};

template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(WARPS * kt::WARP_THREADS)
    forward_kernel(const __grid_constant__ Globals<T> g, const float scale_log2, const int heads_q,
                   const int group_size, const int causal_offset) {
    using S = SharedTiles<T, D>;
    constexpr int K_STEPS = D / kt::TILE_DIM;     // 16-wide slices of the head dim
    constexpr int BLOCK_KV = attention::BLOCK_KV<D>;

    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    auto& q_smem = alloc.allocate<typename S::q_tile>();
    // Stages as arrays, not arrays of pointers: a run-time index into a register
    // array of pointers would put it in local memory.
    auto& k_smem = alloc.allocate<typename S::kv_tile[STAGES]>();
    auto& v_smem = alloc.allocate<typename S::kv_tile[STAGES]>();

    // Task: (batch*head, query block), heaviest causal blocks first within a head.
    const int len_q = g.q.rows(), len_kv = g.k.rows();
    const int q_blocks = kt::ceil_div(len_q, BLOCK_Q);
    const int bh = blockIdx.x / q_blocks;
    const int q_block = CAUSAL ? q_blocks - 1 - blockIdx.x % q_blocks : blockIdx.x % q_blocks;
    const int b = bh / heads_q, h = bh % heads_q, h_kv = h / group_size;
    const int warp = kt::warp_id();
    // Causal: the last key visible to this warp's first query row (row r sees keys <= diag0 + r).
    const int diag0 = q_block * BLOCK_Q + warp * ROWS_PER_WARP + causal_offset;

    // Key tiles this block needs: all of them, or (causal) up to the last visible key of its
    // last real query row; none when a negative offset hides every key from the block (clamped
    // at 0 before dividing: ceil_div of a negative is wrong). q_end + offset <= Lk: no overflow.
    // Such a block just stores O = 0 and lse = -inf.
    const int q_end = min((q_block + 1) * BLOCK_Q, len_q);
    const int kv_end = CAUSAL ? max(0, min(len_kv, q_end + causal_offset)) : len_kv;
    const int kv_tiles = kt::ceil_div(kv_end, BLOCK_KV);

    using score_tile = kt::rt_fl<ROWS_PER_WARP, BLOCK_KV>;
    using row_values = typename score_tile::col_vec;
    if (CAUSAL && kv_tiles == 0) {  // (lower-right, Lq > Lk) no row of the block sees a key
        kt::rt<T, ROWS_PER_WARP, kt::TILE_DIM> zeros;
        kt::zero(zeros);
#pragma unroll
        for (int d = 0; d < K_STEPS; d++) kt::store(g.o, zeros, {b, h, q_block * WARPS + warp, d});
        row_values lse;
        kt::neg_infty(lse);
        kt::store(g.lse, lse, {b, h, 0, q_block * WARPS + warp});
        return;
    }

    // Prologue in two groups, so the first S = Q K^T starts while V_0 is in flight.
    kt::warpgroup::load_async(q_smem, g.q, {b, h, q_block, 0});
    kt::warpgroup::load_async(k_smem[0], g.k, {b, h_kv, 0, 0});
    kt::cp_async_commit();
    kt::warpgroup::load_async(v_smem[0], g.v, {b, h_kv, 0, 0});
    kt::cp_async_commit();

    kt::rt_fl<ROWS_PER_WARP, kt::TILE_DIM> o[K_STEPS];  // O in 16-column slices
    row_values row_max, row_sum;  // running max of raw scores; sum of P (this lane's share)
    kt::neg_infty(row_max);
    kt::zero(row_sum);
#pragma unroll
    for (int d = 0; d < K_STEPS; d++) kt::zero(o[d]);

    // One key tile. MASKED tiles (a causal diagonal, or past the end of the keys) mask
    // their scores, and skip warps whose rows all precede the tile, except tile 0 (every
    // warp must reach its barrier; a warp that sees none of it masks all its scores, which
    // adds nothing). The two kinds are separate instantiations so the unmasked tiles,
    // nearly all of them, run without any of that. (Skipping the masked 16-key slices of a diagonal tile per warp was
    // measured: it cost more in branches than it saved in mma.)
    constexpr int SLICES = BLOCK_KV / kt::TILE_DIM;
    auto process_tile = [&]<bool MASKED>(int j) {
        const int stage = j % STAGES;
        if (j == 0) kt::cp_async_wait<1>();  // Q and K_0 (V_0 may still be landing)
        else kt::cp_async_wait<0>();
        __syncthreads();  // tile j visible to all warps; everyone is done with tile j-1's stage
        if (j + 1 < kv_tiles) {  // tile j+1 into the stage tile j-1 used
            kt::warpgroup::load_async(k_smem[(j + 1) % STAGES], g.k, {b, h_kv, j + 1, 0});
            kt::warpgroup::load_async(v_smem[(j + 1) % STAGES], g.v, {b, h_kv, j + 1, 0});
            kt::cp_async_commit();
        }
        const int kv_col0 = j * BLOCK_KV;
        // All keys in this warp's future (its last row's last visible key precedes the tile):
        if (MASKED && CAUSAL && j > 0 && kv_col0 > diag0 + ROWS_PER_WARP - 1) return;

        // S = Q K^T over 16-wide slices of the head dim. Q slices are re-read from shared
        // memory for every key tile: Q in registers would not leave room for S and O.
        score_tile s;
        kt::zero(s);
#pragma unroll
        for (int d = 0; d < K_STEPS; d++) {
            kt::rt<T, ROWS_PER_WARP, kt::TILE_DIM> q_slice;
            kt::load(q_slice, kt::subtile<ROWS_PER_WARP, kt::TILE_DIM>(q_smem, warp, d));
            kt::rt<T, BLOCK_KV, kt::TILE_DIM> k_slice;  // K is the B operand of Q K^T
            kt::load<kt::mma_operand::b>(k_slice, kt::subtile<BLOCK_KV, kt::TILE_DIM>(k_smem[stage], 0, d));
            kt::mma_ABt(s, q_slice, k_slice, s);
        }
        if constexpr (MASKED) {
            // Key kv_col0 + c is visible to row r iff it is < Lk and (causal) <= diag0 + r.
            const int last_key = len_kv - 1 - kv_col0;
            kt::mask_cols_after(s, [&](int r) {
                return CAUSAL ? min(last_key, diag0 + r - kv_col0) : last_key;
            }, kt::neg_infinity());
        }

        // Online softmax on raw scores (the max commutes with the positive scale c):
        // P = exp2(S * c - m_new * c) is one multiply-add and one exp2 per element.
        // The reductions start from the identity (kt::reduce_start): from the first element,
        // the d64 non-causal loop compiled for sm_90a (the forced path on Hopper) spilled in its
        // loop (22 local loads/stores, SASS), and the sm_80/sm_89 kernels could not be timed here.
        row_values new_max, shift, rescale;
        kt::row_max<kt::reduce_start::identity>(new_max, s, row_max);
        kt::for_each_slot(rescale, [&](int t, int i, float& alpha) {
            const float m_new = new_max.data[t][i];
            // A row with no visible key so far keeps max -inf: shift by 0, not -inf.
            const bool empty = m_new == kt::neg_infinity();
            shift.data[t][i] = empty ? 0.f : m_new * scale_log2;
            alpha = empty ? 1.f : exp2f((row_max.data[t][i] - m_new) * scale_log2);
        });
        kt::mul(s, s, scale_log2);
        kt::sub_row(s, s, shift);
        kt::exp2(s, s);
        kt::copy(row_max, new_max);
        kt::mul(row_sum, row_sum, rescale);
        kt::row_sum_lane_partial<kt::reduce_start::identity>(row_sum, s, row_sum);  // lanes combined after the loop

        if (j == 0) {  // no warp skips tile 0 (see above), so every warp reaches this barrier
            if (kv_tiles > 1) kt::cp_async_wait<1>();  // V_0 (tile 1's group may be in flight)
            else kt::cp_async_wait<0>();
            __syncthreads();
        }

        // O = O * alpha + P V, one 16-key slice of P at a time (bf16 P and V slices
        // stay small, which keeps d=128 within the register file).
#pragma unroll
        for (int d = 0; d < K_STEPS; d++) kt::mul_row(o[d], o[d], rescale);
#pragma unroll
        for (int kk = 0; kk < SLICES; kk++) {
            kt::rt<T, ROWS_PER_WARP, kt::TILE_DIM> p;
            kt::slice_cols(p, s, kk * kt::TILE_DIM);
#pragma unroll
            for (int d = 0; d < K_STEPS; d++) {
                kt::rt<T, kt::TILE_DIM, kt::TILE_DIM, kt::col_l> v_sub;
                kt::load(v_sub, kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(v_smem[stage], kk, d));
                kt::mma_AB(o[d], p, v_sub, o[d]);
            }
        }
    };

    // Tiles before the first one that needs a mask: all keys visible to every row of the
    // block (causal: the tile ends at or before the first key hidden from the block's first
    // query row; clamped at 0 before dividing).
    const int unmasked_tiles =
        min(len_kv / BLOCK_KV, CAUSAL ? max(0, q_block * BLOCK_Q + 1 + causal_offset) / BLOCK_KV : kv_tiles);
    int j = 0;
    for (; j < unmasked_tiles; j++) process_tile.template operator()<false>(j);
    for (; j < kv_tiles; j++) process_tile.template operator()<true>(j);

    kt::reduce_across_lanes<kt::base_ops::add>(row_sum);
    // A row that saw no key has O = 0 and l = 0: divide by 1, so it stores 0, not 0/0.
    guard_empty_rows(row_sum);

    // Epilogue: O / l through this warp's rows of the Q tile, then coalesced stores.
    // The warp's last ldmatrix reads of those rows (other lanes' addresses) come first.
    __syncwarp();
    auto o_smem = kt::subtile<ROWS_PER_WARP, D>(q_smem, warp, 0);
#pragma unroll
    for (int d = 0; d < K_STEPS; d++) {
        kt::div_row(o[d], o[d], row_sum);
        kt::rt<T, ROWS_PER_WARP, kt::TILE_DIM> o_out;
        kt::copy(o_out, o[d]);
        kt::store(kt::subtile<ROWS_PER_WARP, kt::TILE_DIM>(q_smem, warp, d), o_out);
    }
    __syncwarp();
    kt::warp::store(g.o, o_smem, {b, h, q_block * WARPS + warp, 0});

    row_values lse;
    log_sum_exp(lse, row_max, row_sum, scale_log2);  // -inf for a row that saw no key
    kt::store(g.lse, lse, {b, h, 0, q_block * WARPS + warp});
}

struct Sm80Forward {
    using head_dims = Sm80HeadDims;  // not 96 (head_dims.h says why)
    template <typename T, int D, bool CAUSAL>
    static cudaError_t run(const ForwardParams& p, cudaStream_t stream);
};

template <typename T, int D, bool CAUSAL>
cudaError_t launch(const ForwardParams& p, cudaStream_t stream) {
    using G = Globals<T>;
    const G g{head_major<T, D>(p.q, p.batch, p.heads_q, p.len_q, p.q_stride_b, p.q_stride_h, p.q_stride_l),
              head_major<T, D>(p.k, p.batch, p.heads_kv, p.len_kv, p.k_stride_b, p.k_stride_h, p.k_stride_l),
              head_major<T, D>(p.v, p.batch, p.heads_kv, p.len_kv, p.v_stride_b, p.v_stride_h, p.v_stride_l),
              head_major<T, D>(p.o, p.batch, p.heads_q, p.len_q, p.o_stride_b, p.o_stride_h, p.o_stride_l),
              kt::gl<float>(p.lse, p.batch, p.heads_q, 1, p.len_q)};
    constexpr int smem = SharedTiles<T, D>::bytes;
    auto kernel = forward_kernel<T, D, CAUSAL>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
    const int64_t blocks = int64_t(kt::ceil_div(p.len_q, BLOCK_Q)) * p.batch * p.heads_q;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    kernel<<<unsigned(blocks), WARPS * kt::WARP_THREADS, smem, stream>>>(
        g, p.scale * LOG2E, p.heads_q, p.heads_q / p.heads_kv, CAUSAL ? p.causal_offset : 0);
    return cudaGetLastError();
}

template <typename T, int D, bool CAUSAL>
cudaError_t Sm80Forward::run(const ForwardParams& p, cudaStream_t stream) {
    return launch<T, D, CAUSAL>(p, stream);
}

}  // namespace

cudaError_t forward_sm80(const ForwardParams& params, cudaStream_t stream) {
    return dispatch<Sm80Forward>(params, stream);
}

}  // namespace tk::attention
