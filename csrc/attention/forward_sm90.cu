// Attention forward on Hopper (sm_90a): TMA + wgmma + warp specialisation.
//
// A task is 64 query rows per consumer warpgroup (C = 2 or 3, see CONSUMERS) of one
// (batch, head); a persistent grid of one block per SM walks the tasks. The last warpgroup is
// the producer: one thread TMA-loads each task's Q (two buffers, so the next task's Q lands
// during this one) and K and V tiles of BLOCK_N = 128 keys into a ring of stages (K and V on
// separate semaphores, so scores can start before V lands), running ahead into the next task
// while the consumers finish the current one.
// The other warpgroups are consumers, 64 query rows each, with the registers the producer
// gave up (setmaxnreg). Per key tile j a consumer runs
//   S_j = Q K_j^T                 wgmma, A = Q and B = K from shared memory
//   online softmax of S_j         in registers, base 2 (as in forward_sm80.cu)
//   O = O * alpha + P_j V_j       wgmma, A = P from registers, B = V from shared memory
// in the order S_j, then P_{j-1} V_{j-1} (both issued back to back), then the softmax of
// S_j, which runs while the tensor cores do P_{j-1} V_{j-1}; the consumer warpgroups take
// turns issuing, so the tensor cores interleave one's products with another's softmax. (Three
// consumers at d128 run each tile start to end instead: see SERIAL_STEPS.) A
// task starts with its S_0 alone and ends with its last P V alone, then its epilogue.
// K_j's stage is released once S_j is done, V_{j-1}'s once P_{j-1} V_{j-1} is. Masked and
// unmasked tiles are separate instantiations (as in the sm80 kernel); partial tiles need no
// padding: TMA zero-fills rows past the sequence end, their scores are masked, and the O
// store clips rows past Lq. Non-causal tasks left over after the grid's full rounds run split
// over their key tiles (task_order.h: split_last_round): each piece writes its rows' normalised
// O and lse in fp32 to a workspace, and the last piece of a task to finish merges them into
// the output. Causal is key <= query + causal_offset (0: SDPA's top-left rule,
// Lk - Lq: lower-right); keys >= Lk are never visible. A negative offset (lower-right, Lq > Lk)
// leaves rows, even whole tasks, with no visible key: they store O = 0 and lse = -inf.
// Long non-causal d128 launches run in clusters of two blocks that take neighbouring tasks of
// one head and load each K/V tile once for both (TMA multicast): see PAIRS_SHARE_KV.
#include <cuda.h>

#include <type_traits>

#include "kittens/kittens.cuh"
#include "kittens/hopper/hopper.cuh"
#include "kittens/hopper/tma_cache.cuh"
#include "attention/dispatch.h"
#include "attention/attention_params.h"
#include "attention/softmax_rows.cuh"
#include "attention/task_order.h"

