// tk::matmul on Hopper (sm_90a): C (batch, M, N) = A (batch, M, K) * B (batch, K, N), bf16
// or fp16 in, fp32 accumulation, C in the input type. Written on the core's
// load/compute/finish template (kittens/hopper/pipeline.cuh):
//
// - one task is a 128 x 256 tile of C (128 x 128 when those too fit in one round on the SMs,
//   see tile_width); a persistent grid walks the tasks in groups of 16 tile-rows so that
//   blocks running together share A rows and B columns in L2;
// - a product with a side of at most 64 (decode-size M, a narrow N) runs on skinny 128 x 64
//   tiles with an 8-stage ring instead (plan_tiles), or with a side of at most 16 or 32 (and a
//   K-major operand) on thin 128 x 16 or 128 x 32 tiles: its time is streaming the long operand.
//   Over a long K, such tiles may be 64 rows tall instead, which spreads the stream over more
//   SMs (SHORT_BM). A short M is run swapped, C^T = B^T A^T (the operands read the other way,
//   C stored transposed from registers), so that the tile's narrow side is always the short
//   one. Skinny tiles always end in the split-K epilogue below (splits may be 1: a plain
//   bounded store);
// - a producer thread streams 64-deep K slices of A and B through a 4-stage TMA ring;
//   out-of-range rows/cols arrive as zeros, so any M, N, K works without padding;
// - two consumer warpgroups (one in a 64-row tile) each own 64 rows and issue wgmma 64xBNx16
//   from shared memory, keeping one wgmma group in flight (release_lag = 1) so the tensor
//   cores do not drain at every stage;
// - transposed operands are read as they are: a column-major A or B is loaded as its
//   row-major transpose and fed to wgmma as an MN-major / K-major operand;
// - the epilogue converts a consumer's 64 x BN accumulator in 64-column chunks into two
//   alternating shared buffers and writes them with TMA stores, which clip at the matrix
//   edge and run while the next task's wgmma starts (wide tiles' with an L2 evict_first hint,
//   C_EVICT_FIRST). When C's rows are not 16-byte multiples (N % 8 != 0) TMA cannot address
//   C, and the registers are stored directly with bounds checks instead.
// - split-K: when even 128 x 128 tiles leave most SMs idle (small M or N, or a skinny
//   product), the blocks of one tile take equal shares of its K steps. They run as one thread
//   block cluster (at most 8 shares), so the partial sums never leave the GPC: each warp
//   writes its fp32 rows to its own block's shared memory, the cluster meets at a barrier, and
//   one block per 16-row slice reads that slice from every block (distributed shared memory),
//   sums it in split order (the same sum whatever the timing) and stores it, bounds-checked,
//   from registers. No workspace, no counters, nothing to zero before the launch.
#include <cuda.h>

#include <algorithm>
#include <type_traits>

#include "kittens/kittens.cuh"
#include "kittens/hopper/hopper.cuh"
#include "kittens/hopper/tma_cache.cuh"
#include "matmul/matmul_params.h"

