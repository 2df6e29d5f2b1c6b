// Attention backward on Hopper (sm_90a): TMA + wgmma + warp specialisation.
//
// A task is BLOCK_N = 128 keys of one (batch, kv head); the block that takes it keeps dK and dV
// for them in registers: two consumer warpgroups, 64 keys each. It walks every query block (64
// rows) of every query head of its GQA group that can see its keys, which reduces dK and dV over
// the group in registers (no atomics, deterministic). The grid is persistent (one block per SM):
// non-causal tasks (all equal) go round robin, causal ones (uneven) heaviest first from a global
// counter. A producer thread loads each task's K and V, and streams Q_i and dO_i through a ring
// (2 stages at d128, 4 at d64) that runs on across tasks, so the next task's first Q/dO land
// while this one finishes; at d64 K and V are double-buffered too (at d128 shared memory is
// full). Per query block, with c = scale * log2(e) and the per-row statistics as
// backward_rows.cu leaves them (shift = -lse / scale, neg_delta = -rowsum(dO * O)):
//   S^T  = shift + K Q_i^T,   dP^T = V dO_i^T      wgmma, Q and dO from shared memory; K and V
//                                                  from shared memory (d128) or registers (d64);
//                                                  S^T accumulates onto the shift
//   P^T  = exp2(S^T c)   (causal: 0 where key > query + causal_offset)
//   dS^T = P^T (dP^T + neg_delta)
//   dV  += P^T dO_i,  dK += dS^T Q_i                  wgmma, A = P^T from registers, dS^T
//                                                     from shared memory (only one register
//                                                     A operand: with two, ptxas serializes
//                                                     the d128 wgmma for want of registers)
//   dQ_i += dS K                                      over all 128 keys, by one warpgroup per
//                                                     step (alternating), from dS^T in shared
//                                                     memory; TMA reduce-add into an fp32
//                                                     accumulator
// The warpgroups wait for each other only over dS^T (see the step body), so one's
// elementwise work mostly overlaps the other's products; within a warpgroup the products are
// split into groups that overlap its own exponentials and dQ stores.
// At the end of a task dK is scaled by `scale`, and dK and dV go out by TMA stores (rows past
// Lk clipped) from the dQ staging tiles, while the next task's K/V load; the op layer scales
// and converts the dQ accumulator. Keys past Lk load as zero rows: their P and dS only
// multiply those zero rows (dQ) or land in rows that are never stored (dK, dV), so only
// causality needs a mask. Query rows past Lq, and rows that see no key, have shift = -inf
// (P = 0); rows past Lq have zero dO.
#include <cuda.h>

#include <type_traits>

#include "kittens/kittens.cuh"
#include "kittens/hopper/hopper.cuh"
#include "kittens/hopper/tma_cache.cuh"
#include "attention/dispatch.h"
#include "attention/forward_params.h"
#include "attention/task_order.h"

