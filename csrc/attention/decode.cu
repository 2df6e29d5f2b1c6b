// Attention for decoding: a few query rows against a long key/value cache, on mma.sync +
// cp.async (sm_80 and newer; Hopper runs it too). Reading K and V once is the whole cost, so
// the kernel is laid out for the memory system, not the tensor cores:
//
//  * The query rows of one GQA group (group = Hq / Hkv heads x Lq rows, head-major) are packed
//    into the rows of one tile, so each K/V tile is read once per group, not once per head.
//    Up to 16 packed rows take one 16-row warp tile; 17-32 two; more go in tiles of 64 rows
//    (several tiles per group when group * Lq > 64).
//  * A block (4 warps) takes one tile of packed rows of one (batch, kv head) and one split of
//    its keys. Its warps split each K/V tile between them: 4 key groups for a 16-row tile,
//    2 for 32, 1 for 64 rows (4 x 16 rows), so every warp's tensor work is a 16-row tile.
//    Each warp runs its own online softmax over its keys (base 2, on raw scores; the running
//    max of raw scores is the max of the scaled ones for a positive scale, which the op checks),
//    and the block combines the warps' (max, sum, O) through shared memory at the end.
//  * Keys stream through a 3-stage cp.async ring of block_kv-key K and V tiles (32 KB a stage:
//    two blocks fit an SM, four stages in flight each). Rows past the block's last key load as
//    zeros (V must: a cache's unused rows may hold NaN, and 0 * NaN is NaN).
//  * Splits: the keys of each (batch, kv head) are cut into `splits` equal pieces so that
//    batch x kv heads x row tiles x splits gives about one block per SM (plan_decode). Each piece writes its
//    rows' normalised O and natural-log lse in fp32; a second kernel merges them by their lse.
//    With one piece the block writes out and lse directly. On sm_90 the merge kernel is a
//    programmatic dependent launch: its launch overlaps the split kernel's tail.
//
// Per-sequence lengths (seqlens) are read on the device: a block past its sequence's end
// has no keys and writes an empty piece (lse = -inf, no O), a sequence with no keys gets
// out = 0 and lse = -inf (the rule of rows that see no key). Causal: key j visible to query
// i iff j <= i + offset (ForwardParams' rule; with seqlens, lower-right: offset = keys - Lq).
#include <algorithm>

#include "kittens/kittens.cuh"
#include "attention/decode_params.h"
#include "attention/dispatch.h"
#include "attention/head_dims.h"