namespace tk::matmul {
namespace {

namespace kt = kittens;

constexpr int BM = 128, BK = 64;
constexpr int WIDE = 256, NARROW = 128, SKINNY = 64;  // the tile widths (BN)
// Thin tiles: skinny ones 16 or 32 columns wide, for a side of at most 16 or 32 (decode batches)
// whose operand is K-major. Their short operand's slice is 2 or 4 KiB instead of 8 (out-of-range
// rows included: TMA writes them as zeros) and a k-step is a quarter or half of the tensor work.
constexpr int THIN = 16, THIN_32 = 32;
constexpr int STAGES = 4;
// Skinny and thin tiles stream mostly one operand (the other is at most 64, 32 or 16 rows, often
// zero-filled): a deeper ring keeps more of it in flight, up to a point: 12 stages were slower
// for skinny tiles and no faster for thin ones.
constexpr int SKINNY_STAGES = 8, THIN_STAGES = 8;
constexpr int EPILOGUE_COLS = 64;  // columns of C per TMA store chunk
// Task order: tiles go in groups of this many tile-rows, down a group's tile column before the
// next column, so that the ~132 tiles running at once share few panels of A and B, which L2
// keeps while they run. A round of R tiles spanning g tile-rows of BM and R / g tile-columns of BN
// reads g * BM + R / g * BN rows of K: least at g = sqrt(R * BN / BM), 16 for wide tiles on 132
// SMs. Large GEMMs run at the power cap, so DRAM traffic saved is clock gained. 8, 12, 20, 24
// and 32 were slower or level, and so was walking groups of tile-columns instead.
constexpr int TILE_ROWS_PER_GROUP = 16;
// Short skinny tiles: 64 rows (one consumer warpgroup) instead of BM, so that a product with few
// tiles can stream its long operand on more SMs (N = 4096: 64 tiles in 2 shares, 128 blocks,
// where 32 tiles took 3 shares, 96 blocks: the most clusters of 4 that fit are 30). Their rings
// are deeper, to keep as many bytes in flight. They pay only over long shares (MIN_SHORT_STEPS).
constexpr int SHORT_BM = 64, SHORT_THIN_STAGES = 16, SHORT_SKINNY_STAGES = 12;
// Shares of at least this many k-steps: shorter ones were slower with 64-row tiles.
constexpr int MIN_SHORT_STEPS = 64;
// The tensor maps' L2 promotion: 128 bytes, a box row of our 128-byte swizzled panels, rather than
// the 256 of the attention maps (faster for thin products, level elsewhere).
constexpr CUtensorMapL2promotion L2_PROMOTION = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
// C is written once and never read back by the kernel, so wide tiles' C stores ask L2 to drop
// their lines first, leaving room for the A rows a group rereads (as B's loads do where those
// fit, b_evict_first). Only wide tiles: their products are large (C of 4096^3 is 32 MiB, of
// 4096x14336x4096 112 MiB), while a small product's C may still be in L2 when the next kernel
// reads it. B evict_first on every wide tile as well was no better.
template <int BN> constexpr bool C_EVICT_FIRST = BN == WIDE;

// A warp's 16 accumulator rows to / from a slice of the split-K partials (shared memory of the
// cluster's blocks), in register order: float4 f of every lane is at float4 index f * 32 + lane,
// so each access is one contiguous 512-byte row (no bank conflicts). Whoever reads a slice back
// is the same lane of a warp holding the same rows. Only the first `blocks` 16-column blocks
// are moved (a skinny tile's columns past C's edge are never stored: M = 16 moves a quarter of
// the tile).
template <int BN>
__device__ __forceinline__ void store_slice(float* slice, const kt::rt_fl<16, BN>& acc, int blocks) {
    float4* out = reinterpret_cast<float4*>(slice) + kt::lane_id();
#pragma unroll
    for (int j = 0; j < BN / 16; j++) {
        if (j >= blocks) break;
        const auto& d = acc.tiles[0][j].data;
        out[(2 * j) * 32] = make_float4(d[0].x, d[0].y, d[1].x, d[1].y);
        out[(2 * j + 1) * 32] = make_float4(d[2].x, d[2].y, d[3].x, d[3].y);
    }
}
// acc = slice (add: acc += slice), from the slice at `slice` in the shared memory of the
// cluster's block `rank`.
template <bool ADD, int BN>
__device__ __forceinline__ void load_slice(kt::rt_fl<16, BN>& acc, const float* slice, int rank, int blocks) {
    const uint32_t in = kt::cluster::map_shared(slice, rank) + kt::lane_id() * sizeof(float4);
#pragma unroll
    for (int j = 0; j < BN / 16; j++) {
        if (j >= blocks) break;
        auto& d = acc.tiles[0][j].data;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float4 v = kt::cluster::load_shared(in + (2 * j + h) * 32 * sizeof(float4));
            if constexpr (ADD) {
                d[2 * h].x += v.x, d[2 * h].y += v.y, d[2 * h + 1].x += v.z, d[2 * h + 1].y += v.w;
            } else {
                d[2 * h].x = v.x, d[2 * h].y = v.y, d[2 * h + 1].x = v.z, d[2 * h + 1].y = v.w;
            }
        }
    }
}

// SPLIT: split-K (see the top); C is then stored from registers, so C_TMA does not matter.
// Skinny tiles always take the split epilogue (with splits == 1: a plain bounded store).
template <typename T, bool A_T, bool B_T, bool C_TMA, int BN, bool SPLIT = false, int ROWS = BM>
struct Layout {
    static_assert(BN == WIDE || BN == NARROW || BN == SKINNY || BN == THIN_32 || BN == THIN,
                  "matmul: tiles are 256, 128, 64, 32 or 16 columns wide");
    static constexpr bool skinny = BN <= SKINNY, thin = BN < SKINNY;  // (thin tiles are skinny ones)
    static_assert(!SPLIT || BN != WIDE, "matmul: split-K is for narrow and skinny tiles (too few tiles for the SMs)");
    static_assert(!skinny || SPLIT, "matmul: skinny tiles store through the split epilogue");
    static_assert(!thin || B_T, "matmul: thin tiles take a K-major B (a 16- or 32-column MN-major tile is not supported)");
    static_assert(ROWS == BM || (ROWS == SHORT_BM && skinny), "matmul: 64-row tiles are skinny ones");
    static constexpr bool short_rows = ROWS == SHORT_BM;
    static constexpr int consumer_warpgroups = ROWS / 64,
                         stages = thin ? (short_rows ? SHORT_THIN_STAGES : THIN_STAGES)
                                : skinny ? (short_rows ? SHORT_SKINNY_STAGES : SKINNY_STAGES) : STAGES,
                         release_lag = 1;
    using a_tile = std::conditional_t<A_T, kt::st<T, BK, ROWS>, kt::st<T, ROWS, BK>>;
    using b_tile = std::conditional_t<B_T, kt::st<T, BN, BK>, kt::st<T, BK, BN>>;
    using c_tile = kt::st<T, 64, EPILOGUE_COLS>;
    struct inputs {
        a_tile a;
        b_tile b;
    };
    struct staged_outputs {
        c_tile c[2][2];  // [consumer][alternating buffer]
    };
    struct split_outputs {
        float partials[consumer_warpgroups * 4][16 * BN];  // each warp's fp32 rows of its share (store_slice)
    };
    struct no_outputs {};
    using outputs = std::conditional_t<SPLIT, split_outputs, std::conditional_t<C_TMA, staged_outputs, no_outputs>>;
    static constexpr uint32_t input_bytes = kt::tma::tile_bytes<a_tile>() + kt::tma::tile_bytes<b_tile>();