namespace tk::attention {
namespace {

namespace kt = kittens;

constexpr int CONSUMERS = 2;
constexpr int BLOCK_N = 64 * CONSUMERS;  // keys per task
constexpr int BLOCK_M = 64;              // query rows per step
// Q/dO ring depth and K/V buffers: what fits beside the dS/dQ staging (d128 uses ~225 of 227 KiB).
template <int D> constexpr int STAGES = D <= 64 ? 4 : 2;
template <int D> constexpr int KV_BUFFERS = D <= 64 ? 2 : 1;
template <int D> constexpr bool KV_IN_REGISTERS = D <= 64;
// Named barriers (0: __syncthreads; 1 + c: warpgroup c's own): the step's dS^T is complete in
// shared memory (4 + parity), and the step's dQ product has read it (6 + parity).
constexpr int DS_READY = 4, DS_FREE = 6;
// The launch gives every thread 168 registers (65536 / 384, rounded down to 8): the producer
// warpgroup gives back exactly what the consumers take ((168 - 24) * 128 = (240 - 168) * 256),
// or setmaxnreg.inc waits forever.
constexpr int PRODUCER_REGISTERS = 24, CONSUMER_REGISTERS = 240;
constexpr float LOG2E = 1.4426950408889634f;

template <typename T, int D>
struct Shared {
    using kv_tile = kt::st<T, BLOCK_N, D>;
    using q_tile = kt::st<T, BLOCK_M, D>;
    using ds_tile = kt::st<T, BLOCK_N, BLOCK_M>;  // dS^T: the task's keys x the step's queries
    using dq_tile = kt::st<float, BLOCK_M, D>;
    using dkv_tile = kt::st<T, 64, D>;            // a warpgroup's rows of dK or dV
    // A warpgroup's staging: its dQ reduce-adds during a task, its dK and dV at the end (both
    // fit in the fp32 dQ tile's bytes).
    union Staging {
        dq_tile dq;
        dkv_tile dkv[2];
    };
    kv_tile k[KV_BUFFERS<D>], v[KV_BUFFERS<D>];
    q_tile q[STAGES<D>], dout[STAGES<D>];
    ds_tile ds[2];                // by step parity; warpgroup c writes rows 64c..64c+63
    Staging staging[CONSUMERS];
    // The task of the block's task number local (-1: no more tasks), in slot local % (KVB + 1):
    // the producer writes it before waiting for a K/V buffer, while the consumers may not yet
    // have read the KVB tasks before it.
    int task_index[KV_BUFFERS<D> + 1];
    kt::semaphore kv_full[KV_BUFFERS<D>], kv_empty[KV_BUFFERS<D>], in_full[STAGES<D>], in_empty[STAGES<D>];
};

template <typename T, int D>
struct Globals {
    CUtensorMap q_map, k_map, v_map, dout_map, dq_map, dk_map, dv_map;
    kt::gl<float> score_shift, neg_delta;  // (B, Hq, 1, len_q_padded)
    int* task_counter;                     // causal: zeroed before the launch
    int batch, heads_q, heads_kv, group_size, len_q, len_kv;
    int causal_offset;    // key j visible to query i iff j <= i + causal_offset
    int heads_per_group;  // causal task order: heads whose Q/dO are read together (fit in L2)
    float scale, scale_log2;
};

// One task: BLOCK_N keys of one (batch, kv head), and the query blocks that see them, for each
// query head of the group (steps = per_head * group_size).
struct Task {
    int b, h_kv, kv_block, first_q_block, per_head, steps;
};

template <bool CAUSAL, typename G>
__device__ __forceinline__ Task task_at(int index, const G& g) {
    const int kv_blocks = kt::ceil_div(g.len_kv, BLOCK_N), q_blocks = kt::ceil_div(g.len_q, BLOCK_M);
    Task t;
    int bh;
    if constexpr (CAUSAL) {  // a head's first key blocks are seen by the most queries
        const HeadAndRank at = heaviest_first(index, g.batch * g.heads_kv, g.heads_per_group, kv_blocks);
        bh = at.head, t.kv_block = at.rank;
    } else {  // a head's key blocks together, so tasks running together share its Q/dO in L2
        bh = index / kv_blocks, t.kv_block = index % kv_blocks;
    }
    t.b = bh / g.heads_kv, t.h_kv = bh % g.heads_kv;
    // Causal: the first query that sees the task's first key is key0 - causal_offset.
    const int first_query = t.kv_block * BLOCK_N - g.causal_offset;
    t.first_q_block = CAUSAL ? min(q_blocks, max(first_query, 0) / BLOCK_M) : 0;
    t.per_head = q_blocks - t.first_q_block;
    t.steps = t.per_head * g.group_size;
    return t;
}

template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__((CONSUMERS + 1) * 4 * kt::WARP_THREADS, 1)
    backward_kernel_sm90(const __grid_constant__ Globals<T, D> g) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Compiled for a GPU without sm_90a features: no body (the host launches it only on sm_90).
#else
    using S = Shared<T, D>;
    constexpr int STAGES = attention::STAGES<D>, KVB = KV_BUFFERS<D>;
    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    S& sh = alloc.allocate<S>();
    const int tasks = kt::ceil_div(g.len_kv, BLOCK_N) * g.batch * g.heads_kv;

