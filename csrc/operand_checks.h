// The checks the op bindings (the files that include torch) make on a tensor a kernel reads by
// rows, and the strides they hand it. Every message starts with the op's name (`op`, e.g.
// "tk::based_fwd_sm80: ") and names the argument.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <limits>

namespace tk {

// `t` is defined, on CUDA, and on the device and of the dtype of `ref` (named `ref_name`).
inline void check_like(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                       const char* op) {
    TORCH_CHECK(t.defined(), op, name, " is undefined");
    TORCH_CHECK(t.is_cuda(), op, name, " must be a CUDA tensor, got device ", t.device());
    TORCH_CHECK(t.device() == ref.device(), op, name, " is on ", t.device(), " but ", ref_name, " is on ",
                ref.device());
    TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, name, " has dtype ", t.scalar_type(), " but ", ref_name,
                " has dtype ", ref.scalar_type());
}

// `t` has `rank` dims (named in `dims`, e.g. "(batch, heads, length)"), none empty, each fitting
// the kernels' int.
inline void check_extents(const at::Tensor& t, const char* name, int64_t rank, const char* dims, const char* op) {
    TORCH_CHECK(t.dim() == rank, op, name, " must be ", rank, "-D ", dims, ", got shape ", t.sizes());
    for (int64_t dim = 0; dim < rank; ++dim) {
        TORCH_CHECK(t.size(dim) >= 1, op, name, " must not be empty, got shape ", t.sizes());
        TORCH_CHECK(t.size(dim) <= std::numeric_limits<int>::max(), op, name, " dimension ", dim,
                    " is too large: ", t.size(dim));
    }
}

// The layout the kernels' 16-byte loads and stores need: a contiguous last dim, every other
// stride (of a dim longer than 1) a multiple of 8 elements (16 bytes in bf16/fp16), and a
// 16-byte aligned start.
inline void check_row_layout(const at::Tensor& t, const char* name, const char* op) {
    const int64_t last = t.dim() - 1;
    TORCH_CHECK(t.stride(last) == 1, op, name, " must have a contiguous last dimension (stride 1), got strides ",
                t.strides());
    for (int64_t dim = 0; dim < last; ++dim) {
        TORCH_CHECK(t.size(dim) == 1 || t.stride(dim) % 8 == 0, op, name,
                    ": every stride except the last must be a multiple of 8 elements (16 bytes), got strides ",
                    t.strides(), "; pass x.contiguous()");
    }
    TORCH_CHECK(reinterpret_cast<std::uintptr_t>(t.const_data_ptr()) % 16 == 0, op, name,
                ": data pointer must be 16-byte aligned; pass a fresh copy "
                "(x.clone(memory_format=torch.contiguous_format))");
}

// `t` (named `name`): a `rank`-D operand (dims named in `dims`) on q's device in q's dtype, in
// the kernels' row layout.
inline void check_row_operand(const at::Tensor& t, const char* name, const at::Tensor& q, int64_t rank,
                              const char* dims, const char* op) {
    check_like(t, name, q, "q", op);
    check_extents(t, name, rank, dims, op);
    check_row_layout(t, name, op);
}

// q's 16-bit element type as a family's ElementType (an enum with members bf16 and fp16).
template <typename ElementType>
ElementType half_element_type(const at::Tensor& q, const char* op) {
    switch (q.scalar_type()) {
        case at::kBFloat16: return ElementType::bf16;
        case at::kHalf: return ElementType::fp16;
        default: TORCH_CHECK(false, op, "q must be bfloat16 or float16, got ", q.scalar_type());
    }
}

// The strides of every dim but the last, outermost first, handed to the kernel for a `Rank`-D
// tensor that passed check_row_layout. A dim of size 1 is never stepped over, so torch allows it
// any stride (including 0 or an unaligned value); the kernel gets a well-formed row-major value
// for it instead, so the "multiple of 8" promise always holds.
template <int Rank>
std::array<int64_t, Rank - 1> kernel_strides(const at::Tensor& t) {
    std::array<int64_t, Rank - 1> strides{};
    int64_t inner = t.size(Rank - 1);  // the last dim's stride is 1
    for (int dim = Rank - 2; dim >= 0; --dim) {
        strides[dim] = t.size(dim) == 1 ? inner : t.stride(dim);
        inner = strides[dim] * t.size(dim);
    }
    return strides;
}

inline void check_launch(cudaError_t status, const char* op) {
    TORCH_CHECK(status == cudaSuccess, op, "kernel launch failed: ", cudaGetErrorString(status));
}

}  // namespace tk
