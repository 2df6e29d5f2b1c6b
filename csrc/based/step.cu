// Based decoding step (step.h): T new tokens against the fp32 state, on CUDA cores (sm_80 and
// newer). The step is memory-bound: the state (273 x (Dv + 1) floats per (batch, head)) is read
// once and written once, the update and the output computed in the same pass.
//
// One block owns one (batch, head) slice and walks it as a flat array of L = 273 P floats
// (P = Dv + 1), in 16-byte vectors. P is odd, so rows are not 16-byte aligned; rather than
// follow rows, thread `tid` takes vectors tid, tid + THREADS, tid + 2 THREADS, ... of the slice.
// THREADS is a multiple of P, so the block's stride of 4 THREADS floats is a whole number of rows
// (a "band" of BAND_ROWS rows): each thread meets the same four columns in every band, only the
// row changes. It keeps [v_t, 1] at those columns in registers, and its four partial sums of
// phi(q_t)^T state over the rows it visits. A slice need not start 16-byte aligned (its offset
// is (b, h) dependent): the vectors are those of the aligned grid, the first and last of a slice
// partial (elements outside the slice are neither read nor written).
//
// The output column c is the sum of the partial sums of the BAND_ROWS (thread, element) pairs
// whose column is c: written to shared memory at their position in the band, then added in a
// fixed order (deterministic), then divided by the normaliser column's sum when normalize.
// Tokens are applied in order: each element gets every token of a group of up to MAX_TOKENS in
// registers (s += phi(k_t)[row] v_t[col]; acc_t += phi(q_t)[row] s); more tokens than that take
// further passes over the slice, each thread revisiting exactly the elements it wrote.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "based/step.h"

