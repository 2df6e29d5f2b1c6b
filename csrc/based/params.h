// Plain-C++ description of one Based forward call, shared by the torch op (based_ops.cpp) and the
// kernel file, which must not include torch headers.
//
// Based linear attention (feature dim 16): s_ij = scale * <q_i, k_j>,
//   o_i = sum_{j<=i} p(s_ij) v_j with p(s) = 1 + s + s^2 / 2,
//   normalize: o_i / (sum_{j<=i} p(s_ij) + eps).
// With phi(x) = [1, sqrt(scale) x, (scale / sqrt(2)) vec(x x^T)] (273 features, vec row-major:
// feature 17 + 16 a + b is x_a x_b), p(s_ij) = phi(q_i) . phi(k_j), and the recurrent state is
//   state = sum_j phi(k_j) [v_j, 1]^T        (273 x (Dv + 1), fp32; the last column is the
//                                             normaliser state z = sum_j phi(k_j)),
// so that a sequence continued from `state` adds phi(q_i)^T state[:, :Dv] to o_i's numerator and
// phi(q_i) . state[:, Dv] to its denominator. normalize changes the output, never the state.
// The quadratic block of a state built from keys is symmetric (rows 17 + 16 a + b and
// 17 + 16 b + a are equal); the kernel reads an initial state's quadratic block through its
// symmetric part (which gives the same outputs) and returns a symmetric final state.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace tk::based {

enum class ElementType { bf16, fp16 };

inline constexpr int FEATURE_DIM = 16;                                              // q, k head dim
inline constexpr int STATE_ROWS = 1 + FEATURE_DIM + FEATURE_DIM * FEATURE_DIM;      // 273

struct ForwardParams {
    // (batch, heads, length, dim) with the last dim contiguous; every other stride (elements) a
    // multiple of 8 and base pointers 16-byte aligned.
    const void* q;  // (B, H, N, 16)
    const void* k;  // (B, H, N, 16)
    const void* v;  // (B, H, N, Dv), Dv a multiple of 64
    void* o;        // (B, H, N, Dv), q's dtype
    int64_t q_stride_b, q_stride_h, q_stride_l;
    int64_t k_stride_b, k_stride_h, k_stride_l;
    int64_t v_stride_b, v_stride_h, v_stride_l;
    int64_t o_stride_b, o_stride_h, o_stride_l;
    // (B, H, 273, Dv + 1) fp32 contiguous, or null: the state the sequence continues from.
    const float* initial_state;
    // (B, H, 273, Dv + 1) fp32 contiguous, or null: receives the state after the last row.
    float* final_state;

    int batch, heads;
    int len;        // >= 1
    int value_dim;  // Dv: 64 or 128 (any multiple of 64 works)
    float scale;    // > 0 (the state carries sqrt(scale))
    bool normalize;
    float eps;
    ElementType dtype;
};

// mma.sync + cp.async kernel (sm_80 and newer). Returns the launch error, if any.
cudaError_t forward_sm80(const ForwardParams& params, cudaStream_t stream);
// TMA + wgmma kernel (sm_90a; forward_sm90.cu), the same contract (the strides also give TMA its
// tensor maps). Returns the launch error, if any.
cudaError_t forward_sm90(const ForwardParams& params, cudaStream_t stream);

}  // namespace tk::based
