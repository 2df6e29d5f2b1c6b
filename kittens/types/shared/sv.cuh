// Shared vectors: N contiguous elements, 16-byte aligned.
#pragma once
#include "../../common/base_types.cuh"
#include "../../common/util.cuh"

namespace kittens {

template <element T, int N>
struct alignas(16) sv {
    static_assert(N % TILE_DIM == 0, "shared vector length must be a multiple of 16");
    using dtype = T;
    static constexpr int length = N;
    T data[N];
    __device__ T& operator[](int i) { return data[i]; }
    __device__ const T& operator[](int i) const { return data[i]; }
};

template <typename T>
concept shared_vector = requires(T v) { typename T::dtype; T::length; v.data; };

}  // namespace kittens
