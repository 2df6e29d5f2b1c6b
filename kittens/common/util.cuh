// Small device helpers shared by every layer of the core.
#pragma once
#include <cstdint>
#include <type_traits>
#include "layout_math.cuh"

namespace kittens {

using layout_math::ceil_div;
using layout_math::TILE_DIM;

inline constexpr int WARP_THREADS = 32;
inline constexpr uint32_t FULL_MASK = 0xffffffffu;

__device__ __forceinline__ int lane_id() { return threadIdx.x % WARP_THREADS; }
__device__ __forceinline__ int warp_id() { return threadIdx.x / WARP_THREADS; }
// This thread's warpgroup (4 warps), broadcast from lane 0 so that the compiler knows it is the
// same across the warp: arithmetic on it (e.g. the wgmma descriptor of a warpgroup's sub-tile)
// then runs once per warp on the uniform datapath, instead of per lane plus a move into a
// uniform register before every wgmma.
__device__ __forceinline__ int warpgroup_id() { return __shfl_sync(FULL_MASK, warp_id() / 4, 0); }

// 32-bit shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Compile-time loop: f(std::integral_constant<int, i>) for i in [0, N).
template <int N, typename F, int I = 0>
__device__ __forceinline__ void static_for(F&& f) {
    if constexpr (I < N) {
        f(std::integral_constant<int, I>{});
        static_for<N, F, I + 1>(static_cast<F&&>(f));
    }
}

// Bump allocator over dynamic shared memory. Every allocation is aligned to 1024
// bytes, the period of the widest swizzle, so tiles index the same way whatever
// their position.
struct shared_allocator {
    char* next;
    __device__ explicit shared_allocator(void* base)
        : next(reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + 1023) & ~uintptr_t(1023))) {}
    template <typename T>
    __device__ T& allocate() {
        T* p = reinterpret_cast<T*>(next);
        next += (sizeof(T) + 1023) & ~size_t(1023);
        return *p;
    }
};

// Dynamic shared memory that allocations add to a kernel's request, each rounded up as
// shared_allocator places it (optional stages allocated after a kernel's own layout).
template <typename... Ts>
constexpr int added_shared_bytes_for() {
    return int((((sizeof(Ts) + 1023) / 1024 * 1024) + ... + size_t(0)));
}

// Dynamic shared memory a kernel must request for a list of allocations.
template <typename... Ts>
constexpr int shared_bytes_for() {
    return added_shared_bytes_for<Ts...>() + 1024;  // +1024: slack to align the dynamic shared memory base
}

}  // namespace kittens
