// The one dispatch table of the attention kernels: run-time (dtype, head dim, causal) to the
// compile-time instantiation of a kernel's launch function. Each kernel file describes its
// launch as a struct naming the head dims it is built for (`using head_dims = ...`, head_dims.h)
// with `template <typename T, int D, bool CAUSAL> static cudaError_t run(const Params&, ...)`,
// and calls dispatch<ThatStruct>(params, ...); a launch that does not depend on causality
// (backward_statistics.cu) calls with_dtype_and_head_dim directly.
#pragma once
#include <cuda_runtime.h>

#include "attention/attention_params.h"
#include "attention/head_dims.h"
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

namespace detail {
template <typename T, int... Ds, typename F>
cudaError_t with_head_dim(HeadDims<Ds...>, int head_dim, F& f) {
    cudaError_t result = cudaErrorInvalidValue;  // the op layer passes only the family's head dims
    (void)((head_dim == Ds && (result = f.template operator()<T, Ds>(), true)) || ...);
    return result;
}
}  // namespace detail

// f.template operator()<T, D>() for a run-time dtype and head dim, D one of Dims (head_dims.h).
template <typename Dims, typename F>
cudaError_t with_dtype_and_head_dim(ElementType dtype, int head_dim, F&& f) {
    return dtype == ElementType::bf16 ? detail::with_head_dim<kittens::bf16>(Dims{}, head_dim, f)
                                      : detail::with_head_dim<kittens::half>(Dims{}, head_dim, f);
}

template <typename Kernel, typename Params, typename... Args>
cudaError_t dispatch(const Params& p, const Args&... args) {
    return with_dtype_and_head_dim<typename Kernel::head_dims>(p.dtype, p.head_dim, [&]<typename T, int D>() {
        return p.causal ? Kernel::template run<T, D, true>(p, args...)
                        : Kernel::template run<T, D, false>(p, args...);
    });
}

}  // namespace tk::attention
