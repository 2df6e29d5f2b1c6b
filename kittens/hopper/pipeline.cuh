// The load / compute / finish producer-consumer template (sm_90a).
//
// A kernel author describes one problem as a Layout struct and writes small static
// functions; the template owns the persistent task loop, the STAGES-deep ring of
// shared input blocks, the full/empty semaphores with their phases, and the register
// split between the producer warpgroup (one thread issues TMA loads) and the consumer
// warpgroups (tensor-core work).
//
// struct Layout {
//     static constexpr int consumer_warpgroups, stages;
//     using globals = ...;        // kernel arguments (tensor maps, layouts, sizes)
//     using inputs = ...;         // one stage of shared tiles
//     using outputs = ...;        // shared staging for results (may be an empty struct)
//     using task = ...;           // what one unit of work needs to know
//     using registers = ...;      // a consumer warpgroup's accumulators
//     static bool get_task(task&, int index, const globals&);           // false: no more work
//     static int iterations(const task&, const globals&);               // input stages per task
//     static constexpr uint32_t input_bytes;                            // TMA bytes per stage
//     static void load(inputs&, const task&, int it, const globals&, semaphore&);
//         // producer thread: start the TMA copies of iteration `it` on the semaphore
//     static void setup(registers&, const task&);                       // per consumer warpgroup
//     static void compute(registers&, inputs&, const task&, int it, int consumer);
//         // consumer warpgroup `consumer`; must finish reading `inputs` before returning,
//         // unless release_lag is 1 (below)
//     static void finish(registers&, outputs&, const task&, const globals&, int consumer);
//
//     // Optional:
//     static constexpr int release_lag = 1;
//         // compute(it) may return while still reading stage it (e.g. one wgmma group left
//         // in flight) but is done with stage it-1, which the template then releases; before
//         // finish, drain(registers&, consumer) must end all reads of the last stage.
//     static void cleanup(outputs&, int consumer);  // after the last task of the block
//
//     static constexpr int cluster_size = 2;
//         // Run as clusters of this many CTAs (launch with cudaLaunchKernelEx and
//         // cudaLaunchAttributeClusterDimension {cluster_size, 1, 1}; a launch with another
//         // cluster size traps) whose CTAs share input tiles through TMA multicast. Then:
//         //   static bool get_task(task&, int index, const globals&, int cta_rank);
//         // `index` counts tasks of the whole cluster (cluster c takes c, c + clusters, ...)
//         // and cta_rank (0 .. cluster_size - 1) says which CTA asks: all CTAs of a cluster
//         // must get the same answer and the same iterations(); a CTA with nothing of its
//         // own to do still takes part (loads its share, computes, writes nothing). load()
//         // keeps its signature (record the rank in the task). The load() calls of the
//         // cluster's CTAs must together land exactly input_bytes in each CTA's stage, and
//         // each CTA's load() must write into the stage of every CTA of the cluster (the
//         // phase argument below needs it): e.g. its own tiles with tma::load_async and a
//         // 1/cluster_size share of the shared tiles with tma::load_async_multicast to all
//         // CTAs, at the same offset of the stage, on the semaphore it is given.
// };
//
// Synchronisation (S stages, W = consumer_warpgroups, C = cluster_size, 1 by default).
// "Use v" of stage s is the v-th time the ring comes round to it (iteration v * S + s).
//   full[s]:  1 arrival (this CTA's producer: expect_bytes(input_bytes)) + input_bytes of
//             TMA transactions, whichever CTA of the cluster issued the copies. A partner's
//             multicast may complete its bytes before the local expect_bytes of the same
//             phase: the transaction count goes negative, and the phase cannot complete
//             without the local arrival.
//   empty[s]: C * W * 4 arrivals: lane 0 of every consumer warp of every CTA of the
//             cluster releases stage s in every CTA of the cluster (arrive locally,
//             arrive_remote on the others) once its warpgroup's reads of that use are done,
//             because every CTA's producer writes into every CTA's stage s.
//   Phases stay in step across the cluster. All CTAs walk the same tasks with the same
//   iteration counts, so use v of stage s is the same iteration everywhere. No consumer
//   warp anywhere can arrive for use v+1 on empty[s] of CTA X before X's empty[s] phase v
//   has completed: it first waited for full[s] use v+1 of its own CTA, which needs X's
//   producer's copies of use v+1, which X's producer issues only after that phase. So
//   when phase v completes, its C * W * 4 arrivals are exactly one per warp for use v:
//   every consumer of the cluster is done reading use v, and X's producer may overwrite
//   stage s in every CTA. Likewise the bytes of use v+1 cannot reach a CTA's full[s]
//   before its phase v completed (its consumers released use v after waiting for it).
//   With C > 1 the semaphores are initialised, then a cluster barrier (no remote arrival
//   or multicast reaches an uninitialised semaphore), and every thread of the block ends
//   on a cluster barrier: no CTA exits (its shared memory going to another block) while a
//   partner's consumers may still arrive on its semaphores. Every copy into a CTA has
//   landed by then, since its consumers waited for every full phase; idle producer
//   threads wait at that barrier instead of exiting.
#pragma once
#include "semaphore.cuh"
#include "cluster.cuh"
#include "tma.cuh"
#include "../ops/group/group.cuh"

