// Column sums of chunk rows on the tensor cores, shared by the Based forward and backward kernels.
#pragma once
#include "kittens/kittens.cuh"

namespace tk::based {

// One value per column of a 16-wide accumulator tile, at the positions this lane holds: columns
// 2 (lane % 4) + {0, 1} (half 0) and 8 more (half 1). Sums over rows (of v, of k) are kept so,
// instead of as whole tiles of equal rows.
struct column_values {
    float2 half[2];
};

// Column sums of the 64 chunk rows held as four col-layout 16x16 tiles, added to `sums`: as the
// product ones (16 x 64) x X on the tensor cores, whose every row is the column sum in the
// accumulator's layout.
template <typename T>
__device__ __forceinline__ void add_column_sums(column_values& sums, const kittens::rt<T, 16, 16>& ones,
                                                const kittens::rt<T, 16, 16, kittens::col_l> (&x)[4]) {
    kittens::rt_fl<16, 16> total;
    kittens::zero(total);
#pragma unroll
    for (int j = 0; j < 4; j++) kittens::mma_AB(total, ones, x[j], total);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        sums.half[half].x += total.tiles[0][0].data[2 * half].x;
        sums.half[half].y += total.tiles[0][0].data[2 * half].y;
    }
}

}  // namespace tk::based
