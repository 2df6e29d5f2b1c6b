// Attention backward on Hopper (sm_90a): TMA + wgmma + warp specialisation.
//
// A task is BLOCK_N = 128 keys of one (batch, kv head); the block that takes it keeps dK and dV
// for them in registers: two consumer warpgroups, 64 keys each. It walks every query block (64
// rows) of every query head of its GQA group that can see its keys, which reduces dK and dV over
// the group in registers (no atomics, deterministic). The grid is persistent (one block per SM):
// non-causal tasks (all equal) go round robin, causal ones (uneven) heaviest first from a global
// counter (so do non-causal ones in the deterministic mode, see task_at). A producer thread
// loads each task's K and V, and streams Q_i and dO_i, with their rows' statistics, through a
// ring (2 stages at d128, 4 at d64) that runs on across tasks, so the next task's first Q/dO
// land while this one finishes; at d64 K and V are double-buffered too (at d128 shared memory
// is full, so a task's V and K are released in its last step once read, after its dP^T and dQ
// products, and the next task's load during the rest of that step). Per query block, with
// c = scale * log2(e) and the per-row statistics as backward_statistics.cu leaves them
// (shift = -lse / scale, neg_delta = -rowsum(dO * O)):
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
//                                                     step (alternating; at d128 a step
//                                                     later), from dS^T in shared memory; TMA
//                                                     reduce-add into an fp32 accumulator
//                                                     (deterministic mode: the key blocks
//                                                     take turns in a fixed order, ordered_reduce.cuh)
// The warpgroups wait for each other only over dS^T (and at d128 take turns issuing products,
// see the consumers), so one's elementwise work mostly overlaps the other's products; within
// a warpgroup the products are split into groups that overlap its own exponentials and dQ
// stores.
// At the end of a task dK is scaled by `scale`, and dK and dV go out by TMA stores (rows past
// Lk clipped) from the dQ staging tiles, while the next task's K/V load; the op layer scales
// and converts the dQ accumulator. Keys past Lk load as zero rows: their P and dS only
// multiply those zero rows (dQ) or land in rows that are never stored (dK, dV); they are
// masked all the same (see step_body), as their P can overflow fp16. Query rows past Lq, and
// rows that see no key, have shift = -inf (P = 0); rows past Lq have zero dO.
#include <cuda.h>

#include <algorithm>
#include <type_traits>

#include "kittens/kittens.cuh"
#include "kittens/hopper/hopper.cuh"
#include "kittens/hopper/tma_cache.cuh"
#include "attention/dispatch.h"
#include "attention/attention_params.h"
#include "attention/task_order.h"

