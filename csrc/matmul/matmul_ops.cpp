// CUDA implementation of tk::matmul: re-check the inputs (shapes, dtypes, devices, strides,
// alignment; never data), allocate C, describe the call in plain MatmulParams and launch the
// Hopper kernel on the current stream of a's device.
//
// The Python layer (thunderkittens.matmul) already routes calls the kernel cannot take to
// torch.matmul; these checks are for direct callers of torch.ops.tk.matmul and name the
// offending argument and rule.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>

#include "device_facts.h"
#include "matmul/matmul_params.h"

namespace tk::matmul {
namespace {

constexpr const char* kOp = "tk::matmul: ";

// Stride of dim `d`, with a well-formed value for a dim of size 1: torch lets such a dim have
// any stride, and it is never stepped over, so it must not decide alignment.
int64_t stride_or(const at::Tensor& t, int d, int64_t if_size_one) {
    return t.size(d) == 1 ? if_size_one : t.stride(d);
}

int64_t round_up_8(int64_t x) { return (x + 7) / 8 * 8; }

// The operand (batch, rows, cols) as TMA can read it: row-major (cols contiguous) or
// column-major (rows contiguous), other strides multiples of 8 elements. The same rule is
// thunderkittens/_matmul/layout.py's; keep them in step.
Operand describe(const at::Tensor& t, const char* name) {
    const int64_t rows = t.size(1), cols = t.size(2);
    // A stride TMA can step by: a positive multiple of 8 elements (a 0 stride, an expanded dim,
    // is not something a tensor map can describe; the Python layer never sends one).
    auto aligned = [](int64_t s) { return s > 0 && s % 8 == 0; };
    Operand op{};
    op.data = t.const_data_ptr();
    op.batch = static_cast<int>(t.size(0));
    const bool row_major = (cols == 1 || t.stride(2) == 1) && aligned(stride_or(t, 1, round_up_8(cols)));
    const bool col_major = (rows == 1 || t.stride(1) == 1) && aligned(stride_or(t, 2, round_up_8(rows)));
    TORCH_CHECK(row_major || col_major, kOp, name,
                " must be row-major (stride 1 along its last dim) or column-major (stride 1 along its "
                "second-to-last dim, e.g. x.mT) with the other matrix stride a positive multiple of 8 "
                "elements (16 bytes, for TMA); got shape ", t.sizes(), " and strides ", t.strides());
    op.transposed = !row_major;
    op.leading_stride = row_major ? stride_or(t, 1, round_up_8(cols)) : stride_or(t, 2, round_up_8(rows));
    const int64_t matrix_extent = op.leading_stride * (row_major ? rows : cols);
    op.batch_stride = stride_or(t, 0, round_up_8(matrix_extent));
    TORCH_CHECK(aligned(op.batch_stride), kOp, name, ": the batch stride must be a positive multiple of 8 elements, got strides ",
                t.strides());
    TORCH_CHECK(reinterpret_cast<std::uintptr_t>(op.data) % 16 == 0, kOp, name,
                ": data pointer must be 16-byte aligned; pass a fresh copy (x.clone())");
    return op;
}

void check_operand(const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.defined(), kOp, name, " is undefined");
    TORCH_CHECK(t.is_cuda(), kOp, name, " must be a CUDA tensor, got device ", t.device());
    TORCH_CHECK(t.dim() == 3, kOp, name, " must be 3-D (batch, rows, cols), got shape ", t.sizes());
    for (int d = 0; d < 3; ++d) {
        TORCH_CHECK(t.size(d) >= 1, kOp, name, " must not be empty, got shape ", t.sizes());
        TORCH_CHECK(t.size(d) <= std::numeric_limits<int>::max(), kOp, name, " dimension ", d,
                    " is too large: ", t.size(d));
    }
}

at::Tensor matmul_cuda(const at::Tensor& a, const at::Tensor& b) {
    check_operand(a, "a");
    check_operand(b, "b");
    TORCH_CHECK(b.device() == a.device(), kOp, "b is on ", b.device(), " but a is on ", a.device());
    TORCH_CHECK(b.scalar_type() == a.scalar_type(), kOp, "b has dtype ", b.scalar_type(), " but a has dtype ",
                a.scalar_type());
    ElementType dtype{};
    switch (a.scalar_type()) {
        case at::kBFloat16: dtype = ElementType::bf16; break;
        case at::kHalf: dtype = ElementType::fp16; break;
        default: TORCH_CHECK(false, kOp, "a must be bfloat16 or float16, got ", a.scalar_type());
    }
    TORCH_CHECK(a.size(2) == b.size(1), kOp, "a's last dim (", a.size(2), ") must equal b's second-to-last dim (",
                b.size(1), "); got a ", a.sizes(), " and b ", b.sizes());
    const int64_t batch = std::max(a.size(0), b.size(0));
    TORCH_CHECK((a.size(0) == 1 || a.size(0) == batch) && (b.size(0) == 1 || b.size(0) == batch), kOp,
                "batch sizes must be equal or 1, got a ", a.sizes(), " and b ", b.sizes());

    const c10::cuda::CUDAGuard device_guard(a.device());
    check_sm90(a.device(), kOp, "thunderkittens.matmul uses torch.matmul there");

    MatmulParams p{};
    p.a = describe(a, "a");
    p.b = describe(b, "b");
    p.batch = static_cast<int>(batch);
    p.m = static_cast<int>(a.size(1));
    p.k = static_cast<int>(a.size(2));
    p.n = static_cast<int>(b.size(2));
    p.dtype = dtype;
    p.multiprocessors = multiprocessor_count();
    p.l2_bytes = l2_cache_bytes();
    at::Tensor c = at::empty({batch, p.m, p.n}, a.options());
    p.c = c.mutable_data_ptr();
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(a.device().index()).stream();
    const cudaError_t status = matmul_sm90(p, stream);
    TORCH_CHECK(status == cudaSuccess, kOp, "kernel launch failed: ", cudaGetErrorString(status));
    return c;
}

}  // namespace
}  // namespace tk::matmul

TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("matmul", &tk::matmul::matmul_cuda);
}
