// The public Based state (B, H, 273, Dv + 1) of one (batch, head) in HBM, as the forward and
// backward kernels read and write it (feature order in params.h).
#pragma once
#include <cstdint>

namespace tk::based {

struct StateRows {
    float* base;
    int pitch;  // Dv + 1
    __device__ float& operator()(int row, int col) const { return base[int64_t(row) * pitch + col]; }
    // The symmetric part of the quadratic block at features (a, b), over the internal scale:
    // rows 17 + 16 a + b and 17 + 16 b + a, halved, divided by kappa (c.half_inv_kappa).
    template <typename Constants>
    __device__ float quad(int a, int b, int col, const Constants& c) const {
        return ((*this)(17 + 16 * a + b, col) + (*this)(17 + 16 * b + a, col)) * c.half_inv_kappa;
    }
};

}  // namespace tk::based
