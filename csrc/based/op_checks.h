// Host checks shared by the Based op bindings (based_ops.cpp, backward_ops.cpp). Error messages
// start with the op's name `op`.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "based/params.h"
#include "operand_checks.h"

namespace tk::based {

inline void check_operand(const at::Tensor& t, const char* name, const at::Tensor& q, const char* op) {
    check_row_operand(t, name, q, 4, "(batch, heads, length, dim)", op);
}

inline ElementType element_type(const at::Tensor& q, const char* op) { return half_element_type<ElementType>(q, op); }

// The shapes of 4-D q, k (batch, heads, rows, 16) and v (batch, heads, rows, 64 or 128); `rows`
// names their third dim in the messages ("length" for a sequence, "tokens" for a decoding step).
inline void check_qkv_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* rows,
                             const char* op) {
    TORCH_CHECK(q.size(3) == FEATURE_DIM, op, "q feature dim must be ", FEATURE_DIM, ", got shape ", q.sizes());
    TORCH_CHECK(k.sizes() == q.sizes(), op, "k must have q's shape ", q.sizes(), ", got ", k.sizes());
    TORCH_CHECK(v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2), op,
                "v must be (batch, heads, ", rows, ", value_dim) with q's batch, heads and ", rows, ", got v ",
                v.sizes(), " and q ", q.sizes());
    TORCH_CHECK(v.size(3) == 64 || v.size(3) == 128, op, "v's value_dim must be 64 or 128, got ", v.size(3));
}

// q, k (batch, heads, length, 16) and v (batch, heads, length, 64 or 128), each a CUDA tensor the
// kernels read in place, and a finite positive scale.
inline void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, const char* op) {
    TORCH_CHECK(q.defined() && q.is_cuda(), op, "q must be a CUDA tensor");
    check_operand(q, "q", q, op);
    check_operand(k, "k", q, op);
    check_operand(v, "v", q, op);
    check_qkv_shapes(q, k, v, "length", op);
    TORCH_CHECK(std::isfinite(scale) && scale > 0, op, "scale must be finite and positive, got ", scale);
}

// An optional fp32 input of a fixed shape on q's device (a state, or the denominators'
// gradient), contiguous (a copy only for an unusual layout: these are small); undefined when
// absent. `dims` names the shape's dims in the message.
inline at::Tensor optional_float_input(const std::optional<at::Tensor>& s, const char* name, const at::Tensor& q,
                                       const std::vector<int64_t>& shape, const char* dims, const char* op) {
    if (!s.has_value() || !s->defined()) return at::Tensor();
    TORCH_CHECK(s->is_cuda() && s->device() == q.device(), op, name, " must be on q's device ", q.device(),
                ", got ", s->device());
    TORCH_CHECK(s->scalar_type() == at::kFloat, op, name, " must be float32, got ", s->scalar_type());
    TORCH_CHECK(s->sizes() == at::IntArrayRef(shape), op, name, " must have shape ", at::IntArrayRef(shape), " ",
                dims, ", got ", s->sizes());
    return s->contiguous();
}

// An optional state (initial_state, grad_final_state): fp32 (batch, heads, 273, value_dim + 1).
inline at::Tensor state_input(const std::optional<at::Tensor>& s, const char* name, const at::Tensor& q,
                              const std::vector<int64_t>& shape, const char* op) {
    return optional_float_input(s, name, q, shape, "(batch, heads, 273, value_dim + 1)", op);
}

}  // namespace tk::based
