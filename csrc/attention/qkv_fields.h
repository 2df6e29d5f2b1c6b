// The fields every attention params struct (ForwardParams, BackwardParams, DecodeParams) takes
// from q, k and v, filled in one place so that a swapped stride or length cannot creep into only
// one of them. For the op bindings (the files that include torch).
#pragma once
#include <ATen/core/Tensor.h>

#include "attention/attention_params.h"
#include "device_facts.h"
#include "operand_checks.h"

namespace tk::attention {

// Pointers, strides and shapes of q, k, v (checked by check_qkv, op_checks.h), the scale, the
// element type and the current device's multiprocessors. Call it under q's device guard.
template <typename Params>
void fill_qkv_fields(Params& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                     ElementType dtype) {
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
    p.dtype = dtype;
    p.multiprocessors = multiprocessor_count();
}

}  // namespace tk::attention
