// Helpers shared by the test kernels: building kittens::gl from Python's
// description, dispatching element-type codes to types, launch checks.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "kittens/kittens.cuh"
#include "launchers.h"

namespace tk_test {

using namespace kittens;

template <typename T>
gl<T> make_gl(const gl_args& a) {
    if (a.size() != 8) throw std::runtime_error("gl_args needs 8 entries");
    return gl<T>(reinterpret_cast<T*>(a[0]), int(a[1]), int(a[2]), int(a[3]), int(a[4]), a[5], a[6], a[7]);
}

inline coord make_coord(const coord_args& a) {
    if (a.size() != 4) throw std::runtime_error("coord_args needs 4 entries");
    return coord{a[0], a[1], a[2], a[3]};
}

inline cudaStream_t as_stream(int64_t s) { return reinterpret_cast<cudaStream_t>(s); }

inline void check_cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

// Kernels needing more than 48 KiB of dynamic shared memory must opt in.
template <typename Kernel>
void allow_shared(Kernel kernel, int bytes) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
               "cudaFuncSetAttribute");
}

// f(std::type_identity<T>{}) for the element type with this code.
template <typename F>
void with_dtype(int code, F&& f) {
    switch (code) {
        case F32: return f(std::type_identity<float>{});
        case BF16: return f(std::type_identity<bf16>{});
        case F16: return f(std::type_identity<half>{});
    }
    throw std::runtime_error("unknown dtype code " + std::to_string(code));
}

}  // namespace tk_test
