// The small elementwise kernels around the sm90 attention backward: the per-row statistics it
// reads (one warp per query row) and the conversion of its fp32 dq accumulator. Plain CUDA:
// each is one pass over memory, fused so the op layer needs no fp32 temporaries of dO * O.
#include "kittens/kittens.cuh"
#include "attention/forward_params.h"

namespace tk::attention {
namespace {

namespace kt = kittens;

constexpr float LOG2E = 1.4426950408889634f;
constexpr int WARPS_PER_BLOCK = 8;

// delta = rowsum(dO * O) and lse2 = lse * log2(e) for rows < Lq; 0 and +inf for the padding
// rows up to len_q_padded (the backward reads whole 64-row blocks). A row that saw no key
// (lse = -inf: lower-right causal with Lq > Lk) gets lse2 = +inf like padding, so the backward's
// P = exp2(s * c - lse2) is 0 there, not +inf (its out is 0, so its delta is 0 too).
template <typename T, int D>
__global__ void __launch_bounds__(WARPS_PER_BLOCK * kt::WARP_THREADS)
    statistics_kernel(const kt::gl<T> dout, const kt::gl<T> out, const float* lse, float* lse2, float* delta,
                      int heads_q, int len_q, int len_q_padded, int64_t rows) {
    const int64_t row = int64_t(blockIdx.x) * WARPS_PER_BLOCK + kt::warp_id();
    if (row >= rows) return;
    const int i = int(row % len_q_padded);
    const int64_t bh = row / len_q_padded;
    const int b = int(bh / heads_q), h = int(bh % heads_q);
    float dot = 0.f;
    if (i < len_q) {
#pragma unroll
        for (int c = kt::lane_id(); c < D; c += kt::WARP_THREADS)
            dot += kt::convert<float>(*dout.ptr(b, h, i, c)) * kt::convert<float>(*out.ptr(b, h, i, c));
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (kt::lane_id() == 0) {
        delta[row] = dot;
        const float inf = __int_as_float(0x7f800000);
        const float l = i < len_q ? lse[bh * len_q + i] : inf;
        lse2[row] = l == -inf ? inf : l * LOG2E;
    }
}

// dq = dq_accum * scale in T, both (B, Hq, Lq, D) contiguous; 4 elements per thread.
template <typename T>
__global__ void finish_dq_kernel(const float4* dq_accum, T* dq, float scale, int64_t quads) {
    for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < quads; q += int64_t(gridDim.x) * blockDim.x) {
        const float4 x = dq_accum[q];
        T* o = dq + q * 4;
        o[0] = kt::convert<T>(x.x * scale), o[1] = kt::convert<T>(x.y * scale);
        o[2] = kt::convert<T>(x.z * scale), o[3] = kt::convert<T>(x.w * scale);
    }
}

template <typename T, int D>
cudaError_t statistics(const BackwardParams& p, const OutputView& o, float* lse2, float* delta, cudaStream_t stream) {
    const kt::gl<T> dout(static_cast<T*>(const_cast<void*>(p.dout)), p.batch, p.heads_q, p.len_q, D,
                         p.dout_stride_b, p.dout_stride_h, p.dout_stride_l);
    const kt::gl<T> out(static_cast<T*>(const_cast<void*>(o.out)), p.batch, p.heads_q, p.len_q, D, o.stride_b,
                        o.stride_h, o.stride_l);
    const int64_t rows = int64_t(p.batch) * p.heads_q * p.len_q_padded;
    const int64_t blocks = (rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    statistics_kernel<T, D><<<unsigned(blocks), WARPS_PER_BLOCK * kt::WARP_THREADS, 0, stream>>>(
        dout, out, o.lse, lse2, delta, p.heads_q, p.len_q, p.len_q_padded, rows);
    return cudaGetLastError();
}

}  // namespace

cudaError_t backward_statistics(const BackwardParams& p, const OutputView& out, float* lse2, float* delta,
                                cudaStream_t stream) {
    const bool bf16 = p.dtype == ElementType::bf16;
    if (p.head_dim == 64)
        return bf16 ? statistics<kt::bf16, 64>(p, out, lse2, delta, stream)
                    : statistics<kt::half, 64>(p, out, lse2, delta, stream);
    if (p.head_dim == 128)
        return bf16 ? statistics<kt::bf16, 128>(p, out, lse2, delta, stream)
                    : statistics<kt::half, 128>(p, out, lse2, delta, stream);
    return cudaErrorInvalidValue;
}

cudaError_t backward_finish_dq(const BackwardParams& p, void* dq, cudaStream_t stream) {
    const int64_t quads = int64_t(p.batch) * p.heads_q * p.len_q * p.head_dim / 4;  // head_dim % 4 == 0
    const int threads = 256;
    const int64_t wanted = (quads + threads - 1) / threads;
    const unsigned blocks = unsigned(wanted < 65536 ? (wanted > 0 ? wanted : 1) : 65536);
    const auto* in = reinterpret_cast<const float4*>(p.dq_accum);
    if (p.dtype == ElementType::bf16)
        finish_dq_kernel<<<blocks, threads, 0, stream>>>(in, static_cast<kt::bf16*>(dq), p.scale, quads);
    else
        finish_dq_kernel<<<blocks, threads, 0, stream>>>(in, static_cast<kt::half*>(dq), p.scale, quads);
    return cudaGetLastError();
}

}  // namespace tk::attention
