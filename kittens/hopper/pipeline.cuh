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
// };
#pragma once
#include "semaphore.cuh"
#include "tma.cuh"
#include "../ops/group/group.cuh"

namespace kittens::pipeline {

template <typename L>
constexpr int threads() { return (L::consumer_warpgroups + 1) * 4 * WARP_THREADS; }

template <typename L>
constexpr int release_lag() {
    if constexpr (requires { L::release_lag; }) return L::release_lag;
    else return 0;
}

// Also checks the layout's stage constants where every compilation target sees them (the
// kernel body that reads them is compiled for sm_90a only).
template <typename L>
constexpr int shared_bytes() {
    static_assert(L::input_bytes > 0 && L::input_bytes % 16 == 0, "pipeline: a stage's TMA bytes are 16-byte multiples");
    static_assert(release_lag<L>() == 0 || release_lag<L>() == 1, "pipeline: release_lag is 0 or 1");
    return shared_bytes_for<typename L::inputs[L::stages], typename L::outputs, semaphore[2 * L::stages]>();
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
    extern __shared__ char smem[];
    shared_allocator alloc(smem);
    auto& ring = alloc.allocate<typename L::inputs[L::stages]>();
    auto& outputs = alloc.allocate<typename L::outputs>();
    auto& sems = alloc.allocate<semaphore[2 * L::stages]>();
    semaphore* full = sems;                // producer -> consumers: stage loaded
    semaphore* empty = sems + L::stages;   // consumers -> producer: stage free
    if (threadIdx.x == 0) {
        for (int s = 0; s < L::stages; s++) {
            init_semaphore(full[s], 1);
            init_semaphore(empty[s], L::consumer_warpgroups * 4);  // one arrival per consumer warp
        }
        fence_semaphore_init();
    }
    __syncthreads();

    const int warpgroup = warpgroup_id();
    typename L::task task;
    if (warpgroup == L::consumer_warpgroups) {  // producer
        decrease_registers<producer_registers<L>()>();
        if (threadIdx.x % (4 * WARP_THREADS) != 0) return;
        int it = 0;  // input stages issued so far, over all tasks of this block
        for (int index = blockIdx.x; L::get_task(task, index, g); index += gridDim.x) {
            const int n = L::iterations(task, g);
            for (int i = 0; i < n; i++, it++) {
                const int s = it % L::stages;
                if (it >= L::stages) wait(empty[s], (it / L::stages - 1) % 2);
                expect_bytes(full[s], L::input_bytes);
                L::load(ring[s], task, i, g, full[s]);
            }
        }
    } else {  // consumers
        increase_registers<consumer_registers<L>()>();
        typename L::registers regs;
        constexpr int lag = release_lag<L>();
        static_assert(lag == 0 || lag == 1, "pipeline: release_lag is 0 or 1");
        int it = 0;
        for (int index = blockIdx.x; L::get_task(task, index, g); index += gridDim.x) {
            L::setup(regs, task);
            const int n = L::iterations(task, g);
            for (int i = 0; i < n; i++, it++) {
                const int s = it % L::stages;
                wait(full[s], (it / L::stages) % 2);
                L::compute(regs, ring[s], task, i, warpgroup);
                __syncwarp();
                if (lane_id() == 0 && i >= lag) arrive(empty[(it - lag) % L::stages]);
            }
            if constexpr (lag == 1) {
                L::drain(regs, warpgroup);
                __syncwarp();
                if (lane_id() == 0 && n > 0) arrive(empty[(it - 1) % L::stages]);
            }
            L::finish(regs, outputs, task, g, warpgroup);
        }
        if constexpr (requires { L::cleanup(outputs, warpgroup); }) L::cleanup(outputs, warpgroup);
    }
#endif
}

}  // namespace kittens::pipeline
