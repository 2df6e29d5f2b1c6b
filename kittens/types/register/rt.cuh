// Register tiles: a rows x cols matrix held by one warp as a grid of 16x16 base
// tiles, each in the mma.sync fragment pattern of its layout (layout_math.cuh).
#pragma once
#include "../../common/base_types.cuh"
#include "../../common/util.cuh"
#include "rv.cuh"

namespace kittens {

using layout_math::frag_layout;

// Layout tags: row = mma A-operand / accumulator fragments, col = B-operand fragments.
struct row_l { static constexpr frag_layout value = frag_layout::row; };
struct col_l { static constexpr frag_layout value = frag_layout::col; };

template <typename L>
concept tile_layout = std::same_as<L, row_l> || std::same_as<L, col_l>;

// One 16x16 fragment: four packed pairs per lane.
template <element T, tile_layout L>
struct rt_base {
    using dtype = T;
    using layout = L;
    packed<T> data[4];
};

template <element T, int R, int C, tile_layout L = row_l>
struct rt {
    static_assert(R % TILE_DIM == 0 && C % TILE_DIM == 0, "register tile dims must be multiples of 16");
    using dtype = T;
    using layout = L;
    static constexpr frag_layout frag = L::value;
    static constexpr int rows = R, cols = C;
    static constexpr int height = R / TILE_DIM, width = C / TILE_DIM;  // in base tiles

    rt_base<T, L> tiles[height][width];

    // One value per row (a column vector, e.g. a row reduction) and one per column.
    using col_vec = rv<float, R, layout_math::per_row_vec(L::value)>;
    using row_vec = rv<float, C, layout_math::per_col_vec(L::value)>;

    // Coordinates within the base tile of this lane's element (k, h).
    __device__ static int row_in_base(int k, int h) { return layout_math::fragment_row(frag, lane_id(), k, h); }
    __device__ static int col_in_base(int k, int h) { return layout_math::fragment_col(frag, lane_id(), k, h); }
};

template <int R, int C, tile_layout L = row_l> using rt_fl = rt<float, R, C, L>;
template <int R, int C, tile_layout L = row_l> using rt_bf = rt<bf16, R, C, L>;
template <int R, int C, tile_layout L = row_l> using rt_hf = rt<half, R, C, L>;

template <typename T>
concept register_tile = requires { typename T::dtype; typename T::layout; T::height; T::width; T::frag; };

// Calls f(i, j, k, pair&) for every packed pair this lane holds: i/j the base tile,
// k the register.
template <register_tile RT, typename F>
__device__ __forceinline__ void for_each_pair(RT& t, F&& f) {
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) f(i, j, k, t.tiles[i][j].data[k]);
}

// Calls f(i, j, k, h, element&) for every element this lane holds, h the half of
// the pair.
template <register_tile RT, typename F>
__device__ __forceinline__ void for_each_element(RT& t, F&& f) {
    for_each_pair(t, [&](int i, int j, int k, auto& pair) {
        f(i, j, k, 0, pair.x);
        f(i, j, k, 1, pair.y);
    });
}

}  // namespace kittens
