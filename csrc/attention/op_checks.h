// The checks the attention op bindings (attention_ops.cpp, decode_ops.cpp) share: operands laid
// out as (batch, heads, length, head_dim), the element type, q against k and v, the scale and the
// causal diagonal. Every message starts with the op's name (`op`) and names the argument.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "attention/attention_params.h"
#include "operand_checks.h"

namespace tk::attention {

// `t` (named `name`) is a 4-D operand on q's device in q's dtype, in the kernels' row layout.
inline void check_operand(const at::Tensor& t, const char* name, const at::Tensor& q, const char* op) {
    check_row_operand(t, name, q, 4, "(batch, heads, length, head_dim)", op);
}

inline ElementType element_type(const at::Tensor& q, const char* op) { return half_element_type<ElementType>(q, op); }

// A family's head dims for a message: "64, 96 or 128".
template <typename Dims>
std::string head_dim_list() {
    std::string text;
    for (size_t i = 0; i < Dims::values.size(); ++i) {
        if (i > 0) text += i + 1 == Dims::values.size() ? " or " : ", ";
        text += std::to_string(Dims::values[i]);
    }
    return text;
}

// The kernels keep the running max of unscaled scores, which bounds the scaled ones only for a
// positive scale (tk.attention sends scale <= 0 to SDPA's math backend).
inline void check_scale(double scale, const char* op) {
    TORCH_CHECK(std::isfinite(scale) && scale > 0, op, "scale must be finite and positive, got ", scale);
}

// The kernels' causal diagonal (attention_params.h: key j visible to query i iff
// j <= i + causal_offset): 0 is SDPA's is_causal (top-left), Lk - Lq its causal_lower_right.
inline int causal_offset(bool is_causal, bool lower_right, int64_t len_q, int64_t len_kv, const char* op) {
    TORCH_CHECK(is_causal || !lower_right, op,
                "lower_right=True needs is_causal=True (it moves the causal diagonal to the "
                "bottom-right corner; without is_causal there is no diagonal)");
    return lower_right ? static_cast<int>(len_kv - len_q) : 0;  // both lengths fit in int (checked)
}

// q (B, Hq, Lq, D) against k and v (B, Hkv, Lk, D), Hq a multiple of Hkv, D one of `Dims` (the
// head dims of the op's kernels, head_dims.h; `kernel`: a note on them for the message, "" or
// " (...)"), and the scale. Returns q's element type.
template <typename Dims>
ElementType check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, const char* op,
                      const char* kernel) {
    TORCH_CHECK(q.defined() && q.is_cuda(), op, "q must be a CUDA tensor");
    check_operand(q, "q", q, op);
    check_operand(k, "k", q, op);
    check_operand(v, "v", q, op);
    const ElementType dtype = element_type(q, op);

    const int64_t batch = q.size(0), heads_q = q.size(1), head_dim = q.size(3);
    const int64_t heads_kv = k.size(1), len_kv = k.size(2);
    TORCH_CHECK(k.size(0) == batch && v.size(0) == batch, op, "batch sizes differ: q ", q.sizes(), ", k ", k.sizes(),
                ", v ", v.sizes());
    TORCH_CHECK(v.size(1) == heads_kv, op, "k and v must have the same number of heads, got k ", k.sizes(),
                " and v ", v.sizes());
    TORCH_CHECK(heads_q % heads_kv == 0, op, "q heads (", heads_q, ") must be a multiple of k/v heads (", heads_kv,
                ")");
    TORCH_CHECK(v.size(2) == len_kv, op, "k and v must have the same length, got k ", k.sizes(), " and v ",
                v.sizes());
    TORCH_CHECK(Dims::contains(head_dim), op, "q head_dim must be ", head_dim_list<Dims>(), kernel, ", got ",
                head_dim);
    TORCH_CHECK(k.size(3) == head_dim, op, "k head_dim (", k.size(3), ") must equal q head_dim (", head_dim, ")");
    TORCH_CHECK(v.size(3) == head_dim, op, "v head_dim (", v.size(3), ") must equal q head_dim (", head_dim, ")");
    check_scale(scale, op);
    return dtype;
}

}  // namespace tk::attention
