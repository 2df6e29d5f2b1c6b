// Thread block clusters (sm_90): a block's rank in its cluster, the cluster-wide barrier, and
// reads of another block's shared memory (distributed shared memory). The blocks of a cluster
// run at the same time on one GPC, so they can exchange results through shared memory instead
// of global memory, fences and counters.
#pragma once
#include <cstdint>
#include "../common/util.cuh"

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

// 16 bytes from any block's shared memory, at an address from map_shared().
__device__ __forceinline__ float4 load_shared(uint32_t address) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(address)
                 : "memory");
    return v;
}

}  // namespace kittens::cluster
