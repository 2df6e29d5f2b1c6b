// Shared tiles: rows x cols elements in swizzled column panels
// (layout_math::shared_tile_offset), plus views of 16-aligned sub-tiles.
#pragma once
#include "../../common/base_types.cuh"
#include "../../common/util.cuh"

namespace kittens {

template <element T, int R, int C>
struct alignas(1024) st {
    static_assert(R % TILE_DIM == 0 && C % TILE_DIM == 0, "shared tile dims must be multiples of 16");
    using dtype = T;
    static constexpr int rows = R, cols = C;
    static constexpr int swizzle_bytes = layout_math::swizzle_bytes_for_width(C * int(sizeof(T)));
    static constexpr int panel_cols = swizzle_bytes / int(sizeof(T));
    static constexpr int row_bytes = swizzle_bytes;  // address step of one row inside a panel
    static constexpr int panel_bytes = R * row_bytes; // address step from one column panel to the next

    T data[R * C];

    __device__ static uint32_t offset(int r, int c) {
        return layout_math::shared_tile_offset(r, c, R, C, int(sizeof(T)));
    }
    __device__ T* ptr(int r, int c) { return reinterpret_cast<T*>(reinterpret_cast<char*>(data) + offset(r, c)); }
    __device__ const T* ptr(int r, int c) const {
        return reinterpret_cast<const T*>(reinterpret_cast<const char*>(data) + offset(r, c));
    }
    __device__ uint32_t address(int r, int c) const { return shared_address(data) + offset(r, c); }
};

// A SR x SC window of a shared tile starting at (row0, col0): loads and stores
// accept it wherever they accept a tile. col0 must keep 16-byte chunks whole.
template <typename ST, int SR, int SC>
struct st_view {
    static_assert(SR % TILE_DIM == 0 && SC % TILE_DIM == 0, "sub-tile dims must be multiples of 16");
    static_assert(SR <= ST::rows && SC <= ST::cols, "sub-tile larger than its tile");
    using dtype = typename ST::dtype;
    static constexpr int rows = SR, cols = SC;
    static constexpr int row_bytes = ST::row_bytes;
    static constexpr int panel_bytes = ST::panel_bytes;  // the parent's panels: a view spans them
    static constexpr int panel_cols = ST::panel_cols;    // (a TMA copy moves one panel's rows)
    ST* parent;
    int row0, col0;

    __device__ dtype* ptr(int r, int c) const { return parent->ptr(row0 + r, col0 + c); }
    __device__ uint32_t address(int r, int c) const { return parent->address(row0 + r, col0 + c); }
};

// View of sub-tile (tile_row, tile_col), counted in units of SR x SC.
template <int SR, int SC, typename ST>
__device__ __forceinline__ st_view<ST, SR, SC> subtile(ST& tile, int tile_row, int tile_col) {
    return {&tile, tile_row * SR, tile_col * SC};
}

template <typename T>
concept shared_tile = requires(T t) { typename T::dtype; T::rows; T::cols; t.ptr(0, 0); t.address(0, 0); };

template <int R, int C> using st_bf = st<bf16, R, C>;
template <int R, int C> using st_hf = st<half, R, C>;
template <int R, int C> using st_fl = st<float, R, C>;

}  // namespace kittens
