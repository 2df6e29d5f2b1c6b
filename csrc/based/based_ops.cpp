// CUDA implementation of tk::based_fwd_sm80: re-check the inputs (cheaply: shapes, dtypes,
// devices, strides, alignment; never data), allocate the outputs, describe the call in a plain
// ForwardParams struct and launch the kernel on the current stream of q's device.
//
// The Python layer (thunderkittens.based) makes inputs conform; these checks are for direct
// callers of torch.ops.tk.based_fwd_sm80, and they name the offending argument.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "based/params.h"
#include "operand_checks.h"

namespace tk::based {
namespace {

constexpr const char* kOp = "tk::based_fwd_sm80: ";

void check_operand(const at::Tensor& t, const char* name, const at::Tensor& q) {
    check_like(t, name, q, "q", kOp);
    check_extents(t, name, 4, "(batch, heads, length, dim)", kOp);
    check_row_layout(t, name, kOp);
}

ElementType element_type(const at::Tensor& q) {
    switch (q.scalar_type()) {
        case at::kBFloat16: return ElementType::bf16;
        case at::kHalf: return ElementType::fp16;
        default: TORCH_CHECK(false, kOp, "q must be bfloat16 or float16, got ", q.scalar_type());
    }
}

std::tuple<at::Tensor, at::Tensor> based_fwd_sm80_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       double scale, bool normalize, double eps,
                                                       const std::optional<at::Tensor>& initial_state,
                                                       bool output_final_state) {
    TORCH_CHECK(q.defined() && q.is_cuda(), kOp, "q must be a CUDA tensor");
    check_operand(q, "q", q);
    check_operand(k, "k", q);
    check_operand(v, "v", q);
    const ElementType dtype = element_type(q);

    const int64_t batch = q.size(0), heads = q.size(1), len = q.size(2), value_dim = v.size(3);
    TORCH_CHECK(q.size(3) == FEATURE_DIM, kOp, "q feature dim must be ", FEATURE_DIM, ", got shape ", q.sizes());
    TORCH_CHECK(k.sizes() == q.sizes(), kOp, "k must have q's shape ", q.sizes(), ", got ", k.sizes());
    TORCH_CHECK(v.size(0) == batch && v.size(1) == heads && v.size(2) == len, kOp,
                "v must be (batch, heads, length, value_dim) with q's batch, heads and length, got v ", v.sizes(),
                " and q ", q.sizes());
    TORCH_CHECK(value_dim == 64 || value_dim == 128, kOp, "v's value_dim must be 64 or 128, got ", value_dim);
    TORCH_CHECK(std::isfinite(scale) && scale > 0, kOp, "scale must be finite and positive, got ", scale);
    TORCH_CHECK(std::isfinite(eps), kOp, "eps must be finite, got ", eps);
    TORCH_CHECK(batch * heads * (value_dim / 64) <= std::numeric_limits<int>::max(), kOp,
                "batch * heads * (value_dim / 64) must fit in a 32-bit int, got ", batch, " * ", heads, " * ",
                value_dim / 64);

    const std::vector<int64_t> state_shape{batch, heads, STATE_ROWS, value_dim + 1};
    at::Tensor initial;
    if (initial_state.has_value() && initial_state->defined()) {
        const at::Tensor& s = *initial_state;
        TORCH_CHECK(s.is_cuda() && s.device() == q.device(), kOp, "initial_state must be on q's device ", q.device(),
                    ", got ", s.device());
        TORCH_CHECK(s.scalar_type() == at::kFloat, kOp, "initial_state must be float32, got ", s.scalar_type());
        TORCH_CHECK(s.sizes() == at::IntArrayRef(state_shape), kOp, "initial_state must have shape ",
                    at::IntArrayRef(state_shape), " (batch, heads, 273, value_dim + 1), got ", s.sizes());
        initial = s.contiguous();  // small: a copy only for an unusual layout
    }

    const c10::cuda::CUDAGuard device_guard(q.device());
    at::Tensor out = at::empty({batch, heads, len, value_dim}, q.options());
    at::Tensor final_state = output_final_state ? at::empty(state_shape, q.options().dtype(at::kFloat))
                                                : at::empty({0}, q.options().dtype(at::kFloat));

    ForwardParams p{};
    p.q = q.const_data_ptr();
    p.k = k.const_data_ptr();
    p.v = v.const_data_ptr();
    p.o = out.mutable_data_ptr();
    const auto qs = kernel_strides<4>(q), ks = kernel_strides<4>(k), vs = kernel_strides<4>(v),
               os = kernel_strides<4>(out);
    p.q_stride_b = qs[0], p.q_stride_h = qs[1], p.q_stride_l = qs[2];
    p.k_stride_b = ks[0], p.k_stride_h = ks[1], p.k_stride_l = ks[2];
    p.v_stride_b = vs[0], p.v_stride_h = vs[1], p.v_stride_l = vs[2];
    p.o_stride_b = os[0], p.o_stride_h = os[1], p.o_stride_l = os[2];
    p.initial_state = initial.defined() ? initial.const_data_ptr<float>() : nullptr;
    p.final_state = output_final_state ? final_state.mutable_data_ptr<float>() : nullptr;
    p.batch = static_cast<int>(batch);
    p.heads = static_cast<int>(heads);
    p.len = static_cast<int>(len);
    p.value_dim = static_cast<int>(value_dim);
    p.scale = static_cast<float>(scale);
    p.normalize = normalize;
    p.eps = static_cast<float>(eps);
    p.dtype = dtype;

    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
    check_launch(forward_sm80(p, stream), kOp);
    return {out, final_state};
}

}  // namespace
}  // namespace tk::based

TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("based_fwd_sm80", &tk::based::based_fwd_sm80_cuda);
}
