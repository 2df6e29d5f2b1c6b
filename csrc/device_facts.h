// What the op layers (the files that include torch) need to know about the current device.
// Everything comes from torch's cached device properties: no CUDA query per call.
#pragma once
#include <ATen/cuda/CUDAContext.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

namespace tk {

// Refuses a device that is not sm_90 (Hopper) with a message naming the op, the device and
// its architecture; `otherwise` says what the Python layer does on such a device. Call it
// under a device guard for `device`.
inline void check_sm90(const c10::Device& device, const char* op, const char* otherwise) {
    const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
    TORCH_CHECK(props->major == 9 && props->minor == 0, op, "this kernel needs an sm_90 (Hopper) GPU, ", device,
                " is sm_", props->major, props->minor, "; ", otherwise);
}

// Multiprocessors of the current device (persistent grids size themselves by it).
inline int multiprocessor_count() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

// The most shared memory a block may have on the current device, bytes (its opt-in limit).
inline int shared_memory_per_block() {
    return static_cast<int>(at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin);
}

// Whether the current device takes programmatic dependent launches (sm_90 and newer).
inline bool supports_dependent_launch() { return at::cuda::getCurrentDeviceProperties()->major >= 9; }

// Bytes of L2 of the current device.
inline int64_t l2_cache_bytes() { return at::cuda::getCurrentDeviceProperties()->l2CacheSize; }

}  // namespace tk