    struct globals {
        CUtensorMap a_map, b_map, c_map;  // c_map is only used with C_TMA
        kt::gl<T> c;
        int batch, k;
        int m_tiles, n_tiles;
        bool a_batched, b_batched;  // false: batch 1, broadcast
        // Split-K (SPLIT only): blocks per tile (the cluster size), K steps in all.
        int splits, k_steps;
        // Skinny tiles of a swapped product (C^T = B^T A^T, see plan_tiles and
        // swapped_operands): c is C, the tiles are of its transpose.
        bool c_transposed;
        bool b_evict_first;  // B_EVICT_FIRST_L2_SHARE
    };
    struct task {
        int batch, m_tile, n_tile;
        int split;       // SPLIT only: this block's share of the tile's K steps (its cluster rank)
        int first_step;  // SPLIT only: the share's first K step, share_start(split)
    };
    // The first K step of share `split` (shares differ by at most one step; 64-bit: the product
    // can pass 2^31 for a K of a few hundred million). A 64-bit division by a runtime value is a
    // long instruction sequence, so it runs once per task (get_task), not in the producer's
    // per-stage load: one thread issues every stage, and in a decode-size product that thread's
    // time per stage sets the pace (see load).
    __device__ static int share_start(int split, const globals& g) { return int(int64_t(split) * g.k_steps / g.splits); }
    struct registers {
        kt::rt_fl<16, BN> acc;  // this warp's 16 rows of its warpgroup's 64
    };

    __device__ static bool get_task(task& t, int index, const globals& g) {
        const int per_batch = g.m_tiles * g.n_tiles;
        if constexpr (SPLIT) {  // the shares of a tile are consecutive tasks
            if (index >= per_batch * g.batch * g.splits) return false;
            t.split = index % g.splits;
            t.first_step = share_start(t.split, g);
            index /= g.splits;
        }
        if (index >= per_batch * g.batch) return false;
        t.batch = index / per_batch;
        const int local = index % per_batch;
        constexpr int G = TILE_ROWS_PER_GROUP;
        const int first_m = local / (G * g.n_tiles) * G;
        const int rows = min(G, g.m_tiles - first_m), in_group = local % (G * g.n_tiles);
        t.m_tile = first_m + in_group % rows;
        t.n_tile = in_group / rows;
        return true;
    }
    __device__ static int iterations(const task& t, const globals& g) {
        if constexpr (SPLIT) return share_start(t.split + 1, g) - t.first_step;
        else return kt::ceil_div(g.k, BK);
    }