namespace kittens::pipeline {

template <typename L>
constexpr int threads() { return (L::consumer_warpgroups + 1) * 4 * WARP_THREADS; }

template <typename L>
constexpr int shared_bytes() {
    return shared_bytes_for<typename L::inputs[L::stages], typename L::outputs, semaphore[2 * L::stages]>();
}

template <typename L>
constexpr int release_lag() {
    if constexpr (requires { L::release_lag; }) return L::release_lag;
    else return 0;
}

template <typename L>
constexpr int cluster_size() {
    if constexpr (requires { L::cluster_size; }) return L::cluster_size;
    else return 1;
}

template <typename L>
__device__ __forceinline__ bool get_task(typename L::task& t, int index, const typename L::globals& g, int rank) {
    if constexpr (cluster_size<L>() == 1) return L::get_task(t, index, g);
    else return L::get_task(t, index, g, rank);
}

// The tasks of a block (of a cluster when C > 1): first_task(), + task_step(), ...
template <int C> __device__ __forceinline__ int first_task() {
    if constexpr (C == 1) return blockIdx.x;
    else return cluster::id();
}
template <int C> __device__ __forceinline__ int task_step() {
    if constexpr (C == 1) return gridDim.x;
    else return cluster::count();
}

// Registers per thread after the split: the producer keeps few, consumers share the rest
// of the 64K-register file (multiples of 8, at most 240).
template <typename L> constexpr int producer_registers() { return 40; }
template <typename L> constexpr int consumer_registers() {
    constexpr int available = 65536 / (4 * WARP_THREADS) - producer_registers<L>();
    constexpr int each = available / L::consumer_warpgroups / 8 * 8;
    return each > 240 ? 240 : each;
}

template <typename L>
__global__ void __launch_bounds__(threads<L>(), 1) kernel(const __grid_constant__ typename L::globals g) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Compiled for a GPU without the sm_90a features (an extension also built for sm_80,
    // say): no body there, and the host side launches it only on sm_90.
#else
    constexpr int C = cluster_size<L>();
    static_assert(C >= 1 && C <= 16, "pipeline: cluster_size is 1 .. 16");
    extern __shared__ char smem[];
    shared_allocator alloc(smem);
    auto& ring = alloc.allocate<typename L::inputs[L::stages]>();
    auto& outputs = alloc.allocate<typename L::outputs>();
    auto& sems = alloc.allocate<semaphore[2 * L::stages]>();
    semaphore* full = sems;                // producers -> consumers: stage loaded
    semaphore* empty = sems + L::stages;   // consumers (of the whole cluster) -> producer: stage free
    if (threadIdx.x == 0) {
        for (int s = 0; s < L::stages; s++) {
            init_semaphore(full[s], 1);
            init_semaphore(empty[s], C * L::consumer_warpgroups * 4);  // one arrival per consumer warp
        }
        fence_semaphore_init();
    }
    if constexpr (C == 1) {
        __syncthreads();
    } else {
        if (cluster::size() != C) __trap();  // launched without the clusters the layout needs
        cluster::sync();                     // every CTA's semaphores are initialised
    }
    const int rank = C == 1 ? 0 : cluster::rank();  // this CTA's rank in its cluster

    const int warpgroup = warp_id() / 4;
    typename L::task task;
    if (warpgroup == L::consumer_warpgroups) {  // producer
        decrease_registers<producer_registers<L>()>();
        if (threadIdx.x % (4 * WARP_THREADS) != 0) {
            if constexpr (C == 1) return;  // else: on to the final cluster barrier
        } else {
            int it = 0;  // input stages issued so far, over all tasks of this block
            for (int index = first_task<C>(); get_task<L>(task, index, g, rank); index += task_step<C>()) {
                const int n = L::iterations(task, g);
                for (int i = 0; i < n; i++, it++) {
                    const int s = it % L::stages;
                    if (it >= L::stages) wait(empty[s], (it / L::stages - 1) % 2);
                    expect_bytes(full[s], L::input_bytes);
                    L::load(ring[s], task, i, g, full[s]);
                }
            }
        }
    } else {  // consumers
        increase_registers<consumer_registers<L>()>();
        typename L::registers regs;
        constexpr int lag = release_lag<L>();
        static_assert(lag == 0 || lag == 1, "pipeline: release_lag is 0 or 1");
        // Stage s is free again, as far as this warp is concerned, in every CTA of the cluster.
        auto release = [&](int s) {
            arrive(empty[s]);
            if constexpr (C > 1)
                for (int r = 1; r < C; r++) arrive_remote(empty[s], (rank + r) % C);
        };
        int it = 0;
        for (int index = first_task<C>(); get_task<L>(task, index, g, rank); index += task_step<C>()) {
            L::setup(regs, task);
            const int n = L::iterations(task, g);
            for (int i = 0; i < n; i++, it++) {
                const int s = it % L::stages;
                wait(full[s], (it / L::stages) % 2);
                L::compute(regs, ring[s], task, i, warpgroup);
                __syncwarp();
                if (lane_id() == 0 && i >= lag) release((it - lag) % L::stages);
            }
            if constexpr (lag == 1) {
                L::drain(regs, warpgroup);
                __syncwarp();
                if (lane_id() == 0 && n > 0) release((it - 1) % L::stages);
            }
            L::finish(regs, outputs, task, g, warpgroup);
        }
        if constexpr (requires { L::cleanup(outputs, warpgroup); }) L::cleanup(outputs, warpgroup);
    }
    if constexpr (C > 1) cluster::sync();  // no CTA leaves while a partner may still arrive on it
#endif
}

}  // namespace kittens::pipeline
