// Plain-C++ description of one Based decoding step, shared by the torch op (step_ops.cpp) and the
// kernel (step.cu), which must not include torch headers. The state and the feature map are
// those of params.h: state (B, H, 273, Dv + 1) fp32 = sum_j phi(k_j) [v_j, 1]^T.
//
// For each token t = 0 .. T-1 in order:
//   state += phi(k_t) [v_t, 1]^T
//   o_t    = phi(q_t)^T state[:, :Dv]     (normalize: / (phi(q_t)^T state[:, Dv] + eps))
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "based/params.h"

namespace tk::based {

struct StepParams {
    // q, k (B, H, T, 16) and v (B, H, T, Dv) in `dtype`, any strides (elements; read by scalars).
    const void* q;
    const void* k;
    const void* v;
    int64_t q_stride[4], k_stride[4], v_stride[4];  // batch, head, token, feature
    void* o;  // (B, H, T, Dv) contiguous, q's dtype
    // (B, H, 273, Dv + 1) fp32 with rows contiguous (column stride 1, row stride Dv + 1) and the
    // given batch and head strides, shared by both. state_in may equal state_out (in place);
    // otherwise the two must start at the same address modulo 16 and every (b, h) slice must not
    // overlap another: a slice is read and written as 16-byte vectors wherever its addresses allow.
    const float* state_in;
    float* state_out;
    int64_t state_stride_b, state_stride_h;

    int batch, heads;
    int tokens;     // T >= 1
    int value_dim;  // Dv: 64 or 128
    double scale;   // > 0, as given (phi's constants are rounded to fp32 from it, as the reference does)
    bool normalize;
    float eps;
    ElementType dtype;
};

// CUDA cores only (any GPU from sm_80 on). Returns the launch error, if any.
cudaError_t step_sm80(const StepParams& params, cudaStream_t stream);

}  // namespace tk::based
