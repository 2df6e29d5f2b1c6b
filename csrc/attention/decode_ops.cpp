// CUDA implementations of tk::attention_fwd_decode, tk::attention_decode_kvcache and
// tk::kvcache_append: cheap re-checks of what the Python layer already made conform (shapes,
// dtypes, devices, strides, alignment; never data), the outputs and split workspace, a plain
// params struct (decode_params.h), and the launch on the current stream of q's device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "attention/decode_params.h"
#include "attention/head_dims.h"
#include "attention/op_checks.h"
#include "attention/qkv_fields.h"
#include "device_facts.h"
#include "operand_checks.h"

namespace tk::attention {
namespace {

constexpr const char* kDecodeOp = "tk::attention_fwd_decode: ";
constexpr const char* kKvcacheOp = "tk::attention_decode_kvcache: ";
constexpr const char* kAppendOp = "tk::kvcache_append: ";

// q against k/v (op_checks.h), then the decode kernels' query rows. Returns q's element type.
ElementType check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                         const char* op) {
    const ElementType dtype = check_qkv<DecodeHeadDims>(q, k, v, scale, op, " (the decode kernels)");
    TORCH_CHECK(q.size(2) <= kDecodeMaxLenQ, op, "q length must be at most ", kDecodeMaxLenQ,
                " (the decode kernels' query rows), got ", q.size(2));
    return dtype;
}

// Under q's device guard: out, lse and (split plans) the pieces' workspace, then the launch.
std::tuple<at::Tensor, at::Tensor> run(DecodeParams& p, const at::Tensor& q, const char* op) {
    at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), q.size(3)}, q.options());
    at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    p.o = out.mutable_data_ptr();
    p.lse = lse.mutable_data_ptr<float>();
    p.dependent_launch = supports_dependent_launch();
    const DecodePlan plan = plan_decode(p);
    at::Tensor workspace;
    if (plan.splits > 1) {
        // One allocation for both (an allocation is a good part of a decoding step's host time):
        // the pieces' O, then their lse. partial_o keeps the allocation's alignment for its
        // float4 stores; partial_lse (read and written a float at a time) starts
        // partial_rows * splits * head_dim floats in, a multiple of 32 bytes (head_dim % 8 == 0).
        const int64_t pieces = plan.partial_rows * plan.splits;
        workspace = at::empty({pieces * (p.head_dim + 1)}, q.options().dtype(at::kFloat));
        p.partial_o = workspace.mutable_data_ptr<float>();
        p.partial_lse = p.partial_o + pieces * p.head_dim;
    }
    check_launch(decode_forward(p, plan, at::cuda::getCurrentCUDAStream(q.device().index()).stream()), op);
    return {out, lse};
}

// The contract of tk::attention_fwd_sm80 (attention_ops.cpp) for len_q <= kDecodeMaxLenQ.
std::tuple<at::Tensor, at::Tensor> attention_fwd_decode_cuda(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, bool is_causal, double scale,
                                                             bool lower_right) {
    const char* op = kDecodeOp;
    const ElementType dtype = check_shapes(q, k, v, scale, op);
    const int offset = causal_offset(is_causal, lower_right, q.size(2), k.size(2), op);
    const c10::cuda::CUDAGuard device_guard(q.device());
    DecodeParams p{};
    fill_qkv_fields(p, q, k, v, scale, dtype);
    p.causal = is_causal;
    p.causal_offset = offset;
    return run(p, q, op);
}

void check_seqlens(const at::Tensor& seqlens, const at::Tensor& q, const char* op) {
    TORCH_CHECK(seqlens.defined() && seqlens.is_cuda() && seqlens.device() == q.device(), op,
                "cache_seqlens must be a CUDA tensor on q's device (", q.device(), ")");
    TORCH_CHECK(seqlens.scalar_type() == at::kInt, op, "cache_seqlens must be int32, got ", seqlens.scalar_type());
    TORCH_CHECK(seqlens.dim() == 1 && seqlens.size(0) == q.size(0), op,
                "cache_seqlens must have shape (batch,) = (", q.size(0), ",), got ", seqlens.sizes());
    TORCH_CHECK(seqlens.is_contiguous(), op, "cache_seqlens must be contiguous");
}

