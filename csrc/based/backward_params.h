// Plain-C++ description of one Based backward call (the Python layer turns a normalised call into
// this one plus the normaliser's terms across blocks), shared by the torch op
// (backward_ops.cpp) and the kernel files, which must not include torch headers.
//
// With p(s) = 1 + s + s^2 / 2, s_ij = scale <q_i, k_j>, A_ij = p(s_ij) for j <= i, the forward is
//   o = A v + phi(q) S0[:, :Dv]                         (S0: the initial state, params.h)
//   final_state = S0 + sum_j phi(k_j) [v_j, 1]^T
// and, for the gradients do of o and dF of the final state, the kernels compute
//   dv_j = sum_{i >= j} A_ij do_i + phi(k_j)^T dF[:, :Dv]
//   dq_i = sum_{j <= i} dP_ij p'(s_ij) scale k_j + J_phi(q_i)^T S0[:, :Dv] do_i
//   dk_j = sum_{i >= j} dP_ij p'(s_ij) scale q_i + J_phi(k_j)^T dF[:, :Dv] v_j
//   d_initial_state[:, :Dv] = sum_i phi(q_i) do_i^T + dF[:, :Dv],  d_initial_state[:, Dv] = 0
// with dP_ij = <do_i, v_j> and p'(s) = 1 + s. S0 and dF enter through the symmetric part of their
// quadratic blocks (as the forward reads S0), and d_initial_state's quadratic block comes out
// symmetric: the caller adds dF's antisymmetric part and its last column (dk's term from dF's
// last column too), which the kernels never see.
//
// With grad_denominator (g_i per row, float32), the gradient of the block-local denominators
// d_i = sum_{j in block(i), j <= i} p(s_ij) (block(i): the DENOMINATOR_BLOCK rows that hold i) is
// added: dP_ij becomes <do_i, v_j> + g_i for j in block(i) in dq and dk above. That is the
// normalised forward's term that cancels against the value term where o_i hardly depends on the
// keys (the first rows of a sequence: with one key the gradient of q is 0), so the two meet in
// fp32 before dP p'(s) is rounded; the caller adds the earlier blocks' terms, which do not cancel.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "based/params.h"

namespace tk::based {

// The rows of a block of grad_denominator's denominators: the kernels' chunk.
inline constexpr int DENOMINATOR_BLOCK = 64;

struct BackwardParams {
    // (batch, heads, length, dim) with the last dim contiguous; every other stride (elements) a
    // multiple of 8 and base pointers 16-byte aligned.
    const void* grad_out;  // (B, H, N, Dv)
    const void* q;         // (B, H, N, 16)
    const void* k;         // (B, H, N, 16)
    const void* v;         // (B, H, N, Dv)
    void* dq;              // (B, H, N, 16), q's dtype
    void* dk;              // (B, H, N, 16)
    void* dv;              // (B, H, N, Dv)
    int64_t grad_out_stride_b, grad_out_stride_h, grad_out_stride_l;
    int64_t q_stride_b, q_stride_h, q_stride_l;
    int64_t k_stride_b, k_stride_h, k_stride_l;
    int64_t v_stride_b, v_stride_h, v_stride_l;
    int64_t dq_stride_b, dq_stride_h, dq_stride_l;
    int64_t dk_stride_b, dk_stride_h, dk_stride_l;
    int64_t dv_stride_b, dv_stride_h, dv_stride_l;
    // (B, H, 273, Dv + 1) fp32 contiguous, or null: the forward's initial state.
    const float* initial_state;
    // (B, H, 273, Dv + 1) fp32 contiguous, or null: the gradient of the forward's final state.
    const float* grad_final_state;
    // (B, H, 273, Dv + 1) fp32 contiguous, or null: receives the initial state's gradient.
    float* grad_initial_state;
    // (B, H, N) fp32 contiguous, or null: g, the gradient of the block-local denominators.
    const float* grad_denominator;
    // (Dv / 64, B, H, N, 16) fp32 contiguous, or null: where the sm90 kernels split the value
    // columns over blocks (Dv = 128), each block's part of dq and of dk; the op adds the parts.
    float* dq_parts;
    float* dk_parts;

    int batch, heads;
    int len;        // >= 1
    int value_dim;  // Dv: 64 or 128
    float scale;    // > 0
    ElementType dtype;
};

// What the op layer checks about a call's sizes and scale; the kernel entries below refuse a
// direct caller's call that fails it (an error instead of a wrong launch).
inline bool backward_params_valid(const BackwardParams& p) {
    return p.len >= 1 && p.batch >= 1 && p.heads >= 1 && (p.value_dim == 64 || p.value_dim == 128) && p.scale > 0.f;
}

// Dynamic shared memory (bytes) the backward kernels need for value dim Dv (64 or 128), the
// larger of its two kernels: the op checks it against the device's opt-in limit.
int backward_sm80_shared_bytes(int value_dim);

// mma.sync + cp.async kernels (sm_80 and newer): dq, then dk and dv (two launches on `stream`).
// Returns the launch error, if any.
cudaError_t backward_sm80(const BackwardParams& params, cudaStream_t stream);

// The same on sm_90 (Hopper): TMA + wgmma kernels, a block per 64 value columns; with Dv = 128 they
// need dq_parts and dk_parts (backward_sm90_parts(128) = 2 parts each). backward_sm90_shared_bytes
// as above.
inline int backward_sm90_parts(int value_dim) { return value_dim > 64 ? value_dim / 64 : 0; }
int backward_sm90_shared_bytes(int value_dim);
cudaError_t backward_sm90(const BackwardParams& params, cudaStream_t stream);

}  // namespace tk::based
