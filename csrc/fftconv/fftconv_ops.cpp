// CUDA implementations of tk::fftconv_fwd_sm80, tk::fftconv_filter_grad_sm80 and
// tk::fftconv_filter_rfft and the (device-independent) implementation of
// tk::fftconv_filter_spectrum: re-check the inputs
// (cheaply: shapes, dtypes, devices, strides, alignment; never data), allocate the output,
// describe the call in a plain params struct (params.h) and launch the kernel on the current
// stream of u's device.
//
// The Python layer (thunderkittens.fftconv) makes inputs conform; these checks are for direct
// callers of torch.ops.tk.* and name the op and the offending argument.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>

#include "device_facts.h"
#include "fftconv/params.h"
#include "operand_checks.h"

namespace tk::fftconv {
namespace {

constexpr const char* kFwdOp = "tk::fftconv_fwd_sm80: ";
constexpr const char* kFwdSm90Op = "tk::fftconv_fwd_sm90: ";
constexpr const char* kGradOp = "tk::fftconv_filter_grad_sm80: ";
constexpr const char* kSpectrumOp = "tk::fftconv_filter_spectrum: ";
constexpr const char* kRfftOp = "tk::fftconv_filter_rfft: ";

void check_fft_size(int64_t fft_size, const char* op) {
    TORCH_CHECK(fft_size > 0 && fft_size <= std::numeric_limits<int>::max() &&
                    decomposition(static_cast<int>(fft_size)).fft_size != 0,
                op, "fft_size must be one of the kernel sizes 512, 1024, 2048, 4096, 8192, 16384, 32768 (twice "
                "the kernel length 256 .. 16384), got ", fft_size);
}

void check_sequence_tensor(const at::Tensor& t, const char* name, const at::Tensor& u, const char* op) {
    check_like(t, name, u, "u", op);
    TORCH_CHECK(t.sizes() == u.sizes(), op, name, " must have u's shape ", u.sizes(), ", got ", t.sizes());
    check_row_layout(t, name, op);
}

// u (B, H, n) bf16/fp16 with n a multiple of 8 and at most fft_size / 2; returns its element type.
ElementType check_sequences(const at::Tensor& u, int64_t fft_size, const char* op) {
    TORCH_CHECK(u.defined(), op, "u is undefined");
    check_extents(u, "u", 3, "(batch, heads, length)", op);
    ElementType dtype{};
    switch (u.scalar_type()) {
        case at::kBFloat16: dtype = ElementType::bf16; break;
        case at::kHalf: dtype = ElementType::fp16; break;
        default: TORCH_CHECK(false, op, "u must be bfloat16 or float16, got ", u.scalar_type());
    }
    check_fft_size(fft_size, op);
    const int64_t length = u.size(2);
    TORCH_CHECK(length <= fft_size / 2, op, "u's length ", length, " must be at most fft_size / 2 = ", fft_size / 2,
                " (a causal convolution needs an FFT of twice the length)");
    TORCH_CHECK(length % 8 == 0, op, "u's length must be a multiple of 8, got ", length,
                "; pad u (and the gates) with zeros at the end and slice the result");
    check_sequence_tensor(u, "u", u, op);
    return dtype;
}

// The device can run the kernel that needs `shared_bytes` of shared memory per block.
void check_device(const at::Tensor& u, int shared_bytes, int64_t fft_size, const char* what, const char* op) {
    const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
    TORCH_CHECK(props->major >= 8, op, "this kernel needs an sm_80 or newer GPU, ", u.device(), " is sm_",
                props->major, props->minor, "; thunderkittens.fftconv uses torch.fft there");
    TORCH_CHECK(static_cast<size_t>(shared_bytes) <= props->sharedMemPerBlockOptin, op, "the kernel for fft_size ", fft_size,
                what, " needs ", shared_bytes / 1024, " KiB of shared memory per block; ", u.device(), " (sm_",
                props->major, props->minor, ") has ", props->sharedMemPerBlockOptin / 1024,
                " KiB; thunderkittens.fftconv uses torch.fft there");
}

// The fields both params structs take from u and the call (u checked by check_sequences).
// Call it under u's device guard (the multiprocessors are the current device's).
template <typename Params>
void fill_sequence_fields(Params& p, const at::Tensor& u, int64_t fft_size, ElementType dtype) {
    p.u = u.const_data_ptr();
    const auto us = kernel_strides<3>(u);
    p.u_stride_b = us[0], p.u_stride_h = us[1];
    p.batch = static_cast<int>(u.size(0));
    p.heads = static_cast<int>(u.size(1));
    p.seqlen = static_cast<int>(u.size(2));
    p.fft_size = static_cast<int>(fft_size);
    p.dtype = dtype;
    p.multiprocessors = multiprocessor_count();
}

cudaStream_t current_stream(const at::Tensor& u) { return at::cuda::getCurrentCUDAStream(u.device().index()).stream(); }

// The shared memory per block that picks the forward's configuration (configs.cuh) and the
// spectrum's route: the device's, or less where the environment variable
// TK_FFTCONV_SHARED_PER_BLOCK (bytes) says so, which runs a smaller GPU's choices on this one
// (0: the configuration that needs the least, and ATen's spectrum); the tests run them on Hopper
// with it.
int configuration_shared_per_block() {
    const int device = shared_memory_per_block();
    const char* cap = std::getenv("TK_FFTCONV_SHARED_PER_BLOCK");
    if (cap == nullptr || *cap == '\0') return device;
    char* end = nullptr;
    const long bytes = std::strtol(cap, &end, 10);
    TORCH_CHECK(*end == '\0' && bytes >= 0, "environment variable TK_FFTCONV_SHARED_PER_BLOCK must be a number of "
                "bytes >= 0, got '", cap, "'");
    return static_cast<int>(std::min<long>(bytes, device));
}

// A forward kernel family's entry points (params.h).
struct ForwardKernels {
    cudaError_t (*run)(const ForwardParams&, cudaStream_t);
    int (*shared_bytes)(int fft_size, bool pregate);
    int64_t (*workspace_bytes)(int fft_size, int heads);
    bool needs_sm90;
};

at::Tensor forward_call(const at::Tensor& u, const at::Tensor& k_spectrum, const std::optional<at::Tensor>& pregate,
                        const std::optional<at::Tensor>& postgate, int64_t fft_size, bool conjugate,
                        const ForwardKernels& kernels, const char* op) {
    const ElementType dtype = check_sequences(u, fft_size, op);
    if (pregate.has_value()) check_sequence_tensor(*pregate, "pregate", u, op);
    if (postgate.has_value()) check_sequence_tensor(*postgate, "postgate", u, op);

    TORCH_CHECK(k_spectrum.defined(), op, "k_spectrum is undefined");
    TORCH_CHECK(k_spectrum.device() == u.device(), op, "k_spectrum is on ", k_spectrum.device(),
                " but u is on ", u.device());
    TORCH_CHECK(k_spectrum.scalar_type() == at::kFloat, op,
                "k_spectrum must be float32 (from tk::fftconv_filter_spectrum), got ", k_spectrum.scalar_type());
    TORCH_CHECK(k_spectrum.dim() == 3 && k_spectrum.size(0) == u.size(1) && k_spectrum.size(1) == fft_size / 2 + 1 &&
                    k_spectrum.size(2) == 2,
                op, "k_spectrum must have shape (heads, fft_size / 2 + 1, 2) = (", u.size(1), ", ",
                fft_size / 2 + 1, ", 2) (from tk::fftconv_filter_spectrum(k, fft_size)), got ", k_spectrum.sizes());
    TORCH_CHECK(k_spectrum.is_contiguous(), op, "k_spectrum must be contiguous");
    TORCH_CHECK(reinterpret_cast<std::uintptr_t>(k_spectrum.const_data_ptr()) % 8 == 0, op,
                "k_spectrum's data pointer must be 8-byte aligned; pass a fresh copy (x.clone())");

    const c10::cuda::CUDAGuard device_guard(u.device());
    if (kernels.needs_sm90) check_sm90(u.device(), op, "thunderkittens.fftconv picks the sm80 kernels there");
    check_device(u, kernels.shared_bytes(static_cast<int>(fft_size), pregate.has_value()), fft_size,
                 pregate.has_value() ? " with a pregate" : "", op);

    at::Tensor y = at::empty(u.sizes(), u.options());
    ForwardParams p{};
    fill_sequence_fields(p, u, fft_size, dtype);
    p.shared_per_block = configuration_shared_per_block();
    if (pregate.has_value()) {
        p.pregate = pregate->const_data_ptr();
        const auto s = kernel_strides<3>(*pregate);
        p.pre_stride_b = s[0], p.pre_stride_h = s[1];
    }
    if (postgate.has_value()) {
        p.postgate = postgate->const_data_ptr();
        const auto s = kernel_strides<3>(*postgate);
        p.post_stride_b = s[0], p.post_stride_h = s[1];
    }
    p.spectrum = k_spectrum.const_data_ptr<float>();
    p.conjugate = conjugate;
    p.y = y.mutable_data_ptr();
    const auto ys = kernel_strides<3>(y);
    p.y_stride_b = ys[0], p.y_stride_h = ys[1];
    const int64_t workspace_bytes = kernels.workspace_bytes(p.fft_size, p.heads);
    at::Tensor workspace;  // the caching allocator's blocks are 512-byte aligned
    if (workspace_bytes > 0) {
        workspace = at::empty({workspace_bytes}, u.options().dtype(at::kByte));
        p.workspace = workspace.mutable_data_ptr();
    }
    check_launch(kernels.run(p, current_stream(u)), op);
    return y;
}

at::Tensor fftconv_fwd_sm80_cuda(const at::Tensor& u, const at::Tensor& k_spectrum,
                                 const std::optional<at::Tensor>& pregate,
                                 const std::optional<at::Tensor>& postgate, int64_t fft_size, bool conjugate) {
    return forward_call(u, k_spectrum, pregate, postgate, fft_size, conjugate,
                        {fftconv_fwd_sm80, fftconv_fwd_sm80_shared_bytes, fftconv_fwd_sm80_workspace_bytes, false},
                        kFwdOp);
}

at::Tensor fftconv_fwd_sm90_cuda(const at::Tensor& u, const at::Tensor& k_spectrum,
                                 const std::optional<at::Tensor>& pregate,
                                 const std::optional<at::Tensor>& postgate, int64_t fft_size, bool conjugate) {
    return forward_call(u, k_spectrum, pregate, postgate, fft_size, conjugate,
                        {fftconv_fwd_sm90, fftconv_fwd_sm90_shared_bytes, fftconv_fwd_sm90_workspace_bytes, true},
                        kFwdSm90Op);
}

// The gates go into the kernel where its gated instantiation exists and fits the configuration's
// shared memory (TK_FFTCONV_SHARED_PER_BLOCK caps it, as the forward's choice); elsewhere ATen
// multiplies them in first, the same one rounding of each product to u's dtype.
at::Tensor fftconv_filter_grad_sm80_cuda(const at::Tensor& dy, const at::Tensor& u, int64_t fft_size,
                                         const std::optional<at::Tensor>& dy_gate,
                                         const std::optional<at::Tensor>& u_gate) {
    const ElementType dtype = check_sequences(u, fft_size, kGradOp);
    check_sequence_tensor(dy, "dy", u, kGradOp);
    if (dy_gate.has_value()) check_sequence_tensor(*dy_gate, "dy_gate", u, kGradOp);
    if (u_gate.has_value()) check_sequence_tensor(*u_gate, "u_gate", u, kGradOp);
    const c10::cuda::CUDAGuard device_guard(u.device());
    check_device(u, fftconv_filter_grad_sm80_shared_bytes(static_cast<int>(fft_size)), fft_size, "", kGradOp);

    const bool gated = dy_gate.has_value() || u_gate.has_value();
    const int gated_bytes = fftconv_filter_grad_sm80_shared_bytes(static_cast<int>(fft_size), true);
    const bool gates_in_kernel = gated && gated_bytes > 0 && gated_bytes <= configuration_shared_per_block();
    at::Tensor dy_in = dy, u_in = u;
    if (gated && !gates_in_kernel) {
        if (dy_gate.has_value()) dy_in = dy * *dy_gate;
        if (u_gate.has_value()) u_in = u * *u_gate;
    }

    at::Tensor grad = at::zeros({u.size(1), u.size(2)}, u.options().dtype(at::kFloat));
    FilterGradParams p{};
    fill_sequence_fields(p, u_in, fft_size, dtype);
    p.dy = dy_in.const_data_ptr();
    const auto ds = kernel_strides<3>(dy_in);
    p.dy_stride_b = ds[0], p.dy_stride_h = ds[1];
    if (gates_in_kernel && dy_gate.has_value()) {
        p.dy_gate = dy_gate->const_data_ptr();
        const auto s = kernel_strides<3>(*dy_gate);
        p.dy_gate_stride_b = s[0], p.dy_gate_stride_h = s[1];
    }
    if (gates_in_kernel && u_gate.has_value()) {
        p.u_gate = u_gate->const_data_ptr();
        const auto s = kernel_strides<3>(*u_gate);
        p.u_gate_stride_b = s[0], p.u_gate_stride_h = s[1];
    }
    p.grad = grad.mutable_data_ptr<float>();
    check_launch(fftconv_filter_grad_sm80(p, current_stream(u)), kGradOp);
    return grad;
}

// A filter k (H, Nk) with 1 <= Nk <= fft_size / 2.
void check_filter(const at::Tensor& k, int64_t fft_size, const char* op) {
    TORCH_CHECK(k.defined(), op, "k is undefined");
    TORCH_CHECK(k.dim() == 2, op, "k must be 2-D (heads, filter length), got shape ", k.sizes());
    TORCH_CHECK(at::isFloatingType(k.scalar_type()), op, "k must be a floating-point tensor, got ", k.scalar_type());
    check_fft_size(fft_size, op);
    TORCH_CHECK(k.size(1) >= 1 && k.size(1) <= fft_size / 2, op, "k's length must be 1 .. fft_size / 2 = ",
                fft_size / 2, " (longer filters wrap around in the causal convolution), got ", k.size(1));
}

// The element types the spectrum kernel reads; none for the others.
std::optional<FilterType> filter_type(at::ScalarType type) {
    switch (type) {
        case at::kFloat: return FilterType::fp32;
        case at::kBFloat16: return FilterType::bf16;
        case at::kHalf: return FilterType::fp16;
        default: return std::nullopt;
    }
}

// rfft(k, fft_size) by ATen: k in fp32, zero-padded, then the r2c transform.
at::Tensor aten_spectrum(const at::Tensor& k, int64_t fft_size) {
    const at::Tensor padded = at::constant_pad_nd(k.to(at::kFloat), {0, fft_size - k.size(1)});
    return at::view_as_real(at::_fft_r2c(padded, {1}, /*normalization: none*/ 0, /*onesided=*/true));
}

// rfft(k, fft_size) on k's GPU: one kernel (filter_rfft.cu), or ATen's route where the kernel's
// block does not fit the device's shared memory (or TK_FFTCONV_SHARED_PER_BLOCK's cap).
at::Tensor fftconv_filter_rfft_cuda(const at::Tensor& k, int64_t fft_size) {
    check_filter(k, fft_size, kRfftOp);
    const std::optional<FilterType> type = filter_type(k.scalar_type());
    TORCH_CHECK(type.has_value(), kRfftOp, "k must be float32, bfloat16 or float16, got ", k.scalar_type());
    const c10::cuda::CUDAGuard device_guard(k.device());
    if (fftconv_filter_rfft_shared_bytes(static_cast<int>(fft_size)) > configuration_shared_per_block())
        return aten_spectrum(k, fft_size).clone();  // a tensor of its own, not a view of r2c's output
    at::Tensor out = at::empty({k.size(0), fft_size / 2 + 1, 2}, k.options().dtype(at::kFloat));
    if (k.size(0) == 0) return out;
    FilterRfftParams p{};
    p.k = k.const_data_ptr();
    p.k_stride_h = k.stride(0), p.k_stride_t = k.stride(1);
    p.type = *type;
    p.out = out.mutable_data_ptr<float>();
    p.heads = k.size(0);
    p.length = static_cast<int>(k.size(1));
    p.fft_size = static_cast<int>(fft_size);
    check_launch(fftconv_filter_rfft(p, current_stream(k)), kRfftOp);
    return out;
}

// rfft(k, fft_size) per head in fp32, as (heads, fft_size / 2 + 1, 2) floats: the form the
// kernels take. Composite (any device, traceable, differentiable): a per-call precompute, or
// cached by a module whose filter does not change.
at::Tensor fftconv_filter_spectrum(const at::Tensor& k, int64_t fft_size) {
    check_filter(k, fft_size, kSpectrumOp);
    if (k.is_cuda() && filter_type(k.scalar_type()).has_value()) {
        static const auto op = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("tk::fftconv_filter_rfft", "")
                                   .typed<at::Tensor(const at::Tensor&, int64_t)>();
        return op.call(k, fft_size);
    }
    return aten_spectrum(k, fft_size);
}

}  // namespace
}  // namespace tk::fftconv

TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("fftconv_fwd_sm80", &tk::fftconv::fftconv_fwd_sm80_cuda);
    m.impl("fftconv_fwd_sm90", &tk::fftconv::fftconv_fwd_sm90_cuda);
    m.impl("fftconv_filter_grad_sm80", &tk::fftconv::fftconv_filter_grad_sm80_cuda);
    m.impl("fftconv_filter_rfft", &tk::fftconv::fftconv_filter_rfft_cuda);
}

TORCH_LIBRARY_IMPL(tk, CompositeImplicitAutograd, m) {
    m.impl("fftconv_filter_spectrum", &tk::fftconv::fftconv_filter_spectrum);
}
