// Attention backward on Hopper (sm_90a): TMA + wgmma + warp specialisation.
//
// One block owns BLOCK_N = 128 keys of one (batch, kv head) and keeps dK and dV for them in
// registers: two consumer warpgroups, 64 keys each. It walks every query block (64 rows) of
// every query head of its GQA group that can see its keys, which reduces dK and dV over the
// group in registers (no atomics, deterministic). A producer thread loads K and V once, then
// streams Q_i and dO_i through a ring (2 stages at d128, 4 at d64); the consumers read the
// per-row statistics from global memory a step ahead. Per query block, with c = scale * log2(e) and the statistics lse2 = lse * log2(e),
// delta = rowsum(dO * O):
//   S^T  = K Q_i^T,   dP^T = V dO_i^T                 wgmma, operands from shared memory
//   P^T  = exp2(S^T c - lse2)   (causal: 0 where key > query)
//   dS^T = P^T (dP^T - delta)
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
// At the end dK is scaled by `scale` and both are stored (rows past Lk skipped); the op layer
// scales and converts the dQ accumulator. Keys past Lk load as zero rows: their P and dS
// only multiply those zero rows (dQ) or land in rows that are never stored (dK, dV), so only
// causality needs a mask. Query rows past Lq have lse2 = +inf (P = 0) and zero dO.
#include <cuda.h>

#include "kittens/kittens.cuh"
#include "kittens/hopper/hopper.cuh"
#include "kittens/hopper/tma_cache.cuh"
#include "attention/dispatch.h"
#include "attention/forward_params.h"

namespace tk::attention {
namespace {

namespace kt = kittens;

constexpr int CONSUMERS = 2;
constexpr int BLOCK_N = 64 * CONSUMERS;  // keys per block
constexpr int BLOCK_M = 64;              // query rows per step
// Q/dO ring depth: what fits beside K, V and the dS/dQ staging (d128 uses ~225 of 227 KiB).
template <int D> constexpr int STAGES = D <= 64 ? 4 : 2;
// Named barriers (0: __syncthreads; 1 + c: warpgroup c's own): the step's dS^T is complete in
// shared memory (4 + parity), and the step's dQ product has read it (6 + parity).
constexpr int DS_READY = 4, DS_FREE = 6;
constexpr int PRODUCER_REGISTERS = 24, CONSUMER_REGISTERS = 240;
constexpr float LOG2E = 1.4426950408889634f;

template <typename T, int D>
struct Shared {
    using kv_tile = kt::st<T, BLOCK_N, D>;
    using q_tile = kt::st<T, BLOCK_M, D>;
    using ds_tile = kt::st<T, BLOCK_N, BLOCK_M>;  // dS^T: the block's keys x the step's queries
    using dq_tile = kt::st<float, BLOCK_M, D>;
    kv_tile k, v;
    q_tile q[STAGES<D>], dout[STAGES<D>];
    ds_tile ds[2];          // by step parity; warpgroup c writes rows 64c..64c+63
    dq_tile dq[CONSUMERS];  // each warpgroup's staging for its TMA reduce-adds
    kt::semaphore kv_full, in_full[STAGES<D>], in_empty[STAGES<D>];
};

template <typename T, int D>
struct Globals {
    CUtensorMap q_map, k_map, v_map, dout_map, dq_map;
    kt::gl<T> dk, dv;
    kt::gl<float> lse2, delta;  // (B, Hq, 1, len_q_padded)
    int batch, heads_q, heads_kv, group_size, len_q, len_kv;
    float scale, scale_log2;
};

template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__((CONSUMERS + 1) * 4 * kt::WARP_THREADS, 1)
    backward_kernel_sm90(const __grid_constant__ Globals<T, D> g) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Compiled for a GPU without sm_90a features: no body (the host launches it only on sm_90).
#else
    using S = Shared<T, D>;
    constexpr int STAGES = attention::STAGES<D>;
    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    S& sh = alloc.allocate<S>();

