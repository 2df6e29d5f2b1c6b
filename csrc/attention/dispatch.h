// The one dispatch table of the attention kernels: run-time (dtype, head dim, causal) to the
// compile-time instantiation of a kernel's launch function. Each kernel file describes its
// launch as a struct with `template <typename T, int D, bool CAUSAL> static cudaError_t
// run(const Params&, cudaStream_t)` and calls dispatch<ThatStruct>(params, stream); a launch that
// does not depend on causality (backward_statistics.cu) calls with_dtype_and_head_dim directly.
#pragma once
#include <cuda_runtime.h>

#include "attention/attention_params.h"
#include "kittens/common/base_types.cuh"
#include "kittens/types/global/gl.cuh"

namespace tk::attention {

// A (batch, heads, length, D) operand of the params as the tile core's global layout.
template <typename T, int D>
kittens::gl<T> head_major(const void* data, int batch, int heads, int len, int64_t stride_b, int64_t stride_h,
                          int64_t stride_l) {
    return kittens::gl<T>(static_cast<T*>(const_cast<void*>(data)), batch, heads, len, D, stride_b, stride_h,
                          stride_l);
}

// f.template operator()<T, D>() for a run-time dtype and head dim: the one list of the head dims
// the kernels are built for.
template <typename F>
cudaError_t with_dtype_and_head_dim(ElementType dtype, int head_dim, F&& f) {
    auto with_head_dim = [&]<typename T>() {
        switch (head_dim) {
            case 64: return f.template operator()<T, 64>();
            case 96: return f.template operator()<T, 96>();
            case 128: return f.template operator()<T, 128>();
            default: return cudaErrorInvalidValue;  // the op layer only passes 64, 96 and 128
        }
    };
    return dtype == ElementType::bf16 ? with_head_dim.template operator()<kittens::bf16>()
                                      : with_head_dim.template operator()<kittens::half>();
}

template <typename Kernel, typename Params>
cudaError_t dispatch(const Params& p, cudaStream_t stream) {
    return with_dtype_and_head_dim(p.dtype, p.head_dim, [&]<typename T, int D>() {
        return p.causal ? Kernel::template run<T, D, true>(p, stream) : Kernel::template run<T, D, false>(p, stream);
    });
}

}  // namespace tk::attention
