// Ordered reduction into a global accumulator (sm_90): blocks that reduce-add into the same
// global tile take turns in a fixed order, so that the fp32 sum comes out bitwise the same on
// every run.
//
// A turn counter is one int32 in global memory, zeroed before the launch. The block whose
// ticket is t (0, 1, 2, ...: its place in the order) waits until the counter reads t, issues
// its TMA reduce-add(s), and once they have been written advances the counter to t + 1. Each
// call is made by the one thread that issues the copies.
//
// Deadlock: a waiting block spins, holding its SM. Tickets must therefore follow the order in
// which blocks take their work (a block only ever waits for work that a running block has
// already taken), and a block must end every turn it began before it waits for another.
#pragma once
#include "tma.cuh"

namespace kittens::ordered_reduce {

// Blocks until *counter == ticket (acquire at GPU scope), then orders the async-proxy copies
// this thread issues next after the turns that came before.
__device__ __forceinline__ void wait_for_turn(const int* counter, int ticket) {
    int seen;
    for (int backoff = 0;; backoff = backoff < 256 ? backoff + 32 : 256) {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
        if (seen == ticket) break;
        __nanosleep(backoff);
    }
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Waits until this thread's committed bulk copies (its reduce-adds of the turn, and any stores
// before them) have written global memory, then hands the turn on (release at GPU scope).
__device__ __forceinline__ void end_turn(int* counter) {
    tma::store_wait<0>();
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

}  // namespace kittens::ordered_reduce
