// The kernel configuration for each FFT length, shared by the forward and the filter-gradient
// launches (and their shared-memory sizes).
#pragma once
#include "fftconv/three_factor.cuh"
#include "fftconv/three_factor_large.cuh"
#include "fftconv/two_factor.cuh"

namespace tk::fftconv {
namespace {

// Whether C's forward block fits `shared_per_block` bytes (with a pregate's stages if `pregate`).
template <typename C>
constexpr bool block_fits(int shared_per_block, bool pregate) {
    return C::shared_bytes + (pregate ? C::pregate_bytes : 0) <= shared_per_block;
}

// f(config) for fft_size's forward configuration (a TwoFactor or ThreeFactor type); fft_size
// must be one decomposition() knows. shared_per_block: the shared memory a block may have on the
// device (its opt-in limit); 0 gives the configuration that needs the least, which any device
// that runs the length can run.
template <typename T, typename F>
auto with_config(int fft_size, bool pregate, int shared_per_block, F&& f) {
    // L = 4096 and 8192 fold T1 into their matrices where a block holds the folded tables (an
    // H100's does, at L = 4096 as two blocks of 8 warps per SM); elsewhere (an RTX 4090 at
    // L = 4096, an A100 at 8192) the full layout, one block of 16 warps.
    using Folded4096 = ThreeFactor<T, 16, 8, true>;
    using Folded8192 = ThreeFactor<T, 32, 16, true>;
    static_assert(two_blocks_fit<Folded4096>(kSharedPerSm90));
    switch (fft_size) {
        case 512: return f(TwoFactor<T, 32, 16, 1>{});
        case 1024: return f(TwoFactor<T, 32, 32, 2>{});
        case 2048: return f(TwoFactor<T, 64, 32, 4>{});
        case 4096: return block_fits<Folded4096>(shared_per_block, pregate) ? f(Folded4096{}) : f(ThreeFactor<T, 16>{});
        case 8192: return block_fits<Folded8192>(shared_per_block, pregate) ? f(Folded8192{}) : f(ThreeFactor<T, 32>{});
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
