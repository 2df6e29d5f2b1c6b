// CUDA implementations of tk::based_fwd_sm80 and tk::based_fwd_sm90 (one contract, two kernels): re-check the inputs (cheaply: shapes, dtypes,
// devices, strides, alignment; never data), allocate the outputs, describe the call in a plain
// ForwardParams struct and launch the kernel on the current stream of q's device.
//
// The Python layer (thunderkittens.based) makes inputs conform; these checks are for direct
// callers of torch.ops.tk.based_fwd_sm80/_sm90, and they name the offending argument.
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

#include "based/op_checks.h"
#include "device_facts.h"
#include "based/params.h"

namespace tk::based {
namespace {

constexpr const char* kSm80Op = "tk::based_fwd_sm80: ";
constexpr const char* kSm90Op = "tk::based_fwd_sm90: ";

using ForwardKernel = cudaError_t (*)(const ForwardParams&, cudaStream_t);

std::tuple<at::Tensor, at::Tensor> forward_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                double scale, bool normalize, double eps,
                                                const std::optional<at::Tensor>& initial_state,
                                                bool output_final_state, ForwardKernel kernel, bool needs_sm90,
                                                const char* kOp) {
    check_qkv(q, k, v, scale, kOp);
    const ElementType dtype = element_type(q, kOp);
    const int64_t batch = q.size(0), heads = q.size(1), len = q.size(2), value_dim = v.size(3);
    TORCH_CHECK(std::isfinite(eps), kOp, "eps must be finite, got ", eps);
    TORCH_CHECK(batch * heads * (value_dim / 64) <= std::numeric_limits<int>::max(), kOp,
                "batch * heads * (value_dim / 64) must fit in a 32-bit int, got ", batch, " * ", heads, " * ",
                value_dim / 64);

    const std::vector<int64_t> state_shape{batch, heads, STATE_ROWS, value_dim + 1};
    const at::Tensor initial = state_input(initial_state, "initial_state", q, state_shape, kOp);

    const c10::cuda::CUDAGuard device_guard(q.device());
    if (needs_sm90) check_sm90(q.device(), kOp, "tk.based picks the sm80 kernel there");
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
    check_launch(kernel(p, stream), kOp);
    return {out, final_state};
}

std::tuple<at::Tensor, at::Tensor> based_fwd_sm80_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       double scale, bool normalize, double eps,
                                                       const std::optional<at::Tensor>& initial_state,
                                                       bool output_final_state) {
    return forward_call(q, k, v, scale, normalize, eps, initial_state, output_final_state, forward_sm80, false,
                        kSm80Op);
}

std::tuple<at::Tensor, at::Tensor> based_fwd_sm90_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       double scale, bool normalize, double eps,
                                                       const std::optional<at::Tensor>& initial_state,
                                                       bool output_final_state) {
    return forward_call(q, k, v, scale, normalize, eps, initial_state, output_final_state, forward_sm90, true,
                        kSm90Op);
}

}  // namespace
}  // namespace tk::based

TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("based_fwd_sm80", &tk::based::based_fwd_sm80_cuda);
    m.impl("based_fwd_sm90", &tk::based::based_fwd_sm90_cuda);
}
