// Causal FFT convolution forward on Hopper (sm_90a): the wgmma kernels for the lengths that
// have one (three_factor_sm90.cuh: N = 2048 and 4096, FFT sizes 4096 and 8192), the mma.sync
// kernels (fftconv_sm80.cu) for the others. One contract, ForwardParams (params.h).
#include "fftconv/three_factor_sm90.cuh"

namespace tk::fftconv {
namespace {

// N = 2048 without a pregate as two blocks of two warpgroups per SM (113 KiB each; with a
// pregate one block of four), N = 4096 as one block of four (docs/performance.md).
template <typename T, typename F>
auto with_wgmma_config(int fft_size, bool pregate, F&& f) {
    if (fft_size == 4096) return pregate ? f(ThreeFactorWgmma<T, 16>{}) : f(ThreeFactorWgmma<T, 16, 2>{});
    return f(ThreeFactorWgmma<T, 32>{});
}

bool has_wgmma_kernel(int fft_size) { return fft_size == 4096 || fft_size == 8192; }

template <typename T>
cudaError_t run_wgmma(const ForwardParams& p, cudaStream_t stream) {
    return with_wgmma_config<T>(p.fft_size, p.pregate != nullptr, [&](auto config) {
        using C = decltype(config);
        static_assert(decomposition(C::L).r == C::R && decomposition(C::L).p == C::P);
        static_assert(C::shared_bytes + C::pregate_bytes <= kMaxSharedBytes);
        static_assert(C::BLOCKS_PER_SM == 1 || two_blocks_fit<C>(kSharedPerSm90));
        const int smem = C::shared_bytes + (p.pregate != nullptr ? C::pregate_bytes : 0);
        return launch<T>(three_factor_wgmma_forward<T, C::R, C::WARPGROUPS>, C::THREADS, smem, forward_args<T>(p), p.multiprocessors,
                         /*whole_heads=*/false, stream);
    });
}

}  // namespace

int fftconv_fwd_sm90_shared_bytes(int fft_size, bool pregate) {
    if (!has_wgmma_kernel(fft_size)) return fftconv_fwd_sm80_shared_bytes(fft_size, pregate);
    return with_wgmma_config<kt::bf16>(fft_size, pregate, [&](auto config) {
        using C = decltype(config);
        return C::shared_bytes + (pregate ? C::pregate_bytes : 0);
    });
}

int64_t fftconv_fwd_sm90_workspace_bytes(int fft_size, int heads) {
    return has_wgmma_kernel(fft_size) ? 0 : fftconv_fwd_sm80_workspace_bytes(fft_size, heads);
}

cudaError_t fftconv_fwd_sm90(const ForwardParams& params, cudaStream_t stream) {
    if (!has_wgmma_kernel(params.fft_size)) return fftconv_fwd_sm80(params, stream);
    if (!params_describe_a_call(params)) return cudaErrorInvalidValue;
    return params.dtype == ElementType::bf16 ? run_wgmma<kt::bf16>(params, stream) : run_wgmma<kt::half>(params, stream);
}

}  // namespace tk::fftconv
