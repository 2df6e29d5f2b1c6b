// The filter's gradient of the causal FFT convolution on mma.sync + cp.async (sm_80 and newer):
//   grad[h, t] = sum_b sum_n dy[b, h, n] u[b, h, n - t]
// a correlation summed over the batch. Per head, each block transforms both packed sequences of
// every pair it runs (the forward kernels' steps), accumulates fft(dy) * conj(fft(u)) in fp32
// registers, and at the head's last pair runs one inverse transform, whose real part it adds into
// grad (zero on entry; a head split over two blocks is added twice).
#include "fftconv/configs.cuh"

namespace tk::fftconv {
namespace {

// Whether C's filter gradient has a gated instantiation (GATED in two_factor_filter_grad and
// three_factor_filter_grad); the large ones' inputs land in their frequency buffers, which leave
// no room for gates.
template <typename C>
inline constexpr bool has_gated_filter_grad = !is_large<C>;

template <typename C, bool GATED>
auto filter_grad_kernel() {
    using T = typename C::dtype;
    if constexpr (is_large<C>) return three_factor_large_filter_grad<T, C::R, C::WARPS>;
    else if constexpr (C::THREE_FACTORS) return three_factor_filter_grad<T, C::R, C::WARPS, GATED>;
    else return two_factor_filter_grad<T, C::R, C::Q, C::WARPS, GATED>;
}

template <typename C>
constexpr int filter_grad_shared_bytes(bool gated) {
    if constexpr (has_gated_filter_grad<C>) return C::grad_shared_bytes + (gated ? C::grad_gate_bytes : 0);
    else return gated ? 0 : C::grad_shared_bytes;
}

template <typename T>
cudaError_t run(const FilterGradParams& p, cudaStream_t stream) {
    const bool gated = p.u_gate != nullptr || p.dy_gate != nullptr;
    return with_filter_grad_config<T>(p.fft_size, [&](auto config) {
        using C = decltype(config);
        static_assert(matches_decomposition<C>());
        static_assert(filter_grad_shared_bytes<C>(true) <= kMaxSharedBytes);
        Args<T> a = filter_grad_args<T>(p);
        if constexpr (is_large<C>) a.parts = C::PARTS;  // a block per part of a head's frequencies
        auto run_kernel = [&](auto kernel) {
            return launch<T>(kernel, C::THREADS, filter_grad_shared_bytes<C>(gated), a, p.multiprocessors,
                             /*whole_heads=*/true, stream);
        };
        if constexpr (has_gated_filter_grad<C>) {
            if (gated) return run_kernel(filter_grad_kernel<C, true>());
        } else {
            if (gated) return cudaErrorInvalidValue;  // the op multiplies them in first here
        }
        return run_kernel(filter_grad_kernel<C, false>());
    });
}

}  // namespace

int fftconv_filter_grad_sm80_shared_bytes(int fft_size, bool gated) {
    if (decomposition(fft_size).fft_size == 0) return 0;
    return with_filter_grad_config<kt::bf16>(fft_size, [&](auto config) {
        return filter_grad_shared_bytes<decltype(config)>(gated);
    });
}

cudaError_t fftconv_filter_grad_sm80(const FilterGradParams& params, cudaStream_t stream) {
    if (decomposition(params.fft_size).fft_size == 0 || params.batch < 1 || params.heads < 1 || params.seqlen < 1 ||
        params.seqlen % 8 != 0 || params.seqlen > params.fft_size / 2)
        return cudaErrorInvalidValue;
    return params.dtype == ElementType::bf16 ? run<kt::bf16>(params, stream) : run<kt::half>(params, stream);
}

}  // namespace tk::fftconv
