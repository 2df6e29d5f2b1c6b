// CUDA implementations of tk::attention_fwd_sm80, tk::attention_fwd_sm90 and
// tk::attention_bwd_sm90: re-check the inputs (cheaply: shapes, dtypes, devices, strides,
// alignment; never data), allocate the outputs, describe the call in a plain params struct
// (attention_params.h) and launch the kernel on the current stream of q's device.
//
// The Python layer (thunderkittens.attention) already makes inputs conform; these checks are
// for direct callers of torch.ops.tk.*, and they name the op and the offending argument.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "attention/attention_params.h"
#include "attention/head_dims.h"
#include "attention/op_checks.h"
#include "attention/qkv_fields.h"
#include "device_facts.h"
#include "operand_checks.h"

namespace tk::attention {
namespace {

// Error messages start with the op's name.
constexpr const char* kSm80Op = "tk::attention_fwd_sm80: ";
constexpr const char* kSm90Op = "tk::attention_fwd_sm90: ";
constexpr const char* kSm90TrainOp = "tk::attention_fwd_sm90_train: ";
constexpr const char* kBwdOp = "tk::attention_bwd_sm90: ";

// ForwardParams' and BackwardParams' fields beyond q, k and v's (qkv_fields.h).
template <typename Params>
void fill_common(Params& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                 int offset, double scale, ElementType dtype) {
    fill_qkv_fields(p, q, k, v, scale, dtype);
    p.causal = is_causal;
    p.causal_offset = offset;
    p.l2_bytes = l2_cache_bytes();
}

// What the forward's checks establish beside the tensors themselves.
struct ForwardCall {
    ElementType dtype;
    int causal_offset;
};

// The checks both forward ops make. `Dims`: the head dims of the op's kernel (head_dims.h);
// `kernel`: a note on them for the message ("" or " (...)").
template <typename Dims>
ForwardCall check_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                          double scale, bool lower_right, const char* op, const char* kernel) {
    const ElementType dtype = check_qkv<Dims>(q, k, v, scale, op, kernel);
    return {dtype, causal_offset(is_causal, lower_right, q.size(2), k.size(2), op)};
}

// Under q's device guard (the params carry the device's facts): allocates out (q's shape,
// contiguous) and lse (batch, heads_q, len_q) fp32, and describes the call.
ForwardParams forward_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                             double scale, const ForwardCall& call, at::Tensor& out, at::Tensor& lse) {
    out = at::empty({q.size(0), q.size(1), q.size(2), q.size(3)}, q.options());
    lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    ForwardParams params{};
    fill_common(params, q, k, v, is_causal, call.causal_offset, scale, call.dtype);
    params.o = out.mutable_data_ptr();
    params.lse = lse.mutable_data_ptr<float>();
    const auto os = kernel_strides<4>(out);
    params.o_stride_b = os[0], params.o_stride_h = os[1], params.o_stride_l = os[2];
    return params;
}

cudaStream_t current_stream(const at::Tensor& q) { return at::cuda::getCurrentCUDAStream(q.device().index()).stream(); }

// The mma.sync forward (sm_80 and newer).
std::tuple<at::Tensor, at::Tensor> attention_fwd_sm80_cuda(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, bool is_causal, double scale,
                                                           bool lower_right) {
    const char* op = kSm80Op;
    const ForwardCall call =
        check_forward<Sm80HeadDims>(q, k, v, is_causal, scale, lower_right, op, " (the sm80 kernel)");
    const c10::cuda::CUDAGuard device_guard(q.device());
    at::Tensor out, lse;
    const ForwardParams params = forward_params(q, k, v, is_causal, scale, call, out, lse);
    check_launch(forward_sm80(params, current_stream(q)), op);
    return {out, lse};
}