    if (threadIdx.x == 0) {
        for (int s = 0; s < KVB; s++) {
            kt::init_semaphore(sh.kv_full[s], 1);
            kt::init_semaphore(sh.kv_empty[s], CONSUMERS * 4);  // one arrival per consumer warp
        }
        for (int s = 0; s < STAGES; s++) {
            kt::init_semaphore(sh.in_full[s], 1);
            kt::init_semaphore(sh.in_empty[s], CONSUMERS * 4);
        }
        kt::fence_semaphore_init();
    }
    __syncthreads();

    const int warpgroup = kt::warp_id() / 4;
    if (warpgroup == CONSUMERS) {  // producer
        kt::decrease_registers<PRODUCER_REGISTERS>();
        if (threadIdx.x % (4 * kt::WARP_THREADS) == 0) {
            // Per task: publish its index (with the K/V arrival), load K and V once the
            // consumers are done with the buffer, stream its Q/dO. A task's first Q/dO are
            // issued before the wait for the K/V buffer (they only need ring slots, which free
            // up during the previous task's last steps), so they are in flight meanwhile.
            int ring = 0, index = blockIdx.x;
            // Step s of a task: query block first_q_block + s % per_head of the group's query
            // head s / per_head (the consumers walk the same order incrementally).
            auto step_q_block = [](const Task t, int step) { return t.first_q_block + step % t.per_head; };
            auto step_head = [&](const Task t, int step) { return t.h_kv * g.group_size + step / t.per_head; };
            auto load_inputs = [&](const Task t, int from, int to) {
                for (int step = from; step < to; step++) {
                    const int n = ring + step, s = n % STAGES;
                    if (n >= STAGES) kt::wait(sh.in_empty[s], (n / STAGES - 1) % 2);
                    kt::expect_bytes(sh.in_full[s], 2 * kt::tma::tile_bytes<typename S::q_tile>());
                    const kt::coord at{t.b, step_head(t, step), step_q_block(t, step), 0};
                    kt::tma::load_async(sh.q[s], &g.q_map, at, sh.in_full[s]);
                    kt::tma::load_async(sh.dout[s], &g.dout_map, at, sh.in_full[s]);
                }
            };
            for (int local = 0;; local++) {
                const int kvs = local % KVB;
                const bool more = index < tasks;
                const Task t = task_at<CAUSAL>(more ? index : 0, g);
                const int early = more ? min(t.steps, STAGES) : 0;
                sh.task_index[local % (KVB + 1)] = more ? index : -1;
                load_inputs(t, 0, early);
                if (local >= KVB) kt::wait(sh.kv_empty[kvs], (local / KVB - 1) % 2);
                if (!more) {  // tell the consumers to stop (the arrive publishes the -1)
                    kt::arrive(sh.kv_full[kvs]);
                    break;
                }
                kt::expect_bytes(sh.kv_full[kvs], 2 * kt::tma::tile_bytes<typename S::kv_tile>());
                kt::tma::load_async(sh.k[kvs], &g.k_map, kt::coord{t.b, t.h_kv, t.kv_block, 0}, sh.kv_full[kvs]);
                kt::tma::load_async(sh.v[kvs], &g.v_map, kt::coord{t.b, t.h_kv, t.kv_block, 0}, sh.kv_full[kvs]);
                load_inputs(t, early, t.steps);
                ring += t.steps;
                index = CAUSAL ? gridDim.x + atomicAdd(g.task_counter, 1) : index + gridDim.x;
            }
        }
        return;
    }

    // ---- consumers ----
    kt::increase_registers<CONSUMER_REGISTERS>();
    const int consumer = warpgroup, warp = kt::warpgroup::warp();
    const bool issuer = kt::warpgroup::thread() == 0;  // issues this warpgroup's TMA stores

