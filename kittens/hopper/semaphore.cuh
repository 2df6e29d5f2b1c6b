// mbarrier semaphores (sm_90): a CTA-scope barrier that counts thread arrivals and,
// for the copy engine, transaction bytes. A phase completes when every expected
// arrival and byte has come; waiters name the phase parity they wait for.
#pragma once
#include <cstdint>
#include "../common/util.cuh"

namespace kittens {

struct alignas(8) semaphore {
    uint64_t state;
};

// Set up with the number of arrivals that completes a phase. One thread calls it,
// then the block synchronises (fence_semaphore_init + __syncthreads).
__device__ __forceinline__ void init_semaphore(semaphore& s, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(&s)), "r"(arrivals) : "memory");
}

// Makes initialised semaphores visible to the copy engine (async proxy).
__device__ __forceinline__ void fence_semaphore_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void invalidate_semaphore(semaphore& s) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(shared_address(&s)) : "memory");
}

// One arrival that also announces `bytes` more transaction bytes for this phase
// (issued by the thread that starts the copies).
__device__ __forceinline__ void expect_bytes(semaphore& s, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(&s)), "r"(bytes)
                 : "memory");
}

// `count` plain arrivals (release semantics: this thread's earlier writes are
// visible to whoever waits on the phase).
__device__ __forceinline__ void arrive(semaphore& s, uint32_t count = 1) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(&s)), "r"(count)
                 : "memory");
}

// Block until the phase with parity `phase` (0 or 1) has completed.
__device__ __forceinline__ void wait(semaphore& s, int phase) {
    const uint32_t addr = shared_address(&s);
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "retry:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra retry;\n"
        "}\n" ::"r"(addr),
        "r"(phase)
        : "memory");
}

// Non-blocking test of the same.
__device__ __forceinline__ bool test_wait(semaphore& s, int phase) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(shared_address(&s)), "r"(phase)
        : "memory");
    return done != 0;
}

// Ordinary shared-memory writes (st.shared, stmatrix) that the copy engine or wgmma
// reads next must be fenced into the async proxy by each writing thread, before the
// barrier that publishes them.
__device__ __forceinline__ void fence_async_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace kittens

namespace kittens {

// Register reallocation between warpgroups (sm_90a): a producer warpgroup gives
// registers back (decrease), consumers take them (increase). Every thread of the
// warpgroup executes it; the kernel needs __launch_bounds__(threads, 1) for the
// compiler to honour it.
template <int REGISTERS> __device__ __forceinline__ void increase_registers() {
    static_assert(REGISTERS % 8 == 0 && REGISTERS >= 24 && REGISTERS <= 256, "setmaxnreg: 24..256, a multiple of 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}
template <int REGISTERS> __device__ __forceinline__ void decrease_registers() {
    static_assert(REGISTERS % 8 == 0 && REGISTERS >= 24 && REGISTERS <= 256, "setmaxnreg: 24..256, a multiple of 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}

}  // namespace kittens
