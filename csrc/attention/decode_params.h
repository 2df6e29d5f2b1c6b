// Plain-C++ description of a decoding call (a few query rows against a long key/value cache) and
// the launch functions of the decode kernels (decode.cu) and of the KV-cache append
// (kvcache.cu). Shared by the op bindings (decode_ops.cpp) and the kernel files, which include
// no torch headers.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "attention/attention_params.h"

namespace tk::attention {

// Query rows (len_q) the decode kernels take: the rows of a GQA group are packed into tiles of
// up to 64 rows (decode.cu), and past a few dozen query rows the forward kernels are faster.
constexpr int kDecodeMaxLenQ = 64;

struct DecodeParams {
    // Layouts (batch, heads, length, head_dim) as ForwardParams': last dim contiguous, every
    // other stride a multiple of 8 elements, base pointers 16-byte aligned.
    const void* q;  // (B, Hq,  Lq, D)
    const void* k;  // (B, Hkv, Lk, D); Lk is the cache's capacity when `seqlens` is given
    const void* v;  // (B, Hkv, Lk, D)
    void* o;        // (B, Hq,  Lq, D) contiguous, q's dtype
    float* lse;     // (B, Hq,  Lq) contiguous fp32, natural log
    // Split launches (DecodePlan::splits > 1): each split's normalised O and its lse, fp32,
    // (B * Hq * Lq, splits, D) and (B * Hq * Lq, splits); merged into o and lse afterwards.
    float* partial_o;
    float* partial_lse;

    // Per-sequence key counts: keys 0 .. seqlens[b] + seqlen_add - 1 of sequence b are read
    // (clamped to [0, len_kv]); nullptr: every sequence has len_kv keys.
    const int* seqlens;
    int seqlen_add;

    int64_t q_stride_b, q_stride_h, q_stride_l;
    int64_t k_stride_b, k_stride_h, k_stride_l;
    int64_t v_stride_b, v_stride_h, v_stride_l;

    int batch, heads_q, heads_kv;  // heads_q % heads_kv == 0
    int len_q;                     // 1 .. kDecodeMaxLenQ
    int len_kv;                    // >= 1
    int head_dim;                  // one of DecodeHeadDims (head_dims.h)
    float scale;                   // > 0
    // Causal: key j visible to query i iff j <= i + offset, where offset is causal_offset without
    // seqlens and (lower-right) keys_b - len_q with them (keys_b: sequence b's key count).
    bool causal;
    int causal_offset;
    ElementType dtype;

    int multiprocessors;    // of the current device
    bool dependent_launch;  // the current device is sm_90 or newer: the merge kernel is launched
                            // as a programmatic dependent of the split kernel
};

// How a decode call is cut into blocks, from shapes only (plan_decode): the op sizes the split
// workspace by it and decode_forward launches by it.
struct DecodePlan {
    int row_groups;       // 16-row warp groups per block: 1, 2 or 4 (a block's tile of query rows)
    int m_tiles;          // tiles of 16 * row_groups packed rows per (batch, kv head)
    int block_kv;         // keys per shared-memory stage
    int splits;           // pieces the keys of each (batch, kv head) are cut into
    int tiles_per_split;  // key tiles (block_kv keys) per piece
    int64_t partial_rows; // B * Hq * Lq when split, else 0
};
DecodePlan plan_decode(const DecodeParams& params);

// The split kernel (and, when split, the merge kernel) on `stream`.
cudaError_t decode_forward(const DecodeParams& params, const DecodePlan& plan, cudaStream_t stream);

// Writes k_new / v_new (B, Hkv, Lnew, D) into the caches (B, Hkv, S, D) at rows
// seqlens[b] .. seqlens[b] + Lnew - 1 of each sequence b (rows outside 0 .. S - 1 are dropped).
struct AppendParams {
    void* k_cache;
    void* v_cache;
    const void* k_new;
    const void* v_new;
    const int* seqlens;
    int64_t kc_stride_b, kc_stride_h, kc_stride_l;
    int64_t vc_stride_b, vc_stride_h, vc_stride_l;
    int64_t kn_stride_b, kn_stride_h, kn_stride_l;
    int64_t vn_stride_b, vn_stride_h, vn_stride_l;
    int batch, heads, len_new, capacity, head_dim;
    int element_bytes;  // 2 (bf16 / fp16)
};
cudaError_t kvcache_append(const AppendParams& params, cudaStream_t stream);

}  // namespace tk::attention