namespace tk::attention {
namespace {

namespace kt = kittens;

constexpr int WARPS = 4;
constexpr int THREADS = WARPS * kt::WARP_THREADS;
constexpr int STAGES = 3;
constexpr int BLOCKS_PER_SM = 2;  // what the shared memory below allows
constexpr int MAX_SPLITS = 128;
constexpr int MIN_TILES_PER_SPLIT = 2;
constexpr int HALF_FILLED_MIN_TILES = 32;  // plan_decode
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// Keys per stage: 32 KB of K and V at d64 and d128 (24 KB at d96).
template <int D> constexpr int BLOCK_KV = D <= 64 ? 128 : 64;
constexpr int block_kv_for(int head_dim) { return head_dim <= 64 ? 128 : 64; }

template <typename T, int D, int ROW_GROUPS>
struct Layout {
    static constexpr int KEY_GROUPS = WARPS / ROW_GROUPS;  // warps sharing a row tile
    static constexpr int M_TILE = 16 * ROW_GROUPS;         // packed rows per block
    static constexpr int KW = BLOCK_KV<D> / KEY_GROUPS;     // keys per warp per tile
    static_assert(KW % kt::TILE_DIM == 0, "each warp's share of a tile is whole 16-key slices");
    using kv_tile = kt::st<T, BLOCK_KV<D>, D>;
    // The warps' O, row max and row sum for the final combine; O overlays the K stages (free by
    // then), one row of D + 4 floats (16-byte rows, fewer bank conflicts than D).
    static constexpr int O_STRIDE = D + 4;
    struct Stats {
        float max[KEY_GROUPS][M_TILE];
        float sum[KEY_GROUPS][M_TILE];
    };
    static_assert(KEY_GROUPS * M_TILE * O_STRIDE * sizeof(float) <= sizeof(kv_tile[STAGES]),
                  "the combine buffer must fit in the K stages");
    static constexpr int bytes = kt::shared_bytes_for<kv_tile[STAGES], kv_tile[STAGES], Stats>();
    static_assert(BLOCKS_PER_SM * (bytes + 1024) <= 228 * 1024, "two blocks must fit an SM");
};

template <typename T>
__device__ __forceinline__ void store4(T* dst, float4 x) {  // 4 elements, 8-byte aligned
    struct alignas(8) Four { kt::packed<T> lo, hi; };
    *reinterpret_cast<Four*>(dst) = {kt::convert_pair<T, float>(float2{x.x, x.y}),
                                     kt::convert_pair<T, float>(float2{x.z, x.w})};
}

template <typename T, int D, int ROW_GROUPS>
__global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
    decode_kernel(const __grid_constant__ DecodeParams p, const int m_tiles, const int splits,
                  const int tiles_per_split) {
    using L = Layout<T, D, ROW_GROUPS>;
    constexpr int BKV = BLOCK_KV<D>, KW = L::KW, M_TILE = L::M_TILE, KEY_GROUPS = L::KEY_GROUPS;
    constexpr int K_STEPS = D / kt::TILE_DIM;

    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    auto& k_smem = alloc.allocate<typename L::kv_tile[STAGES]>();
    auto& v_smem = alloc.allocate<typename L::kv_tile[STAGES]>();
    auto& stats = alloc.allocate<typename L::Stats>();

    // Block: (batch, kv head, split, row tile), the row tile fastest (its neighbours read the
    // same keys, from L2).
    int index = blockIdx.x;
    const int m_tile = index % m_tiles;
    index /= m_tiles;
    const int split = index % splits;
    index /= splits;
    const int h_kv = index % p.heads_kv, b = index / p.heads_kv;

    const int group = p.heads_q / p.heads_kv;
    const int rows = group * p.len_q;  // packed rows of this (batch, kv head)
    const int warp = kt::warp_id(), lane = kt::lane_id();
    const int row_group = warp % ROW_GROUPS, key_group = warp / ROW_GROUPS;
    const int row_base = m_tile * M_TILE + row_group * 16;  // this warp's first packed row

    // This sequence's keys and causal offset; the keys any row of the block may see.
    int keys = p.len_kv, offset = p.causal_offset;
    if (p.seqlens != nullptr) {
        const long long wanted = static_cast<long long>(p.seqlens[b]) + p.seqlen_add;
        keys = static_cast<int>(wanted < 0 ? 0 : wanted > p.len_kv ? p.len_kv : wanted);
        offset = keys - p.len_q;
    }
    const int kv_end = p.causal ? min(keys, max(0, p.len_q + offset)) : keys;
    const int k0 = split * tiles_per_split * BKV;
    const int k1 = min(kv_end, k0 + tiles_per_split * BKV);
    const int n_tiles = k1 > k0 ? kt::ceil_div(k1 - k0, BKV) : 0;
    // Tiles before the first key hidden from some row need no mask: keys < k1, and (causal)
    // <= offset, the last key row i = 0 sees.
    const int clear_end = p.causal ? min(k1, max(0, offset + 1)) : k1;
    const int unmasked_tiles = min(n_tiles, max(0, clear_end - k0) / BKV);

    // K and V of this (batch, kv head) up to the block's last key: rows from k1 on load as 0.
    const kt::gl<T> gk(static_cast<T*>(const_cast<void*>(p.k)), p.batch, p.heads_kv, k1, D, p.k_stride_b,
                       p.k_stride_h, p.k_stride_l);
    const kt::gl<T> gv(static_cast<T*>(const_cast<void*>(p.v)), p.batch, p.heads_kv, k1, D, p.v_stride_b,
                       p.v_stride_h, p.v_stride_l);
    const int tile0 = k0 / BKV;
    auto load_tile = [&](int j) {
        kt::group<WARPS>::load_async(k_smem[j % STAGES], gk, {b, h_kv, tile0 + j, 0});
        kt::group<WARPS>::load_async(v_smem[j % STAGES], gv, {b, h_kv, tile0 + j, 0});
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < n_tiles) load_tile(s);
        kt::cp_async_commit();  // empty groups too: the waits below count groups
    }

