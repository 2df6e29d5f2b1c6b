// Plain-C++ description of one causal FFT convolution call, shared by the torch op
// (fftconv_ops.cpp) and the kernel file, which must not include torch headers.
//
// The kernels compute, per (batch b, head h),
//   y[b, h, :n] = irfft(rfft(u[b, h] * pregate[b, h], L) * K[h], L)[:n] * postgate[b, h]
// with L = fft_size and n = seqlen <= L / 2 (u is zero past n: the causal half of an FFT of
// twice the kernel length), K[h] the filter's spectrum fft(k[h], L) handed over precomputed in
// the layout below (fftconv_filter_spectrum builds it).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace tk::fftconv {

enum class ElementType { bf16, fp16 };

// How the kernel for an FFT of length L factors it (L = R * P * Q, index n = q + Q p + Q P r,
// frequency k = k_r + R k_p + R P k_q; r is the slowest input index, so the causal zero half
// is r >= R / 2). P == 1: two factors, R x Q. Shared by the kernel (its tile shapes) and the
// op (the spectrum's layout), so they cannot disagree.
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
        default: return {0, 0, 0, 0};
    }
}

// Filter spectrum layout, (heads, L, 2) fp32 contiguous (re, im interleaved), per head:
//  - two factors (P == 1): K[k_r + R k_q] at complex index k_r * Q + k_q (row-major R x Q);
//  - three factors: R tiles of 16 x 16 (rows k_p, cols k_q), tile k_r at complex index
//    256 k_r, inside a tile in the order of the kernel's register fragments: element
//    (row, col) = (8 rh + rl, 8 ch + 2 cm + e) (rh, ch, e in {0, 1}, rl < 8, cm < 4) at complex
//    index ((ch * 2 + rh) * 32 + rl * 4 + cm) * 2 + e, so a warp reads each tile as 16-byte
//    chunks, 512 contiguous bytes per access.

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
    const float* spectrum;  // (heads, fft_size, 2) in the layout above
    void* y;                // (batch, heads, seqlen), same rules as u
    int64_t y_stride_b, y_stride_h;

    int batch, heads;
    int seqlen;    // n: 1 <= n <= fft_size / 2, a multiple of 8
    int fft_size;  // L, one decomposition() knows
    ElementType dtype;
    int multiprocessors;  // of the current device (sizes the grid)
};

// mma.sync + cp.async kernels (sm_80 and newer). Returns the launch error, if any
// (cudaErrorInvalidValue for an fft_size without a kernel).
cudaError_t fftconv_fwd_sm80(const ForwardParams& params, cudaStream_t stream);

// Dynamic shared memory (bytes) fftconv_fwd_sm80's kernel for fft_size needs per block, with or
// without a pregate; 0 for an fft_size without a kernel. More than a device's opt-in limit
// (cudaDevAttrMaxSharedMemoryPerBlockOptin) means the kernel cannot run there.
int fftconv_fwd_sm80_shared_bytes(int fft_size, bool pregate);

}  // namespace tk::fftconv
