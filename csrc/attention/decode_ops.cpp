// CUDA implementations of tk::attention_fwd_decode, tk::attention_decode_kvcache and
// tk::kvcache_append: cheap re-checks of what the Python layer already made conform (shapes,
// dtypes, devices, strides, alignment; never data), the outputs and split workspace, a plain
// params struct (decode_params.h), and the launch on the current stream of q's device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>

#include "attention/decode_params.h"
#include "attention/head_dims.h"
#include "device_facts.h"
#include "operand_checks.h"

namespace tk::attention {
namespace {

constexpr const char* kDecodeOp = "tk::attention_fwd_decode: ";
constexpr const char* kKvcacheOp = "tk::attention_decode_kvcache: ";
constexpr const char* kAppendOp = "tk::kvcache_append: ";

void check_operand(const at::Tensor& t, const char* name, const at::Tensor& q, const char* op) {
    check_like(t, name, q, "q", op);
    check_extents(t, name, 4, "(batch, heads, length, head_dim)", op);
    check_row_layout(t, name, op);
}

ElementType element_type(const at::Tensor& q, const char* op) {
    switch (q.scalar_type()) {
        case at::kBFloat16: return ElementType::bf16;
        case at::kHalf: return ElementType::fp16;
        default: TORCH_CHECK(false, op, "q must be bfloat16 or float16, got ", q.scalar_type());
    }
}

// q against k/v: batch, heads (GQA), head dims, the decode kernels' limits.
void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, const char* op) {
    TORCH_CHECK(q.defined() && q.is_cuda(), op, "q must be a CUDA tensor");
    check_operand(q, "q", q, op);
    check_operand(k, "k", q, op);
    check_operand(v, "v", q, op);
    element_type(q, op);
    const int64_t batch = q.size(0), heads_q = q.size(1), len_q = q.size(2), head_dim = q.size(3);
    TORCH_CHECK(k.size(0) == batch && v.size(0) == batch, op, "batch sizes differ: q ", q.sizes(), ", k ",
                k.sizes(), ", v ", v.sizes());
    TORCH_CHECK(k.sizes() == v.sizes(), op, "k and v must have the same shape, got k ", k.sizes(), " and v ",
                v.sizes());
    TORCH_CHECK(heads_q % k.size(1) == 0, op, "q heads (", heads_q, ") must be a multiple of k/v heads (",
                k.size(1), ")");
    TORCH_CHECK(DecodeHeadDims::contains(head_dim), op, "head_dim must be 64, 96 or 128, got ", head_dim);
    TORCH_CHECK(k.size(3) == head_dim, op, "k head_dim (", k.size(3), ") must equal q head_dim (", head_dim, ")");
    TORCH_CHECK(len_q <= kDecodeMaxLenQ, op, "q length must be at most ", kDecodeMaxLenQ,
                " (the decode kernels' query rows), got ", len_q);
    TORCH_CHECK(std::isfinite(scale) && scale > 0, op, "scale must be finite and positive, got ", scale);
}

DecodeParams describe(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
    DecodeParams p{};
    p.q = q.const_data_ptr();
    p.k = k.const_data_ptr();
    p.v = v.const_data_ptr();
    const auto qs = kernel_strides<4>(q), ks = kernel_strides<4>(k), vs = kernel_strides<4>(v);
    p.q_stride_b = qs[0], p.q_stride_h = qs[1], p.q_stride_l = qs[2];
    p.k_stride_b = ks[0], p.k_stride_h = ks[1], p.k_stride_l = ks[2];
    p.v_stride_b = vs[0], p.v_stride_h = vs[1], p.v_stride_l = vs[2];
    p.batch = static_cast<int>(q.size(0));
    p.heads_q = static_cast<int>(q.size(1));
    p.heads_kv = static_cast<int>(k.size(1));
    p.len_q = static_cast<int>(q.size(2));
    p.len_kv = static_cast<int>(k.size(2));
    p.head_dim = static_cast<int>(q.size(3));
    p.scale = static_cast<float>(scale);
    p.dtype = q.scalar_type() == at::kBFloat16 ? ElementType::bf16 : ElementType::fp16;
    p.multiprocessors = multiprocessor_count();
    return p;
}

// Under q's device guard: out, lse and (split plans) the pieces' workspace, then the launch.
std::tuple<at::Tensor, at::Tensor> run(DecodeParams& p, const at::Tensor& q, const char* op) {
    at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), q.size(3)}, q.options());
    at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    p.o = out.mutable_data_ptr();
    p.lse = lse.mutable_data_ptr<float>();
    const DecodePlan plan = plan_decode(p);
    at::Tensor partial_o, partial_lse;
    if (plan.splits > 1) {
        const auto f32 = q.options().dtype(at::kFloat);
        partial_o = at::empty({plan.partial_rows * plan.splits * p.head_dim}, f32);
        partial_lse = at::empty({plan.partial_rows * plan.splits}, f32);
        p.partial_o = partial_o.mutable_data_ptr<float>();
        p.partial_lse = partial_lse.mutable_data_ptr<float>();
    }
    check_launch(decode_forward(p, plan, at::cuda::getCurrentCUDAStream(q.device().index()).stream()), op);
    return {out, lse};
}

// The contract of tk::attention_fwd_sm80 (attention_ops.cpp) for len_q <= kDecodeMaxLenQ.
std::tuple<at::Tensor, at::Tensor> attention_fwd_decode_cuda(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, bool is_causal, double scale,
                                                             bool lower_right) {
    const char* op = kDecodeOp;
    check_shapes(q, k, v, scale, op);
    TORCH_CHECK(is_causal || !lower_right, op,
                "lower_right=True needs is_causal=True (it moves the causal diagonal to the "
                "bottom-right corner; without is_causal there is no diagonal)");
    const c10::cuda::CUDAGuard device_guard(q.device());
    DecodeParams p = describe(q, k, v, scale);
    p.causal = is_causal;
    p.causal_offset = lower_right ? p.len_kv - p.len_q : 0;
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
    check_shapes(q, k_cache, v_cache, scale, op);
    check_seqlens(cache_seqlens, q, op);
    TORCH_CHECK(seqlen_add >= 0 && seqlen_add <= k_cache.size(2), op, "seqlen_add must be in [0, ",
                k_cache.size(2), "], got ", seqlen_add);
    const c10::cuda::CUDAGuard device_guard(q.device());
    DecodeParams p = describe(q, k_cache, v_cache, scale);
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