    // This warp's 16 query rows, straight into registers (their A fragments) while the first
    // tiles land. A lane holds rows lane / 4 and lane / 4 + 8; padding rows are 0.
    kt::rt<T, kt::TILE_DIM, kt::TILE_DIM> q_reg[K_STEPS];
    {
        const T* row_ptr[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = row_base + lane / 4 + 8 * half;
            row_ptr[half] = nullptr;
            if (r < rows) {
                const int g = r / p.len_q, i = r - g * p.len_q;
                row_ptr[half] = static_cast<const T*>(p.q) + b * p.q_stride_b +
                                int64_t(h_kv * group + g) * p.q_stride_h + int64_t(i) * p.q_stride_l;
            }
        }
#pragma unroll
        for (int d = 0; d < K_STEPS; d++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const T* row = row_ptr[k % 2];
                const int col = d * kt::TILE_DIM + 2 * (lane % 4) + 8 * (k / 2);
                q_reg[d].tiles[0][0].data[k] = row != nullptr ? *reinterpret_cast<const kt::packed<T>*>(row + col)
                                                              : kt::convert_pair<T, float>(float2{0.f, 0.f});
            }
    }

    using score_tile = kt::rt_fl<kt::TILE_DIM, KW>;
    using row_values = typename score_tile::col_vec;
    kt::rt_fl<kt::TILE_DIM, kt::TILE_DIM> o[K_STEPS];
    row_values row_max, row_sum;  // running max of raw scores; this lane's share of the sum of P
    kt::neg_infty(row_max);
    kt::zero(row_sum);
#pragma unroll
    for (int d = 0; d < K_STEPS; d++) kt::zero(o[d]);
    const float scale_log2 = p.scale * LOG2E;

