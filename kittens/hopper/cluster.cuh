// Thread block clusters (sm_90): a block's rank in its cluster, the cluster-wide barrier,
// reads of another block's shared memory (distributed shared memory) and arrivals on another
// block's semaphores; on the host, the launch configuration of a clustered grid. The blocks of
// a cluster run at the same time on one GPC, so they can exchange results through shared memory
// instead of global memory, fences and counters, and share copies (TMA multicast).
#pragma once
#include <cuda_runtime.h>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include "../common/util.cuh"
#include "semaphore.cuh"

namespace kittens::cluster {

// This block's rank in its cluster (0 .. size() - 1); 0 in a launch without clusters.
__device__ __forceinline__ int rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return int(r);
}
__device__ __forceinline__ int size() {
    uint32_t n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
    return int(n);
}

// The cluster barrier, in two halves. It completes when every thread of the cluster that has
// not exited has arrived (threads that exited earlier do not hold it up). arrive() releases
// the thread's earlier memory accesses, wait() acquires everyone's: shared-memory writes made
// before all the arrivals are visible, in any block of the cluster, after the wait. A thread
// waits once after each arrival before it arrives again.
__device__ __forceinline__ void arrive() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }
__device__ __forceinline__ void sync() {
    arrive();
    wait();
}

// The address that `p`, a location in this block's shared memory, has in the shared memory of
// the cluster's block `rank` (the same variable there), for load_shared().
__device__ __forceinline__ uint32_t map_shared(const void* p, int rank) {
    uint32_t out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(shared_address(p)), "r"(rank));
    return out;
}

// One arrival on block `rank`'s copy of semaphore `s` (`s` is this block's; the blocks of a
// cluster lay out their shared memory alike): a consumer frees a stage that another block's
// copies also write into (TMA multicast). Release at CTA scope, as a local arrival: with
// .release.cluster, paired matmul tiles were much slower.
__device__ __forceinline__ void arrive_at(semaphore& s, int rank) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(map_shared(&s, rank)) : "memory");
}

// 16 bytes from any block's shared memory, at an address from map_shared().
__device__ __forceinline__ float4 load_shared(uint32_t address) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(address)
                 : "memory");
    return v;
}

// Host: a launch of `blocks` blocks (a multiple of `size`) in 1-D clusters of `size` blocks, for
// cudaLaunchKernelEx(&launch.config, kernel, args...) and cudaOccupancyMaxActiveClusters. The
// configuration points at the attribute beside it, so it is neither copied nor moved.
struct launch_config {
    cudaLaunchAttribute dimension{};
    cudaLaunchConfig_t config{};
    launch_config(int blocks, int size, int threads, int shared_bytes, cudaStream_t stream = nullptr) {
        dimension.id = cudaLaunchAttributeClusterDimension;
        dimension.val.clusterDim.x = size, dimension.val.clusterDim.y = 1, dimension.val.clusterDim.z = 1;
        config.gridDim = dim3(blocks), config.blockDim = dim3(threads);
        config.dynamicSmemBytes = shared_bytes, config.stream = stream;
        config.attrs = &dimension, config.numAttrs = 1;
    }
    launch_config(const launch_config&) = delete;
    launch_config& operator=(const launch_config&) = delete;
};

// Host: how many clusters of `size` blocks of `kernel` (`threads` threads and `shared_bytes` of
// dynamic shared memory each) the current device runs at once. A cluster lives on one GPC, so
// when the GPCs' SM counts are not multiples of `size` this is less than SMs / size. Asked of
// the driver once per device, kernel and size (setting the kernel's shared-memory attribute,
// as its launches do), then cached; 0 if the driver cannot say (its error cleared, so that the
// next launch does not report it).
template <typename Kernel>
int clusters_at_once(Kernel kernel, int size, int threads, int shared_bytes) {
    static std::mutex mutex;
    static std::map<std::tuple<int, const void*, int>, int> known;  // (device, kernel, size) -> clusters
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    const std::lock_guard<std::mutex> lock(mutex);
    const auto [at, added] = known.try_emplace({device, reinterpret_cast<const void*>(kernel), size}, 0);
    if (added) {
        const launch_config launch(size, size, threads, shared_bytes);
        if (allow_dynamic_shared_memory(kernel, shared_bytes) != cudaSuccess ||
            cudaOccupancyMaxActiveClusters(&at->second, kernel, &launch.config) != cudaSuccess) {
            at->second = 0;
            (void)cudaGetLastError();
        }
    }
    return at->second;
}

}  // namespace kittens::cluster
