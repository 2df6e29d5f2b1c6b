// Plain-C++ description of the FFT convolution calls, shared by the torch ops (fftconv_ops.cpp)
// and the kernel files, which must not include torch headers.
//
// The forward kernels compute, per (batch b, head h),
//   y[b, h, :n] = irfft(rfft(u[b, h] * pregate[b, h], L) * K[h], L)[:n] * postgate[b, h]
// with L = fft_size and n = seqlen <= L / 2 (u is zero past n: the causal half of an FFT of
// twice the kernel length), K[h] = rfft(k[h], L) the filter's spectrum (conj(K[h]) for the
// correlation that is the convolution's input gradient). The filter-gradient kernels compute
//   grad[h, t] = sum_b sum_n dy[b, h, n] u[b, h, n - t]        (t < n)
// the filter's gradient of that convolution (gates already applied by the caller).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace tk::fftconv {

enum class ElementType { bf16, fp16 };

// How the kernel for an FFT of length L factors it (L = R * P * Q, index n = q + Q p + Q P r,
// frequency k = k_r + R k_p + R P k_q; r is the slowest input index, so the causal zero half
// is r >= R / 2). P == 1: two factors, R x Q.
struct Decomposition {
    int fft_size;  // L; 0: no kernel for this length
    int r, p, q;
};

constexpr Decomposition decomposition(int fft_size) {
    switch (fft_size) {
        case 512: return {512, 32, 1, 16};
        case 1024: return {1024, 32, 1, 32};
        case 2048: return {2048, 64, 1, 32};
        case 4096: return {4096, 16, 16, 16};
        case 8192: return {8192, 32, 16, 16};
        case 16384: return {16384, 64, 16, 16};
        case 32768: return {32768, 128, 16, 16};
        default: return {0, 0, 0, 0};
    }
}

// The filter's spectrum as the kernels take it: rfft(k, L) per head, (heads, L / 2 + 1) complex
// fp32 as interleaved (re, im) floats, contiguous: torch.fft.rfft's own output (view_as_real).
// k is real, so K[f] = conj(K[L - f]) above L / 2; each block copies a head's L / 2 + 1 values
// to shared memory and arranges them in the order of its own products there.

struct ForwardParams {
    // u, pregate, postgate: (batch, heads, seqlen) in the element type, last dim contiguous, the
    // batch and head strides multiples of 8 elements, data 16-byte aligned. pregate/postgate
    // nullptr: no gate.
    const void* u;
    int64_t u_stride_b, u_stride_h;
    const void* pregate;
    int64_t pre_stride_b, pre_stride_h;
    const void* postgate;
    int64_t post_stride_b, post_stride_h;
    const float* spectrum;  // (heads, fft_size / 2 + 1, 2), 8-byte aligned
    bool conjugate;         // multiply by conj(K): y[n] = sum_{m >= n} k[m - n] u[m] (pre/post-gated)
    void* y;                // (batch, heads, seqlen), same rules as u
    int64_t y_stride_b, y_stride_h;
    // fftconv_fwd_sm80_workspace_bytes(fft_size, heads) bytes, 16-byte aligned (nullptr where
    // that is 0): the spectrum arranged for a kernel that reads it from global memory.
    void* workspace;

    int batch, heads;
    int seqlen;    // n: 1 <= n <= fft_size / 2, a multiple of 8
    int fft_size;  // L, one decomposition() knows
    ElementType dtype;
    int multiprocessors;  // of the current device (sizes the grid)
    int shared_per_block;  // the shared memory a block may have there, bytes (picks a configuration)
};

struct FilterGradParams {
    // dy, u: (batch, heads, seqlen), the rules of ForwardParams::u.
    const void* dy;
    int64_t dy_stride_b, dy_stride_h;
    const void* u;
    int64_t u_stride_b, u_stride_h;
    // Optional (nullptr: none), shaped like u: the gradient is that of dy * dy_gate and
    // u * u_gate, each product rounded to u's dtype (a gated convolution's backward).
    const void* dy_gate;
    int64_t dy_gate_stride_b, dy_gate_stride_h;
    const void* u_gate;
    int64_t u_gate_stride_b, u_gate_stride_h;
    float* grad;  // (heads, seqlen) contiguous, zero on entry: the kernels add into it

    int batch, heads;
    int seqlen;    // as ForwardParams
    int fft_size;
    ElementType dtype;
    int multiprocessors;
};

// Whether a forward call's sizes are ones the kernels take (the ops check them with messages;
// this guards direct callers of the launch functions).
inline bool params_describe_a_call(const ForwardParams& p) {
    return decomposition(p.fft_size).fft_size != 0 && p.batch >= 1 && p.heads >= 1 && p.seqlen >= 1 &&
           p.seqlen % 8 == 0 && p.seqlen <= p.fft_size / 2;
}

// mma.sync + cp.async kernels (sm_80 and newer). Return the launch error, if any
// (cudaErrorInvalidValue for an fft_size without a kernel).
cudaError_t fftconv_fwd_sm80(const ForwardParams& params, cudaStream_t stream);
cudaError_t fftconv_filter_grad_sm80(const FilterGradParams& params, cudaStream_t stream);

// Dynamic shared memory (bytes) per block of the forward kernel for fft_size, with or without a
// pregate, and of the filter-gradient kernel; 0 for an fft_size without a kernel. More than a
// device's opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin) means the kernel cannot run there.
int fftconv_fwd_sm80_shared_bytes(int fft_size, bool pregate);
// Global memory (bytes) the forward needs beside its output for fft_size and `heads` (0 for most
// sizes).
int64_t fftconv_fwd_sm80_workspace_bytes(int fft_size, int heads);
// With `gated`, of the instantiation that takes dy_gate and u_gate; 0 where there is none (the
// longest sizes: the op multiplies the gates in first there).
int fftconv_filter_grad_sm80_shared_bytes(int fft_size, bool gated = false);

// The filter's spectrum (fftconv_filter_spectrum on a GPU): out[h, f] = rfft(k[h], fft_size)[f]
// for f = 0 .. fft_size / 2, k zero-padded, computed in fp32 by one kernel (filter_rfft.cu).
enum class FilterType { fp32, bf16, fp16 };

struct FilterRfftParams {
    const void* k;  // (heads, length) of `type`, any element strides
    int64_t k_stride_h, k_stride_t;
    FilterType type;
    float* out;  // (heads, fft_size / 2 + 1, 2) contiguous
    int64_t heads;
    int length;    // 1 <= length <= fft_size / 2
    int fft_size;  // 512 .. 32768, a power of two
};

cudaError_t fftconv_filter_rfft(const FilterRfftParams& params, cudaStream_t stream);
// Shared memory (bytes) its block takes for fft_size; more than the device's opt-in limit means
// the kernel cannot run there (the spectrum op then takes ATen's route).
int fftconv_filter_rfft_shared_bytes(int fft_size);

// Hopper (sm_90a): the wgmma kernels where there is one (fft_size 4096 and 8192), the mma.sync
// kernels above for the other sizes; the same contract and functions.
cudaError_t fftconv_fwd_sm90(const ForwardParams& params, cudaStream_t stream);
int fftconv_fwd_sm90_shared_bytes(int fft_size, bool pregate);
int64_t fftconv_fwd_sm90_workspace_bytes(int fft_size, int heads);

}  // namespace tk::fftconv