    // The producer thread's loop body: keep it short. Skinny and thin tiles move 10-24 KiB per
    // stage, and the one thread that issues them spent ~400 cycles per stage (a clock64
    // timeline), which held the ring to ~3 stages in flight; hence the share's start is hoisted
    // out of here.
    __device__ static void load(inputs& in, const task& t, int it, const globals& g, kt::semaphore& sem) {
        if constexpr (SPLIT) it += t.first_step;
        const int ab = g.a_batched ? t.batch : 0, bb = g.b_batched ? t.batch : 0;
        kt::tma::load_async(in.a, &g.a_map, A_T ? kt::coord{ab, 0, it, t.m_tile} : kt::coord{ab, 0, t.m_tile, it}, sem);
        const kt::coord b_at = B_T ? kt::coord{bb, 0, t.n_tile, it} : kt::coord{bb, 0, it, t.n_tile};
        if (g.b_evict_first) kt::tma::load_async(in.b, &g.b_map, b_at, sem, kt::tma::evict_first_policy());
        else kt::tma::load_async(in.b, &g.b_map, b_at, sem);
    }

    __device__ static void setup(registers&, const task&) {}  // the first k-step overwrites acc

    __device__ static void compute(registers& r, inputs& in, const task&, int it, int consumer) {
        const bool accumulate = it > 0;
        kt::wgmma::fence();
        if constexpr (A_T) {
            const auto a = kt::subtile<BK, 64>(in.a, 0, consumer);
            if constexpr (B_T) kt::wgmma::mma_AtBt(r.acc, a, in.b, accumulate);
            else kt::wgmma::mma_AtB(r.acc, a, in.b, accumulate);
        } else {
            const auto a = kt::subtile<64, BK>(in.a, consumer, 0);
            if constexpr (B_T) kt::wgmma::mma_ABt(r.acc, a, in.b, accumulate);
            else kt::wgmma::mma_AB(r.acc, a, in.b, accumulate);
        }
        kt::wgmma::commit();
        kt::wgmma::wait<1>();  // the previous stage's reads are now done
    }
    __device__ static void drain(registers&, int) { kt::wgmma::wait<0>(); }