    // Task: (batch, kv head, key block).
    const int kv_blocks = kt::ceil_div(g.len_kv, BLOCK_N);
    const int kv_block = blockIdx.x % kv_blocks;
    const int bh = blockIdx.x / kv_blocks;
    const int b = bh / g.heads_kv, h_kv = bh % g.heads_kv;
    const int key0 = kv_block * BLOCK_N;

    // Steps: every query block that sees a key of this block, for each query head of the group.
    const int q_blocks = kt::ceil_div(g.len_q, BLOCK_M);
    const int first_q_block = CAUSAL ? min(q_blocks, key0 / BLOCK_M) : 0;
    const int per_head = q_blocks - first_q_block;
    const int steps = per_head * g.group_size;
    // Causal steps need a mask while the query block starts before this block's last key.
    auto step_q_block = [&](int step) { return first_q_block + step % per_head; };
    auto step_head = [&](int step) { return h_kv * g.group_size + step / per_head; };

    if (threadIdx.x == 0) {
        kt::init_semaphore(sh.kv_full, 1);
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
            kt::expect_bytes(sh.kv_full, 2 * kt::tma::tile_bytes<typename S::kv_tile>());
            kt::tma::load_async(sh.k, &g.k_map, kt::coord{b, h_kv, kv_block, 0}, sh.kv_full);
            kt::tma::load_async(sh.v, &g.v_map, kt::coord{b, h_kv, kv_block, 0}, sh.kv_full);
            for (int step = 0; step < steps; step++) {
                const int s = step % STAGES, i = step_q_block(step), h = step_head(step);
                if (step >= STAGES) kt::wait(sh.in_empty[s], (step / STAGES - 1) % 2);
                kt::expect_bytes(sh.in_full[s], 2 * kt::tma::tile_bytes<typename S::q_tile>());
                kt::tma::load_async(sh.q[s], &g.q_map, kt::coord{b, h, i, 0}, sh.in_full[s]);
                kt::tma::load_async(sh.dout[s], &g.dout_map, kt::coord{b, h, i, 0}, sh.in_full[s]);
            }
        }
        return;
    }

    // ---- consumers ----
    kt::increase_registers<CONSUMER_REGISTERS>();
    const int consumer = warpgroup, warp = kt::warpgroup::warp();
    const int my_key0 = key0 + consumer * 64 + warp * 16;  // first key row of this warp
    const auto k_mine = kt::subtile<64, D>(sh.k, consumer, 0);
    const auto v_mine = kt::subtile<64, D>(sh.v, consumer, 0);

    using score_tile = kt::rt_fl<16, BLOCK_M>;  // keys x queries
    using column_values = typename score_tile::row_vec;
    kt::rt_fl<16, D> dk, dv;
    kt::zero(dk);
    kt::zero(dv);
    kt::rt<T, 16, BLOCK_M> p_t;  // register A operand of the dV product