    auto process_tile = [&]<bool MASKED>(int j) {
        kt::cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile j visible; every warp is done with tile j - 1's stage
        if (j + STAGES - 1 < n_tiles) load_tile(j + STAGES - 1);
        kt::cp_async_commit();
        const int stage = j % STAGES;
        const int key0 = k0 + j * BKV + key_group * KW;  // this warp's first key

        score_tile s;
        kt::zero(s);
#pragma unroll
        for (int d = 0; d < K_STEPS; d++) {
            kt::rt<T, KW, kt::TILE_DIM> k_slice;
            kt::load<kt::mma_operand::b>(k_slice, kt::subtile<KW, kt::TILE_DIM>(k_smem[stage], key_group, d));
            kt::mma_ABt(s, q_reg[d], k_slice, s);
        }
        if constexpr (MASKED) {
            kt::mask_cols_after(s, [&](int r) {
                int last = k1 - 1 - key0;
                if (p.causal) last = min(last, (row_base + r) % p.len_q + offset - key0);
                return last;
            }, kt::neg_infinity());
        }

        row_values new_max, shift, rescale;
        kt::row_max(new_max, s, row_max);
        kt::for_each_slot(rescale, [&](int t, int i, float& alpha) {
            const float m_new = new_max.data[t][i];
            const bool empty = m_new == kt::neg_infinity();  // no visible key yet: shift by 0
            shift.data[t][i] = empty ? 0.f : m_new * scale_log2;
            alpha = empty ? 1.f : exp2f((row_max.data[t][i] - m_new) * scale_log2);
        });
        kt::mul(s, s, scale_log2);
        kt::sub_row(s, s, shift);
        kt::exp2(s, s);
        kt::copy(row_max, new_max);
        kt::mul(row_sum, row_sum, rescale);
        kt::row_sum_lane_partial(row_sum, s, row_sum);

#pragma unroll
        for (int d = 0; d < K_STEPS; d++) kt::mul_row(o[d], o[d], rescale);
#pragma unroll
        for (int kk = 0; kk < KW / kt::TILE_DIM; kk++) {
            kt::rt<T, kt::TILE_DIM, kt::TILE_DIM> p_slice;
            kt::slice_cols(p_slice, s, kk * kt::TILE_DIM);
#pragma unroll
            for (int d = 0; d < K_STEPS; d++) {
                kt::rt<T, kt::TILE_DIM, kt::TILE_DIM, kt::col_l> v_sub;
                kt::load(v_sub, kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(v_smem[stage], key_group * (KW / kt::TILE_DIM) + kk, d));
                kt::mma_AB(o[d], p_slice, v_sub, o[d]);
            }
        }
    };
    int j = 0;
    for (; j < unmasked_tiles; j++) process_tile.template operator()<false>(j);
    for (; j < n_tiles; j++) process_tile.template operator()<true>(j);
    kt::allow_next_grid();  // the merge kernel's blocks may start (and wait for this grid)
    kt::reduce_across_lanes<kt::base_ops::add>(row_sum);

    // Combine the key groups: each warp's O (unnormalised), max and sum into shared memory.
    kt::cp_async_wait<0>();
    __syncthreads();  // the stages are free
    float* combine = reinterpret_cast<float*>(&k_smem[0]);  // [KEY_GROUPS][M_TILE][O_STRIDE]
    if (lane % 4 == 0) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = row_group * 16 + lane / 4 + 8 * half;
            stats.max[key_group][r] = row_max.data[0][half];
            stats.sum[key_group][r] = row_sum.data[0][half];
        }
    }
    float* mine = combine + (key_group * M_TILE + row_group * 16) * L::O_STRIDE;
#pragma unroll
    for (int d = 0; d < K_STEPS; d++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int r = lane / 4 + 8 * (k % 2), c = d * kt::TILE_DIM + 2 * (lane % 4) + 8 * (k / 2);
            *reinterpret_cast<float2*>(mine + r * L::O_STRIDE + c) = o[d].tiles[0][0].data[k];
        }
    __syncthreads();

    // Each thread: 4 columns of one row at a time, coalesced along the row.
    constexpr int CHUNKS = D / 4;
    for (int idx = threadIdx.x; idx < M_TILE * CHUNKS; idx += THREADS) {
        const int r = idx / CHUNKS, c = (idx % CHUNKS) * 4;
        const int packed_row = m_tile * M_TILE + r;
        if (packed_row >= rows) break;  // rows grow with idx: the rest are padding too
        float mx = kt::neg_infinity();
#pragma unroll
        for (int g = 0; g < KEY_GROUPS; g++) mx = fmaxf(mx, stats.max[g][r]);
        float4 acc = {0.f, 0.f, 0.f, 0.f};
        float sum = 0.f;
        if (mx != kt::neg_infinity()) {
#pragma unroll
            for (int g = 0; g < KEY_GROUPS; g++) {
                const float m_g = stats.max[g][r];
                if (m_g == kt::neg_infinity()) continue;  // a warp that saw no key of this row
                const float w = exp2f((m_g - mx) * scale_log2);
                sum += w * stats.sum[g][r];
                const float4 x = *reinterpret_cast<const float4*>(combine + (g * M_TILE + r) * L::O_STRIDE + c);
                acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
            }
        }
        // sum >= 1 where any key was seen (the max's own term); 0 rows store 0 and lse -inf.
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
        const float lse = mx == kt::neg_infinity() ? mx : (mx * scale_log2 + __log2f(sum)) * LN2;
        const int g = packed_row / p.len_q, i = packed_row - g * p.len_q;
        const int64_t out_row = (int64_t(b) * p.heads_q + h_kv * group + g) * p.len_q + i;
        if (splits == 1) {
            store4(static_cast<T*>(p.o) + out_row * D + c, acc);
            if (c == 0) p.lse[out_row] = lse;
        } else {
            const int64_t piece = out_row * splits + split;
            *reinterpret_cast<float4*>(p.partial_o + piece * D + c) = acc;
            if (c == 0) p.partial_lse[piece] = lse;
        }
    }
}