    __device__ static void finish(registers& r, outputs& out, const task& t, const globals& g, int consumer) {
        if constexpr (SPLIT) {
            finish_split(r, out, t, g, consumer);
        } else if constexpr (C_TMA) {
            const int row_tile = t.m_tile * (ROWS / 64) + consumer;  // in 64-row units
            const int barrier = 1 + consumer;                      // named barrier of this warpgroup
            const bool issuer = kt::warpgroup::thread() == 0;
#pragma unroll
            for (int q = 0; q < BN / EPILOGUE_COLS; q++) {
                c_tile& buffer = out.c[consumer][q % 2];
                if (issuer) kt::tma::store_wait_read<1>();  // the store that last used this buffer has read it
                kt::warpgroup::sync(barrier);
                kt::rt<T, 16, EPILOGUE_COLS> part;
                kt::slice_cols(part, r.acc, q * EPILOGUE_COLS);
                kt::store(kt::subtile<16, EPILOGUE_COLS>(buffer, kt::warpgroup::warp(), 0), part);
                kt::fence_async_proxy();
                kt::warpgroup::sync(barrier);
                if (issuer) {
                    const kt::coord at{t.batch, 0, row_tile, t.n_tile * (BN / EPILOGUE_COLS) + q};
                    if constexpr (C_EVICT_FIRST<BN>) kt::tma::store_async(&g.c_map, buffer, at, kt::tma::evict_first_policy());
                    else kt::tma::store_async(&g.c_map, buffer, at);
                    kt::tma::store_commit();
                }
            }
        } else {
            kt::store(g.c, r.acc, kt::coord{t.batch, 0, (t.m_tile * ROWS + consumer * 64) / 16 + kt::warpgroup::warp(), t.n_tile});
        }
    }
    // Split-K (see the top). A split launch gives every block exactly one task (tiles x splits
    // <= SMs, plan_tiles), so the blocks of a cluster are the shares of one tile, split ==
    // cluster rank, and nothing else uses `out` meanwhile.
    __device__ static void finish_split(registers& r, outputs& out, const task& t, const globals& g, int consumer) {
        const int warp = kt::warpgroup::warp(), slot = consumer * 4 + warp;
        const int row16 = (t.m_tile * ROWS + consumer * 64) / 16 + warp;  // this warp's rows, in 16s
        const bool transposed = skinny && g.c_transposed;
        const int rows = transposed ? g.c.cols() : g.c.rows();
        // All past M: no share of this slice stores anything. Such a warp leaves at once, in
        // every block alike; the cluster barrier does not wait for threads that have exited.
        if (row16 * 16 >= rows) return;
        if (g.splits > 1) {
            // 16-column blocks that reach into C (skinny: the tile's only column of tiles). Not
            // through kt::ceil_div: another device call site of it changes how the unsplit
            // kernels' task loops compile (SASS compared with and without).
            const int blocks = skinny ? ((transposed ? g.c.rows() : g.c.cols()) + 15) / 16 : BN / 16;
            float* const slice = out.partials[slot];
            store_slice(slice, r.acc, blocks);
            kt::cluster::sync();  // every share's partials are in its block's shared memory
            // Slices are summed by the blocks in turn, so a cluster of S sums S of them at once.
            const bool sums = slot % g.splits == t.split;
            if (sums) {
                load_slice<false>(r.acc, slice, 0, blocks);
                for (int split = 1; split < g.splits; split++) load_slice<true>(r.acc, slice, split, blocks);
            }
            // No block may exit while another reads its shared memory (the store runs meanwhile).
            kt::cluster::arrive();
            if (sums) store_rows(r, t, g, row16, transposed);
            kt::cluster::wait();
            return;
        }
        store_rows(r, t, g, row16, transposed);
    }
    // A warp's 16 finished rows of C (of C^T when transposed), bounds-checked, from registers.
    __device__ static void store_rows(const registers& r, const task& t, const globals& g, int row16, bool transposed) {
        const kt::coord at{t.batch, 0, row16, t.n_tile};
        if (transposed) kt::store_transposed(g.c, r.acc, at);
        else kt::store(g.c, r.acc, at);
    }
    __device__ static void cleanup(outputs&, int) {
        if constexpr (C_TMA && !SPLIT)
            if (kt::warpgroup::thread() == 0) kt::tma::store_wait<0>();
    }
};

// ---------------------------------------------------------------------------------------
// Host: tensor maps (cached: kittens/hopper/tma_cache.cuh), launch.
// ---------------------------------------------------------------------------------------

// An operand as the row-major matrix TMA reads: itself, or its transpose when it is
// column-major.
template <typename T>
kt::gl<T> operand_layout(const Operand& op, int rows, int cols) {
    const int r = op.transposed ? cols : rows, c = op.transposed ? rows : cols;
    return kt::gl<T>(static_cast<T*>(const_cast<void*>(op.data)), op.batch, 1, r, c, op.batch_stride,
                     int64_t(r) * op.leading_stride, op.leading_stride);
}

// C's rows are TMA-addressable: 16-byte multiples, 16-byte aligned.
bool c_by_tma(const MatmulParams& p) { return p.n % 8 == 0 && reinterpret_cast<uintptr_t>(p.c) % 16 == 0; }

// Output tiles of BM rows and `bn` columns, over the batch.
int64_t output_tiles(const MatmulParams& p, int bn) {
    return int64_t(kt::ceil_div(p.m, BM)) * kt::ceil_div(p.n, bn) * p.batch;
}

// Wide tiles unless they leave SMs idle and narrow ones do not: with fewer 128 x 256 tiles than
// SMs (one round), 128 x 128 tiles halve each block's work only if they too fit in one round.
// Past that they take two rounds, the same time per SM as one wide round, with a third more
// reads from L2 per product and twice the epilogues. Many rounds (wide tiles >= SMs) stay wide:
// there a round is only the tail.
int tile_width(const MatmulParams& p, bool c_tma) {
    return c_tma && output_tiles(p, NARROW) <= p.multiprocessors ? NARROW : WIDE;
}

// Split-K's fixed cost (writing, exchanging and summing the partials, the cluster barriers)
// pays only over long enough shares: the partials go through a cluster's shared memory, cheap
// enough for shares of 16 steps (through global memory it took 48).
constexpr int MIN_SPLIT_STEPS = 16;
// A skinny tile's partials are at most half a narrow one's (only the 16-column blocks that reach
// into C are exchanged) and the product is bound by streaming the long operand, so it splits
// down to short shares (16, 8 or 4 steps were level; unsplit is much slower).
constexpr int MIN_SKINNY_SPLIT_STEPS = 8;
// A tile's shares run as one cluster: at most 8 blocks (the portable cluster size).
constexpr int MAX_SPLITS = 8;

// The kernel a split launch's cluster capacity is asked about: every split kernel (64-row tiles
// too) has one block per SM (its shared memory), so they all fit the same clusters.
using ClusterProbe = Layout<kt::bf16, false, false, false, SKINNY, true>;

// clusters[s]: how many clusters of s blocks (2..MAX_SPLITS) the current device runs at once
// (kt::cluster::clusters_at_once: asked of the driver once per device and size; 0 where it
// cannot say, and then nothing is split in s shares).
struct ClusterCapacity {
    int clusters[MAX_SPLITS + 1] = {};
};
ClusterCapacity cluster_capacity() {
    ClusterCapacity capacity;
    for (int size = 2; size <= MAX_SPLITS; size++)
        capacity.clusters[size] = kt::cluster::clusters_at_once(kt::pipeline::kernel<ClusterProbe>, size,
                                                                kt::pipeline::threads<ClusterProbe>(),
                                                                kt::pipeline::shared_bytes<ClusterProbe>());
    return capacity;
}

// Shares per tile: `wanted`, down to what fits in one round of clusters (every block then has
// exactly one task, which the split epilogue relies on).
int splits_that_fit(int64_t tiles, int64_t wanted, const ClusterCapacity& capacity) {
    int splits = int(std::clamp<int64_t>(wanted, 1, MAX_SPLITS));
    while (splits > 1 && tiles > capacity.clusters[splits]) splits--;
    return splits;
}

// How a call is tiled. A product with a side of at most 64 (decode-size M, or a narrow N) runs
// on skinny 128 x 64 tiles (or thin 128 x 16 / 128 x 32 ones, see THIN) whose short side is
// that one: with a short M the product is run swapped, C^T = B^T A^T, so that the long N is
// tiled by 128 rows (wgmma's M; 64 with SHORT_BM) and the few rows of A become the tile's
// columns (wgmma's N). Everything else runs on wide or narrow tiles.
struct TilePlan {
    int bn;
    int rows;  // tile rows: BM, or SHORT_BM for skinny tiles
    bool swapped;
    int64_t tiles;  // output tiles, over the batch
    int splits;     // split-K shares per tile, the cluster size (1: none)
};

TilePlan plan_tiles(const MatmulParams& p) {
    const int64_t sms = std::max(p.multiprocessors, 0);
    const bool n_skinny = p.n <= SKINNY && p.n <= p.m, m_skinny = !n_skinny && p.m <= SKINNY;
    if (n_skinny || m_skinny) {
        // Thin tiles when the short side fits in 16 or 32 and is K-major as the kernel's B
        // (swapped: B is A^T, K-major when A is row-major, as activations are).
        const int side = m_skinny ? p.m : p.n;
        const bool k_major = m_skinny ? !p.a.transposed : p.b.transposed;
        const int bn = !k_major ? SKINNY : side <= THIN ? THIN : side <= THIN_32 ? THIN_32 : SKINNY;
        const ClusterCapacity capacity = cluster_capacity();  // once for both tile heights
        auto plan = [&](int rows) {
            const int64_t tiles = int64_t(kt::ceil_div(m_skinny ? p.n : p.m, rows)) * p.batch;  // one tile column
            const int64_t wanted = std::min<int64_t>(sms / tiles, kt::ceil_div(p.k, BK) / MIN_SKINNY_SPLIT_STEPS);
            return TilePlan{bn, rows, m_skinny, tiles, splits_that_fit(tiles, wanted, capacity)};
        };
        // 64-row tiles where they keep more SMs streaming in one round, over long enough shares.
        const TilePlan rows128 = plan(BM), rows64 = plan(SHORT_BM);
        const int64_t blocks128 = rows128.tiles * rows128.splits, blocks64 = rows64.tiles * rows64.splits;
        const bool long_shares = kt::ceil_div(p.k, BK) / rows64.splits >= MIN_SHORT_STEPS;
        return blocks64 <= sms && blocks64 > blocks128 && long_shares ? rows64 : rows128;
    }
    const int bn = tile_width(p, c_by_tma(p));
    const int64_t tiles = output_tiles(p, bn);
    if (bn == WIDE) return {bn, BM, false, tiles, 1};  // enough tiles for the SMs: never split
    const int64_t wanted = std::min<int64_t>(sms / tiles, kt::ceil_div(p.k, BK) / MIN_SPLIT_STEPS);
    return {bn, BM, false, tiles, splits_that_fit(tiles, wanted, cluster_capacity())};
}

// The swapped problem: A' = B^T and B' = A^T are the same memory read the other way (each
// operand's column-major flag flips), M and N exchange.
MatmulParams swapped_operands(const MatmulParams& p) {
    MatmulParams q = p;
    q.a = p.b, q.a.transposed = !p.b.transposed;
    q.b = p.a, q.b.transposed = !p.a.transposed;
    q.m = p.n, q.n = p.m;
    return q;
}

// A group of tile-rows (TILE_ROWS_PER_GROUP) rereads its rows of A for every tile-column while
// B streams past. When those A rows take at most this share of L2, B's loads ask L2 to drop
// their lines first, so that A stays (faster, but slower where the A rows fill much of L2:
// hence the share). Only for wide tiles: skinny and thin ones reread the small operand and
// stream the long one, whichever side it is. A evict_last as well gained less, A evict_last
// alone nothing; an explicit evict_normal policy where no hint is wanted was slower, so those
// loads go without one.
constexpr int B_EVICT_FIRST_L2_SHARE = 3;
template <typename T>
bool b_evict_first(const MatmulParams& q, int rows) {
    const int64_t group_rows = int64_t(std::min(TILE_ROWS_PER_GROUP, kt::ceil_div(q.m, rows))) * rows;
    return group_rows * q.k * int64_t(sizeof(T)) <= q.l2_bytes / B_EVICT_FIRST_L2_SHARE;
}

// q: the problem as the kernel runs it (swapped_operands when plan.swapped); C is p.c either way.
template <typename T, bool A_T, bool B_T, bool C_TMA, int BN, bool SPLIT, int ROWS>
cudaError_t launch(const MatmulParams& q, const TilePlan& plan, cudaStream_t stream) {
    using L = Layout<T, A_T, B_T, C_TMA, BN, SPLIT, ROWS>;
    const kt::gl<T> a = operand_layout<T>(q.a, q.m, q.k), b = operand_layout<T>(q.b, q.k, q.n);
    const kt::gl<T> c(static_cast<T*>(q.c), q.batch, 1, plan.swapped ? q.n : q.m, plan.swapped ? q.m : q.n);
    CUtensorMap a_map, b_map, c_map{};
    if (kt::tma::cached_tensor_map<typename L::a_tile>(&a_map, a, L2_PROMOTION) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename L::b_tile>(&b_map, b, L2_PROMOTION) != CUDA_SUCCESS)
        return cudaErrorInvalidValue;
    if constexpr (C_TMA && !SPLIT)
        if (kt::tma::cached_tensor_map<typename L::c_tile>(&c_map, c, L2_PROMOTION) != CUDA_SUCCESS) return cudaErrorInvalidValue;
    const typename L::globals g{a_map, b_map, c_map, c, q.batch, q.k,
                                kt::ceil_div(q.m, ROWS), kt::ceil_div(q.n, BN), q.a.batch > 1, q.b.batch > 1,
                                plan.splits, kt::ceil_div(q.k, BK), plan.swapped,
                                BN == WIDE && b_evict_first<T>(q, ROWS)};  // never split (static_assert above)

    const int64_t tasks = plan.tiles * plan.splits;
    if (tasks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    const int sms = q.multiprocessors;
    if (sms <= 0) return cudaErrorInvalidDevice;
    constexpr int smem = kt::pipeline::shared_bytes<L>();
    auto kernel = kt::pipeline::kernel<L>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
    const int blocks = int(tasks < sms ? tasks : sms);
    if (plan.splits == 1) {
        kernel<<<blocks, kt::pipeline::threads<L>(), smem, stream>>>(g);
        return cudaGetLastError();
    }
    // Split: a tile's shares are consecutive blocks (get_task), one cluster; one task per block.
    if (blocks != tasks) return cudaErrorInvalidConfiguration;
    const kt::cluster::launch_config launch(blocks, plan.splits, kt::pipeline::threads<L>(), smem, stream);
    return cudaLaunchKernelEx(&launch.config, kernel, g);
}

// The instantiations: one row per (element type, A column-major, B column-major, C rows
// addressable by TMA, tile width, split). Narrow tiles only with TMA stores of C (the common
// case); skinny tiles store C from registers whatever its layout (c_tma false).
struct Entry {
    ElementType dtype;
    bool a_transposed, b_transposed, c_tma;
    int bn;
    bool split;
    int rows;
    cudaError_t (*run)(const MatmulParams&, const TilePlan&, cudaStream_t);
};
// One row, its key fields taken from the instantiation they select.
template <typename T, ElementType E, bool A_T, bool B_T, bool C_TMA, int BN, bool SPLIT = false, int ROWS = BM>
constexpr Entry entry() {
    return {E, A_T, B_T, C_TMA, BN, SPLIT, ROWS, launch<T, A_T, B_T, C_TMA, BN, SPLIT, ROWS>};
}
template <typename T, ElementType E>
constexpr Entry entries[] = {
    entry<T, E, false, false, true, WIDE>(),    entry<T, E, false, true, true, WIDE>(),
    entry<T, E, true, false, true, WIDE>(),     entry<T, E, true, true, true, WIDE>(),
    entry<T, E, false, false, false, WIDE>(),   entry<T, E, false, true, false, WIDE>(),
    entry<T, E, true, false, false, WIDE>(),    entry<T, E, true, true, false, WIDE>(),
    entry<T, E, false, false, true, NARROW>(),  entry<T, E, false, true, true, NARROW>(),
    entry<T, E, true, false, true, NARROW>(),   entry<T, E, true, true, true, NARROW>(),
    entry<T, E, false, false, true, NARROW, true>(), entry<T, E, false, true, true, NARROW, true>(),
    entry<T, E, true, false, true, NARROW, true>(),  entry<T, E, true, true, true, NARROW, true>(),
    entry<T, E, false, false, false, SKINNY, true>(), entry<T, E, false, true, false, SKINNY, true>(),
    entry<T, E, true, false, false, SKINNY, true>(),  entry<T, E, true, true, false, SKINNY, true>(),
    entry<T, E, false, true, false, THIN, true>(),    entry<T, E, true, true, false, THIN, true>(),
    entry<T, E, false, true, false, THIN_32, true>(), entry<T, E, true, true, false, THIN_32, true>(),
    entry<T, E, false, false, false, SKINNY, true, SHORT_BM>(), entry<T, E, false, true, false, SKINNY, true, SHORT_BM>(),
    entry<T, E, true, false, false, SKINNY, true, SHORT_BM>(),  entry<T, E, true, true, false, SKINNY, true, SHORT_BM>(),
    entry<T, E, false, true, false, THIN, true, SHORT_BM>(),    entry<T, E, true, true, false, THIN, true, SHORT_BM>(),
    entry<T, E, false, true, false, THIN_32, true, SHORT_BM>(), entry<T, E, true, true, false, THIN_32, true, SHORT_BM>(),
};

}  // namespace

cudaError_t matmul_sm90(const MatmulParams& p, cudaStream_t stream) {
    const TilePlan plan = plan_tiles(p);
    const bool skinny = plan.bn <= SKINNY;
    const bool split = skinny || plan.splits > 1, c_tma = !skinny && c_by_tma(p);
    const MatmulParams q = plan.swapped ? swapped_operands(p) : p;
    auto matches = [&](const Entry& e) {
        return e.dtype == q.dtype && e.a_transposed == q.a.transposed && e.b_transposed == q.b.transposed &&
               e.c_tma == c_tma && e.bn == plan.bn && e.split == split && e.rows == plan.rows;
    };
    for (const Entry& e : entries<kt::bf16, ElementType::bf16>)
        if (matches(e)) return e.run(q, plan, stream);
    for (const Entry& e : entries<kt::half, ElementType::fp16>)
        if (matches(e)) return e.run(q, plan, stream);
    return cudaErrorInvalidValue;  // the op layer only passes supported combinations
}

}  // namespace tk::matmul
