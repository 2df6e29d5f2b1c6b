// Causal FFT convolution forward on mma.sync + cp.async (sm_80 and newer: A100, RTX 3090/4090,
// and Hopper when forced), written in the tile core's warp ops.
//
// y = irfft(rfft(u * pregate, L) * K, L)[:n] * postgate with L = 2N for kernel length N. The FFT
// of length L is the Monarch (four-step) factorisation L = R x Q (two_factor.cuh) or R x 16 x 16
// (three_factor.cuh, three_factor_large.cuh); the spectrum is multiplied by K (conj(K) for the correlation) and the
// inverse runs the same steps backwards with conjugate matrices and twiddles, computing only the
// output's first half. Every DFT matrix carries 1/sqrt(size), so the inverse's 1/L is spread over
// the stages and every intermediate stays near the input's or the output's magnitude (fp16 has
// little range).
//
// Two real sequences of one head (batches 2i and 2i + 1) travel as one complex sequence
// z = u_2i + i u_2i+1: the filter is real, so the inverse gives y_2i + i y_2i+1.
//
// Products are 16-bit (the input's type) with fp32 accumulation; twiddles, the spectrum and the
// gates multiply in fp32, and each intermediate is rounded to 16 bits once, where it becomes an
// mma operand. csrc/fftconv/model.py is a Python model of exactly these steps and roundings.
//
// The grid is one wave of persistent blocks, each running an equal share of the (head, pair of
// batches) tasks in order, with the next tasks' inputs in flight (cp.async) while the current one
// computes. A block computes its DFT matrices and twiddles once; the filter's spectrum comes
// through a shared-memory slot that is refilled when the head changes (at L = 32768, where it does
// not fit, from global memory: arrange_spectrum lays it out in the op's workspace first).
#include <limits>

#include "fftconv/configs.cuh"

namespace tk::fftconv {
namespace {

template <typename C, bool STAGED_POSTGATE = false>
auto forward_kernel() {
    using T = typename C::dtype;
    if constexpr (is_large<C>) return three_factor_large_forward<T, C::R, C::WARPS, STAGED_POSTGATE>;
    else if constexpr (C::THREE_FACTORS) return three_factor_forward<T, C::R, C::WARPS, C::FOLDED, STAGED_POSTGATE>;
    else return two_factor_forward<T, C::R, C::Q, C::WARPS, STAGED_POSTGATE>;
}

// Configurations whose forward can take its postgate through shared memory where a block has the
// stage's room (two_factor.cuh, three_factor.cuh, three_factor_large.cuh at N = 8192; not 16384).
template <typename C>
concept stages_postgates = requires { C::postgate_bytes; } &&
                           C::shared_bytes + C::pregate_bytes + C::postgate_bytes <= kMaxSharedBytes;

template <typename C>
constexpr int64_t workspace_bytes(int heads) {
    if constexpr (reads_arranged_spectrum<C>) return int64_t(heads) * C::STORED * int64_t(sizeof(float2));
    else return 0;
}

template <typename T>
cudaError_t run(const ForwardParams& p, cudaStream_t stream) {
    return with_config<T>(p.fft_size, p.pregate != nullptr, p.shared_per_block, [&](auto config) {
        using C = decltype(config);
        static_assert(matches_decomposition<C>());
        static_assert(C::shared_bytes + C::pregate_bytes <= kMaxSharedBytes);
        int smem = C::shared_bytes + (p.pregate != nullptr ? C::pregate_bytes : 0);
        auto kernel = forward_kernel<C>();
        // The postgate staged where the stage fits a block and costs no block per SM.
        if constexpr (stages_postgates<C>) {
            if (p.postgate != nullptr && smem + C::postgate_bytes <= p.shared_per_block) {
                const auto staged = forward_kernel<C, true>();
                int staged_blocks = 0, plain_blocks = 0;
                if (kt::blocks_per_sm(staged, C::THREADS, smem + C::postgate_bytes, staged_blocks) == cudaSuccess &&
                    kt::blocks_per_sm(kernel, C::THREADS, smem, plain_blocks) == cudaSuccess &&
                    staged_blocks >= plain_blocks) {
                    kernel = staged;
                    smem += C::postgate_bytes;
                }
            }
        }
        Args<T> a = forward_args<T>(p);
        if constexpr (reads_arranged_spectrum<C>) {
            if (p.workspace == nullptr) return cudaErrorInvalidValue;
            const int64_t blocks = int64_t(p.heads) * arrange_groups<C>;
            if (blocks > std::numeric_limits<int>::max()) return cudaErrorInvalidConfiguration;
            arrange_spectrum<C><<<unsigned(blocks), ARRANGE_THREADS, 0, stream>>>(
                a.spectrum, static_cast<float2*>(p.workspace), p.conjugate);
            if (cudaError_t e = cudaGetLastError()) return e;
            a.arranged_spectrum = static_cast<const float4*>(p.workspace);
        }
        return launch<T>(kernel, C::THREADS, smem, a, p.multiprocessors, /*whole_heads=*/false, stream);
    });
}

}  // namespace

int fftconv_fwd_sm80_shared_bytes(int fft_size, bool pregate) {
    if (decomposition(fft_size).fft_size == 0) return 0;
    // The same for both element types (16-bit either way); where a device's shared memory picks
    // the configuration, the one that needs the least (a device with more runs a larger one).
    return with_config<kt::bf16>(fft_size, pregate, 0, [&](auto config) {
        using C = decltype(config);
        return C::shared_bytes + (pregate ? C::pregate_bytes : 0);
    });
}

int64_t fftconv_fwd_sm80_workspace_bytes(int fft_size, int heads) {
    if (decomposition(fft_size).fft_size == 0) return 0;
    return with_config<kt::bf16>(fft_size, false, 0, [&](auto config) { return workspace_bytes<decltype(config)>(heads); });
}

cudaError_t fftconv_fwd_sm80(const ForwardParams& params, cudaStream_t stream) {
    if (!params_describe_a_call(params)) return cudaErrorInvalidValue;
    return params.dtype == ElementType::bf16 ? run<kt::bf16>(params, stream) : run<kt::half>(params, stream);
}

}  // namespace tk::fftconv