// out and lse of each row from its pieces: weights exp(lse_s - max) / sum (0 for an empty piece,
// whose O was never written), lse = max + log(sum). One block per row: warp 0 turns the pieces'
// lse into weights in shared memory, then each thread sums one column over the pieces, so
// consecutive threads read a piece's row whole and a thread's loads are independent of each
// other. (One warp per row, each lane walking its columns piece by piece, put a batch-1 step's
// few rows on a few SMs with their loads in series.)
template <typename T>
__global__ void __launch_bounds__(THREADS)
    merge_kernel(const float* __restrict__ partial_o, const float* __restrict__ partial_lse, T* __restrict__ out,
                 float* __restrict__ lse, const int splits, const int head_dim) {
    __shared__ float weight[MAX_SPLITS];
    const int64_t row = blockIdx.x;
    kt::wait_for_prior_grid();  // the pieces (launched as a dependent of the split kernel)
    if (kt::warp_id() == 0) {
        const int lane = kt::lane_id();
        const float* piece_lse = partial_lse + row * splits;
        float mx = kt::neg_infinity();
        for (int s = lane; s < splits; s += kt::WARP_THREADS) mx = fmaxf(mx, piece_lse[s]);
#pragma unroll
        for (int step = 16; step > 0; step /= 2) mx = fmaxf(mx, __shfl_xor_sync(kt::FULL_MASK, mx, step));
        const bool empty = mx == kt::neg_infinity();
        float sum = 0.f;
        if (!empty)
            for (int s = lane; s < splits; s += kt::WARP_THREADS) sum += __expf(piece_lse[s] - mx);  // -inf: 0
#pragma unroll
        for (int step = 16; step > 0; step /= 2) sum += __shfl_xor_sync(kt::FULL_MASK, sum, step);
        const float inv = empty ? 0.f : 1.f / sum;
        for (int s = lane; s < splits; s += kt::WARP_THREADS) {
            const float l = piece_lse[s];
            weight[s] = empty || l == kt::neg_infinity() ? 0.f : __expf(l - mx) * inv;
        }
        if (lane == 0) lse[row] = empty ? mx : mx + __logf(sum);
    }
    __syncthreads();
    const float* pieces = partial_o + row * splits * head_dim;
    for (int c = threadIdx.x; c < head_dim; c += THREADS) {
        float acc = 0.f;
#pragma unroll 4
        for (int s = 0; s < splits; s++) {
            const float w = weight[s];
            if (w != 0.f) acc += w * pieces[int64_t(s) * head_dim + c];  // an empty piece's O is unwritten
        }
        out[row * head_dim + c] = kt::convert<T>(acc);
    }
}

