// Launch helpers: a kernel's dynamic shared-memory limit set once per device, its blocks per SM
// queried once per device and size, and programmatic dependent launch (a kernel launched before
// the one ahead of it in the stream has finished, waiting for that one's writes on the device;
// sm_90 and newer).
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

namespace kittens {

// Host: raises `kernel`'s dynamic shared-memory limit on the current device to at least `bytes`.
// The attribute belongs to the function on each device and persists, so it is set the first time
// a (device, kernel) asks for more than it has, not at every launch: on a decoding step, where
// the host's time is most of the step, the call cost about as much as the launch itself.
inline cudaError_t allow_dynamic_shared_memory(const void* kernel, int bytes) {
    static std::mutex mutex;
    static std::map<std::pair<int, const void*>, int> allowed;  // (device, kernel) -> bytes set
    int device = 0;
    if (cudaError_t e = cudaGetDevice(&device)) return e;
    const std::lock_guard<std::mutex> lock(mutex);
    int& set = allowed[{device, kernel}];
    if (set >= bytes) return cudaSuccess;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)) return e;
    set = bytes;
    return cudaSuccess;
}

template <typename... Args>
cudaError_t allow_dynamic_shared_memory(void (*kernel)(Args...), int bytes) {
    return allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), bytes);
}

// Host: how many blocks of `kernel` (`threads` threads and `smem` bytes of dynamic shared memory
// each) one SM of the current device holds, the kernel's dynamic shared-memory limit raised to
// `smem` first. An answer is kept per (device, kernel, threads, smem), so a launch after the
// first queries nothing; a failed query is returned (and cleared from the runtime's last error),
// not kept.
inline cudaError_t blocks_per_sm(const void* kernel, int threads, int smem, int& blocks) {
    static std::mutex mutex;
    static std::map<std::tuple<int, const void*, int, int>, int> known;
    blocks = 0;
    int device = 0;
    if (cudaError_t e = cudaGetDevice(&device)) return e;
    const auto key = std::make_tuple(device, kernel, threads, smem);
    {
        const std::lock_guard<std::mutex> lock(mutex);
        if (auto it = known.find(key); it != known.end()) {
            blocks = it->second;
            return cudaSuccess;
        }
    }
    cudaError_t e = allow_dynamic_shared_memory(kernel, smem);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        blocks = 0;
        return e;
    }
    const std::lock_guard<std::mutex> lock(mutex);
    known[key] = blocks;
    return cudaSuccess;
}

template <typename... Args>
cudaError_t blocks_per_sm(void (*kernel)(Args...), int threads, int smem, int& blocks) {
    return blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem, blocks);
}

// Device, in a kernel launched with the attribute below: waits until the grid before it in the
// stream has finished and its memory writes are visible. Nothing to wait for before sm_90 (the
// attribute is not set there, and launches are ordered as usual).
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Device: lets the grid after this one in the stream (launched with the attribute below) start
// its blocks now rather than when this grid's blocks exit. Its wait_for_prior_grid still waits
// for all of this grid.
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Host: a launch of `blocks` x `threads` on `stream` that may begin while the grid before it in
// the stream is still running (the kernel calls wait_for_prior_grid before reading that grid's
// output), where `dependent` (the device is sm_90 or newer); a plain ordered launch otherwise.
// For cudaLaunchKernelEx(&launch.config, kernel, args...); the configuration points at the
// attribute beside it, so it is neither copied nor moved.
struct dependent_launch_config {
    cudaLaunchAttribute serialization{};
    cudaLaunchConfig_t config{};
    dependent_launch_config(unsigned blocks, int threads, int shared_bytes, cudaStream_t stream, bool dependent) {
        serialization.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        serialization.val.programmaticStreamSerializationAllowed = 1;
        config.gridDim = dim3(blocks), config.blockDim = dim3(threads);
        config.dynamicSmemBytes = shared_bytes, config.stream = stream;
        config.attrs = &serialization, config.numAttrs = dependent ? 1 : 0;
    }
    dependent_launch_config(const dependent_launch_config&) = delete;
    dependent_launch_config& operator=(const dependent_launch_config&) = delete;
};

}  // namespace kittens