namespace tk::attention {
namespace {

namespace kt = kittens;

constexpr int CONSUMERS = 2;
constexpr int BLOCK_N = 64 * CONSUMERS;  // keys per task
constexpr int BLOCK_M = 64;              // query rows per step
// Q/dO ring depth and K/V buffers: what fits beside the dS/dQ staging (d128 uses ~225 of 227 KiB,
// d96 ~200 with three stages). d96 runs as d128 does (K and V read from shared memory, dQ a step
// later): with K and V in registers as at d64, its consumers would hold ~210 of their 240.
template <int D> constexpr int STAGES = D <= 64 ? 4 : D <= 96 ? 3 : 2;
template <int D> constexpr int KV_BUFFERS = D <= 64 ? 2 : 1;
template <int D> constexpr bool KV_IN_REGISTERS = D <= 64;
// Named barriers (0: __syncthreads; 1 + c: warpgroup c's own): step n's dS^T is complete in
// shared memory (4 + n % 2), its dQ product has read it (6 + n % 2), and warpgroup c's turn to
// issue products (8 + c). These constants and the register counts below are read only by the
// sm_90a kernel body, which the other targets compile empty: [[maybe_unused]].
[[maybe_unused]] constexpr int DS_READY = 4, DS_FREE = 6, TURN = 8;
// d96 and d128: a step's dQ is computed one step later, and the warpgroups take turns issuing their
// products (see the consumers): faster at d128. d64 computes dQ in its own step, without turns:
// its consumers have no registers to spare, and deferring made it slower.
template <int D> constexpr bool DEFER_DQ = D > 64;
// The launch gives every thread 168 registers (65536 / 384, rounded down to 8): the producer
// warpgroup gives back exactly what the consumers take ((168 - 24) * 128 = (240 - 168) * 256),
// or setmaxnreg.inc waits forever.
[[maybe_unused]] constexpr int PRODUCER_REGISTERS = 24, CONSUMER_REGISTERS = 240;
constexpr float LOG2E = 1.4426950408889634f;

// Deterministic mode: a staged dQ block for the keeper to reduce-add when its turn comes (query
// block i of query head h of batch b, from key block kv_block; i < 0: the warpgroup is done).
struct DqJob {
    int b, h, i, kv_block;
};

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
    // A stage's per-row statistics, beside its Q and dO: [0] the shift, [1] neg_delta.
    alignas(16) float statistics[STAGES<D>][2][BLOCK_M];
    ds_tile ds[2];                // by step parity; warpgroup c writes rows 64c..64c+63
    Staging staging[CONSUMERS];
    // The task of the block's task number local (-1: no more tasks), in slot local % (KVB + 1):
    // the producer writes it before waiting for a K/V buffer, while the consumers may not yet
    // have read the KVB tasks before it.
    int task_index[KV_BUFFERS<D> + 1];
    // kv_full: K and V landed (with the task index). V is released in a task's last step, once
    // dP^T has read it (v_empty), K once that step's dQ products have (k_empty; at the task's
    // end for a warpgroup that collects no dQ there), so the next task's load early.
    kt::semaphore kv_full[KV_BUFFERS<D>], k_empty[KV_BUFFERS<D>], v_empty[KV_BUFFERS<D>], in_full[STAGES<D>],
        in_empty[STAGES<D>];
    // Deterministic: the dQ reduce-adds go through a keeper thread (see DqJob). Per warpgroup,
    // the semaphores of the hand-over: staged (one arrival, the warpgroup's issuer) and free
    // (one arrival, the keeper: the staging tile has been read); the job it staged last and
    // how many it has handed over (kept here: the d128 consumers have no register to spare).
    kt::semaphore dq_staged[CONSUMERS], dq_free[CONSUMERS];
    DqJob dq_job[CONSUMERS];
    int dq_jobs[CONSUMERS];
};

template <typename T, int D>
struct Globals {
    CUtensorMap q_map, k_map, v_map, dout_map, dq_map, dk_map, dv_map;
    const float *score_shift, *neg_delta;  // (B, Hq, len_q_padded)
    int* task_counter;                     // causal or deterministic: zeroed before the launch
    // Deterministic: one turn counter per (batch, query head, query block), zeroed before the
    // launch; the key blocks reduce-add into that dQ block in ascending order (ordered_reduce.cuh).
    // nullptr: reduce-adds in arrival order.
    int* dq_turns;
    int batch, heads_q, heads_kv, group_size, len_q, len_kv, len_q_padded;
    int causal_offset;    // key j visible to query i iff j <= i + causal_offset
    float scale, scale_log2;
    // Last: its size changes move no other field's offset in the kernel parameters.
    HeadGroups head_groups;  // counted task order: heads whose tasks share L2 (heaviest_first)
};

// One task: BLOCK_N keys of one (batch, kv head), and the query blocks that see them, for each
// query head of the group (steps = per_head * group_size).
struct Task {
    int b, h_kv, kv_block, first_q_block, per_head, steps;
};

// COUNTED: blocks take their tasks from the global counter (rather than round robin), heaviest
// first. Always when causal; also when deterministic, as a block then waits for the key blocks
// before its own to add their dQ, so it must only ever wait for tasks that running blocks have
// taken.
template <bool CAUSAL, bool COUNTED, typename G>
__device__ __forceinline__ Task task_at(int index, const G& g) {
    const int kv_blocks = kt::ceil_div(g.len_kv, BLOCK_N), q_blocks = kt::ceil_div(g.len_q, BLOCK_M);
    Task t;
    int bh;
    if constexpr (COUNTED) {
        // Causal: a head's first key blocks are seen by the most queries. Deterministic: a
        // head's key block k is taken after its block k - 1 (whose dQ turns come first), and
        // after the same block of the other heads of its group, which spaces out the blocks of
        // one head that wait for each other.
        const HeadAndRank at = heaviest_first(index, g.head_groups);
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

// DETERMINISTIC (g.dq_turns set): the dQ reduce-adds in a fixed order, through the keeper (see
// below). A separate instantiation rather than a run-time flag, like COUNTED: code beside the
// arrival-order path, even unused, costs it (the 24-register producer spilled with the
// counter's code beside it, 1-5% of the non-causal fwd+bwd; the consumers lost uniform
// registers to the issuer's turn bookkeeping, 4-7% of the non-causal backward kernel).
template <typename T, int D, bool CAUSAL, bool DETERMINISTIC>
__global__ void __launch_bounds__((CONSUMERS + 1) * 4 * kt::WARP_THREADS, 1)
    backward_kernel_sm90(const __grid_constant__ Globals<T, D> g) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Compiled for a GPU without sm_90a features: no body (the host launches it only on sm_90).
#else
    using S = Shared<T, D>;
    constexpr int STAGES = attention::STAGES<D>, KVB = KV_BUFFERS<D>;
    constexpr bool COUNTED = CAUSAL || DETERMINISTIC;
    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    S& sh = alloc.allocate<S>();
    const int tasks = kt::ceil_div(g.len_kv, BLOCK_N) * g.batch * g.heads_kv;

    if (threadIdx.x == 0) {
        for (int s = 0; s < KVB; s++) {
            kt::init_semaphore(sh.kv_full[s], 1);
            // Every consumer thread releases the buffer: each read the task index beside it (K:
            // after the last step's dQ product or at the task's end; V: after its dP^T).
            kt::init_semaphore(sh.k_empty[s], CONSUMERS * 4 * kt::WARP_THREADS);
            kt::init_semaphore(sh.v_empty[s], CONSUMERS * 4 * kt::WARP_THREADS);
        }
        for (int s = 0; s < STAGES; s++) {
            kt::init_semaphore(sh.in_full[s], 1);
            // Every consumer thread releases the stage: they read its statistics with plain
            // loads (see the release at the end of step_body).
            kt::init_semaphore(sh.in_empty[s], CONSUMERS * 4 * kt::WARP_THREADS);
        }
        if constexpr (DETERMINISTIC)
            for (int c = 0; c < CONSUMERS; c++) {
                kt::init_semaphore(sh.dq_staged[c], 1);
                kt::init_semaphore(sh.dq_free[c], 1);
                sh.dq_jobs[c] = 0;
            }
        kt::fence_semaphore_init();
    }
    __syncthreads();

    // Deterministic: the key blocks add into each dQ block in ascending order, taking turns at
    // a global counter per dQ block (ordered_reduce.cuh). A waiting turn must not hold up the
    // consumers, so one producer thread, the keeper, does it: a consumer warpgroup stages its
    // dQ block as usual and hands it over (dq_staged); the keeper waits for the block's turn,
    // reduce-adds it, frees the staging tile once read (dq_free), and ends the turn once
    // written. The collectors alternate between the warpgroups in ring order, and so does the
    // keeper. Key block kv_block adds to dQ block i after key blocks 0 .. kv_block - 1: the
    // blocks that see a query block are a prefix of the key blocks (causal masks hide a
    // suffix), so its ticket is kv_block.

    const int warpgroup = kt::warpgroup_id();
    if (warpgroup == CONSUMERS) {  // producer
        kt::decrease_registers<PRODUCER_REGISTERS>();
        if (threadIdx.x % (4 * kt::WARP_THREADS) == 0) {
            // Per task: publish its index (with the K/V arrival), load K and V once the
            // consumers are done with the buffer, stream its Q/dO. A task's first Q/dO are
            // issued before the wait for the K/V buffer (they only need ring slots, which free
            // up during the previous task's last steps), so they are in flight meanwhile.
            int ring = 0, index = COUNTED ? atomicAdd(g.task_counter, 1) : blockIdx.x;
            // Step s of a task: query block first_q_block + s % per_head of the group's query
            // head s / per_head (the consumers walk the same order incrementally).
            auto step_q_block = [](const Task t, int step) { return t.first_q_block + step % t.per_head; };
            auto step_head = [&](const Task t, int step) { return t.h_kv * g.group_size + step / t.per_head; };
            auto load_inputs = [&](const Task t, int from, int to) {
                for (int step = from; step < to; step++) {
                    const int n = ring + step, s = n % STAGES;
                    if (n >= STAGES) kt::wait(sh.in_empty[s], (n / STAGES - 1) % 2);
                    constexpr uint32_t row_bytes = BLOCK_M * sizeof(float);
                    kt::expect_bytes(sh.in_full[s], 2 * kt::tma::tile_bytes<typename S::q_tile>() + 2 * row_bytes);
                    const kt::coord at{t.b, step_head(t, step), step_q_block(t, step), 0};
                    kt::tma::load_async(sh.q[s], &g.q_map, at, sh.in_full[s]);
                    kt::tma::load_async(sh.dout[s], &g.dout_map, at, sh.in_full[s]);
                    // The block's row of each statistic (256-byte aligned: the rows are padded to
                    // whole blocks).
                    const size_t row = (size_t(at.b) * g.heads_q + at.h) * g.len_q_padded + at.r * BLOCK_M;
                    kt::tma::load_bytes_async(sh.statistics[s][0], g.score_shift + row, row_bytes, sh.in_full[s]);
                    kt::tma::load_bytes_async(sh.statistics[s][1], g.neg_delta + row, row_bytes, sh.in_full[s]);
                }
            };
            for (int local = 0;; local++) {
                const int kvs = local % KVB;
                const bool more = index < tasks;
                const Task t = task_at<CAUSAL, COUNTED>(more ? index : 0, g);
                // With one K/V buffer, only the first step's Q/dO go ahead of K and V (the
                // first step needs all four).
                const int early = more ? min(t.steps, KVB == 1 ? 1 : STAGES) : 0;
                sh.task_index[local % (KVB + 1)] = more ? index : -1;
                load_inputs(t, 0, early);
                const kt::coord kv_at{t.b, t.h_kv, t.kv_block, 0};
                if (local >= KVB) kt::wait(sh.v_empty[kvs], (local / KVB - 1) % 2);
                if (more) {
                    kt::expect_bytes(sh.kv_full[kvs], 2 * kt::tma::tile_bytes<typename S::kv_tile>());
                    kt::tma::load_async(sh.v[kvs], &g.v_map, kv_at, sh.kv_full[kvs]);
                }
                if (local >= KVB) kt::wait(sh.k_empty[kvs], (local / KVB - 1) % 2);
                if (!more) {  // tell the consumers to stop (the arrive publishes the -1)
                    kt::arrive(sh.kv_full[kvs]);
                    break;
                }
                kt::tma::load_async(sh.k[kvs], &g.k_map, kv_at, sh.kv_full[kvs]);
                load_inputs(t, early, t.steps);
                ring += t.steps;
                index = COUNTED ? atomicAdd(g.task_counter, 1) : index + gridDim.x;
            }
        } else if (DETERMINISTIC && threadIdx.x % (4 * kt::WARP_THREADS) == kt::WARP_THREADS) {  // keeper
            const int q_blocks = kt::ceil_div(g.len_q, BLOCK_M);
            int handed[CONSUMERS] = {}, stopped = 0;
            for (int c = 0; stopped < CONSUMERS; c ^= 1) {
                kt::wait(sh.dq_staged[c], handed[c]++ % 2);
                const DqJob job = sh.dq_job[c];
                if (job.i < 0) {
                    stopped++;
                    continue;
                }
                int* turn = g.dq_turns + (job.b * g.heads_q + job.h) * q_blocks + job.i;
                kt::ordered_reduce::wait_for_turn(turn, job.kv_block);
                kt::tma::store_add_async(&g.dq_map, sh.staging[c].dq, kt::coord{job.b, job.h, job.i, 0});
                kt::tma::store_commit();
                kt::tma::store_wait_read<0>();
                kt::arrive(sh.dq_free[c]);
                kt::ordered_reduce::end_turn(turn);
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

    // One step per query block. dQ_i = dS K needs the dS of all 128 keys, so one warpgroup
    // (the "collector" of step n: warpgroup n % 2, n the block's running step count) computes
    // it over both halves of dS^T and issues one reduce-add; that halves the fp32 reduce
    // traffic into L2 against a partial dQ per warpgroup. The other warpgroup arrives at
    // DS_READY when its half of dS^T(n) is stored, and in step n + 2 waits on DS_FREE (dQ(n)
    // has read that buffer) before overwriting it. With DEFER (d128) the collector computes
    // dQ(n) in its step n + 1 (in a task's last step at once: the next task has other keys),
    // so the warpgroups may run up to a step apart without waiting for each other; they then
    // also issue their product groups in turns (0, 1, 0, 1, ...; warpgroup 0 takes its first
    // without waiting), so that one's products run while the other does its elementwise
    // work. Without DEFER (d64) the collector of step n waits for the other half in step n.
    // Within a step the products are split into wgmma groups (completing in issue order) that
    // overlap the warpgroup's own elementwise work:
    //   issue S^T_n, commit; issue dP^T_n, commit
    //   wait<1>: S^T_n done                 P^T_n = exp2(...) while dP^T_n runs
    //   wait<0>: dP^T_n done                dS^T_n into shared memory
    //   collector: issue dQ, commit         (of step n - 1 or n, see above)
    //   issue dV_n, dK_n, commit
    //   collector: wait<1>: dQ done         staged and reduce-added while dV_n, dK_n run
    //   wait<0>: all done                   release the stage (collector: arrive at DS_FREE)
    // Nothing stays in flight across steps: with dV/dK still running into the next step, ptxas
    // serializes every wgmma (C7515, nvcc 13.0).
    constexpr int BOTH = CONSUMERS * 4 * kt::WARP_THREADS;
    static_assert(CONSUMERS == 2, "backward: dQ collection alternates between two warpgroups");
    constexpr bool DEFER = DEFER_DQ<D>, TAKE_TURNS = DEFER_DQ<D>;
    bool first_turn = consumer == 0;
    auto my_turn = [&] {
        if (TAKE_TURNS && !first_turn) kt::warpgroup::sync_with<BOTH>(TURN + consumer);
        first_turn = false;
    };
    auto pass_turn = [&] {
        if (TAKE_TURNS) kt::warpgroup::arrive_at<BOTH>(TURN + 1 - consumer);
    };
    // The per-row statistics of the step's query block (one value per query column, a lane's
    // columns here) arrive with its Q and dO in the stage. (Read from global memory, even a step
    // ahead, their L2 latency stalled the warps: ncu put a third of all stall samples on long
    // scoreboard waits.) The shift is S^T's initial value (wgmma accumulates onto it).
    // (Starting dP^T from neg_delta as well makes ptxas serialize the wgmma, C7520.)
    auto load_statistic = [&](column_values& v, int stage, int which) {
        const int lane_column = 2 * (kt::lane_id() % 4);  // column_values' layout: two pairs per 16
        const uint32_t row = kt::shared_address(sh.statistics[stage][which]);
#pragma unroll
        for (int t = 0; t < column_values::tiles; t++) {
#pragma unroll
            for (int pair = 0; pair < 2; pair++) {
                const uint32_t at = row + uint32_t(t * kt::TILE_DIM + 8 * pair + lane_column) * sizeof(float);
                asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                             : "=f"(v.data[t][2 * pair]), "=f"(v.data[t][2 * pair + 1])
                             : "r"(at));
            }
        }
    };
    static_assert(column_values::slots == 4, "load_statistic: a lane holds two pairs per 16 columns");
    // dQ of the step m this warpgroup collects (query block i of head h of batch b) from the
    // complete dS^T(m): wait for the other half, issue, stage the result once done and
    // reduce-add it, free the dS^T buffer. `then` issues more products into the same wait
    // window (the step's dV/dK) after the dQ's commit.
    // (Issuer only.) The staging tile is free once this thread's own stores have read it, and
    // when deterministic once the keeper has read the last dQ block handed over.
    auto wait_staging_free = [&] {
        kt::tma::store_wait_read<0>();
        if constexpr (DETERMINISTIC)
            if (const int jobs = sh.dq_jobs[consumer]; jobs > 0) kt::wait(sh.dq_free[consumer], (jobs - 1) % 2);
    };
    // Releases a K or V buffer after this thread's last read of it in the task (at d64 the reads
    // include the register copies, through the generic proxy: fenced into the async proxy that
    // the producer's next load writes through).
    auto release_kv = [&](kt::semaphore& empty) {
        if constexpr (KV_IN_REGISTERS<D>) kt::fence_async_proxy();
        kt::arrive(empty);
    };
    auto hand_over = [&](const DqJob& job) {  // (issuer, deterministic)
        sh.dq_job[consumer] = job;
        sh.dq_jobs[consumer]++;
        kt::arrive(sh.dq_staged[consumer]);
    };
    // release_k: the task's last read of K (the K buffer is released once the product is done).
    auto collect_dq = [&](int b, int h, int i, int kv_block, int m, int kvs, bool release_k, auto&& then) {
        kt::warpgroup::sync_with<BOTH>(DS_READY + m % 2);  // the other half of dS^T(m) is stored
        kt::rt_fl<16, D> dq;
        kt::wgmma::fence();
        kt::wgmma::mma_AtB(dq, sh.ds[m % 2], sh.k[kvs], false);
        kt::wgmma::commit();
        then();
        kt::wgmma::wait<1>();  // dQ done (then's group may still run)
        if (release_k) release_kv(sh.k_empty[kvs]);  // the next task's K may load
        kt::wgmma::fence_operand(dq);
        kt::warpgroup::arrive_at<BOTH>(DS_FREE + m % 2);
        auto& staging = sh.staging[consumer].dq;
        if (issuer) wait_staging_free();
        kt::warpgroup::sync(1 + consumer);
        kt::store(kt::subtile<16, D>(staging, warp, 0), dq);
        kt::fence_async_proxy();
        kt::warpgroup::sync(1 + consumer);
        if (issuer) {
            if constexpr (DETERMINISTIC) {
                hand_over(DqJob{b, h, i, kv_block});
            } else {
                kt::tma::store_add_async(&g.dq_map, staging, kt::coord{b, h, i, 0});
                kt::tma::store_commit();
            }
        }
    };
    // Query block i of query head h (of batch b) against key block kv_block; n: the block's
    // running step count (the ring position; its parity picks the dS^T buffer and the
    // collector). collect: this warpgroup collects the dQ of step m (query block collect_i of
    // head collect_h) here.
    auto step_body = [&](int b, int h, int i, int kv_block, int kvs, int n, bool masked, bool last, bool collect,
                         int m, int collect_h, int collect_i) {
        const int s = n % STAGES, parity = n % 2;
        const auto k_mine = kt::subtile<64, D>(sh.k[kvs], consumer, 0);
        const auto v_mine = kt::subtile<64, D>(sh.v[kvs], consumer, 0);
        const int my_key0 = kv_block * BLOCK_N + consumer * 64 + warp * 16;  // this warp's first key
        const bool keys_past_end = my_key0 + 16 > g.len_kv;
        kt::wait(sh.in_full[s], (n / STAGES) % 2);
        score_tile s_t, dp_t;
        {
            column_values shift;
            load_statistic(shift, s, 0);
            kt::broadcast_col(s_t, shift);
        }
        my_turn();
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
        pass_turn();
        kt::wgmma::wait<1>();  // S^T_n done
        kt::wgmma::fence_operand(s_t);

        kt::mul(s_t, s_t, g.scale_log2);
        // Keys past Lk (zero rows) are masked too: their P = exp(-lse) can overflow fp16 when
        // converted for the products (a row's only visible keys scoring far below 0), and an
        // infinite dS times their zero K rows would make dQ NaN.
        if ((CAUSAL && masked) || keys_past_end) {
            const int visible_to = CAUSAL ? i * BLOCK_M + g.causal_offset : 0;  // key <= query + offset
            // Key my_key0 + r is visible to query column c iff my_key0 + r <= visible_to + c
            // (causal) and my_key0 + r < Lk.
            kt::mask_cols_before(s_t, [&](int r) {
                const int key = my_key0 + r;
                return key >= g.len_kv ? BLOCK_M : CAUSAL ? key - visible_to : 0;
            }, kt::neg_infinity());
        }
        kt::exp2(s_t, s_t);  // P^T
        kt::wgmma::wait<0>();  // dP^T_n done
        kt::wgmma::fence_operand(dp_t);
        if (last) release_kv(sh.v_empty[kvs]);  // V read for the last time: the next task's may load
        {
            column_values neg_delta;
            load_statistic(neg_delta, s, 1);
            kt::add_col(dp_t, dp_t, neg_delta);
        }
        kt::mul(dp_t, dp_t, s_t);  // dS^T
        kt::copy(p_t, s_t);

        // dS^T goes through shared memory, where dK += dS^T Q_i reads this warpgroup's rows as
        // a K-major A and dQ += dS K all rows as a transposed A: only P^T stays a register
        // operand, which keeps the products in flight within the registers. The collector of
        // step n computed dQ(n - 2) from this buffer in its step n - 1 and waited for it; the
        // other warpgroup waits until it has.
        auto& ds_smem = sh.ds[parity];
        if (consumer != parity && n >= 2) kt::warpgroup::sync_with<BOTH>(DS_FREE + parity);
        {
            kt::rt<T, 16, BLOCK_M> ds_t;
            kt::copy(ds_t, dp_t);
            kt::store(kt::subtile<16, BLOCK_M>(ds_smem, consumer * 4 + warp, 0), ds_t);
        }
        // Into the async proxy: the dS^T rows just written (read next by wgmma), and the stage's
        // statistics read above (the producer's next bulk copy into the stage writes through
        // the async proxy, after this thread's release of the stage).
        kt::fence_async_proxy();
        if (consumer != parity) kt::warpgroup::arrive_at<BOTH>(DS_READY + parity);
        kt::warpgroup::sync(1 + consumer);  // this warpgroup's rows stored before its dK reads them
        const auto ds_mine = kt::subtile<64, BLOCK_M>(ds_smem, consumer, 0);
        auto dv_dk = [&] {
            kt::wgmma::fence();
            kt::wgmma::mma_AB(dv, p_t, sh.dout[s], true);
            kt::wgmma::mma_AB(dk, ds_mine, sh.q[s], true);
            kt::wgmma::commit();
        };
        my_turn();
        if (collect)
            collect_dq(b, collect_h, collect_i, kv_block, m, kvs, last, [&] {
                dv_dk();
                pass_turn();
            });
        else {
            dv_dk();
            pass_turn();
        }
        kt::wgmma::wait<0>();  // dV/dK_n done: p_t, dS^T and the stage are free
        kt::wgmma::fence_operand(p_t);
        kt::wgmma::fence_operand(dk);
        kt::wgmma::fence_operand(dv);
        // Q_i, dO_i and the statistics are read. Each thread arrives for its own statistics
        // reads: compute-sanitizer's racecheck orders a thread's shared loads before the
        // producer's next bulk copy only through that thread's own arrival. A __syncwarp and
        // one arrival per warp is enough under the PTX memory model, but racecheck reports it
        // as a WAR hazard (a minimal ring was clean only with per-thread arrivals).
        kt::arrive(sh.in_empty[s]);
    };

    // Tasks in the producer's order; the ring position (= the block's step count) runs on
    // across tasks.
    const int q_blocks = kt::ceil_div(g.len_q, BLOCK_M);
    int ring = 0;
    for (int local = 0;; local++) {
        const int kvs = local % KVB;
        kt::wait(sh.kv_full[kvs], (local / KVB) % 2);  // also publishes the producer's task_index
        // Through a warp reduction, as in the forward: the index lands in a uniform register, so
        // what derives from it (counted tasks' step counts, ring stages) stays uniform.
        const int index = __reduce_min_sync(0xffffffffu, sh.task_index[local % (KVB + 1)]);
        if (index < 0) break;
        if constexpr (KV_IN_REGISTERS<D>) {
            kt::load(k_reg, kt::subtile<16, D>(sh.k[kvs], consumer * 4 + warp, 0));
            kt::load(v_reg, kt::subtile<16, D>(sh.v[kvs], consumer * 4 + warp, 0));
        }
        const Task t = task_at<CAUSAL, COUNTED>(index, g);
        kt::zero(dk);
        kt::zero(dv);
        // Causal: a query block needs the mask while its first query cannot see the task's
        // last key.
        const int last_key_seen_from = t.kv_block * BLOCK_N + BLOCK_N - 1 - g.causal_offset;
        int i = t.first_q_block, h = t.h_kv * g.group_size;  // the step's query block and head
        int prev_i = i, prev_h = h;                          // the previous step's
        const int end = ring + t.steps;
        bool k_released = false;
        for (int n = ring; n < end; n++) {
            int next_i = i + 1, next_h = h;
            if (next_i == q_blocks) next_i = t.first_q_block, next_h++;
            const bool last = n + 1 == end;
            const bool masked = i * BLOCK_M < last_key_seen_from;
            // Deferred: this warpgroup collects step n - 1's dQ, or in the task's last step its
            // own; otherwise the collector of step n collects it in step n.
            const bool mine = consumer == n % 2;
            const bool collect = mine ? !DEFER || last : DEFER && n > ring;
            const bool previous = DEFER && !mine;  // (constant false without DEFER)
            k_released = last && collect;  // its dQ product was the last read of K
            step_body(t.b, h, i, t.kv_block, kvs, n, masked, last, collect, previous ? n - 1 : n,
                      previous ? prev_h : h, previous ? prev_i : i);
            prev_i = i, prev_h = h;
            i = next_i, h = next_h;
        }
        // Keys no query sees (causal, Lk > Lq): no last step released V.
        if (t.steps == 0) release_kv(sh.v_empty[kvs]);
        ring = end;
        // K and the task index read: the next task's K may load (released already if this
        // warpgroup collected a dQ in the last step). Each thread arrives for its own
        // task_index read, for racecheck as with the statistics (step_body): with one arrival
        // per warp it reported the producer's next write to the slot as a hazard once a block
        // took more tasks than there are slots. Fenced like the other releases:
        // at d64 a task with no steps has no step fence after its register copies of K.
        if (!k_released) release_kv(sh.k_empty[kvs]);

        // Epilogue: dK (scaled) and dV through this warpgroup's staging tile (its last dQ
        // reduce-add must have read it), TMA stores clipped at Lk.
        kt::mul(dk, dk, g.scale);
        auto& out = sh.staging[consumer].dkv;
        if (issuer) wait_staging_free();
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
    // Every barrier ends balanced. The collectors of the block's last two steps arrived at
    // DS_FREE for steps that never came: the warpgroup that would have waited there takes
    // those arrivals. Warpgroup 1 passed the turn once more than warpgroup 0 took it (0 went
    // first without it): warpgroup 0 takes that arrival.
    for (int n = max(ring - 2, 0); n < ring; n++)
        if (consumer != n % 2) kt::warpgroup::sync_with<BOTH>(DS_FREE + n % 2);
    if (TAKE_TURNS && consumer == 0 && ring > 0) kt::warpgroup::sync_with<BOTH>(TURN);
    if constexpr (DETERMINISTIC)
        if (issuer) {            // the keeper stops once both warpgroups have said so
            wait_staging_free();  // (it has read the last job before this one overwrites it)
            hand_over(DqJob{0, 0, -1, 0});
        }
    if (issuer) kt::tma::store_wait<0>();  // reduce-adds and stores done before the block ends
#endif
}

struct Sm90Backward {
    using head_dims = Sm90HeadDims;
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
    // Task indices (and the task order's counts) are ints.
    const int kv_blocks = kt::ceil_div(p.len_kv, BLOCK_N);
    const int64_t tasks = int64_t(kv_blocks) * p.batch * p.heads_kv;
    if (tasks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    const int group_size = p.heads_q / p.heads_kv;
    const bool deterministic = p.dq_turns != nullptr, counted = CAUSAL || deterministic;
    int heads_per_group = 1;
    if (counted) {
        // The counted order: what a kv head's tasks touch is its group's Q and dO, the fp32 dQ
        // accumulator they reduce-add into (counted twice: each add reads and writes it in
        // L2), and its K and V. Counting only Q and dO put four times as many heads in a group,
        // and was slower on short sequences.
        const int64_t per_query_row = 2 * sizeof(T) + 2 * sizeof(float);  // Q, dO; dQ read and written
        const int64_t touched = (int64_t(p.len_q) * group_size * per_query_row + 2 * int64_t(p.len_kv) * sizeof(T)) * D;
        heads_per_group = heads_sharing_l2(touched, p.l2_bytes, int64_t(p.batch) * p.heads_kv);
        // Deterministic and causal: key block j first adds to query block ~2j, and only after
        // blocks 0 .. j - 1 have, so when all of a head's key blocks start together block j
        // waits ~2j steps. Spreading each wave over at least a quarter as many heads as SMs
        // (about four key blocks of a head at a time) keeps those waits short, at some L2
        // locality: GQA 4 n4096 d128 causal 3986 -> 2815 us (arrival order: 2633). Non-causal
        // waits are not of that kind, and more heads only cost L2 there (n3072 d128: 6067 ->
        // 6402 us), so they keep the L2 grouping.
        if (deterministic && CAUSAL)
            heads_per_group = std::max<int64_t>(heads_per_group, std::min<int64_t>(kt::ceil_div(p.multiprocessors, 4),
                                                                                   int64_t(p.batch) * p.heads_kv));
    }
    const G g{q_map, k_map, v_map, dout_map, dq_map, dk_map, dv_map,
              p.score_shift, p.neg_delta, p.task_counter, p.dq_turns, p.batch, p.heads_q, p.heads_kv, group_size,
              p.len_q, p.len_kv, p.len_q_padded,
              CAUSAL ? p.causal_offset : 0, p.scale, p.scale * LOG2E,
              split_heads(p.batch * p.heads_kv, heads_per_group, kv_blocks)};

    constexpr int smem = kt::shared_bytes_for<Sh>();
    static_assert(smem <= 227 * 1024, "backward: shared memory over the sm_90 limit");
    auto kernel = deterministic ? backward_kernel_sm90<T, D, CAUSAL, true> : backward_kernel_sm90<T, D, CAUSAL, false>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
    if (p.multiprocessors <= 0 || (counted && p.task_counter == nullptr)) return cudaErrorInvalidValue;
    const unsigned blocks = unsigned(tasks < p.multiprocessors ? tasks : p.multiprocessors);  // persistent
    kernel<<<blocks, (CONSUMERS + 1) * 4 * kt::WARP_THREADS, smem, stream>>>(g);
    return cudaGetLastError();
}

}  // namespace

cudaError_t backward_sm90(const BackwardParams& params, cudaStream_t stream) {
    return dispatch<Sm90Backward>(params, stream);
}

}  // namespace tk::attention