namespace tk::attention {
namespace {

namespace kt = kittens;

// Consumer warpgroups C (64 query rows each), a kernel parameter picked per launch
// (plan_forward_sm90): at d64 the tensor work per key tile halves while the softmax does not, so
// a third warpgroup keeps the tensor cores fed; at d128 (and d96) two warpgroups get 240
// registers each, which O, S and P need. Short causal d64 runs with two (smaller tasks balance
// better there; three win from n3072 on), long non-causal d128 with three (SERIAL_STEPS).
template <int D> constexpr int CONSUMERS = D <= 64 ? 3 : 2;
constexpr int SHORT_CAUSAL_D64_MAX_LEN = 2048;  // len_q up to which d64 causal uses two
// Non-causal d128 with Lq and Lk both at least this long runs with three consumers (two are
// faster below it). Causal stays with two: with three its loop spills (ptxas).
constexpr int THREE_CONSUMER_D128_MIN_LEN = 3072;
constexpr int BLOCK_N = 128;               // keys per tile
// Constants and helpers marked [[maybe_unused]] are read only by the sm_90a kernel body, which
// the other targets compile empty.
[[maybe_unused]] constexpr int PRODUCER_REGISTERS = 24;
// What the register file leaves each consumer thread once the producer has given its share back
// (the launch gives every thread 65536 / threads, rounded down to 8).
template <int C> constexpr int CONSUMER_REGISTERS = C == 2 ? 240 : 160;
constexpr float LOG2E = 1.4426950408889634f;

// Stages of the K/V ring: as many as fit beside two Q tiles and the O staging buffers.
template <int D> constexpr int STAGES = D <= 64 ? 4 : D <= 96 ? 3 : 2;

// Whether non-causal launches split their last round (task_order.h: split_last_round). Not at
// d128 with two consumers: the piece code moved ptxas's placement of the P V wait among the
// exponentials in the d128 loop (SASS), which made every non-causal config slower, split or not;
// with the pieces in a launch of their own the loop kept its schedule, but the split's fixed cost
// outweighed the d128 last rounds it replaced. Three consumers at d128 split (their loop is
// serial, see below).
constexpr bool splits_last_round(int head_dim, int consumers) { return head_dim <= 64 || consumers == 3; }

// d128 with three consumer warpgroups (as TK's kernel): at 160 registers a consumer cannot hold
// S_j, P_{j-1} and O at once (64 + 32 + 64), so each warpgroup runs a tile start to end (S_j,
// softmax, P_j V_j, wait) while the other two keep the tensor cores busy; and its tasks of 192
// rows split their last round (splits_last_round: b8 h16 n6144 is 31.03 rounds of them on 132
// SMs). Two Q buffers (192 x 128) and two K/V stages fill shared memory, so a warpgroup stages
// its O in its own Q rows, free once its last S is done (O_IN_Q); a Q buffer then goes back to
// the producer when the O stores out of it have read it, at the next task's first S.
template <int D, int C> constexpr bool SERIAL_STEPS = D > 64 && C == 3;
template <int D, int C> constexpr bool O_IN_Q = SERIAL_STEPS<D, C>;
// How the softmax's row max and row sum start their per-lane partials (kt::reduce_start).
// Starting from the first element saves 32 instructions of a step's ~450 (SASS) and is faster
// everywhere but in the serial steps, which were slower with it and keep the identity start.
template <int D, int C>
constexpr kt::reduce_start SOFTMAX_REDUCE_START =
    SERIAL_STEPS<D, C> ? kt::reduce_start::identity : kt::reduce_start::first_element;

// O *= alpha row by row (kt::row_map) in the serial steps, as a predicated multiply that only
// rows whose factor is not exactly 1 execute (NaN included: an unordered compare): a row whose
// running max did not move keeps O bit for bit, and late tiles of long rows mostly move no max.
// Without a branch the step keeps its shape (a warp-wide skip split the softmax and was slower).
// The overlapped steps were slower with it, so they keep kt::mul_row. A member template like the
// core's base ops (kittens/ops/base_ops.cuh), so only the sm_90a kernel body instantiates it.
struct mul_unless_one {
    template <typename F>
    __device__ static F op(F x, F factor) {
        static_assert(std::is_same_v<F, float>, "mul_unless_one: fp32 only");
        asm("{\n\t.reg .pred moved;\n\tsetp.neu.f32 moved, %1, 0f3F800000;\n\t@moved mul.f32 %0, %0, %1;\n\t}"
            : "+f"(x) : "f"(factor));
        return x;
    }
};

template <typename T, int D, int C>
struct Shared {
    using q_tile = kt::st<T, 64 * C, D>;
    using kv_tile = kt::st<T, BLOCK_N, D>;
    using o_tile = kt::st<T, 64, D>;
    struct no_staging {};
    q_tile q[2];  // this task's and the next one's
    int task_index[2];  // the task behind each Q buffer (-1: no more tasks), set by the producer
    kv_tile k[STAGES<D>], v[STAGES<D>];
    std::conditional_t<O_IN_Q<D, C>, no_staging, o_tile[C]> o;  // O staging (O_IN_Q: in the Q rows)
    kt::semaphore q_full[2], q_empty[2], k_full[STAGES<D>], v_full[STAGES<D>], k_empty[STAGES<D>],
        v_empty[STAGES<D>];
};

template <typename T, int D>
struct Globals {
    CUtensorMap q_map, k_map, v_map, o_map;
    float* lse;  // (B, Hq, Lq) contiguous
    int* task_counter;  // causal: zeroed before the launch; tasks handed out after each block's first
    int batch, heads_q, group_size, len_q, len_kv;
    int causal_offset;    // causal: key j visible to query i iff j <= i + causal_offset
    float scale_log2;
    // Last: its size changes move no other field's offset in the kernel parameters.
    HeadGroups head_groups;  // causal task order: heads whose tasks share L2 (heaviest_first)
    // The non-causal split last round (task_order.h): tasks from whole_tasks on are pieces,
    // 2^piece_shift per task. A piece's partial O (64 C rows x D) and lse (64 C) go to slot
    // index - whole_tasks of partial_o / partial_lse; pieces_done counts a task's finished
    // pieces per warp (16 rows); the last warp to finish writes the merged rows to `out`.
    int tasks;  // whole tasks and pieces
    int whole_tasks, piece_shift;
    float *partial_o, *partial_lse;
    int* pieces_done;
    T* out;  // O, as o_map describes it
    int64_t out_stride_b, out_stride_h, out_stride_l;
    T* out_residual;  // nullptr, or (B, Hq, Lq, D) contiguous: O - O as stored (ForwardParams)
};

// One unit of work: 64 C query rows of one (batch, head), and the key tiles they need: `tiles`
// of them from first_tile on, the first `unmasked` of those needing no mask. piece: the slot of
// a piece of a split task (first_tile > 0 but for the first piece), -1 for a whole task.
struct Task {
    int b, h, h_kv, q_block, tiles, unmasked, first_tile, piece;
};

template <int BLOCK_M, bool CAUSAL, bool SPLIT, bool PAIRED, typename G>
__device__ __forceinline__ Task task_at(int index, const G& g) {
    const int q_blocks = kt::ceil_div(g.len_q, BLOCK_M);
    Task t;
    t.first_tile = 0, t.piece = -1;
    if (SPLIT && index >= g.whole_tasks) {  // a piece of task whole_tasks + piece / 2^piece_shift
        t.piece = index - g.whole_tasks;
        if (PAIRED) t.piece = paired_piece(t.piece, g.piece_shift);  // the pair reads the same keys
        index = g.whole_tasks + (t.piece >> g.piece_shift);
    }
    int bh;
    if constexpr (CAUSAL) {  // the last query blocks see the most keys
        const HeadAndRank at = heaviest_first(index, g.head_groups);
        t.q_block = q_blocks - 1 - at.rank;
        bh = at.head;
    } else {  // a head's query blocks together, so blocks running together share its K/V in L2
        t.q_block = index % q_blocks;
        bh = index / q_blocks;
    }
    t.b = bh / g.heads_q, t.h = bh % g.heads_q, t.h_kv = t.h / g.group_size;
    const int q_row0 = t.q_block * BLOCK_M;
    // Key tiles the block needs (up to the last visible key of its last real row), and how many
    // of them need no mask at all (every key visible to its first row). Both clamped at 0 before
    // dividing: with a negative offset a block may see no key (and ceil_div of a negative is wrong).
    // q_end + offset <= Lk and q_row0 + 1 + offset <= Lk: no overflow.
    const int q_end = min(q_row0 + BLOCK_M, g.len_q);
    const int kv_end = CAUSAL ? max(0, min(g.len_kv, q_end + g.causal_offset)) : g.len_kv;
    t.tiles = kt::ceil_div(kv_end, BLOCK_N);
    t.unmasked = min(g.len_kv / BLOCK_N, CAUSAL ? max(0, q_row0 + 1 + g.causal_offset) / BLOCK_N : t.tiles);
    if (SPLIT && t.piece >= 0) {
        const TileRange share = piece_tiles(t.piece & ((1 << g.piece_shift) - 1), g.piece_shift, t.tiles);
        t.first_tile = share.first;
        t.tiles = share.end - share.first;
        t.unmasked = min(max(t.unmasked - share.first, 0), t.tiles);
    }
    return t;
}

// CLUSTER = 2 (PAIRED): blocks 2i and 2i + 1 form a cluster and take tasks 2t and 2t + 1,
// which read the same key tiles (the host launches it so only then, paired_tasks); each block
// loads half of each step's K/V panels into both blocks (TMA multicast), so L2 sends each tile
// once per pair, and a stage is free once the consumers of both blocks released it.
template <typename T, int D, bool CAUSAL, int C, int CLUSTER>
__global__ void __launch_bounds__((C + 1) * 4 * kt::WARP_THREADS, 1)
    forward_kernel_sm90(const __grid_constant__ Globals<T, D> g) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Compiled for a GPU without sm_90a features: no body (the host launches it only on sm_90).
#else
    constexpr int CONSUMERS = C, BLOCK_M = 64 * C;
    constexpr bool SPLIT = !CAUSAL && splits_last_round(D, C);
    constexpr bool SERIAL = SERIAL_STEPS<D, C>;
    constexpr bool PAIRED = CLUSTER > 1;
    using S = Shared<T, D, C>;
    constexpr int ST = STAGES<D>;
    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    S& sh = alloc.allocate<S>();
    const int tasks = SPLIT ? g.tasks : kt::ceil_div(g.len_q, BLOCK_M) * g.batch * g.heads_q;

    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; s++) {
            kt::init_semaphore(sh.q_full[s], 1);
            // Every consumer thread arrives: each read the task index beside the Q buffer, and
            // racecheck orders a thread's read before the producer's next write only through
            // that thread's own arrival (as in the backward).
            kt::init_semaphore(sh.q_empty[s], CONSUMERS * 4 * kt::WARP_THREADS);
        }
        for (int s = 0; s < ST; s++) {
            kt::init_semaphore(sh.k_full[s], 1);
            kt::init_semaphore(sh.v_full[s], 1);
            // one arrival per consumer warp of every block whose copies fill this block's stage
            kt::init_semaphore(sh.k_empty[s], CONSUMERS * 4 * CLUSTER);
            kt::init_semaphore(sh.v_empty[s], CONSUMERS * 4 * CLUSTER);
        }
        kt::fence_semaphore_init();
    }
    // Paired: no block's copies or arrivals may reach the other's semaphores before they exist.
    if constexpr (PAIRED) kt::cluster::sync();
    else __syncthreads();

    // Persistent: block x takes task x, then (equal-sized non-causal tasks) x + grid, x + 2 grid,
    // ..., or (causal tasks of uneven size) the next unclaimed one from a global counter. The
    // producer passes the task index on with the Q buffer and runs ahead into the next
    // task (its Q in the other buffer, its first K/V tiles in the ring) while the consumers
    // finish the current one. K/V ring positions count on across tasks (`ring`).
    const int warpgroup = kt::warpgroup_id();
    const int rank = PAIRED ? kt::cluster::rank() : 0;
    if (warpgroup == CONSUMERS) {  // producer
        kt::decrease_registers<PRODUCER_REGISTERS>();
        if (threadIdx.x % (4 * kt::WARP_THREADS) == 0) {
            int ring = 0, index = blockIdx.x;
            for (int local = 0;; local++) {
                const int qs = local % 2;
                if (local >= 2) kt::wait(sh.q_empty[qs], (local / 2 - 1) % 2);
                sh.task_index[qs] = index < tasks ? index : -1;
                if (index >= tasks) {  // tell the consumers to stop (the arrive publishes the -1)
                    kt::arrive(sh.q_full[qs]);
                    break;
                }
                const Task t = task_at<BLOCK_M, CAUSAL, SPLIT, PAIRED>(index, g);
                kt::expect_bytes(sh.q_full[qs], kt::tma::tile_bytes<typename S::q_tile>());
                kt::tma::load_async(sh.q[qs], &g.q_map, kt::coord{t.b, t.h, t.q_block, 0}, sh.q_full[qs]);
                // K_j is needed a step before V_j (S_j = Q K_j^T comes before P_j V_j), and a K
                // stage frees up a step earlier: issue in the order K_0, K_1, V_0, K_2, V_1, ...
                // (Serial steps need V_j before K_{j+1}, yet the order K_0, V_0, K_1, V_1 made
                // the three-consumer kernel slower.)
                auto load = [&](kt::semaphore* full, kt::semaphore* empty, typename S::kv_tile* tiles_of,
                                const CUtensorMap* map, int j) {
                    const int n = ring + j, s = n % ST;
                    if (n >= ST) kt::wait(empty[s], (n / ST - 1) % 2);
                    kt::expect_bytes(full[s], kt::tma::tile_bytes<typename S::kv_tile>());
                    const kt::coord at{t.b, t.h_kv, t.first_tile + j, 0};
                    if constexpr (PAIRED) {  // this block's panels (every CLUSTER-th), into both blocks
                        constexpr int PANELS = S::kv_tile::cols / S::kv_tile::panel_cols;
                        static_assert(PANELS % CLUSTER == 0, "forward: K/V panels do not split over the cluster");
                        for (int panel = 0; panel < PANELS; panel++)  // unrolls; starting at rank did not (SASS)
                            if (panel % CLUSTER == rank)
                                kt::tma::load_panel_multicast(tiles_of[s], map, at, panel, full[s], (1 << CLUSTER) - 1);
                    } else {
                        kt::tma::load_async(tiles_of[s], map, at, full[s]);
                    }
                };
                for (int j = 0; j < t.tiles; j++) {
                    load(sh.k_full, sh.k_empty, sh.k, &g.k_map, j);
                    if (j > 0) load(sh.v_full, sh.v_empty, sh.v, &g.v_map, j - 1);
                }
                if (t.tiles > 0) load(sh.v_full, sh.v_empty, sh.v, &g.v_map, t.tiles - 1);
                ring += t.tiles;
                index = CAUSAL ? gridDim.x + atomicAdd(g.task_counter, 1) : index + gridDim.x;
            }
        }
        return;
    }

    // ---- consumers ----
    kt::increase_registers<CONSUMER_REGISTERS<C>>();
    const int consumer = warpgroup, warp = kt::warpgroup::warp();
    const bool issuer = kt::warpgroup::thread() == 0;  // issues this warpgroup's O stores

    using score_tile = kt::rt_fl<16, BLOCK_N>;
    using row_values = typename score_tile::col_vec;
    kt::rt_fl<16, D> o;
    kt::rt<T, 16, BLOCK_N> p;  // P of the tile whose P V may still be in flight
    row_values row_max, row_sum;  // running max of raw scores; sum of P (this lane's share)
    score_tile s;

    // The consumer warpgroups take turns, round robin, issuing their products (warpgroup c
    // waits on named barrier 4 + c, which its predecessor arrives at; 1..3 are the warpgroups'
    // own epilogue barriers), so one's softmax runs
    // while another's products keep the tensor cores busy, instead of all doing exponentials
    // at once.
    constexpr int PAIR = 2 * 4 * kt::WARP_THREADS;  // the waiting and the arriving warpgroup
    auto my_turn = [&] { kt::warpgroup::sync_with<PAIR>(4 + consumer); };
    auto pass_turn = [&] { kt::warpgroup::arrive_at<PAIR>(4 + (consumer + 1) % CONSUMERS); };
    auto release = [&](kt::semaphore& empty) {  // a K/V stage (paired: in both blocks)
        __syncwarp();
        if constexpr (PAIRED) {
            if (kt::lane_id() < CLUSTER) kt::cluster::arrive_at(empty, kt::lane_id());
        } else {
            if (kt::lane_id() == 0) kt::arrive(empty);
        }
    };
    if (!SERIAL && consumer == CONSUMERS - 1) pass_turn();  // warpgroup 0 goes first

    // Ring position n of a K/V tile (counting on across tasks) -> its stage and phase.
    auto issue_scores = [&](const auto& q, int n) {  // S = Q K_n^T
        kt::wait(sh.k_full[n % ST], (n / ST) % 2);
        kt::wgmma::fence();
        kt::wgmma::mma_ABt(s, q, sh.k[n % ST], false);
        kt::wgmma::commit();
    };
    auto issue_pv = [&](int n) {  // O += P V_n
        kt::wait(sh.v_full[n % ST], (n / ST) % 2);
        kt::wgmma::fence();
        kt::wgmma::mma_AB(o, p, sh.v[n % ST], true);
        kt::wgmma::commit();
    };
    auto pv_done = [&](int n) {  // the last P V issued is done: O, P and V_n are free
        kt::wgmma::wait<0>();
        kt::wgmma::fence_operand(o);
        kt::wgmma::fence_operand(p);
        release(sh.v_empty[n % ST]);
    };
    auto first_row = [&](const Task& t) { return t.q_block * BLOCK_M + consumer * 64 + warp * 16; };
    // Online softmax of the scores of a tile whose first key is key0, in place (S becomes P in
    // fp32); returns through `rescale` the factor O and l must be multiplied by.
    auto softmax = [&]<bool MASKED>(int row0, int key0, row_values& rescale) {
        if constexpr (MASKED) {
            // Key key0 + c is visible to row row0 + r iff key0 + c < Lk and (causal)
            // key0 + c <= row0 + r + offset: c up to the smaller of the two bounds.
            const int last_key = g.len_kv - 1 - key0;
            const int diagonal = row0 + (CAUSAL ? g.causal_offset : 0) - key0;
            kt::mask_cols_after(s, [&](int r) {
                return CAUSAL ? min(last_key, diagonal + r) : last_key;
            }, kt::neg_infinity());
        }
        row_values new_max, shift;
        kt::row_max<SOFTMAX_REDUCE_START<D, C>>(new_max, s, row_max);
        kt::for_each_slot(rescale, [&](int tt, int i, float& alpha) {
            const float m_new = new_max.data[tt][i];
            const bool empty = m_new == kt::neg_infinity();  // no visible key yet: shift by 0
            shift.data[tt][i] = empty ? 0.f : __fmul_rn(m_new, g.scale_log2);
            alpha = empty ? 1.f : exp2f((row_max.data[tt][i] - m_new) * g.scale_log2);
        });
        // P = exp2(s c - m c). With out_residual (a training forward), both products are
        // rounded alike (no FMA), so the row's largest score gives P = 1 exactly: a row with one
        // visible (or one dominant) key gets O = V and l = 1 exactly. Fused into one FMA, P is
        // 1 +- 3e-6 there, a normalisation error that the residual would pass on to the
        // backward's delta, where dS = P (dP - delta) is about 0 (dq, dk 1e-4 where the exact
        // gradient is 0). Inference keeps the FMA: one instruction less per score, and an
        // error far below out's rounding.
        if (g.out_residual != nullptr) {
            kt::mul_rn(s, s, g.scale_log2);
            kt::sub_row(s, s, shift);
        } else {
            kt::mul(s, s, g.scale_log2);
            kt::sub_row(s, s, shift);
        }
        kt::exp2(s, s);
        kt::copy(row_max, new_max);
        kt::mul(row_sum, row_sum, rescale);
        kt::row_sum_lane_partial<SOFTMAX_REDUCE_START<D, C>>(row_sum, s, row_sum);
    };
    // A task's rows once all its scores are in (its last P V may still run): `lse` gets their
    // log-sum-exp (and goes out, but for a piece), and `divisor` the row sums combined across
    // lanes, 1 where a row saw no key (its O is 0: O / 1 stores 0, not 0/0).
    row_values lse, divisor;
    auto store_lse = [&](const Task& t) {
        const kt::gl<float> lse_rows(g.lse, g.batch, g.heads_q, 1, g.len_q);
        kt::store(lse_rows, lse, kt::coord{t.b, t.h, 0, first_row(t) / 16});
    };
    auto close_rows = [&](const Task& t) {
        kt::reduce_across_lanes<kt::base_ops::add>(row_sum);
        log_sum_exp(lse, row_max, row_sum, g.scale_log2);  // -inf for a row that saw no key
        if (!SPLIT || t.piece < 0) store_lse(t);
        guard_empty_rows(row_sum);
        kt::copy(divisor, row_sum);
    };
    // A task's O (complete) / divisor into this warpgroup's staging rows, one TMA store (clipped
    // at Lq). The rows: its own tile, once the previous task's store has read it; or (O_IN_Q)
    // its 64 rows of the task's Q buffer `qs`, free once every warp of it is past its last S
    // (the first sync), and the last store out of that buffer was read before the producer
    // refilled it (release_q).
    auto store_output = [&](const Task& t, int qs) {
        kt::div_row(o, o, divisor);
        kt::rt<T, 16, D> o_out;
        kt::copy(o_out, o);
        const kt::coord at{t.b, t.h, t.q_block * CONSUMERS + consumer, 0};
        auto stage_and_store = [&](auto& tile, int row_tile) {  // rows from 16 * row_tile on
            kt::warpgroup::sync(1 + consumer);
            kt::store(kt::subtile<16, D>(tile, row_tile + warp, 0), o_out);
            kt::fence_async_proxy();
            kt::warpgroup::sync(1 + consumer);
            if (issuer) {
                kt::tma::store_async(&g.o_map, kt::subtile<64, D>(tile, row_tile / 4, 0), at);
                kt::tma::store_commit();
            }
        };
        if constexpr (O_IN_Q<D, C>) {
            stage_and_store(sh.q[qs], consumer * 4);
        } else {
            if (issuer) kt::tma::store_wait_read<0>();
            stage_and_store(sh.o[consumer], 0);
        }
    };
    // With out_residual: this warp's rows of O's rounding residual, O - T(O) in T (O normalised),
    // straight from registers, a pair of neighbouring columns per 4-byte store; rows past Lq are
    // clipped. Only a forward for a backward asks.
    auto store_residual = [&](const Task& t) {
        if (g.out_residual == nullptr) return;
        using tile = kt::rt_fl<16, D>;
        const int row0 = first_row(t);
        T* const head_rows = g.out_residual + (int64_t(t.b) * g.heads_q + t.h) * g.len_q * D;
        kt::for_each_pair(o, [&](int i, int j, int k, const float2& full) {
            const int r = row0 + i * kt::TILE_DIM + tile::row_in_base(k, 0);
            if (r >= g.len_q) return;
            const int c = j * kt::TILE_DIM + tile::col_in_base(k, 0);  // and c + 1
            const float2 stored = kt::convert_pair<float, T>(kt::convert_pair<T, float>(full));
            *reinterpret_cast<kt::packed<T>*>(head_rows + int64_t(r) * D + c) =
                kt::convert_pair<T, float>(make_float2(full.x - stored.x, full.y - stored.y));
        });
    };
    // O_IN_Q: the Q buffer of this warpgroup's last O store, until that store has read it.
    int unreleased_q = -1;
    auto release_q = [&] {
        if (unreleased_q < 0) return;
        if (issuer) kt::tma::store_wait_read<0>();
        kt::warpgroup::sync(1 + consumer);
        kt::arrive(sh.q_empty[unreleased_q]);
        unreleased_q = -1;
    };
    auto start_rows = [&] {
        kt::neg_infty(row_max);
        kt::zero(row_sum);
    };
    // A split task's pieces: slot k of the workspace holds a piece's 64 C rows, this warpgroup's
    // 64 of them from row 64 consumer on, this warp's 16 from 16 warp on (O in the warp's
    // fragment order, lse by row). Each warp counts and merges its own rows: a warpgroup-wide
    // decision (a flag through shared memory) cost the task loop its uniform registers, and with
    // them the wgmma descriptors (ptxas moved them to vector registers, copied back before every
    // wgmma). The layouts are made where used, for the same reason.
    const int piece_row_tile = consumer * 4 + warp;  // in 16-row units
    // This warp's O rows of slot k, in its fragment order (kt::store_part).
    auto partial_o = [&](int k) { return g.partial_o + (int64_t(k) * BLOCK_M + piece_row_tile * 16) * D; };
    auto partial_lse = [&] { return kt::gl<float>(g.partial_lse, g.tasks - g.whole_tasks, 1, 1, BLOCK_M); };
    // After a piece's rows are closed (O normalised): writes this warp's to the piece's slot, and
    // tells whether it is the last of the task's pieces to have done so (then it merges them).
    auto piece_done_last = [&](const Task& t) {
        kt::store_part(partial_o(t.piece), o);
        kt::store(partial_lse(), lse, kt::coord{t.piece, 0, 0, piece_row_tile});
        const int counter = ((t.piece >> g.piece_shift) * CONSUMERS + consumer) * 4 + warp;
        return kt::arrive_last(g.pieces_done + counter, 1 << g.piece_shift);
    };
    // The last piece's warp: o and lse become the whole task's, from the pieces' partial results
    // in piece order (not arrival order, so the output is the same on every run), in one pass
    // (one round trip to L2 per piece) with a running max, as the softmax's:
    // lse = log sum_k exp(lse_k), O = sum_k exp(lse_k - lse) O_k: a few times faster than two
    // passes over row-major parts, which held up the end of the last round.
    auto merge_pieces = [&](const Task& t) {
        constexpr float LN2 = 0.6931471805599453f;
        const int pieces = 1 << g.piece_shift, first = t.piece & -pieces;
        row_values top, sum;
        kt::neg_infty(top);
        kt::zero(sum);
        kt::zero(o);
        for (int k = 0; k < pieces; k++) {
            row_values lse_k, keep;  // lse_k becomes the piece's weight; keep, the old terms'
            kt::rt_fl<16, D> o_k;
            kt::load(lse_k, partial_lse(), kt::coord{first + k, 0, 0, piece_row_tile});
            kt::load_part(o_k, partial_o(first + k));
            kt::for_each_slot(lse_k, [&](int tt, int i, float& x) {
                const float m = fmaxf(top.data[tt][i], x);
                const bool none = m == kt::neg_infinity();  // no piece so far saw a key of the row
                keep.data[tt][i] = none ? 0.f : exp2f((top.data[tt][i] - m) * LOG2E);
                x = none ? 0.f : exp2f((x - m) * LOG2E);
                top.data[tt][i] = m;
            });
            kt::mul(sum, sum, keep);
            kt::add(sum, sum, lse_k);
            kt::mul_row(o, o, keep);
            kt::mul_row(o_k, o_k, lse_k);
            kt::add(o, o, o_k);
        }
        kt::for_each_slot(lse, [&](int tt, int i, float& x) {
            const float m = top.data[tt][i];
            x = m == kt::neg_infinity() ? m : m + __log2f(sum.data[tt][i]) * LN2;
        });
        guard_empty_rows(sum);
        kt::div_row(o, o, sum);
    };

    int ring = 0;  // the K/V ring position of the current task's first tile
    // A task's key tiles, from its first S to its last P V: O (not yet divided by the row sums)
    // and the rows' statistics, closed (close_rows). K/V ring positions from `ring` on.
    //
    // Two consumers (overlapped): tile j >= 1 issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} back
    // to back, and the softmax of S_j runs while the second one does; S_0 comes alone at the
    // start and the last P V alone at the end. S_j done releases K_j, and after the task's last
    // tile Q.
    auto overlapped_tiles = [&](const Task& t, const auto& q, int qs, int row0, int key0) {
        my_turn();
        issue_scores(q, ring);
        pass_turn();
        kt::wgmma::wait<0>();  // S_0 is done
        kt::wgmma::fence_operand(s);
        release(sh.k_empty[ring % ST]);
        start_rows();
        row_values rescale;  // O starts at zero: nothing to rescale
        if (t.unmasked == 0) softmax.template operator()<true>(row0, key0, rescale);
        else softmax.template operator()<false>(row0, key0, rescale);
        if (t.tiles == 1) kt::arrive(sh.q_empty[qs]);
        kt::zero(o);
        kt::copy(p, s);
        auto step = [&]<bool MASKED>(int j) {
            my_turn();
            issue_scores(q, ring + j);
            issue_pv(ring + j - 1);
            pass_turn();
            kt::wgmma::wait<1>();  // S_j is done
            kt::wgmma::fence_operand(s);
            release(sh.k_empty[(ring + j) % ST]);
            if (j == t.tiles - 1) kt::arrive(sh.q_empty[qs]);
            row_values rescale;
            softmax.template operator()<MASKED>(row0, key0 + j * BLOCK_N, rescale);
            pv_done(ring + j - 1);
            kt::mul_row(o, o, rescale);
            kt::copy(p, s);
        };
        int j = 1;
        for (; j < t.unmasked; j++) step.template operator()<false>(j);
        for (; j < t.tiles; j++) step.template operator()<true>(j);
        ring += t.tiles;
        my_turn();
        issue_pv(ring - 1);
        pass_turn();
        close_rows(t);
        pv_done(ring - 1);
    };
    // Three consumers at d128 (serial): each tile start to end, S_j, its softmax, O = O * alpha +
    // P_j V_j, and the wait for that product before S_{j+1}; the other two warpgroups keep the
    // tensor cores busy meanwhile. No turns: ordering S_j only or every product in a ring (S of
    // one warpgroup, P V of the next, ...) held the step to the slowest softmax, and both were
    // slower.
    auto serial_tiles = [&](const Task& t, const auto& q, int qs, int row0, int key0) {
        start_rows();
        kt::zero(o);
        auto step = [&]<bool MASKED>(int j) {
            issue_scores(q, ring + j);
            if (j == 0) release_q();  // the previous task's O store has long been read by now
            kt::wgmma::wait<0>();
            kt::wgmma::fence_operand(s);
            release(sh.k_empty[(ring + j) % ST]);
            // A whole task's Q buffer goes back after its O store (O_IN_Q); a piece's (no store)
            // once its last S is done.
            if (j == t.tiles - 1 && (!O_IN_Q<D, C> || t.piece >= 0)) kt::arrive(sh.q_empty[qs]);
            row_values rescale;
            softmax.template operator()<MASKED>(row0, key0 + j * BLOCK_N, rescale);
            kt::row_map<mul_unless_one>(o, o, rescale);
            kt::copy(p, s);
            issue_pv(ring + j);
            pv_done(ring + j);
        };
        int j = 0;
        for (; j < t.unmasked; j++) step.template operator()<false>(j);
        for (; j < t.tiles; j++) step.template operator()<true>(j);
        ring += t.tiles;
        close_rows(t);
    };

    // Tasks in the producer's order.
    for (int local = 0;; local++) {
        const int qs = local % 2;
        kt::wait(sh.q_full[qs], (local / 2) % 2);  // also publishes the producer's task_index
        // Every lane reads the same index; taking it through a warp reduction puts it in a uniform
        // register, so the task's tile counts and the ring positions, stages and wgmma descriptors
        // derived from it stay in the uniform datapath (a plain shared load would leave them in
        // vector registers, copied to uniform ones at every wgmma).
        const int index = __reduce_min_sync(0xffffffffu, sh.task_index[qs]);
        if (index < 0) break;  // no more tasks
        const Task t = task_at<BLOCK_M, CAUSAL, SPLIT, PAIRED>(index, g);
        if (t.tiles == 0) {  // no visible key (lower-right causal, Lq > Lk): O = 0, lse = -inf
            release_q();
            if constexpr (!O_IN_Q<D, C>) kt::arrive(sh.q_empty[qs]);
            kt::zero(o);
            start_rows();
            close_rows(t);
            store_output(t, qs);
            store_residual(t);
            if constexpr (O_IN_Q<D, C>) unreleased_q = qs;
            continue;
        }
        const int row0 = first_row(t);
        const auto q = kt::subtile<64, D>(sh.q[qs], consumer, 0);
        const int key0 = SPLIT ? t.first_tile * BLOCK_N : 0;  // the task's first key
        if constexpr (SERIAL) serial_tiles(t, q, qs, row0, key0);
        else overlapped_tiles(t, q, qs, row0, key0);
        if (SPLIT && t.piece >= 0) {
            kt::div_row(o, o, divisor);
            if (piece_done_last(t)) {  // this warp's merged rows go out straight from registers
                merge_pieces(t);
                store_lse(t);
                const kt::gl<T> out(g.out, g.batch, g.heads_q, g.len_q, D, g.out_stride_b, g.out_stride_h,
                                    g.out_stride_l);
                kt::store(out, o, kt::coord{t.b, t.h, first_row(t) / 16, 0});
                store_residual(t);
            }
            continue;
        }
        store_output(t, qs);
        store_residual(t);
        if constexpr (O_IN_Q<D, C>) unreleased_q = qs;  // released at the next task's first S
    }
    if (!SERIAL && consumer == 0) my_turn();  // takes the last warpgroup's last pass: every barrier ends balanced
    if (issuer) kt::tma::store_wait<0>();  // the staging tile outlives the store
    // Paired: the other block's consumers arrive on this block's semaphores up to their last
    // stage, so neither block leaves before both are done.
    if constexpr (PAIRED) kt::cluster::sync();
