// The one dispatch table of the attention kernels: run-time (dtype, head dim, causal) to the
// compile-time instantiation of a kernel's launch function. Each kernel file describes its
// launch as a struct with `template <typename T, int D, bool CAUSAL> static cudaError_t
// run(const Params&, cudaStream_t)` and calls dispatch<ThatStruct>(params, stream).
#pragma once
#include <cuda_runtime.h>

#include "attention/forward_params.h"
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

template <typename Kernel, typename Params>
cudaError_t dispatch(const Params& p, cudaStream_t stream) {
    auto with_causal = [&]<typename T, int D>() {
        return p.causal ? Kernel::template run<T, D, true>(p, stream) : Kernel::template run<T, D, false>(p, stream);
    };
    auto with_head_dim = [&]<typename T>() {
        switch (p.head_dim) {
            case 64: return with_causal.template operator()<T, 64>();
            case 96: return with_causal.template operator()<T, 96>();
            case 128: return with_causal.template operator()<T, 128>();
            default: return cudaErrorInvalidValue;  // the op layer only passes 64, 96 and 128
        }
    };
    return p.dtype == ElementType::bf16 ? with_head_dim.template operator()<kittens::bf16>()
                                        : with_head_dim.template operator()<kittens::half>();
}

}  // namespace tk::attention
