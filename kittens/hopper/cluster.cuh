// Thread-block clusters (sm_90): the CTAs of a cluster run at the same time on one GPC
// and can reach each other's shared memory. Here: where a CTA sits in its cluster, and
// the cluster-wide barrier. (Semaphore arrivals on another CTA are in semaphore.cuh,
// TMA multicast in tma.cuh.)
//
// Clusters are set at launch (cudaLaunchKernelEx with cudaLaunchAttributeClusterDimension)
// and, in this core, are always 1-D along x: the CTAs of cluster c are blocks
// c * size .. c * size + size - 1.
#pragma once
#include <cstdint>

namespace kittens::cluster {

// Rank of this CTA in its cluster, 0 .. size() - 1 (%cluster_ctarank).
__device__ __forceinline__ int rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return int(r);
}

// CTAs in this cluster (%cluster_nctarank): 1 when launched without clusters.
__device__ __forceinline__ int size() {
    uint32_t n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
    return int(n);
}

// Index of this cluster in the grid along x, and the number of clusters along x
// (%clusterid.x, %nclusterid.x).
__device__ __forceinline__ int id() {
    uint32_t c;
    asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(c));
    return int(c);
}
__device__ __forceinline__ int count() {
    uint32_t n;
    asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(n));
    return int(n);
}

// Cluster-wide barrier, split in two: arrive (release: this thread's earlier memory
// operations, shared memory of other CTAs included, are visible to every thread of the
// cluster after its wait) and wait (acquire) until every thread of every CTA of the
// cluster has arrived. Non-.aligned forms: threads of one warp may call them apart.
// Every thread of the cluster must arrive, once per barrier phase.
__device__ __forceinline__ void arrive() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }

// arrive + wait: also a block-wide barrier (__syncthreads) at cluster scope.
__device__ __forceinline__ void sync() {
    arrive();
    wait();
}

}  // namespace kittens::cluster
