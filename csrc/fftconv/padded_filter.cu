// The filter zero-padded to the FFT length in fp32 (params.h, PaddedFilterParams): each thread
// writes 16 bytes of a padded row, k's values where the row has them and zeros past its length,
// so the padded rows are written once. A plain streaming kernel (any GPU the extension targets).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "fftconv/params.h"

namespace tk::fftconv {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxRowBlocks = 65535;  // gridDim.y's limit; more rows are strided over

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// Block (x, y): float4s x * kThreads .. of rows y, y + gridDim.y, ...
template <typename T>
__global__ void __launch_bounds__(kThreads) padded_filter(const T* __restrict__ k, int64_t stride_h,
                                                          int64_t stride_t, int64_t heads, int length, int width,
                                                          float4* __restrict__ out) {
    const int t = (int(blockIdx.x) * kThreads + int(threadIdx.x)) * 4;
    if (t >= width) return;
    for (int64_t h = blockIdx.y; h < heads; h += gridDim.y) {
        const T* row = k + h * stride_h;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = t + j < length ? to_float(row[int64_t(t + j) * stride_t]) : 0.f;
        out[(h * width + t) / 4] = make_float4(v[0], v[1], v[2], v[3]);
    }
}

template <typename T>
cudaError_t launch(const PaddedFilterParams& p, cudaStream_t stream) {
    const dim3 grid(unsigned((p.width / 4 + kThreads - 1) / kThreads), unsigned(std::min<int64_t>(p.heads, kMaxRowBlocks)));
    padded_filter<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(p.k), p.k_stride_h, p.k_stride_t, p.heads,
                                                    p.length, p.width, reinterpret_cast<float4*>(p.out));
    return cudaGetLastError();
}

}  // namespace

cudaError_t fftconv_padded_filter(const PaddedFilterParams& p, cudaStream_t stream) {
    if (p.heads < 1 || p.length < 1 || p.length > p.width || p.width % 4 != 0) return cudaErrorInvalidValue;
    switch (p.type) {
        case FilterType::fp32: return launch<float>(p, stream);
        case FilterType::bf16: return launch<__nv_bfloat16>(p, stream);
        case FilterType::fp16: return launch<__half>(p, stream);
    }
    return cudaErrorInvalidValue;
}

}  // namespace tk::fftconv
