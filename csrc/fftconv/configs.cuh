// The kernel configuration for each FFT length, shared by the forward and the filter-gradient
// launches (and their shared-memory sizes).
#pragma once
#include "fftconv/three_factor.cuh"
#include "fftconv/three_factor_large.cuh"
#include "fftconv/two_factor.cuh"

namespace tk::fftconv {
namespace {

// f(config) for fft_size's forward configuration (a TwoFactor or ThreeFactor type); fft_size
// must be one decomposition() knows. shared_per_sm: the device's shared memory per SM (0 for
// the configuration that needs the most, which any device that runs the length can run).
template <typename T, typename F>
auto with_config(int fft_size, bool pregate, int shared_per_sm, F&& f) {
    using Compact8192 = ThreeFactor<T, 32, 8, false, true>;
    switch (fft_size) {
        case 512: return f(TwoFactor<T, 32, 16, 1>{});
        case 1024: return f(TwoFactor<T, 32, 32, 2>{});
        case 2048: return f(TwoFactor<T, 64, 32, 4>{});
        // Two blocks of 8 warps per SM: their phases and barriers interleave. At L = 8192 where
        // two do not fit (with a pregate; an A100's 164 KiB per SM), one block of 16 in the full
        // layout, which is faster than one of 8 (docs/performance.md has the A/Bs).
        case 4096: return f(ThreeFactor<T, 16, 8, true, true>{});
        case 8192:
            return !pregate && two_blocks_fit<Compact8192>(shared_per_sm) ? f(Compact8192{}) : f(ThreeFactor<T, 32>{});
        case 16384: return f(ThreeFactorLarge<T, 64>{});
        default: return f(ThreeFactorLarge<T, 128>{});
    }
}

// The filter gradient's: as the forward's, but 8 warps per block from L = 8192, where 16 warps'
// 128 registers each cannot hold the accumulated spectrum without spilling (from L = 16384 a
// block holds a part of a head's frequencies, as many tiles per warp as at 8192).
template <typename T, typename F>
auto with_filter_grad_config(int fft_size, F&& f) {
    switch (fft_size) {
        case 512: return f(TwoFactor<T, 32, 16, 1>{});
        case 1024: return f(TwoFactor<T, 32, 32, 2>{});
        case 2048: return f(TwoFactor<T, 64, 32, 4>{});
        case 4096: return f(ThreeFactor<T, 16>{});
        case 8192: return f(ThreeFactor<T, 32, 8>{});
        case 16384: return f(ThreeFactorLarge<T, 64, 8>{});
        default: return f(ThreeFactorLarge<T, 128, 8>{});
    }
}

template <typename C>
constexpr bool matches_decomposition() {
    constexpr Decomposition d = decomposition(C::L);
    return d.r == C::R && d.p == C::P && d.q == C::Q;
}

}  // namespace
}  // namespace tk::fftconv