    using score_tile = kt::rt_fl<16, BLOCK_M>;  // keys x queries
    using column_values = typename score_tile::row_vec;
    kt::rt_fl<16, D> dk, dv;
    kt::rt<T, 16, BLOCK_M> p_t;  // register A operand of the dV product
    // At d64 this warp's 16 keys of K and V stay in registers for the task (register A
    // operands of S^T and dP^T): shared memory bandwidth, not the tensor cores, bounds the
    // step there (both operands of every product come from it).
    struct NoTile {};
    using kv_registers = std::conditional_t<KV_IN_REGISTERS<D>, kt::rt<T, 16, D>, NoTile>;
    kv_registers k_reg, v_reg;

    // One step per query block. dQ_i = dS K needs the dS of all 128 keys, so one warpgroup per
    // step (the parity of the block's running step count: the "owner") computes it over both
    // halves of dS^T and issues one reduce-add; that halves the fp32 reduce traffic into L2
    // against a partial dQ per warpgroup. The other warpgroup only signals: DS_READY when its
    // half of dS^T is stored, and it waits on DS_FREE (the owner's dQ has read that buffer) two
    // steps later, before overwriting it; the count runs on across tasks. Within a step the
    // products are split into wgmma groups (completing in issue order) that overlap the
    // warpgroup's own elementwise work:
    //   issue S^T_j, commit; issue dP^T_j, commit
    //   wait<1>: S^T_j done                 P^T_j = exp2(...) while dP^T_j runs
    //   wait<0>: dP^T_j done                dS^T_j into shared memory
    //   owner: issue dQ_j, commit           (after DS_READY)
    //   issue dV_j, dK_j, commit
    //   owner: wait<1>: dQ_j done           staged and reduce-added while dV_j, dK_j run
    //   wait<0>: all done                   release the stage (owner: arrive at DS_FREE)
    // Nothing stays in flight across steps: with dV/dK still running into the next step, ptxas
    // serializes every wgmma (C7515, nvcc 13.0).
    constexpr int BOTH = CONSUMERS * 4 * kt::WARP_THREADS;
    static_assert(CONSUMERS == 2, "backward: dQ ownership alternates between two warpgroups");
    // The per-row statistics (one value per query column, a lane's columns here), from global
    // memory (L2); loaded right before use they stalled the warps (ncu: 31% of stalls). The
    // shift is loaded during the previous step's dV/dK products and becomes S^T's initial
    // value when the step starts, so it holds registers only while S^T does not (held through
    // the step, lse and delta made the d128 kernels spill); neg_delta loads while S^T and dP^T
    // run. (Starting dP^T from neg_delta as well makes ptxas serialize the wgmma, C7520.)
    // Unchecked float2 loads from one base address each: the arrays are padded to whole query
    // blocks.
    column_values shift, neg_delta;
    auto load_columns = [&](column_values& v, const float* row) {
        const int lane_column = 2 * (kt::lane_id() % 4);  // column_values' layout: two pairs per 16
#pragma unroll
        for (int t = 0; t < column_values::tiles; t++) {
#pragma unroll
            for (int pair = 0; pair < 2; pair++) {
                const float2 x = *reinterpret_cast<const float2*>(row + t * kt::TILE_DIM + 8 * pair + lane_column);
                v.data[t][2 * pair] = x.x, v.data[t][2 * pair + 1] = x.y;
            }
        }
    };
    auto load_shift = [&](int b, int h, int i) { load_columns(shift, g.score_shift.ptr(b, h, 0, i * BLOCK_M)); };
    auto load_neg_delta = [&](int b, int h, int i) { load_columns(neg_delta, g.neg_delta.ptr(b, h, 0, i * BLOCK_M)); };
    static_assert(column_values::slots == 4, "load_columns: a lane holds two pairs per 16 columns");
    // Query block i of query head h (of batch b) against key block kv_block; n: the block's
    // running step count (the ring position; its parity picks the dS^T buffer and the owner).
    // The shift of query block next_i of head next_h (the task's next step) loads during it.
    auto step_body = [&](int b, int h, int i, int kv_block, int kvs, int n, bool masked, int next_h, int next_i) {
        const int s = n % STAGES, parity = n % 2;
        const bool owner = parity == consumer;
        auto& k_all = sh.k[kvs];
        const auto k_mine = kt::subtile<64, D>(k_all, consumer, 0);
        const auto v_mine = kt::subtile<64, D>(sh.v[kvs], consumer, 0);
        const int my_key0 = kv_block * BLOCK_N + consumer * 64 + warp * 16;  // this warp's first key
        kt::wait(sh.in_full[s], (n / STAGES) % 2);
        score_tile s_t, dp_t;
        kt::broadcast_col(s_t, shift);
        kt::wgmma::fence();
        if constexpr (KV_IN_REGISTERS<D>)
            kt::wgmma::mma_ABt(s_t, k_reg, sh.q[s], true);  // onto the statistics
        else
            kt::wgmma::mma_ABt(s_t, k_mine, sh.q[s], true);
        kt::wgmma::commit();
        if constexpr (KV_IN_REGISTERS<D>)
            kt::wgmma::mma_ABt(dp_t, v_reg, sh.dout[s], false);
        else
            kt::wgmma::mma_ABt(dp_t, v_mine, sh.dout[s], false);
        kt::wgmma::commit();
        load_neg_delta(b, h, i);
        kt::wgmma::wait<1>();  // S^T_j done
        kt::wgmma::fence_operand(s_t);

        kt::mul(s_t, s_t, g.scale_log2);
        if (CAUSAL && masked) {
            const int visible_to = i * BLOCK_M + g.causal_offset;  // key <= query + offset
            kt::mask(s_t, [&](int r, int c) { return my_key0 + r <= visible_to + c; }, kt::neg_infinity());
        }
        kt::exp2(s_t, s_t);  // P^T
        kt::wgmma::wait<0>();  // dP^T_j done
        kt::wgmma::fence_operand(dp_t);
        kt::add_col(dp_t, dp_t, neg_delta);
        kt::mul(dp_t, dp_t, s_t);  // dS^T
        kt::copy(p_t, s_t);

        // dS^T goes through shared memory, where dK += dS^T Q_i reads this warpgroup's rows as
        // a K-major A and dQ_i += dS K all rows as a transposed A: only P^T stays a register
        // operand, which keeps the products in flight within the registers.
        auto& ds_smem = sh.ds[parity];
        if (!owner && n >= 2) kt::warpgroup::sync_with<BOTH>(DS_FREE + parity);
        {
            kt::rt<T, 16, BLOCK_M> ds_t;
            kt::copy(ds_t, dp_t);
            kt::store(kt::subtile<16, BLOCK_M>(ds_smem, consumer * 4 + warp, 0), ds_t);
        }
        kt::fence_async_proxy();
        const auto ds_mine = kt::subtile<64, BLOCK_M>(ds_smem, consumer, 0);
        if (owner) {
            kt::warpgroup::sync_with<BOTH>(DS_READY + parity);  // both halves stored
            kt::rt_fl<16, D> dq;
            kt::wgmma::fence();
            kt::wgmma::mma_AtB(dq, ds_smem, k_all, false);
            kt::wgmma::commit();
            kt::wgmma::mma_AB(dv, p_t, sh.dout[s], true);
            kt::wgmma::mma_AB(dk, ds_mine, sh.q[s], true);
            kt::wgmma::commit();
            kt::wgmma::wait<1>();  // dQ_i done
            kt::wgmma::fence_operand(dq);
            auto& staging = sh.staging[consumer].dq;
            if (issuer) kt::tma::store_wait_read<0>();  // the last store has read the staging tile
            kt::warpgroup::sync(1 + consumer);
            kt::store(kt::subtile<16, D>(staging, warp, 0), dq);
            kt::fence_async_proxy();
            kt::warpgroup::sync(1 + consumer);
            if (issuer) {
                kt::tma::store_add_async(&g.dq_map, staging, kt::coord{b, h, i, 0});
                kt::tma::store_commit();
            }
        } else {
            kt::warpgroup::arrive_at<BOTH>(DS_READY + parity);
            kt::warpgroup::sync(1 + consumer);  // this warpgroup's rows stored before its dK reads them
            kt::wgmma::fence();
            kt::wgmma::mma_AB(dv, p_t, sh.dout[s], true);
            kt::wgmma::mma_AB(dk, ds_mine, sh.q[s], true);
            kt::wgmma::commit();
        }
        load_shift(b, next_h, next_i);  // while dV/dK run
        kt::wgmma::wait<0>();  // dV/dK_j (and dQ_j) done: p_t, dS^T and the stage are free
        kt::wgmma::fence_operand(p_t);
        kt::wgmma::fence_operand(dk);
        kt::wgmma::fence_operand(dv);
        if (owner) kt::warpgroup::arrive_at<BOTH>(DS_FREE + parity);
        __syncwarp();
        if (kt::lane_id() == 0) kt::arrive(sh.in_empty[s]);  // Q_i and dO_i are read
    };

