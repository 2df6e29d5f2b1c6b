// The small elementwise kernels around the sm90 attention backward: the per-row statistics it
// reads (one warp per query row) and the conversion of its fp32 dq accumulator. Plain CUDA:
// each is one pass over memory, fused so the op layer needs no fp32 temporaries of dO * O.
#include "kittens/kittens.cuh"
#include "attention/dispatch.h"
#include "attention/attention_params.h"

namespace tk::attention {
namespace {

namespace kt = kittens;

constexpr int WARPS_PER_BLOCK = 8;

// Lanes that share a row of the statistics kernel: the largest power of two (up to a warp) that
// divides the row's 16-byte chunks.
template <typename T, int D>
constexpr int lanes_per_row() {
    constexpr int chunks = D * int(sizeof(T)) / 16;
    static_assert(D * int(sizeof(T)) % 16 == 0, "statistics: rows of whole 16-byte chunks");
    int lanes = 1;
    while (lanes < kt::WARP_THREADS && chunks % (2 * lanes) == 0) lanes *= 2;
    return lanes;
}

// Per query row (rows < Lq): neg_delta = -rowsum(dO * O) (O = out + out_residual where the
// forward left its rounding residual, see OutputView), score_shift = -lse / scale (-inf where
// lse is -inf: a row that sees no key gets P = 0), and its fp32 dq accumulator row zeroed (one
// pass instead of a separate fill). Padding rows up to len_q_padded (the backward reads whole
// 64-row blocks) get neg_delta 0 and score_shift -inf. Also zeroes the backward kernel's task
// counter (causal or deterministic) and dq turn counters (deterministic: one per 64-row block),
// as the kernel runs after this on the same stream. A row is LANES_PER_ROW lanes (a power of
// two, so the lanes of a row are one shuffle group) with CHUNKS 16-byte loads each: d64 8 x 1,
// d96 4 x 3, d128 16 x 1.
template <typename T, int D>
__global__ void __launch_bounds__(WARPS_PER_BLOCK * kt::WARP_THREADS)
    statistics_kernel(const kt::gl<T> dout, const kt::gl<T> out, const T* out_residual, const float* lse,
                      float* score_shift, float* neg_delta, float* dq_accum, float scale, int heads_q, int len_q,
                      int len_q_padded, int64_t rows, int* task_counter, int* dq_turns) {
    constexpr int CHUNK = 16 / int(sizeof(T));  // elements per 16-byte load
    constexpr int LANES_PER_ROW = lanes_per_row<T, D>(), ROWS_PER_WARP = kt::WARP_THREADS / LANES_PER_ROW;
    constexpr int CHUNKS = D / CHUNK / LANES_PER_ROW;
    if (task_counter != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *task_counter = 0;
    const int lane = kt::lane_id(), part = lane % LANES_PER_ROW;
    const int64_t row = (int64_t(blockIdx.x) * WARPS_PER_BLOCK + kt::warp_id()) * ROWS_PER_WARP + lane / LANES_PER_ROW;
    const int i = int(row % len_q_padded);
    const int64_t bh = row / len_q_padded;
    const bool real = row < rows && i < len_q;
    float dot = 0.f;
    if (real) {
        const int b = int(bh / heads_q), h = int(bh % heads_q);
#pragma unroll
        for (int chunk = 0; chunk < CHUNKS; chunk++) {
            const int c = (chunk * LANES_PER_ROW + part) * CHUNK;
            const uint4 x = *reinterpret_cast<const uint4*>(dout.ptr(b, h, i, c));
            const uint4 y = *reinterpret_cast<const uint4*>(out.ptr(b, h, i, c));
            const T* xs = reinterpret_cast<const T*>(&x);
            const T* ys = reinterpret_cast<const T*>(&y);
#pragma unroll
            for (int e = 0; e < CHUNK; e++) dot += kt::convert<float>(xs[e]) * kt::convert<float>(ys[e]);
            if (out_residual != nullptr) {
                const uint4 z = *reinterpret_cast<const uint4*>(out_residual + (bh * len_q + i) * D + c);
                const T* zs = reinterpret_cast<const T*>(&z);
#pragma unroll
                for (int e = 0; e < CHUNK; e++) dot += kt::convert<float>(xs[e]) * kt::convert<float>(zs[e]);
            }
        }
        float4* dq_row = reinterpret_cast<float4*>(dq_accum + (bh * len_q + i) * D);
#pragma unroll
        for (int q = part; q < D / 4; q += LANES_PER_ROW) dq_row[q] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int offset = LANES_PER_ROW / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (part == 0 && row < rows) {
        if (dq_turns != nullptr && i % 64 == 0) dq_turns[row / 64] = 0;  // len_q_padded % 64 == 0
        const float l = real ? lse[bh * len_q + i] : kt::neg_infinity();
        neg_delta[row] = -dot;
        score_shift[row] = l == kt::neg_infinity() ? kt::neg_infinity() : -l / scale;
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
cudaError_t statistics(const BackwardParams& p, const OutputView& o, cudaStream_t stream) {
    const kt::gl<T> dout =
        head_major<T, D>(p.dout, p.batch, p.heads_q, p.len_q, p.dout_stride_b, p.dout_stride_h, p.dout_stride_l);
    const kt::gl<T> out = head_major<T, D>(o.out, p.batch, p.heads_q, p.len_q, o.stride_b, o.stride_h, o.stride_l);
    const int64_t rows = int64_t(p.batch) * p.heads_q * p.len_q_padded;
    constexpr int rows_per_block = WARPS_PER_BLOCK * kt::WARP_THREADS / lanes_per_row<T, D>();
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    statistics_kernel<T, D><<<unsigned(blocks), WARPS_PER_BLOCK * kt::WARP_THREADS, 0, stream>>>(
        dout, out, static_cast<const T*>(o.out_residual), o.lse, p.score_shift, p.neg_delta, p.dq_accum, p.scale,
        p.heads_q, p.len_q, p.len_q_padded, rows, p.task_counter, p.dq_turns);
    return cudaGetLastError();
}

}  // namespace

cudaError_t backward_statistics(const BackwardParams& p, const OutputView& out, cudaStream_t stream) {
    return with_dtype_and_head_dim<Sm90HeadDims>(p.dtype, p.head_dim,
                                                 [&]<typename T, int D>() { return statistics<T, D>(p, out, stream); });
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