#endif
}

struct Sm90Forward {
    using head_dims = Sm90HeadDims;
    template <typename T, int D, bool CAUSAL>
    static cudaError_t run(const ForwardParams& p, const ForwardSm90Plan& plan, cudaStream_t stream);
};

// The consumer warpgroups of a launch: CONSUMERS<D>, but two for short causal d64 and three for
// long non-causal d128.
int consumers_for(const ForwardParams& p) {
    if (p.head_dim == 64 && p.causal && p.len_q <= SHORT_CAUSAL_D64_MAX_LEN) return 2;
    if (p.head_dim == 128 && !p.causal && p.len_q >= THREE_CONSUMER_D128_MIN_LEN &&
        p.len_kv >= THREE_CONSUMER_D128_MIN_LEN)
        return 3;
    return p.head_dim <= 64 ? CONSUMERS<64> : CONSUMERS<128>;
}

// How a launch with `consumers` warpgroups splits its last round (task_order.h); nothing when
// causal (the counted order hands the light tasks out last), at a head dim that does not split
// (splits_last_round), or with more tasks than fit in an int.
TailSplit tail_split(const ForwardParams& p, int consumers) {
    const int64_t tasks = int64_t(kt::ceil_div(p.len_q, 64 * consumers)) * p.batch * p.heads_q;
    const bool splits = splits_last_round(p.head_dim, consumers);
    if (p.causal || !splits || tasks > 0x7fffffff) return {int(tasks), 0, 0};
    return split_last_round(tasks, p.multiprocessors, kt::ceil_div(p.len_kv, BLOCK_N));
}

