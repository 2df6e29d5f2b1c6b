// Plain-C++ descriptions of the attention calls (forward and backward) and the launch functions
// of every attention kernel. Shared by the torch ops (attention_ops.cpp) and the kernel files,
// which must not include torch headers (they compile much faster without them).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace tk::attention {

enum class ElementType { bf16, fp16 };

struct ForwardParams {
    // Layouts are (batch, heads, length, head_dim); the last dim is contiguous and
    // every other stride (in elements) is a multiple of 8, base pointers 16-byte aligned.
    const void* q;  // (B, Hq,  Lq, D)
    const void* k;  // (B, Hkv, Lk, D)
    const void* v;  // (B, Hkv, Lk, D)
    void* o;        // (B, Hq,  Lq, D), same strides rules
    float* lse;     // (B, Hq,  Lq) contiguous fp32: natural-log log-sum-exp of scaled scores
    // sm90 only, nullptr for none: (B, Hq, Lq, D) contiguous, in the input dtype, out's rounding
    // residual (O - O as stored), for the backward's rowsum(dO * O) (OutputView).
    void* o_residual;
    int* task_counter;  // sm90 causal only: one int32, zero at launch (the persistent grid's task queue)
    // sm90 non-causal, when its plan splits (ForwardSm90Plan): the split last round's partial
    // results (fp32) and its per-task counters of finished pieces (int32, zero at launch).
    float* partials;
    int* pieces_done;

    int64_t q_stride_b, q_stride_h, q_stride_l;
    int64_t k_stride_b, k_stride_h, k_stride_l;
    int64_t v_stride_b, v_stride_h, v_stride_l;
    int64_t o_stride_b, o_stride_h, o_stride_l;

    int batch, heads_q, heads_kv;  // heads_q % heads_kv == 0 (GQA/MQA)
    int len_q, len_kv;             // >= 1, arbitrary
    int head_dim;                  // one the kernel family is built for (head_dims.h)
    float scale;                   // softmax scale applied to q.k
    bool causal;                   // key j visible to query i iff j <= i + causal_offset
    int causal_offset;             // 0: SDPA's is_causal (top-left); Lk - Lq: causal_lower_right
    ElementType dtype;

    // Facts about the current device (from torch's cached properties: no query per launch).
    int multiprocessors;
    int64_t l2_bytes;
};

// One attention backward call (dq, dk, dv from dO), for the sm_90 kernel. q, k, v, dout follow
// ForwardParams' layout rules; the op layer prepares the per-row statistics and the fp32 dq
// accumulator, and converts dq afterwards.
struct BackwardParams {
    const void* q;     // (B, Hq,  Lq, D)
    const void* k;     // (B, Hkv, Lk, D)
    const void* v;     // (B, Hkv, Lk, D)
    const void* dout;  // (B, Hq,  Lq, D)
    int64_t q_stride_b, q_stride_h, q_stride_l;
    int64_t k_stride_b, k_stride_h, k_stride_l;
    int64_t v_stride_b, v_stride_h, v_stride_l;
    int64_t dout_stride_b, dout_stride_h, dout_stride_l;
    float* dq_accum;     // (B, Hq, Lq, D) fp32 contiguous, zeroed by backward_statistics: receives dS K (unscaled)
    void* dk;            // (B, Hkv, Lk, D) contiguous, input dtype
    void* dv;            // (B, Hkv, Lk, D) contiguous, input dtype
    // Per-row statistics, (B, Hq, len_q_padded) fp32, in the form the kernel's products start
    // from: S = Q K^T + score_shift gives P = exp2(S * scale * log2(e)), dP + neg_delta = dP - delta.
    // Written by backward_statistics, read by the backward kernel.
    float* score_shift;  // -lse / scale; -inf past Lq and where lse is -inf (P = 0)
    float* neg_delta;    // -rowsum(dO * O); 0 past Lq
    int len_q_padded;    // Lq rounded up to a multiple of 64
    int* task_counter;   // causal or deterministic: one int32, zeroed by backward_statistics (the task queue)
    // Deterministic dq: one int32 turn counter per (batch, query head, 64-row query block),
    // zeroed by backward_statistics; the key blocks then add into each dq block in a fixed
    // order. nullptr: in arrival order (faster; dq may differ in the last bits between runs).
    int* dq_turns;

    int batch, heads_q, heads_kv;
    int len_q, len_kv;
    int head_dim;  // one of Sm90HeadDims (head_dims.h)
    float scale;
    bool causal;        // ForwardParams' rule: key j visible to query i iff j <= i + causal_offset
    int causal_offset;  // rows that see no key (lower-right with Lq > Lk) have lse = -inf, out = 0
    ElementType dtype;

    // Facts about the current device, as in ForwardParams.
    int multiprocessors;
    int64_t l2_bytes;
};

// TMA + wgmma backward (sm_90a only).
cudaError_t backward_sm90(const BackwardParams& params, cudaStream_t stream);

// The forward's output and log-sum-exp, as the backward's preparation reads them.
struct OutputView {
    const void* out;  // (B, Hq, Lq, D), ForwardParams' layout rules
    int64_t stride_b, stride_h, stride_l;
    const float* lse;  // (B, Hq, Lq) contiguous
    // nullptr, or the forward's o_residual: delta = rowsum(dO * (out + residual)). Without it
    // delta carries out's rounding error (|dO| |O| 2^-9 in bf16), which a peaked softmax turns
    // into a gradient error as large as the gradient: dP - delta nearly cancels there.
    const void* out_residual;
};

// Fills BackwardParams' score_shift and neg_delta (B, Hq, len_q_padded) from dout, out and lse,
// and zeroes its dq_accum and task_counter (backward_statistics.cu; any GPU).
cudaError_t backward_statistics(const BackwardParams& params, const OutputView& out, cudaStream_t stream);

// dq = dq_accum * scale in the input dtype, (B, Hq, Lq, D) contiguous (backward_statistics.cu).
cudaError_t backward_finish_dq(const BackwardParams& params, void* dq, cudaStream_t stream);

// mma.sync + cp.async kernel (sm_80 and newer). Returns the launch error, if any.
cudaError_t forward_sm80(const ForwardParams& params, cudaStream_t stream);

// How the sm90 forward runs one call, from the params' shapes, causality and head dim and the
// device's SM count (never data). Made once per call (plan_forward_sm90): the op sizes the
// workspace by it and hands it to forward_sm90, which launches by it.
struct ForwardSm90Plan {
    int consumers;  // consumer warpgroups per block, 64 query rows each
    // The non-causal split of the last round (task_order.h: split_last_round): the tasks from
    // whole_tasks on, split_tasks of them, run as 2^piece_shift pieces each; 0: nothing split.
    int whole_tasks, split_tasks, piece_shift;
    // What the launch needs beside the outputs: one zeroed int32 at task_counter (causal: the
    // task queue); partial_floats fp32 elements at partials and `counters` zeroed int32 at
    // pieces_done (both 0 when nothing is split, always so for causal).
    bool needs_task_counter;
    int64_t partial_floats;
    int64_t counters;
};
ForwardSm90Plan plan_forward_sm90(const ForwardParams& params);

// TMA + wgmma + warp-specialised kernel (sm_90a only), as `plan` (made for these params) says.
cudaError_t forward_sm90(const ForwardParams& params, const ForwardSm90Plan& plan, cudaStream_t stream);

}  // namespace tk::attention
