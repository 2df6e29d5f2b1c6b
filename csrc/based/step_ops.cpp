// CUDA implementations of tk::based_step_sm80 (returns a new state) and
// tk::based_step_inplace_sm80 (updates the state it is given): re-check the inputs (cheaply:
// shapes, dtypes, devices, layout; never data), describe the call in a StepParams and launch the
// kernel (step.cu) on the current stream of q's device.
//
// The Python layer (thunderkittens.based_step) hands these a state they can use; the checks are
// for direct callers, and they name the offending argument.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "based/op_checks.h"
#include "based/step.h"
#include "operand_checks.h"

namespace tk::based {
namespace {

// q, k, v and their shapes; every stride is allowed (the kernel reads them by scalars).
void check_tokens(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* op) {
    TORCH_CHECK(q.defined() && q.is_cuda(), op, "q must be a CUDA tensor");
    check_like(k, "k", q, "q", op);
    check_like(v, "v", q, "q", op);
    check_extents(q, "q", 4, "(batch, heads, tokens, 16)", op);
    check_extents(k, "k", 4, "(batch, heads, tokens, 16)", op);
    check_extents(v, "v", 4, "(batch, heads, tokens, value_dim)", op);
    element_type(q, op);  // q is bfloat16 or float16
    check_qkv_shapes(q, k, v, "tokens", op);
    TORCH_CHECK(q.size(0) * q.size(1) <= std::numeric_limits<int>::max(), op,
                "batch * heads must fit in a 32-bit int, got ", q.size(0), " * ", q.size(1));
}

// The state's dtype, shape and row layout (column stride 1, row stride value_dim + 1).
void check_state(const at::Tensor& state, const at::Tensor& q, const at::Tensor& v, const char* op) {
    TORCH_CHECK(state.defined() && state.is_cuda() && state.device() == q.device(), op,
                "state must be on q's device ", q.device(), ", got ", state.device());
    TORCH_CHECK(state.scalar_type() == at::kFloat, op, "state must be float32, got ", state.scalar_type());
    const std::vector<int64_t> shape{q.size(0), q.size(1), STATE_ROWS, v.size(3) + 1};
    TORCH_CHECK(state.sizes() == at::IntArrayRef(shape), op, "state must have shape ", at::IntArrayRef(shape),
                " (batch, heads, 273, value_dim + 1), got ", state.sizes());
}

bool rows_contiguous(const at::Tensor& state) {
    return state.stride(3) == 1 && state.stride(2) == state.size(3);
}

// Whether no two (batch, head) slices of a state with contiguous rows share memory: with the
// batch and head dims ordered by stride, each steps over everything inside it.
bool slices_disjoint(const at::Tensor& state) {
    std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims longer than 1
    for (int d = 0; d < 2; d++) {
        if (state.size(d) > 1) dims.emplace_back(state.stride(d), state.size(d));
    }
    std::sort(dims.begin(), dims.end());
    int64_t extent = state.size(2) * state.size(3);
    for (const auto& [stride, size] : dims) {
        if (stride < extent) return false;
        extent = stride * (size - 1) + extent;
    }
    return true;
}

at::Tensor launch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& state_in,
                  at::Tensor& state_out, double scale, bool normalize, double eps, const char* op) {
    TORCH_CHECK(std::isfinite(scale) && scale > 0, op, "scale must be finite and positive, got ", scale);
    TORCH_CHECK(std::isfinite(eps), op, "eps must be finite, got ", eps);
    const int64_t batch = q.size(0), heads = q.size(1), tokens = q.size(2), value_dim = v.size(3);
    at::Tensor out = at::empty({batch, heads, tokens, value_dim}, q.options());

    StepParams p{};
    p.q = q.const_data_ptr();
    p.k = k.const_data_ptr();
    p.v = v.const_data_ptr();
    for (int d = 0; d < 4; d++) {
        p.q_stride[d] = q.stride(d);
        p.k_stride[d] = k.stride(d);
        p.v_stride[d] = v.stride(d);
    }
    p.o = out.mutable_data_ptr();
    p.state_in = state_in.const_data_ptr<float>();
    p.state_out = state_out.mutable_data_ptr<float>();
    p.state_stride_b = state_out.stride(0);
    p.state_stride_h = state_out.stride(1);
    p.batch = static_cast<int>(batch);
    p.heads = static_cast<int>(heads);
    p.tokens = static_cast<int>(tokens);
    p.value_dim = static_cast<int>(value_dim);
    p.scale = scale;
    p.normalize = normalize;
    p.eps = static_cast<float>(eps);
    p.dtype = element_type(q, op);

    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
    check_launch(step_sm80(p, stream), op);
    return out;
}

std::tuple<at::Tensor, at::Tensor> based_step_sm80_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                        const at::Tensor& state, double scale, bool normalize,
                                                        double eps) {
    constexpr const char* kOp = "tk::based_step_sm80: ";
    check_tokens(q, k, v, kOp);
    check_state(state, q, v, kOp);
    const c10::cuda::CUDAGuard device_guard(q.device());
    // The kernel reads and writes the same offsets of both states, 16 bytes at a time: the source
    // must be laid out as the new (contiguous, 16-byte aligned) one. One copy otherwise.
    const bool readable = state.is_contiguous() && reinterpret_cast<std::uintptr_t>(state.const_data_ptr()) % 16 == 0;
    const at::Tensor source = readable ? state : state.clone(at::MemoryFormat::Contiguous);
    at::Tensor new_state = at::empty(state.sizes(), state.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor out = launch(q, k, v, source, new_state, scale, normalize, eps, kOp);
    return {out, new_state};
}

at::Tensor based_step_inplace_sm80_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        at::Tensor& state, double scale, bool normalize, double eps) {
    constexpr const char* kOp = "tk::based_step_inplace_sm80: ";
    check_tokens(q, k, v, kOp);
    check_state(state, q, v, kOp);
    TORCH_CHECK(rows_contiguous(state), kOp, "state must have contiguous rows (strides (*, *, ", state.size(3),
                ", 1)), got strides ", state.strides(), "; use tk::based_step_sm80 and copy the result back");
    TORCH_CHECK(slices_disjoint(state), kOp, "state's (batch, head) slices share memory (strides ", state.strides(),
                ", e.g. an expanded tensor); it cannot be updated in place");
    const c10::cuda::CUDAGuard device_guard(q.device());
    return launch(q, k, v, state, state, scale, normalize, eps, kOp);
}

}  // namespace
}  // namespace tk::based

TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("based_step_sm80", &tk::based::based_step_sm80_cuda);
    m.impl("based_step_inplace_sm80", &tk::based::based_step_inplace_sm80_cuda);
}