namespace tk::based {
namespace {

constexpr int VEC = 4;  // floats per 16-byte vector

template <int DV>
struct Shape {
    static constexpr int P = DV + 1;                          // state columns
    static constexpr int L = STATE_ROWS * P;                  // floats per slice
    static constexpr int THREADS = P * (DV == 64 ? 8 : 4);    // 520 or 516: a multiple of P
    static constexpr int BAND = VEC * THREADS;                // floats the block covers per pass
    static constexpr int BAND_ROWS = BAND / P;                // 32 or 16
    // Vectors per thread: a slice starts up to 3 floats into its first vector.
    static constexpr int ITERS = (L + VEC - 1 + BAND - 1) / BAND;
    static_assert(BAND % P == 0, "a thread must meet the same columns in every band");
};

// Vectors each thread loads before it computes on them: enough bytes in flight to cover HBM
// latency (with two blocks per SM), few enough registers for two blocks per SM.
constexpr int UNROLL = 3;

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

struct Scalars {
    float sqrt_scale;  // phi's linear features: sqrt(scale) x
    float kappa;       // phi's quadratic features: scale / sqrt(2) x_a x_b
    float eps;
    bool normalize;
};

template <int DV, int MAX_TOKENS>
struct Shared {
    float x[2][MAX_TOKENS][FEATURE_DIM];           // k, q of this group's tokens
    float phi[2][MAX_TOKENS][STATE_ROWS];          // phi(k), phi(q)
    float v[MAX_TOKENS][Shape<DV>::P];             // [v, 1]
    float partial[MAX_TOKENS][Shape<DV>::BAND];    // each token's partial sums, by band position
    float column[MAX_TOKENS][Shape<DV>::P];        // each token's column sums
};

template <typename T>
__device__ __forceinline__ float load(const T* base, int64_t index) {
    return to_float(base[index]);
}

// x[which][t][:] <- k or q of token t, [v_t, 1], then phi(k_t), phi(q_t).
template <typename T, int DV, int MAX_TOKENS>
__device__ void load_token_group(Shared<DV, MAX_TOKENS>& sh, const StepParams& p, int b, int h, int first,
                                 int count, const Scalars& s) {
    constexpr int P = Shape<DV>::P;
    const int tid = threadIdx.x;
    const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + h * p.k_stride[1];
    const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1];
    for (int i = tid; i < 2 * MAX_TOKENS * FEATURE_DIM; i += blockDim.x) {
        const int which = i / (MAX_TOKENS * FEATURE_DIM), t = i / FEATURE_DIM % MAX_TOKENS, d = i % FEATURE_DIM;
        float x = 0.f;
        if (t < count) {
            x = which == 0 ? load(k, (first + t) * p.k_stride[2] + d * p.k_stride[3])
                           : load(q, (first + t) * p.q_stride[2] + d * p.q_stride[3]);
        }
        sh.x[which][t][d] = x;
    }
    for (int i = tid; i < MAX_TOKENS * P; i += blockDim.x) {
        const int t = i / P, c = i % P;
        float x = 0.f;
        if (t < count) x = c < DV ? load(v, (first + t) * p.v_stride[2] + c * p.v_stride[3]) : 1.f;
        sh.v[t][c] = x;
    }
    __syncthreads();
    for (int i = tid; i < 2 * MAX_TOKENS * STATE_ROWS; i += blockDim.x) {
        const int which = i / (MAX_TOKENS * STATE_ROWS), t = i / STATE_ROWS % MAX_TOKENS, r = i % STATE_ROWS;
        const float* x = sh.x[which][t];
        float f;
        if (r == 0) {
            f = 1.f;
        } else if (r <= FEATURE_DIM) {
            f = s.sqrt_scale * x[r - 1];
        } else {
            const int a = (r - 1 - FEATURE_DIM) / FEATURE_DIM, c = (r - 1 - FEATURE_DIM) % FEATURE_DIM;
            f = s.kappa * (x[a] * x[c]);  // as the reference: the product first, then the constant
        }
        sh.phi[which][t][r] = f;
    }
    __syncthreads();
}

template <typename T, int DV, int MAX_TOKENS>
// Two blocks per SM for one token (256 slices then fill an H100 in one wave); the multi-token
// instantiation keeps more registers per element.
__global__ void __launch_bounds__(Shape<DV>::THREADS, MAX_TOKENS == 1 ? 2 : 1)
    step_kernel(const StepParams p, const Scalars s) {
    using S = Shape<DV>;
    constexpr int P = S::P, L = S::L, BAND = S::BAND, BAND_ROWS = S::BAND_ROWS, THREADS = S::THREADS;
    __shared__ Shared<DV, MAX_TOKENS> sh;

    const int bh = blockIdx.x;
    const int b = bh / p.heads, h = bh % p.heads;
    const int tid = threadIdx.x;
    const int64_t slice = b * p.state_stride_b + h * p.state_stride_h;
    const float* in = p.state_in + slice;
    float* out = p.state_out + slice;
    // The slice's offset in floats past a 16-byte boundary (the same for state_out): flat index f
    // of the slice is element (f + misalign) % 4 of aligned vector (f + misalign) / 4.
    const int misalign = int((reinterpret_cast<std::uintptr_t>(in) / sizeof(float)) % VEC);

    // This thread's elements j = 0..3 of its first vector sit at flat index 4 tid + j - misalign
    // (one band later: + BAND, and so on): column col[j] always, row row0[j] + BAND_ROWS i.
    int col[VEC], row0[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        const int f = VEC * tid + j - misalign + BAND;  // kept positive: one band ahead
        col[j] = f % P;
        row0[j] = f / P - BAND_ROWS;
    }

    T* o = static_cast<T*>(p.o) + int64_t(bh) * p.tokens * DV;
    for (int first = 0; first < p.tokens; first += MAX_TOKENS) {
        const int count = min(MAX_TOKENS, p.tokens - first);
        if (first > 0) __syncthreads();  // the previous group's shared memory is read
        load_token_group<T, DV, MAX_TOKENS>(sh, p, b, h, first, count, s);

        float vo[MAX_TOKENS][VEC], acc[MAX_TOKENS][VEC];
#pragma unroll
        for (int t = 0; t < MAX_TOKENS; t++) {
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                vo[t][j] = sh.v[t][col[j]];
                acc[t][j] = 0.f;
            }
        }

        const float* src = first == 0 ? in : out;  // later groups read what this thread wrote
#pragma unroll 1
        for (int i0 = 0; i0 < S::ITERS; i0 += UNROLL) {
            float4 val[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int f = VEC * (tid + THREADS * (i0 + u)) - misalign;  // flat index of element 0
                if (f >= 0 && f + VEC <= L) {
                    val[u] = *reinterpret_cast<const float4*>(src + f);
                } else {
                    float e[VEC];
#pragma unroll
                    for (int j = 0; j < VEC; j++) e[j] = (f + j >= 0 && f + j < L) ? src[f + j] : 0.f;
                    val[u] = make_float4(e[0], e[1], e[2], e[3]);
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                float* e = reinterpret_cast<float*>(&val[u]);
#pragma unroll
                for (int j = 0; j < VEC; j++) {
                    const int row = row0[j] + BAND_ROWS * (i0 + u);
                    if (unsigned(row) >= unsigned(STATE_ROWS)) continue;  // outside the slice
                    float x = e[j];
#pragma unroll
                    for (int t = 0; t < MAX_TOKENS; t++) {
                        if (t < count) {
                            x = fmaf(sh.phi[0][t][row], vo[t][j], x);
                            acc[t][j] = fmaf(sh.phi[1][t][row], x, acc[t][j]);
                        }
                    }
                    e[j] = x;
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int f = VEC * (tid + THREADS * (i0 + u)) - misalign;
                if (f >= 0 && f + VEC <= L) {
                    *reinterpret_cast<float4*>(out + f) = val[u];
                } else {
                    const float* e = reinterpret_cast<const float*>(&val[u]);
#pragma unroll
                    for (int j = 0; j < VEC; j++) {
                        if (f + j >= 0 && f + j < L) out[f + j] = e[j];
                    }
                }
            }
        }

        // o_t: every token's partial sums by band position (a bijection of (thread, j)), then
        // their column sums, a thread per (token, column), then the output rows: all tokens of
        // the group at once, so the sums run side by side behind two barriers rather than one
        // token after another (docs/performance.md has the 4-token step before and after).
#pragma unroll
        for (int t = 0; t < MAX_TOKENS; t++) {
#pragma unroll
            for (int j = 0; j < VEC; j++) sh.partial[t][(VEC * tid + j - misalign + BAND) % BAND] = acc[t][j];
        }
        __syncthreads();
        static_assert(MAX_TOKENS * P <= THREADS, "a thread per (token, column) sum");
        if (tid < count * P) {
            const int t = tid / P, c = tid % P;
            float sum = 0.f;
#pragma unroll 8
            for (int r = 0; r < BAND_ROWS; r++) sum += sh.partial[t][r * P + c];
            sh.column[t][c] = sum;
        }
        __syncthreads();
        for (int i = tid; i < count * DV; i += THREADS) {
            const int t = i / DV, c = i % DV;
            float value = sh.column[t][c];
            if (s.normalize) value = __fdiv_rn(value, sh.column[t][DV] + s.eps);  // IEEE, despite fast math
            o[int64_t(first + t) * DV + c] = from_float<T>(value);
        }
        // The next group's load_token_group overwrites shared memory only after the barrier at
        // its start.
    }
}

template <typename T, int DV, int MAX_TOKENS>
cudaError_t launch(const StepParams& p, const Scalars& s, cudaStream_t stream) {
    const int64_t blocks = int64_t(p.batch) * p.heads;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    step_kernel<T, DV, MAX_TOKENS><<<unsigned(blocks), Shape<DV>::THREADS, 0, stream>>>(p, s);
    return cudaGetLastError();
}

// Up to 4 tokens per pass over the state; a single token (decoding) gets its own instantiation
// with one set of registers.
template <typename T, int DV>
cudaError_t launch_for_tokens(const StepParams& p, const Scalars& s, cudaStream_t stream) {
    return p.tokens == 1 ? launch<T, DV, 1>(p, s, stream) : launch<T, DV, 4>(p, s, stream);
}

template <typename T>
cudaError_t launch_for_value_dim(const StepParams& p, const Scalars& s, cudaStream_t stream) {
    return p.value_dim == 64 ? launch_for_tokens<T, 64>(p, s, stream) : launch_for_tokens<T, 128>(p, s, stream);
}

}  // namespace

cudaError_t step_sm80(const StepParams& p, cudaStream_t stream) {
    // The op layer checks these; a direct caller gets an error instead of a wrong launch.
    const bool same_alignment = p.state_in == p.state_out ||
                                reinterpret_cast<std::uintptr_t>(p.state_in) % 16 ==
                                    reinterpret_cast<std::uintptr_t>(p.state_out) % 16;
    if (p.batch < 1 || p.heads < 1 || p.tokens < 1 || (p.value_dim != 64 && p.value_dim != 128) ||
        !(p.scale > 0.0) || reinterpret_cast<std::uintptr_t>(p.state_in) % sizeof(float) != 0 || !same_alignment)
        return cudaErrorInvalidValue;
    const Scalars s{float(std::sqrt(p.scale)), float(p.scale / std::sqrt(2.0)), p.eps, p.normalize};
    return p.dtype == ElementType::bf16 ? launch_for_value_dim<__nv_bfloat16>(p, s, stream)
                                        : launch_for_value_dim<__half>(p, s, stream);
}

}  // namespace tk::based
