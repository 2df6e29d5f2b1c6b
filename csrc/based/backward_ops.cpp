// CUDA implementations of tk::based_bwd_sm80 and tk::based_bwd_sm90 (one contract, two kernel
// sets): re-check the inputs (cheaply: shapes, dtypes,
// devices, strides, alignment, shared memory; never data), allocate the gradients, describe the
// call in a plain BackwardParams struct and launch the kernels on the current stream of q's
// device.
//
// The Python layer (thunderkittens._based.autograd) makes inputs conform; these checks are for
// direct callers of torch.ops.tk.based_bwd_sm80/_sm90, and they name the offending argument.
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

#include "based/backward_params.h"
#include "based/op_checks.h"
#include "device_facts.h"

namespace tk::based {
namespace {

constexpr const char* kSm80Op = "tk::based_bwd_sm80: ";
constexpr const char* kSm90Op = "tk::based_bwd_sm90: ";

// A kernel set: its launch, its shared memory per block by value dim, whether it needs sm_90, and
// into how many fp32 parts it splits dq and dk by value dim (0: none, it writes them itself).
struct BackwardKernels {
    cudaError_t (*run)(const BackwardParams&, cudaStream_t);
    int (*shared_bytes)(int value_dim);
    bool needs_sm90;
    int (*parts)(int value_dim);
};

int no_parts(int) { return 0; }

using Gradients = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

Gradients backward_call(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        double scale, const std::optional<at::Tensor>& initial_state,
                        const std::optional<at::Tensor>& grad_final_state, bool grad_initial_state,
                        const std::optional<at::Tensor>& grad_denominator, const BackwardKernels& kernels,
                        const char* kOp) {
    check_qkv(q, k, v, scale, kOp);
    check_operand(grad_out, "grad_out", q, kOp);
    const ElementType dtype = element_type(q, kOp);
    const int64_t batch = q.size(0), heads = q.size(1), len = q.size(2), value_dim = v.size(3);
    TORCH_CHECK(grad_out.sizes() == v.sizes(), kOp, "grad_out must have v's shape ", v.sizes(), ", got ",
                grad_out.sizes());
    TORCH_CHECK(batch * heads <= std::numeric_limits<int>::max(), kOp,
                "batch * heads must fit in a 32-bit int, got ", batch, " * ", heads);

    const std::vector<int64_t> state_shape{batch, heads, STATE_ROWS, value_dim + 1};
    const at::Tensor initial = state_input(initial_state, "initial_state", q, state_shape, kOp);
    const at::Tensor grad_final = state_input(grad_final_state, "grad_final_state", q, state_shape, kOp);
    const at::Tensor denominator_grad = optional_float_input(grad_denominator, "grad_denominator", q,
                                                             {batch, heads, len}, "(batch, heads, length)", kOp);

    const c10::cuda::CUDAGuard device_guard(q.device());
    if (kernels.needs_sm90) check_sm90(q.device(), kOp, "tk.based picks the sm80 kernels there");
    int optin = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, q.device().index()));
    const int needed = kernels.shared_bytes(static_cast<int>(value_dim));
    TORCH_CHECK(needed <= optin, kOp, "value_dim ", value_dim, " needs ", needed,
                " bytes of shared memory per block; this GPU allows ", optin);

    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());
    at::Tensor d_initial = grad_initial_state ? at::empty(state_shape, q.options().dtype(at::kFloat))
                                              : at::empty({0}, q.options().dtype(at::kFloat));
    const int parts = kernels.parts(static_cast<int>(value_dim));
    at::Tensor dq_parts, dk_parts;
    if (parts > 0) {
        dq_parts = at::empty({parts, batch, heads, len, q.size(3)}, q.options().dtype(at::kFloat));
        dk_parts = at::empty({parts, batch, heads, len, q.size(3)}, q.options().dtype(at::kFloat));
    }

    BackwardParams p{};
    p.grad_out = grad_out.const_data_ptr();
    p.q = q.const_data_ptr();
    p.k = k.const_data_ptr();
    p.v = v.const_data_ptr();
    p.dq = dq.mutable_data_ptr();
    p.dk = dk.mutable_data_ptr();
    p.dv = dv.mutable_data_ptr();
    const auto gs = kernel_strides<4>(grad_out), qs = kernel_strides<4>(q), ks = kernel_strides<4>(k),
               vs = kernel_strides<4>(v), dqs = kernel_strides<4>(dq), dks = kernel_strides<4>(dk),
               dvs = kernel_strides<4>(dv);
    p.grad_out_stride_b = gs[0], p.grad_out_stride_h = gs[1], p.grad_out_stride_l = gs[2];
    p.q_stride_b = qs[0], p.q_stride_h = qs[1], p.q_stride_l = qs[2];
    p.k_stride_b = ks[0], p.k_stride_h = ks[1], p.k_stride_l = ks[2];
    p.v_stride_b = vs[0], p.v_stride_h = vs[1], p.v_stride_l = vs[2];
    p.dq_stride_b = dqs[0], p.dq_stride_h = dqs[1], p.dq_stride_l = dqs[2];
    p.dk_stride_b = dks[0], p.dk_stride_h = dks[1], p.dk_stride_l = dks[2];
    p.dv_stride_b = dvs[0], p.dv_stride_h = dvs[1], p.dv_stride_l = dvs[2];
    p.initial_state = initial.defined() ? initial.const_data_ptr<float>() : nullptr;
    p.grad_final_state = grad_final.defined() ? grad_final.const_data_ptr<float>() : nullptr;
    p.grad_initial_state = grad_initial_state ? d_initial.mutable_data_ptr<float>() : nullptr;
    p.grad_denominator = denominator_grad.defined() ? denominator_grad.const_data_ptr<float>() : nullptr;
    p.dq_parts = parts > 0 ? dq_parts.mutable_data_ptr<float>() : nullptr;
    p.dk_parts = parts > 0 ? dk_parts.mutable_data_ptr<float>() : nullptr;
    p.batch = static_cast<int>(batch);
    p.heads = static_cast<int>(heads);
    p.len = static_cast<int>(len);
    p.value_dim = static_cast<int>(value_dim);
    p.scale = static_cast<float>(scale);
    p.dtype = dtype;

    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
    check_launch(kernels.run(p, stream), kOp);
    if (parts > 0) {  // on the same (current) stream
        dq.copy_(dq_parts.sum(0));
        dk.copy_(dk_parts.sum(0));
    }
    return {dq, dk, dv, d_initial};
}

Gradients based_bwd_sm80_cuda(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              double scale, const std::optional<at::Tensor>& initial_state,
                              const std::optional<at::Tensor>& grad_final_state, bool grad_initial_state,
                              const std::optional<at::Tensor>& grad_denominator) {
    return backward_call(grad_out, q, k, v, scale, initial_state, grad_final_state, grad_initial_state,
                         grad_denominator, {backward_sm80, backward_sm80_shared_bytes, false, no_parts}, kSm80Op);
}

Gradients based_bwd_sm90_cuda(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              double scale, const std::optional<at::Tensor>& initial_state,
                              const std::optional<at::Tensor>& grad_final_state, bool grad_initial_state,
                              const std::optional<at::Tensor>& grad_denominator) {
    return backward_call(grad_out, q, k, v, scale, initial_state, grad_final_state, grad_initial_state,
                         grad_denominator, {backward_sm90, backward_sm90_shared_bytes, true, backward_sm90_parts}, kSm90Op);
}

}  // namespace
}  // namespace tk::based

TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("based_bwd_sm80", &tk::based::based_bwd_sm80_cuda);
    m.impl("based_bwd_sm90", &tk::based::based_bwd_sm90_cuda);
}