template <typename T, int D, int ROW_GROUPS>
cudaError_t launch(const DecodeParams& p, const DecodePlan& plan, cudaStream_t stream) {
    constexpr int smem = Layout<T, D, ROW_GROUPS>::bytes;
    auto kernel = decode_kernel<T, D, ROW_GROUPS>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
    const int64_t blocks = int64_t(p.batch) * p.heads_kv * plan.splits * plan.m_tiles;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    kernel<<<unsigned(blocks), THREADS, smem, stream>>>(p, plan.m_tiles, plan.splits, plan.tiles_per_split);
    if (plan.splits == 1) return cudaGetLastError();
    if (cudaError_t e = cudaGetLastError()) return e;
    if (plan.partial_rows == 0) return cudaSuccess;
    if (plan.partial_rows > 0x7fffffff || plan.splits > MAX_SPLITS) return cudaErrorInvalidConfiguration;
    // Launched while the split kernel runs where the GPU allows it: its launch and block
    // scheduling overlap the split kernel's last blocks instead of following them.
    const kt::dependent_launch_config merge(unsigned(plan.partial_rows), THREADS, 0, stream, p.dependent_launch);
    return cudaLaunchKernelEx(&merge.config, merge_kernel<T>, static_cast<const float*>(p.partial_o),
                              static_cast<const float*>(p.partial_lse), static_cast<T*>(p.o), p.lse, plan.splits, D);
}

}  // namespace

DecodePlan plan_decode(const DecodeParams& p) {
    DecodePlan plan{};
    const int rows = (p.heads_q / p.heads_kv) * p.len_q;
    plan.row_groups = rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
    plan.m_tiles = kt::ceil_div(rows, 16 * plan.row_groups);
    plan.block_kv = block_kv_for(p.head_dim);
    const int tiles = kt::ceil_div(p.len_kv, plan.block_kv);
    // About one block per SM: a block keeps STAGES tiles of loads in flight, enough for its SM's
    // share of the bandwidth, and more pieces only add partial results to write and merge. With
    // at least MIN_TILES_PER_SPLIT tiles a piece, so that a piece's pipeline fill is paid over
    // more than one tile. On an H100 (batch 1, GQA 32/8 and MHA 32/32, d64 and d128, Lk 2k ..
    // 32k), 2 was level with 1 and 4 and up to 1.3x faster than 8 on caches of 2048 keys (16
    // pieces instead of 4 at d128: 13.8 -> 11.4 us; 8 instead of 2 at d64: 13.0 -> 10.0), and
    // 8-16 pieces ran 10-30% faster than the 28-33 that fill two blocks per SM.
    // Where batch x kv heads x row tiles already fill half the GPU, a split only doubles the
    // blocks, and short pieces do not pay for their partial results and the merge: pieces then
    // need HALF_FILLED_MIN_TILES. On an H100 (b8, GQA 32/8, d128) one piece of 2048 keys took
    // 28.9 us against 30.6 for two of 1024 keys; at 8192 keys two pieces took 94.6 against 97.6.
    const int64_t units = int64_t(p.batch) * p.heads_kv * plan.m_tiles;
    const int64_t per_sm = std::max<int64_t>(1, p.multiprocessors / units);
    const int min_tiles = per_sm <= 2 ? HALF_FILLED_MIN_TILES : MIN_TILES_PER_SPLIT;
    const int64_t by_length = std::max(1, tiles / min_tiles);
    const int splits = int(std::min<int64_t>({per_sm, by_length, MAX_SPLITS}));
    plan.tiles_per_split = kt::ceil_div(tiles, splits);
    plan.splits = kt::ceil_div(tiles, plan.tiles_per_split);
    plan.partial_rows = plan.splits > 1 ? int64_t(p.batch) * p.heads_q * p.len_q : 0;
    return plan;
}

cudaError_t decode_forward(const DecodeParams& params, const DecodePlan& plan, cudaStream_t stream) {
    return with_dtype_and_head_dim<DecodeHeadDims>(params.dtype, params.head_dim, [&]<typename T, int D>() {
        switch (plan.row_groups) {
            case 1: return launch<T, D, 1>(params, plan, stream);
            case 2: return launch<T, D, 2>(params, plan, stream);
            default: return launch<T, D, 4>(params, plan, stream);
        }
    });
}

}  // namespace tk::attention