// Attention of q against the first cache_seqlens[b] + seqlen_add rows of the caches.
std::tuple<at::Tensor, at::Tensor> attention_decode_kvcache_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                                                                 const at::Tensor& v_cache,
                                                                 const at::Tensor& cache_seqlens, int64_t seqlen_add,
                                                                 bool is_causal, double scale) {
    const char* op = kKvcacheOp;
    const ElementType dtype = check_shapes(q, k_cache, v_cache, scale, op);
    check_seqlens(cache_seqlens, q, op);
    TORCH_CHECK(seqlen_add >= 0 && seqlen_add <= k_cache.size(2), op, "seqlen_add must be in [0, ",
                k_cache.size(2), "], got ", seqlen_add);
    const c10::cuda::CUDAGuard device_guard(q.device());
    DecodeParams p{};
    fill_qkv_fields(p, q, k_cache, v_cache, scale, dtype);
    p.seqlens = cache_seqlens.const_data_ptr<int>();
    p.seqlen_add = static_cast<int>(seqlen_add);
    p.causal = is_causal;
    return run(p, q, op);
}

void kvcache_append_cuda(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                         const at::Tensor& k_new, const at::Tensor& v_new) {
    const char* op = kAppendOp;
    TORCH_CHECK(k_cache.defined() && k_cache.is_cuda(), op, "k_cache must be a CUDA tensor");
    check_operand(k_cache, "k_cache", k_cache, op);
    check_operand(v_cache, "v_cache", k_cache, op);
    check_operand(k_new, "k_new", k_cache, op);
    check_operand(v_new, "v_new", k_cache, op);
    element_type(k_cache, op);
    TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), op, "k_cache and v_cache must have the same shape, got ",
                k_cache.sizes(), " and ", v_cache.sizes());
    TORCH_CHECK(k_new.sizes() == v_new.sizes(), op, "k_new and v_new must have the same shape, got ",
                k_new.sizes(), " and ", v_new.sizes());
    TORCH_CHECK(k_new.size(0) == k_cache.size(0) && k_new.size(1) == k_cache.size(1) &&
                    k_new.size(3) == k_cache.size(3),
                op, "k_new ", k_new.sizes(), " must be (batch, heads, len_new, head_dim) of the cache ",
                k_cache.sizes());
    TORCH_CHECK(k_cache.size(3) % 8 == 0, op, "head_dim must be a multiple of 8, got ", k_cache.size(3));
    check_seqlens(cache_seqlens, k_cache, op);
    const c10::cuda::CUDAGuard device_guard(k_cache.device());
    AppendParams p{};
    p.k_cache = k_cache.mutable_data_ptr();
    p.v_cache = v_cache.mutable_data_ptr();
    p.k_new = k_new.const_data_ptr();
    p.v_new = v_new.const_data_ptr();
    p.seqlens = cache_seqlens.const_data_ptr<int>();
    const auto kc = kernel_strides<4>(k_cache), vc = kernel_strides<4>(v_cache);
    const auto kn = kernel_strides<4>(k_new), vn = kernel_strides<4>(v_new);
    p.kc_stride_b = kc[0], p.kc_stride_h = kc[1], p.kc_stride_l = kc[2];
    p.vc_stride_b = vc[0], p.vc_stride_h = vc[1], p.vc_stride_l = vc[2];
    p.kn_stride_b = kn[0], p.kn_stride_h = kn[1], p.kn_stride_l = kn[2];
    p.vn_stride_b = vn[0], p.vn_stride_h = vn[1], p.vn_stride_l = vn[2];
    p.batch = static_cast<int>(k_cache.size(0));
    p.heads = static_cast<int>(k_cache.size(1));
    p.capacity = static_cast<int>(k_cache.size(2));
    p.len_new = static_cast<int>(k_new.size(2));
    p.head_dim = static_cast<int>(k_cache.size(3));
    p.element_bytes = static_cast<int>(k_cache.element_size());
    check_launch(kvcache_append(p, at::cuda::getCurrentCUDAStream(k_cache.device().index()).stream()), op);
}

}  // namespace
}  // namespace tk::attention

TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("attention_fwd_decode", &tk::attention::attention_fwd_decode_cuda);
    m.impl("attention_decode_kvcache", &tk::attention::attention_decode_kvcache_cuda);
    m.impl("kvcache_append", &tk::attention::kvcache_append_cuda);
}