// Which launches run in clusters of two sharing K/V (forward_kernel_sm90's CLUSTER): the
// long non-causal d128 ones (three consumers). They run at the power cap, where time follows
// energy per call, and L2 sending every K/V tile to each block is a part of that energy; shared
// by pairs, L2 sends each tile half as often, and the clock runs higher. Not the other
// non-causal launches: paired, d64 (three consumers, K from one block and V from the other) and
// two-consumer d128 took more time.
template <int D, bool CAUSAL, int C> constexpr bool PAIRS_SHARE_KV = SERIAL_STEPS<D, C> && !CAUSAL;
// Whether tasks 2t and 2t + 1 read the same keys, and blocks 2i and 2i + 1 take them together:
// a head's query blocks are an even number (so a pair never straddles two heads; the split's
// pieces pair up by share, task_at), and so are the SMs (so the grid, and the whole tasks before
// the split, are even).
bool paired_tasks(const ForwardParams& p, int q_blocks) { return q_blocks % 2 == 0 && p.multiprocessors % 2 == 0; }

// The kernel with C consumer warpgroups, as the plan says.
template <typename T, int D, bool CAUSAL, int C>
cudaError_t launch(const ForwardParams& p, const ForwardSm90Plan& plan, cudaStream_t stream) {
    if (plan.consumers != C) return cudaErrorInvalidValue;  // a plan made for other params
    // Task indices (and the task order's counts) are ints.
    const int q_blocks = kt::ceil_div(p.len_q, 64 * C);
    const int64_t whole = int64_t(q_blocks) * p.batch * p.heads_q;
    if (whole > 0x7fffffff) return cudaErrorInvalidConfiguration;
    const int64_t tasks = int64_t(plan.whole_tasks) + (int64_t(plan.split_tasks) << plan.piece_shift);
    if (tasks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    if (plan.needs_task_counter && p.task_counter == nullptr) return cudaErrorInvalidValue;
    if (plan.piece_shift > 0 && (p.partials == nullptr || p.pieces_done == nullptr)) return cudaErrorInvalidValue;
    using G = Globals<T, D>;
    using Sh = Shared<T, D, C>;
    G g{};
    g.out = static_cast<T*>(p.o);
    g.out_stride_b = p.o_stride_b, g.out_stride_h = p.o_stride_h, g.out_stride_l = p.o_stride_l;
    g.out_residual = static_cast<T*>(p.o_residual);
    const kt::gl<T> q = head_major<T, D>(p.q, p.batch, p.heads_q, p.len_q, p.q_stride_b, p.q_stride_h, p.q_stride_l);
    const kt::gl<T> k = head_major<T, D>(p.k, p.batch, p.heads_kv, p.len_kv, p.k_stride_b, p.k_stride_h, p.k_stride_l);
    const kt::gl<T> v = head_major<T, D>(p.v, p.batch, p.heads_kv, p.len_kv, p.v_stride_b, p.v_stride_h, p.v_stride_l);
    const kt::gl<T> o = head_major<T, D>(p.o, p.batch, p.heads_q, p.len_q, p.o_stride_b, p.o_stride_h, p.o_stride_l);
    if (kt::tma::cached_tensor_map<typename Sh::q_tile>(&g.q_map, q) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::kv_tile>(&g.k_map, k) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::kv_tile>(&g.v_map, v) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::o_tile>(&g.o_map, o) != CUDA_SUCCESS)
        return cudaErrorInvalidValue;
    g.lse = p.lse;
    g.task_counter = p.task_counter;
    g.batch = p.batch, g.heads_q = p.heads_q, g.group_size = p.heads_q / p.heads_kv;
    g.len_q = p.len_q, g.len_kv = p.len_kv;
    if constexpr (CAUSAL) {  // read only by causal launches (mask, task sizes, task order)
        g.causal_offset = p.causal_offset;
        // What a group's tasks touch: each head's Q and O, and its share of the K/V its tasks
        // all read (counting K/V alone put twice as many heads in a group, and was slower).
        const int64_t bytes_per_q_head = 2 * int64_t(p.len_kv) * D * sizeof(T) / g.group_size +
                                         2 * int64_t(p.len_q) * D * sizeof(T);
        g.head_groups = split_heads(p.batch * p.heads_q,
                                    heads_sharing_l2(bytes_per_q_head, p.l2_bytes, int64_t(p.batch) * p.heads_q),
                                    q_blocks);
    }
    g.scale_log2 = p.scale * LOG2E;
    g.tasks = int(tasks);
    g.whole_tasks = plan.whole_tasks, g.piece_shift = plan.piece_shift;
    if (plan.piece_shift > 0) {
        const int64_t slots = int64_t(plan.split_tasks) << plan.piece_shift;
        g.partial_o = p.partials;
        g.partial_lse = p.partials + slots * 64 * C * D;
        g.pieces_done = p.pieces_done;
    }

    constexpr int smem = kt::shared_bytes_for<Sh>();
    static_assert(smem <= 227 * 1024, "forward: shared memory over the sm_90 limit");
    const int sms = p.multiprocessors;
    if (sms <= 0) return cudaErrorInvalidDevice;
    const unsigned blocks = unsigned(tasks < sms ? tasks : sms);  // persistent: one block per SM
    constexpr int threads = (C + 1) * 4 * kt::WARP_THREADS;
    if constexpr (PAIRS_SHARE_KV<D, CAUSAL, C>) {
        auto kernel = forward_kernel_sm90<T, D, CAUSAL, C, 2>;
        // Paired only where the whole grid runs at once (else one block per SM would need a
        // second round: each GPC with an odd number of SMs leaves one out of its clusters).
        if (paired_tasks(p, q_blocks) && 2 * kt::cluster::clusters_at_once(kernel, 2, threads, smem) >= int(blocks)) {
            if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
            const kt::cluster::launch_config launch(int(blocks), 2, threads, smem, stream);
            return cudaLaunchKernelEx(&launch.config, kernel, g);
        }
    }
    auto kernel = forward_kernel_sm90<T, D, CAUSAL, C, 1>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, smem)) return e;
    kernel<<<blocks, threads, smem, stream>>>(g);
    return cudaGetLastError();
}

