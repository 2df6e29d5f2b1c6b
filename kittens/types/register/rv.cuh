// Register vectors: one value per row or per column of a register tile, spread
// over the warp in the pattern that matches the tile's fragments (see
// layout_math::vec_layout).
#pragma once
#include "../../common/base_types.cuh"
#include "../../common/util.cuh"

namespace kittens {

using layout_math::vec_layout;

template <element T, int N, vec_layout L>
struct rv {
    static_assert(N % TILE_DIM == 0, "register vector length must be a multiple of 16");
    using dtype = T;
    static constexpr int length = N;
    static constexpr vec_layout layout = L;
    static constexpr int tiles = N / TILE_DIM;
    static constexpr int slots = layout_math::vec_slots(L);  // values per 16 held by one lane

    T data[tiles][slots];

    // Index (0..N) held by this lane in (tile t, slot s).
    __device__ static int index(int t, int s) { return t * TILE_DIM + layout_math::vec_index(L, lane_id(), s); }
};

template <typename V>
concept register_vector = requires { typename V::dtype; V::length; V::layout; V::slots; };

}  // namespace kittens