// The TMA + wgmma forward (sm_90 only), with the workspace its plan asks for: the causal task
// queue, or the split last round's partial results and counters (zeroed by memsets on the
// stream, so the call stays graph-capturable). With `residual` (defined on return) also out's
// rounding residual, for the backward.
std::tuple<at::Tensor, at::Tensor> forward_sm90_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     bool is_causal, double scale, bool lower_right, const char* op,
                                                     at::Tensor* residual) {
    const ForwardCall call = check_forward<Sm90HeadDims>(q, k, v, is_causal, scale, lower_right, op, "");
    const c10::cuda::CUDAGuard device_guard(q.device());
    check_sm90(q.device(), op, "tk.attention picks the sm80 kernel or SDPA there");
    at::Tensor out, lse;
    ForwardParams params = forward_params(q, k, v, is_causal, scale, call, out, lse);
    if (residual != nullptr) {
        *residual = at::empty_like(out);  // written whole by the kernel (rows of no key: 0)
        params.o_residual = residual->mutable_data_ptr();
    }
    const ForwardSm90Plan plan = plan_forward_sm90(params);
    const auto i32 = q.options().dtype(at::kInt);
    at::Tensor task_counter, partials, pieces_done;
    if (plan.needs_task_counter) {
        task_counter = at::zeros({1}, i32);
        params.task_counter = task_counter.mutable_data_ptr<int>();
    }
    if (plan.partial_floats > 0) {
        partials = at::empty({plan.partial_floats}, q.options().dtype(at::kFloat));
        pieces_done = at::zeros({plan.counters}, i32);
        params.partials = partials.mutable_data_ptr<float>();
        params.pieces_done = pieces_done.mutable_data_ptr<int>();
    }
    check_launch(forward_sm90(params, plan, current_stream(q)), op);
    return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> attention_fwd_sm90_cuda(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, bool is_causal, double scale,
                                                           bool lower_right) {
    return forward_sm90_call(q, k, v, is_causal, scale, lower_right, kSm90Op, nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_fwd_sm90_train_cuda(const at::Tensor& q, const at::Tensor& k,
                                                                             const at::Tensor& v, bool is_causal,
                                                                             double scale, bool lower_right) {
    at::Tensor residual;
    auto [out, lse] = forward_sm90_call(q, k, v, is_causal, scale, lower_right, kSm90TrainOp, &residual);
    return {out, lse, residual};
}

// dq, dk, dv of out = attention(q, k, v) given dout, in three launches on the current stream:
// the per-row statistics the kernel reads (-lse / scale and -rowsum(dout * out), padded to whole
// 64-row blocks), the backward kernel (dk, dv, and dq into a zeroed fp32 accumulator), and the
// scaling/conversion of dq.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_bwd_sm90_cuda(const at::Tensor& dout, const at::Tensor& q,
                                                                       const at::Tensor& k, const at::Tensor& v,
                                                                       const at::Tensor& out, const at::Tensor& lse,
                                                                       bool is_causal, double scale,
                                                                       bool lower_right, bool deterministic,
                                                                       const std::optional<at::Tensor>& out_residual) {
    const char* op = kBwdOp;
    TORCH_CHECK(q.defined() && q.is_cuda(), op, "q must be a CUDA tensor");
    check_operand(q, "q", q, op);
    check_operand(k, "k", q, op);
    check_operand(v, "v", q, op);
    check_operand(out, "out", q, op);
    check_operand(dout, "grad_out", q, op);
    const ElementType dtype = element_type(q, op);
    const int64_t batch = q.size(0), heads_q = q.size(1), len_q = q.size(2), head_dim = q.size(3);
    const int64_t heads_kv = k.size(1), len_kv = k.size(2);
    TORCH_CHECK(out.sizes() == q.sizes() && dout.sizes() == q.sizes(), op, "out ", out.sizes(), " and grad_out ",
                dout.sizes(), " must have q's shape ", q.sizes());
    TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == batch && k.size(3) == head_dim, op,
                "k and v must be (batch, heads_kv, len_kv, head_dim) like each other and q, got k ", k.sizes(),
                ", v ", v.sizes(), ", q ", q.sizes());
    TORCH_CHECK(heads_q % heads_kv == 0, op, "q heads (", heads_q, ") must be a multiple of k/v heads (", heads_kv,
                ")");
    TORCH_CHECK(Sm90HeadDims::contains(head_dim), op, "head_dim must be ", head_dim_list<Sm90HeadDims>(), ", got ",
                head_dim);
    TORCH_CHECK(lse.defined() && lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat &&
                    lse.dim() == 3 && lse.size(0) == batch && lse.size(1) == heads_q && lse.size(2) == len_q,
                op, "lse must be the forward's float32 (batch, heads_q, len_q) tensor on q's device, got ",
                lse.sizes(), " ", lse.scalar_type());
    check_scale(scale, op);
    const int offset = causal_offset(is_causal, lower_right, len_q, len_kv, op);
    const bool has_residual = out_residual.has_value() && out_residual->defined();
    if (has_residual)
        TORCH_CHECK(out_residual->is_cuda() && out_residual->device() == q.device() &&
                        out_residual->scalar_type() == q.scalar_type() && out_residual->sizes() == q.sizes() &&
                        out_residual->is_contiguous(),
                    op, "out_residual must be the training forward's contiguous tensor of q's shape and dtype, got ",
                    out_residual->sizes(), " ", out_residual->scalar_type());

    const c10::cuda::CUDAGuard device_guard(q.device());
    check_sm90(q.device(), op, "tk.attention computes gradients with SDPA there");
    const at::Tensor lse_rows = lse.contiguous();
    const int64_t len_q_padded = (len_q + 63) / 64 * 64;
    const auto f32 = q.options().dtype(at::kFloat);
    at::Tensor score_shift = at::empty({batch, heads_q, len_q_padded}, f32);
    at::Tensor neg_delta = at::empty({batch, heads_q, len_q_padded}, f32);
    at::Tensor dq_accum = at::empty({batch, heads_q, len_q, head_dim}, f32);  // zeroed by backward_statistics
    at::Tensor dq = at::empty({batch, heads_q, len_q, head_dim}, q.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor dk = at::empty({batch, heads_kv, len_kv, head_dim}, k.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor dv = at::empty({batch, heads_kv, len_kv, head_dim}, v.options().memory_format(at::MemoryFormat::Contiguous));

    BackwardParams params{};
    fill_common(params, q, k, v, is_causal, offset, scale, dtype);
    params.dout = dout.const_data_ptr();
    const auto ds = kernel_strides<4>(dout);
    params.dout_stride_b = ds[0], params.dout_stride_h = ds[1], params.dout_stride_l = ds[2];
    params.dq_accum = dq_accum.mutable_data_ptr<float>();
    params.dk = dk.mutable_data_ptr();
    params.dv = dv.mutable_data_ptr();
    params.score_shift = score_shift.mutable_data_ptr<float>();
    params.neg_delta = neg_delta.mutable_data_ptr<float>();
    params.len_q_padded = static_cast<int>(len_q_padded);
    // Zeroed by backward_statistics: the kernel's task queue (causal or deterministic), and
    // the deterministic dq's turn counters, one per 64-row query block.
    at::Tensor task_counter, dq_turns;
    if (is_causal || deterministic) {
        task_counter = at::empty({1}, q.options().dtype(at::kInt));
        params.task_counter = task_counter.mutable_data_ptr<int>();
    }
    if (deterministic) {
        dq_turns = at::empty({batch, heads_q, len_q_padded / 64}, q.options().dtype(at::kInt));
        params.dq_turns = dq_turns.mutable_data_ptr<int>();
    }

    const auto os = kernel_strides<4>(out);
    const OutputView out_view{out.const_data_ptr(), os[0], os[1], os[2], lse_rows.const_data_ptr<float>(),
                              has_residual ? out_residual->const_data_ptr() : nullptr};

    const cudaStream_t stream = current_stream(q);
    cudaError_t status = backward_statistics(params, out_view, stream);
    if (status == cudaSuccess) status = backward_sm90(params, stream);
    if (status == cudaSuccess) status = backward_finish_dq(params, dq.mutable_data_ptr(), stream);
    check_launch(status, op);
    return {dq, dk, dv};
}

}  // namespace
}  // namespace tk::attention

TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("attention_fwd_sm80", &tk::attention::attention_fwd_sm80_cuda);
    m.impl("attention_fwd_sm90", &tk::attention::attention_fwd_sm90_cuda);
    m.impl("attention_fwd_sm90_train", &tk::attention::attention_fwd_sm90_train_cuda);
    m.impl("attention_bwd_sm90", &tk::attention::attention_bwd_sm90_cuda);
}