template <typename T, int D, bool CAUSAL>
cudaError_t Sm90Forward::run(const ForwardParams& p, const ForwardSm90Plan& plan, cudaStream_t stream) {
    if constexpr (D == 64 && CAUSAL)
        if (plan.consumers == 2) return launch<T, D, CAUSAL, 2>(p, plan, stream);
    if constexpr (D == 128 && !CAUSAL)
        if (plan.consumers == 3) return launch<T, D, CAUSAL, 3>(p, plan, stream);
    return launch<T, D, CAUSAL, CONSUMERS<D>>(p, plan, stream);
}

}  // namespace

ForwardSm90Plan plan_forward_sm90(const ForwardParams& params) {
    ForwardSm90Plan plan{};
    plan.consumers = consumers_for(params);
    const TailSplit split = tail_split(params, plan.consumers);
    plan.whole_tasks = split.whole_tasks, plan.split_tasks = split.split_tasks, plan.piece_shift = split.piece_shift;
    plan.needs_task_counter = params.causal;
    if (split.piece_shift > 0) {  // per slot a piece's O (rows x D) and lse (rows); a counter per warp
        const int64_t slots = int64_t(split.split_tasks) << split.piece_shift, rows = 64 * plan.consumers;
        plan.partial_floats = slots * rows * (params.head_dim + 1);
        plan.counters = int64_t(split.split_tasks) * rows / 16;
    }
    return plan;
}

cudaError_t forward_sm90(const ForwardParams& params, const ForwardSm90Plan& plan, cudaStream_t stream) {
    return dispatch<Sm90Forward>(params, plan, stream);
}

}  // namespace tk::attention
