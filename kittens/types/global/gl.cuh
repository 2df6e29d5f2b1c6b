// Global layouts: a 4-D tensor (batch, head, row, col) in device memory with a
// unit column stride. Each dim is either fixed at compile time (template value > 0)
// or given at run time (-1). Tile loads address it in units of the tile's shape.
#pragma once
#include <cstdint>
#include "../../common/base_types.cuh"
#include "../../common/util.cuh"

namespace kittens {

// A dim fixed at compile time costs no storage; a run-time dim is one int.
template <int N> struct dim_value {
    static_assert(N > 0 || N == -1, "a dim is a positive compile-time size or -1 (run time)");
    __host__ __device__ constexpr dim_value(int) {}
    __host__ __device__ static constexpr int get() { return N; }
};
template <> struct dim_value<-1> {
    int n;
    __host__ __device__ constexpr dim_value(int v) : n(v) {}
    __host__ __device__ constexpr int get() const { return n; }
};

// Position of a tile (or vector) in a global layout, counted in tile units for
// the rows and cols and in plain indices for batch and head.
struct coord {
    int b = 0, h = 0, r = 0, c = 0;
};

template <element T, int B = -1, int H = -1, int R = -1, int C = -1>
struct gl {
    using dtype = T;
    T* raw;
    int64_t batch_stride, head_stride, row_stride;  // in elements
    dim_value<B> b_;
    dim_value<H> h_;
    dim_value<R> r_;
    dim_value<C> c_;

    // Strides default to a contiguous tensor.
    __host__ __device__ gl(T* data, int batch, int heads, int rows, int cols, int64_t bstride = -1,
                           int64_t hstride = -1, int64_t rstride = -1)
        : raw(data),
          batch_stride(bstride >= 0 ? bstride : int64_t(heads) * rows * cols),
          head_stride(hstride >= 0 ? hstride : int64_t(rows) * cols),
          row_stride(rstride >= 0 ? rstride : cols),
          b_(batch), h_(heads), r_(rows), c_(cols) {}

    __host__ __device__ int batch() const { return b_.get(); }
    __host__ __device__ int heads() const { return h_.get(); }
    __host__ __device__ int rows() const { return r_.get(); }
    __host__ __device__ int cols() const { return c_.get(); }

    __host__ __device__ T* ptr(int b, int h, int r, int c) const {
        return raw + b * batch_stride + h * head_stride + r * row_stride + c;
    }
};

template <typename G>
concept global_layout = requires(G g) { typename G::dtype; g.raw; g.rows(); g.cols(); g.row_stride; };

}  // namespace kittens