    // One step per query block. dQ_i = dS K needs the dS of all 128 keys, so one warpgroup per
    // step (the step's parity: the "owner") computes it over both halves of dS^T and issues
    // one reduce-add; that halves the fp32 reduce traffic into L2 against a partial dQ per
    // warpgroup. The other warpgroup only signals: DS_READY when its half of dS^T is stored,
    // and it waits on DS_FREE (the owner's dQ has read that buffer) two steps later, before
    // overwriting it. Within a step the products are split into wgmma groups (completing in
    // issue order) that overlap the warpgroup's own elementwise work:
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
    // The statistics of a step's 64 query rows (a lane's columns), from global memory (L2):
    // loaded right before use they stalled the warps (ncu: 31% of stalls). At d64 they are
    // loaded a step ahead; at d128 that spills, so there while S^T and dP^T run.
    constexpr bool STATISTICS_AHEAD = D <= 64;
    column_values lse2, delta;
    auto load_statistics = [&](int step) {
        if (step < steps) {
            kt::load(lse2, g.lse2, kt::coord{b, step_head(step), 0, step_q_block(step)});
            kt::load(delta, g.delta, kt::coord{b, step_head(step), 0, step_q_block(step)});
        }
    };
    auto step_body = [&]<bool MASKED>(int step) {
        const int s = step % STAGES, i = step_q_block(step), h = step_head(step);
        const int parity = step % 2;
        const bool owner = parity == consumer;
        kt::wait(sh.in_full[s], (step / STAGES) % 2);
        score_tile s_t, dp_t;
        kt::wgmma::fence();
        kt::wgmma::mma_ABt(s_t, k_mine, sh.q[s], false);
        kt::wgmma::commit();
        kt::wgmma::mma_ABt(dp_t, v_mine, sh.dout[s], false);
        kt::wgmma::commit();
        if constexpr (!STATISTICS_AHEAD) load_statistics(step);  // while the products run
        kt::wgmma::wait<1>();  // S^T_j done
        kt::wgmma::fence_operand(s_t);

        kt::mul(s_t, s_t, g.scale_log2);
        kt::sub_col(s_t, s_t, lse2);
        if constexpr (MASKED) {
            const int query0 = i * BLOCK_M;
            kt::mask(s_t, [&](int r, int c) { return my_key0 + r <= query0 + c; }, kt::neg_infinity());
        }
        kt::exp2(s_t, s_t);  // P^T
        kt::wgmma::wait<0>();  // dP^T_j done
        kt::wgmma::fence_operand(dp_t);
        kt::sub_col(dp_t, dp_t, delta);
        kt::mul(dp_t, dp_t, s_t);  // dS^T
        kt::copy(p_t, s_t);

        // dS^T goes through shared memory, where dK += dS^T Q_i reads this warpgroup's rows as
        // a K-major A and dQ_i += dS K all rows as a transposed A: only P^T stays a register
        // operand, which keeps the products in flight within the registers.
        auto& ds_smem = sh.ds[parity];
        if (!owner && step >= 2) kt::warpgroup::sync_with<BOTH>(DS_FREE + parity);
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
            kt::wgmma::mma_AtB(dq, ds_smem, sh.k, false);
            kt::wgmma::commit();
            kt::wgmma::mma_AB(dv, p_t, sh.dout[s], true);
            kt::wgmma::mma_AB(dk, ds_mine, sh.q[s], true);
            kt::wgmma::commit();
            kt::wgmma::wait<1>();  // dQ_i done
            kt::wgmma::fence_operand(dq);
            const bool issuer = kt::warpgroup::thread() == 0;
            if (issuer) kt::tma::store_wait_read<0>();  // the last reduce-add has read the staging tile
            kt::warpgroup::sync(1 + consumer);
            kt::store(kt::subtile<16, D>(sh.dq[consumer], warp, 0), dq);
            kt::fence_async_proxy();
            kt::warpgroup::sync(1 + consumer);
            if (issuer) {
                kt::tma::store_add_async(&g.dq_map, sh.dq[consumer], kt::coord{b, h, i, 0});
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
        kt::wgmma::wait<0>();  // dV/dK_j (and dQ_j) done: p_t, dS^T and the stage are free
        kt::wgmma::fence_operand(p_t);
        kt::wgmma::fence_operand(dk);
        kt::wgmma::fence_operand(dv);
        if (owner && step + 2 < steps) kt::warpgroup::arrive_at<BOTH>(DS_FREE + parity);
        __syncwarp();
        if (kt::lane_id() == 0) kt::arrive(sh.in_empty[s]);  // Q_i and dO_i are read
        if constexpr (STATISTICS_AHEAD) load_statistics(step + 1);
    };

    if constexpr (STATISTICS_AHEAD) load_statistics(0);
    kt::wait(sh.kv_full, 0);
    for (int step = 0; step < steps; step++) {
        // Causal: the query block starts before this block's last key.
        const bool masked = CAUSAL && step_q_block(step) * BLOCK_M < key0 + BLOCK_N - 1;
        if (masked) step_body.template operator()<true>(step);
        else step_body.template operator()<false>(step);
    }
    // Epilogue: dK (scaled) and dV from registers, rows past Lk not stored.
    kt::mul(dk, dk, g.scale);
    kt::rt<T, 16, D> out;
    const kt::coord at{b, h_kv, my_key0 / 16, 0};
    kt::copy(out, dk);
    kt::store(g.dk, out, at);
    kt::copy(out, dv);
    kt::store(g.dv, out, at);
    if (kt::warpgroup::thread() == 0) kt::tma::store_wait<0>();  // reduce-adds done before the block ends
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
    auto tensor = [](const void* ptr, int batch, int heads, int len, int64_t sb, int64_t sh, int64_t sl) {
        return kt::gl<T>(static_cast<T*>(const_cast<void*>(ptr)), batch, heads, len, D, sb, sh, sl);
    };
    const kt::gl<T> q = tensor(p.q, p.batch, p.heads_q, p.len_q, p.q_stride_b, p.q_stride_h, p.q_stride_l);
    const kt::gl<T> k = tensor(p.k, p.batch, p.heads_kv, p.len_kv, p.k_stride_b, p.k_stride_h, p.k_stride_l);
    const kt::gl<T> v = tensor(p.v, p.batch, p.heads_kv, p.len_kv, p.v_stride_b, p.v_stride_h, p.v_stride_l);
    const kt::gl<T> dout =
        tensor(p.dout, p.batch, p.heads_q, p.len_q, p.dout_stride_b, p.dout_stride_h, p.dout_stride_l);
    const kt::gl<float> dq(p.dq_accum, p.batch, p.heads_q, p.len_q, D);
    CUtensorMap q_map, k_map, v_map, dout_map, dq_map;
    if (kt::tma::cached_tensor_map<typename Sh::q_tile>(&q_map, q) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::kv_tile>(&k_map, k) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::kv_tile>(&v_map, v) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::q_tile>(&dout_map, dout) != CUDA_SUCCESS ||
        kt::tma::cached_tensor_map<typename Sh::dq_tile>(&dq_map, dq) != CUDA_SUCCESS)
        return cudaErrorInvalidValue;
    const G g{q_map, k_map, v_map, dout_map, dq_map,
              kt::gl<T>(static_cast<T*>(p.dk), p.batch, p.heads_kv, p.len_kv, D),
              kt::gl<T>(static_cast<T*>(p.dv), p.batch, p.heads_kv, p.len_kv, D),
              kt::gl<float>(const_cast<float*>(p.lse2), p.batch, p.heads_q, 1, p.len_q_padded),
              kt::gl<float>(const_cast<float*>(p.delta), p.batch, p.heads_q, 1, p.len_q_padded), p.batch, p.heads_q, p.heads_kv, p.heads_q / p.heads_kv,
              p.len_q, p.len_kv, p.scale, p.scale * LOG2E};

    constexpr int smem = kt::shared_bytes_for<Sh>();
    static_assert(smem <= 227 * 1024, "backward: shared memory over the sm_90 limit");
    auto kernel = backward_kernel_sm90<T, D, CAUSAL>;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) return e;
    const int64_t blocks = int64_t(kt::ceil_div(p.len_kv, BLOCK_N)) * p.batch * p.heads_kv;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    kernel<<<unsigned(blocks), (CONSUMERS + 1) * 4 * kt::WARP_THREADS, smem, stream>>>(g);
    return cudaGetLastError();
}

}  // namespace

cudaError_t backward_sm90(const BackwardParams& params, cudaStream_t stream) {
    return dispatch<Sm90Backward>(params, stream);
}

}  // namespace tk::attention
