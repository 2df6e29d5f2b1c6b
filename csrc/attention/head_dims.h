// The head dims each attention kernel family is built for, written once: the dispatch
// instantiates exactly these (dispatch.h), the ops accept exactly these (attention_ops.cpp), and
// the Python package reads them as thunderkittens._C.attention_head_dims (python_module.cpp).
// Plain C++ (no torch, no CUDA), so every one of those can include it.
#pragma once
#include <array>
#include <cstdint>

namespace tk::attention {

// A list of head dims as a type, so that the dispatch can expand it into instantiations.
template <int... Ds>
struct HeadDims {
    static constexpr std::array<int, sizeof...(Ds)> values{Ds...};
    static constexpr bool contains(int64_t head_dim) { return ((head_dim == Ds) || ...); }
};

// The TMA + wgmma kernels (forward and backward).
using Sm90HeadDims = HeadDims<64, 96, 128>;
// The mma.sync forward: not 96, where it ran slower than SDPA's FlashAttention-2 (calls with
// head dim 96 go to SDPA off Hopper; docs/performance.md).
using Sm80HeadDims = HeadDims<64, 128>;
// The decode kernels (mma.sync, sm_80 and newer; decode.cu): memory-bound, so d96 costs no more
// than its bytes.
using DecodeHeadDims = HeadDims<64, 96, 128>;

}  // namespace tk::attention
