// Work split over blocks whose last finisher combines the parts (the attention forward's split
// key ranges; tk.matmul's split-K used it until its shares became one cluster, session 19):
// each part's warp writes its results to global memory and arrives at a counter; only the
// warp whose arrival completes the count reads all the parts back.
#pragma once
#include "../../../common/util.cuh"

namespace kittens {

// One warp's arrival at `counter` (int32 in global memory, zero at launch). The warp's global
// writes before the call are made visible at GPU scope before its arrival counts. Returns, in
// every lane, whether this arrival was the `arrivals`-th, i.e. the last; if so, the other
// arrivals' writes are visible to this warp's reads after the call. Read them through L2
// (e.g. __ldcg): another SM wrote them.
__device__ __forceinline__ bool arrive_last(int* counter, int arrivals) {
    __threadfence();
    __syncwarp();
    int before = 0;
    if (lane_id() == 0) before = atomicAdd(counter, 1);
    const bool last = __shfl_sync(0xffffffffu, before, 0) == arrivals - 1;
    if (last) __threadfence();
    return last;
}

}  // namespace kittens
