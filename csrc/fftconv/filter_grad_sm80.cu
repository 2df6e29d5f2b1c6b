// The filter's gradient of the causal FFT convolution on mma.sync + cp.async (sm_80 and newer):
//   grad[h, t] = sum_b sum_n dy[b, h, n] u[b, h, n - t]
// a correlation summed over the batch. Per head, each block transforms both packed sequences of
// every pair it runs (the forward kernels' steps), accumulates fft(dy) * conj(fft(u)) in fp32
// registers, and at the head's last pair runs one inverse transform, whose real part it adds into
// grad (zero on entry; a head split over two blocks is added twice).
#include "fftconv/configs.cuh"

namespace tk::fftconv {
namespace {

template <typename C>
auto filter_grad_kernel() {
    using T = typename C::dtype;
    if constexpr (is_large<C>) return three_factor_large_filter_grad<T, C::R, C::WARPS>;
    else if constexpr (C::THREE_FACTORS) return three_factor_filter_grad<T, C::R, C::WARPS>;
    else return two_factor_filter_grad<T, C::R, C::Q, C::WARPS>;
}

template <typename T>
cudaError_t run(const FilterGradParams& p, cudaStream_t stream) {
    return with_filter_grad_config<T>(p.fft_size, [&](auto config) {
        using C = decltype(config);
        static_assert(matches_decomposition<C>());
        static_assert(C::grad_shared_bytes <= kMaxSharedBytes);
        Args<T> a = filter_grad_args<T>(p);
        if constexpr (is_large<C>) a.parts = C::PARTS;  // a block per part of a head's frequencies
        return launch<T>(filter_grad_kernel<C>(), C::THREADS, C::grad_shared_bytes, a, p.multiprocessors,
                         /*whole_heads=*/true, stream);
    });
}

}  // namespace

int fftconv_filter_grad_sm80_shared_bytes(int fft_size) {
    if (decomposition(fft_size).fft_size == 0) return 0;
    return with_filter_grad_config<kt::bf16>(fft_size, [&](auto config) { return decltype(config)::grad_shared_bytes; });
}

cudaError_t fftconv_filter_grad_sm80(const FilterGradParams& params, cudaStream_t stream) {
    if (decomposition(params.fft_size).fft_size == 0 || params.batch < 1 || params.heads < 1 || params.seqlen < 1 ||
        params.seqlen % 8 != 0 || params.seqlen > params.fft_size / 2)
        return cudaErrorInvalidValue;
    return params.dtype == ElementType::bf16 ? run<kt::bf16>(params, stream) : run<kt::half>(params, stream);
}

}  // namespace tk::fftconv