    // Tasks in the producer's order; the ring position (= the block's step count) runs on
    // across tasks.
    const int q_blocks = kt::ceil_div(g.len_q, BLOCK_M);
    int ring = 0;
    for (int local = 0;; local++) {
        const int kvs = local % KVB;
        kt::wait(sh.kv_full[kvs], (local / KVB) % 2);  // also publishes the producer's task_index
        const int index = sh.task_index[local % (KVB + 1)];
        if (index < 0) break;
        if constexpr (KV_IN_REGISTERS<D>) {
            kt::load(k_reg, kt::subtile<16, D>(sh.k[kvs], consumer * 4 + warp, 0));
            kt::load(v_reg, kt::subtile<16, D>(sh.v[kvs], consumer * 4 + warp, 0));
        }
        const Task t = task_at<CAUSAL>(index, g);
        kt::zero(dk);
        kt::zero(dv);
        // Causal: a query block needs the mask while its first query cannot see the task's
        // last key.
        const int last_key_seen_from = t.kv_block * BLOCK_N + BLOCK_N - 1 - g.causal_offset;
        int i = t.first_q_block, h = t.h_kv * g.group_size;  // the step's query block and head
        const int end = ring + t.steps;
        // Each step loads the next one's shift (no branch around the loads: a task with no steps
        // loads its last query block's, the last step its own again).
        load_shift(t.b, h, min(i, q_blocks - 1));
        for (int n = ring; n < end; n++) {
            int next_i = i + 1, next_h = h;
            if (next_i == q_blocks) next_i = t.first_q_block, next_h++;
            const bool last = n + 1 == end;
            const int load_h = last ? h : next_h, load_i = last ? i : next_i;
            const bool masked = i * BLOCK_M < last_key_seen_from;
            step_body(t.b, h, i, t.kv_block, kvs, n, masked, load_h, load_i);
            i = next_i, h = next_h;
        }
        ring = end;
        __syncwarp();
        if (kt::lane_id() == 0) kt::arrive(sh.kv_empty[kvs]);  // K and V read: the next task's may load

        // Epilogue: dK (scaled) and dV through this warpgroup's staging tile (its last dQ
        // reduce-add must have read it), TMA stores clipped at Lk.
        kt::mul(dk, dk, g.scale);
        auto& out = sh.staging[consumer].dkv;
        if (issuer) kt::tma::store_wait_read<0>();
        kt::warpgroup::sync(1 + consumer);
        kt::store(kt::subtile<16, D>(out[0], warp, 0), dk);  // converted to T on the way
        kt::store(kt::subtile<16, D>(out[1], warp, 0), dv);
        kt::fence_async_proxy();
        kt::warpgroup::sync(1 + consumer);
        if (issuer) {
            const kt::coord at{t.b, t.h_kv, t.kv_block * CONSUMERS + consumer, 0};
            kt::tma::store_async(&g.dk_map, out[0], at);
            kt::tma::store_async(&g.dv_map, out[1], at);
            kt::tma::store_commit();
        }
    }
    // The owners of the block's last two steps arrived at DS_FREE for steps that never came:
    // the warpgroup that would have waited there takes those arrivals, so every barrier ends
    // balanced.
    for (int n = max(ring - 2, 0); n < ring; n++)
        if (consumer != n % 2) kt::warpgroup::sync_with<BOTH>(DS_FREE + n % 2);
    if (issuer) kt::tma::store_wait<0>();  // reduce-adds and stores done before the block ends
#endif
}

struct Sm90Backward {
    template <typename T, int D, bool CAUSAL>
    static cudaError_t run(const BackwardParams& p, cudaStream_t stream);
};

template <typename T, int D, bool CAUSAL>
cudaError_t Sm90Backward::run(const BackwardParams& p, cudaStream_t stream) {
    using G = Globals<T, D>;
    using Sh = Shared<T, D>;
    const kt::gl<T> q = head_major<T, D>(p.q, p.batch, p.heads_q, p.len_q, p.q_stride_b, p.q_stride_h, p.q_stride_l);
    const kt::gl<T> k = head_major<T, D>(p.k, p.batch, p.heads_kv, p.len_kv, p.k_stride_b, p.k_stride_h, p.k_stride_l);
    const kt::gl<T> v = head_major<T, D>(p.v, p.batch, p.heads_kv, p.len_kv, p.v_stride_b, p.v_stride_h, p.v_stride_l);
    const kt::gl<T> dout =
        head_major<T, D>(p.dout, p.batch, p.heads_q, p.len_q, p.dout_stride_b, p.dout_stride_h, p.dout_stride_l);
    const kt::gl<float> dq(p.dq_accum, p.batch, p.heads_q, p.len_q, D);
    const kt::gl<T> dk(static_cast<T*>(p.dk), p.batch, p.heads_kv, p.len_kv, D);
    const kt::gl<T> dv(static_cast<T*>(p.dv), p.batch, p.heads_kv, p.len_kv, D);
    CUtensorMap q_map, k_map, v_map, dout_map, dq_map, dk_map, dv_map;
    if (kt::tma::cached_tensor_map<typename Sh::q_tile>(&q_map, q) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::kv_tile>(&k_map, k) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::kv_tile>(&v_map, v) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::q_tile>(&dout_map, dout) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::dq_tile>(&dq_map, dq) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::dkv_tile>(&dk_map, dk) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::dkv_tile>(&dv_map, dv) != CUDA_SUCCESS)
        return cudaErrorInvalidValue;
    const int group_size = p.heads_q / p.heads_kv;
    int heads_per_group = 1;
    if constexpr (CAUSAL) {  // a kv head's tasks stream the Q and dO of its group's query heads
        const int64_t streamed = 2 * int64_t(p.len_q) * D * sizeof(T) * group_size;
        heads_per_group = heads_sharing_l2(streamed, p.l2_bytes, int64_t(p.batch) * p.heads_kv);
    }
    const G g{q_map, k_map, v_map, dout_map, dq_map, dk_map, dv_map,
              kt::gl<float>(const_cast<float*>(p.score_shift), p.batch, p.heads_q, 1, p.len_q_padded),
              kt::gl<float>(const_cast<float*>(p.neg_delta), p.batch, p.heads_q, 1, p.len_q_padded),
              p.task_counter, p.batch, p.heads_q, p.heads_kv, group_size, p.len_q, p.len_kv,
              CAUSAL ? p.causal_offset : 0, heads_per_group, p.scale, p.scale * LOG2E};

    constexpr int smem = kt::shared_bytes_for<Sh>();
    static_assert(smem <= 227 * 1024, "backward: shared memory over the sm_90 limit");
    auto kernel = backward_kernel_sm90<T, D, CAUSAL>;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) return e;
    const int64_t tasks = int64_t(kt::ceil_div(p.len_kv, BLOCK_N)) * p.batch * p.heads_kv;
    if (tasks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    if (p.multiprocessors <= 0 || (CAUSAL && p.task_counter == nullptr)) return cudaErrorInvalidValue;
    const unsigned blocks = unsigned(tasks < p.multiprocessors ? tasks : p.multiprocessors);  // persistent
    kernel<<<blocks, (CONSUMERS + 1) * 4 * kt::WARP_THREADS, smem, stream>>>(g);
    return cudaGetLastError();
}

}  // namespace

cudaError_t backward_sm90(const BackwardParams& params, cudaStream_t stream) {
    return dispatch<Sm90Backward>(params, stream);
}

}  // namespace tk::attention
