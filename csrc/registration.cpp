// Schemas of every tk op. They are defined here, whatever op families were compiled, so that:
//  - the Python package can always register fake (meta) implementations against them, and
//  - a family left out of the build (TK_OPS) fails with a clear message when called, instead
//    of the dispatcher's generic "could not run with arguments from the CUDA backend".
// The CUDA implementations live next to their kernels in csrc/<family>/<family>_ops.cpp.
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#ifndef TK_BUILD_OPS
#define TK_BUILD_OPS "?"
#endif

TORCH_LIBRARY(tk, m) {
    // The attention forward of the mma.sync kernel (sm_80 and newer).
    // q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), bf16/fp16, Hq % Hkv == 0, D one the kernel is built
    // for (thunderkittens._C.attention_head_dims["sm80"]; csrc/attention/head_dims.h).
    // Returns out (B, Hq, Lq, D) contiguous and lse (B, Hq, Lq) fp32, the natural-log
    // log-sum-exp of the scaled scores, which the backward pass will need.
    // is_causal: key j is visible to query i iff j <= i (top-left, SDPA's is_causal); with
    // lower_right too, iff j <= i + Lk - Lq (SDPA's causal_lower_right). lower_right without
    // is_causal is an error. With Lq > Lk, lower-right query rows i < Lq - Lk see no key: their
    // out row is 0, their lse -inf, and their gradients 0 (as FlashAttention and SDPA's math
    // backend give).
    m.def("attention_fwd_sm80(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, "
          "bool lower_right=False) -> (Tensor out, Tensor lse)");
    // The same contract, computed by the Hopper (sm_90a: TMA + wgmma) kernel, with its head dims
    // (attention_head_dims["sm90"]).
    m.def("attention_fwd_sm90(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, "
          "bool lower_right=False) -> (Tensor out, Tensor lse)");
    // attention_fwd_sm90 for a training step: also out_residual (q's shape and dtype,
    // contiguous), out's rounding residual (the fp32 result minus out), which makes the
    // backward's rowsum(grad_out * out) exact to fp32 rather than to out's dtype.
    m.def("attention_fwd_sm90_train(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, "
          "bool lower_right=False) -> (Tensor out, Tensor lse, Tensor out_residual)");
    // Gradients of attention_fwd_sm90's out (given grad_out) with respect to q, k and v, from the
    // forward's out and lse (and out_residual, when the training forward gave one); dk/dv summed
    // over each GQA group's query heads. sm_90 only.
    // is_causal and lower_right as the forward's. deterministic: dq bitwise the same on every run
    // (the key blocks add into it in a fixed order; a little slower), as
    // torch.use_deterministic_algorithms(True) asks.
    m.def("attention_bwd_sm90(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
          "bool is_causal, float scale, bool lower_right=False, bool deterministic=False, "
          "Tensor? out_residual=None) -> (Tensor dq, Tensor dk, Tensor dv)");
    // Attention for decoding (mma.sync + cp.async, sm_80 and newer; csrc/attention/decode.cu):
    // attention_fwd_sm80's contract for q of at most 64 rows, the query heads of each GQA group
    // packed into one tile and the keys split over the GPU; head dims
    // thunderkittens._C.attention_head_dims["decode"].
    m.def("attention_fwd_decode(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, "
          "bool lower_right=False) -> (Tensor out, Tensor lse)");
    // The same against preallocated caches (B, Hkv, S, D) holding cache_seqlens[b] + seqlen_add
    // valid rows for sequence b (cache_seqlens: int32 (B,) on q's device, read on the device;
    // clamped to [0, S]). is_causal: lower-right, the Lq query rows are the last Lq of those
    // rows. A sequence with no row gives out 0 and lse -inf.
    m.def("attention_decode_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, "
          "int seqlen_add, bool is_causal, float scale) -> (Tensor out, Tensor lse)");
    // Writes k_new / v_new (B, Hkv, Lnew, D) into rows cache_seqlens[b] .. + Lnew - 1 of the caches
    // (B, Hkv, S, D), in place; rows outside [0, S) are dropped. cache_seqlens is not changed.
    m.def("kvcache_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, Tensor k_new, "
          "Tensor v_new) -> ()");
    // a (Ba, M, K), b (Bb, K, N), bf16/fp16, Ba and Bb each 1 (broadcast) or the batch B.
    // Each operand row-major or column-major (a transposed view). Returns c (B, M, N)
    // contiguous in the inputs' dtype, accumulated in fp32.
    m.def("matmul(Tensor a, Tensor b) -> Tensor");
    // Based linear attention forward, mma.sync kernel (sm_80 and newer). q, k (B, H, N, 16), v
    // (B, H, N, Dv) with Dv 64 or 128, bf16/fp16; scale > 0. o_i = sum_{j<=i} p(s_ij) v_j with
    // s_ij = scale q_i.k_j and p(s) = 1 + s + s^2 / 2, divided by sum_{j<=i} p(s_ij) + eps when
    // normalize. The state is float32 (B, H, 273, Dv + 1): sum_j phi(k_j) [v_j, 1]^T with
    // phi(x) = [1, sqrt(scale) x, (scale / sqrt(2)) vec(x x^T)] (csrc/based/params.h);
    // initial_state (or None) is the state the sequence continues from. Returns o (B, H, N, Dv)
    // contiguous in q's dtype, and final_state: the state after the last row when
    // output_final_state, else an empty tensor.
    m.def("based_fwd_sm80(Tensor q, Tensor k, Tensor v, float scale, bool normalize, float eps, "
          "Tensor? initial_state, bool output_final_state) -> (Tensor o, Tensor final_state)");
    // The same contract, computed by the Hopper (sm_90a: TMA + wgmma) kernel. Its gradients are
    // based_bwd_sm90's.
    m.def("based_fwd_sm90(Tensor q, Tensor k, Tensor v, float scale, bool normalize, float eps, "
          "Tensor? initial_state, bool output_final_state) -> (Tensor o, Tensor final_state)");
    // Gradients of based_fwd_sm80 without normalize (csrc/based/backward_params.h), mma.sync
    // kernels (sm_80 and newer): grad_out (the gradient of o) of v's shape; initial_state as the
    // forward took it (or None); grad_final_state, the gradient of the forward's final state (or
    // None); grad_denominator, float32 (B, H, N) or None: the gradient of the block-local
    // denominators (sum of p(s_ij) over the keys j <= i of row i's 64-row block), whose terms are
    // added to dq and dk (normalize's share that cancels against the value term). Returns dq, dk,
    // dv (new contiguous tensors in q's dtype) and, when grad_initial_state, the initial state's
    // gradient: float32 (B, H, 273, Dv + 1) with the value columns' part (sum_i phi(q_i)
    // grad_out_i^T plus grad_final_state's value columns, whose quadratic block enters through its
    // symmetric part) and a zero last column; else an empty tensor.
    m.def("based_bwd_sm80(Tensor grad_out, Tensor q, Tensor k, Tensor v, float scale, Tensor? initial_state, "
          "Tensor? grad_final_state, bool grad_initial_state, Tensor? grad_denominator) "
          "-> (Tensor dq, Tensor dk, Tensor dv, Tensor d_initial_state)");
    // The same contract on Hopper (sm_90 only), by TMA + wgmma kernels.
    m.def("based_bwd_sm90(Tensor grad_out, Tensor q, Tensor k, Tensor v, float scale, Tensor? initial_state, "
          "Tensor? grad_final_state, bool grad_initial_state, Tensor? grad_denominator) "
          "-> (Tensor dq, Tensor dk, Tensor dv, Tensor d_initial_state)");
    // Based decoding step (CUDA cores, sm_80 and newer; csrc/based/step.h): T tokens q, k
    // (B, H, T, 16), v (B, H, T, Dv) with Dv 64 or 128, bf16/fp16, any strides, against the float32
    // state (B, H, 273, Dv + 1) of based_fwd_sm80, applied in order: state += phi(k_t) [v_t, 1]^T,
    // then o_t = phi(q_t)^T state[:, :Dv] (divided by phi(q_t)^T state[:, Dv] + eps when
    // normalize). Returns o (B, H, T, Dv) contiguous in q's dtype and the new state (contiguous);
    // the given state is not changed.
    m.def("based_step_sm80(Tensor q, Tensor k, Tensor v, Tensor state, float scale, bool normalize, float eps) "
          "-> (Tensor o, Tensor new_state)");
    // The same step writing the new state into `state` (contiguous rows, no two (b, h) slices
    // sharing memory); returns o.
    m.def("based_step_inplace_sm80(Tensor q, Tensor k, Tensor v, Tensor(a!) state, float scale, bool normalize, "
          "float eps) -> Tensor o");
    // Causal FFT convolution forward, mma.sync kernel (sm_80 and newer; csrc/fftconv/params.h):
    // y = irfft(rfft(u * pregate, fft_size) * K, fft_size)[..., :n] * postgate with u, pregate,
    // postgate (B, H, n) bf16/fp16 (last dim contiguous, other strides multiples of 8), n a
    // multiple of 8 and at most fft_size / 2, fft_size in {512, 1024, ..., 32768}, and
    // k_spectrum = fftconv_filter_spectrum(k, fft_size); conjugate: times conj(K), the
    // anti-causal correlation y[n] = sum_{m >= n} k[m - n] u[m] (the convolution's input
    // gradient). Returns y (B, H, n) contiguous in u's dtype.
    m.def("fftconv_fwd_sm80(Tensor u, Tensor k_spectrum, Tensor? pregate, Tensor? postgate, int fft_size, "
          "bool conjugate=False) -> Tensor");
    // The same contract on Hopper (sm_90a): the wgmma kernels for fft_size 4096 and 8192, the
    // mma.sync kernels for the other sizes.
    m.def("fftconv_fwd_sm90(Tensor u, Tensor k_spectrum, Tensor? pregate, Tensor? postgate, int fft_size, "
          "bool conjugate=False) -> Tensor");
    // The filter's gradient of that convolution (same kernel family and sizes): dy, u (B, H, n)
    // as u above; returns grad (H, n) float32, grad[h, t] = sum_b sum_n dy[b, h, n] u[b, h, n - t],
    // with dy and u times dy_gate and u_gate (shaped like u) where given, each product rounded to
    // u's dtype (a gated convolution's backward).
    m.def("fftconv_filter_grad_sm80(Tensor dy, Tensor u, int fft_size, Tensor? dy_gate=None, "
          "Tensor? u_gate=None) -> Tensor");
    // rfft(k, fft_size) of a filter k (H, Nk), Nk <= fft_size / 2, in fp32 as (H, fft_size / 2 + 1,
    // 2) floats, the form fftconv_fwd_sm80 takes. Composite (any device, differentiable: on a GPU
    // fftconv_filter_rfft, elsewhere ATen's rfft of the zero-padded rows); a module whose filter
    // does not change can keep it.
    m.def("fftconv_filter_spectrum(Tensor k, int fft_size) -> Tensor");
    // The same for k (H, Nk) float32/bfloat16/float16 on a GPU, any strides, in one kernel
    // (contiguous result; autograd formula registered in Python).
    m.def("fftconv_filter_rfft(Tensor k, int fft_size) -> Tensor");
}

namespace {

[[noreturn]] [[maybe_unused]] void family_not_built(const char* op, const char* family) {
    const std::string built = TK_BUILD_OPS;
    TORCH_CHECK(false, "tk::", op, ": the '", family,
                "' op family was not compiled into this build of thunderkittens (families built: ",
                built.empty() ? "none" : built, "). Rebuild with TK_OPS unset (all families) or listing '",
                family, "': pip install --no-build-isolation .");
}

#ifndef TK_HAS_ATTENTION
std::tuple<at::Tensor, at::Tensor> attention_fwd_sm80_not_built(const at::Tensor&, const at::Tensor&,
                                                                 const at::Tensor&, bool, double, bool) {
    family_not_built("attention_fwd_sm80", "attention");
}
std::tuple<at::Tensor, at::Tensor> attention_fwd_sm90_not_built(const at::Tensor&, const at::Tensor&,
                                                                 const at::Tensor&, bool, double, bool) {
    family_not_built("attention_fwd_sm90", "attention");
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_fwd_sm90_train_not_built(const at::Tensor&,
                                                                                  const at::Tensor&,
                                                                                  const at::Tensor&, bool, double,
                                                                                  bool) {
    family_not_built("attention_fwd_sm90_train", "attention");
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_bwd_not_built(const at::Tensor&, const at::Tensor&,
                                                                       const at::Tensor&, const at::Tensor&,
                                                                       const at::Tensor&, const at::Tensor&, bool,
                                                                       double, bool, bool,
                                                                       const std::optional<at::Tensor>&) {
    family_not_built("attention_bwd_sm90", "attention");
}
std::tuple<at::Tensor, at::Tensor> attention_fwd_decode_not_built(const at::Tensor&, const at::Tensor&,
                                                                   const at::Tensor&, bool, double, bool) {
    family_not_built("attention_fwd_decode", "attention");
}
std::tuple<at::Tensor, at::Tensor> attention_decode_kvcache_not_built(const at::Tensor&, const at::Tensor&,
                                                                       const at::Tensor&, const at::Tensor&, int64_t,
                                                                       bool, double) {
    family_not_built("attention_decode_kvcache", "attention");
}
void kvcache_append_not_built(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
    family_not_built("kvcache_append", "attention");
}
#endif

#ifndef TK_HAS_MATMUL
at::Tensor matmul_not_built(const at::Tensor&, const at::Tensor&) { family_not_built("matmul", "matmul"); }
#endif

#ifndef TK_HAS_FFTCONV
at::Tensor fftconv_fwd_sm80_not_built(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                      const std::optional<at::Tensor>&, int64_t, bool) {
    family_not_built("fftconv_fwd_sm80", "fftconv");
}
at::Tensor fftconv_fwd_sm90_not_built(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                      const std::optional<at::Tensor>&, int64_t, bool) {
    family_not_built("fftconv_fwd_sm90", "fftconv");
}
at::Tensor fftconv_filter_grad_sm80_not_built(const at::Tensor&, const at::Tensor&, int64_t,
                                              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&) {
    family_not_built("fftconv_filter_grad_sm80", "fftconv");
}
at::Tensor fftconv_filter_spectrum_not_built(const at::Tensor&, int64_t) {
    family_not_built("fftconv_filter_spectrum", "fftconv");
}
at::Tensor fftconv_filter_rfft_not_built(const at::Tensor&, int64_t) {
    family_not_built("fftconv_filter_rfft", "fftconv");
}
#endif

#ifndef TK_HAS_BASED
std::tuple<at::Tensor, at::Tensor> based_fwd_sm80_not_built(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                             double, bool, double, const std::optional<at::Tensor>&,
                                                             bool) {
    family_not_built("based_fwd_sm80", "based");
}
std::tuple<at::Tensor, at::Tensor> based_fwd_sm90_not_built(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                             double, bool, double, const std::optional<at::Tensor>&,
                                                             bool) {
    family_not_built("based_fwd_sm90", "based");
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> based_bwd_sm80_not_built(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, bool, const std::optional<at::Tensor>&) {
    family_not_built("based_bwd_sm80", "based");
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> based_bwd_sm90_not_built(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, bool, const std::optional<at::Tensor>&) {
    family_not_built("based_bwd_sm90", "based");
}
std::tuple<at::Tensor, at::Tensor> based_step_sm80_not_built(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                              const at::Tensor&, double, bool, double) {
    family_not_built("based_step_sm80", "based");
}
at::Tensor based_step_inplace_sm80_not_built(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                                             double, bool, double) {
    family_not_built("based_step_inplace_sm80", "based");
}
#endif

}  // namespace

#ifndef TK_HAS_ATTENTION
TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("attention_fwd_sm80", &attention_fwd_sm80_not_built);
    m.impl("attention_fwd_sm90", &attention_fwd_sm90_not_built);
    m.impl("attention_fwd_sm90_train", &attention_fwd_sm90_train_not_built);
    m.impl("attention_bwd_sm90", &attention_bwd_not_built);
    m.impl("attention_fwd_decode", &attention_fwd_decode_not_built);
    m.impl("attention_decode_kvcache", &attention_decode_kvcache_not_built);
    m.impl("kvcache_append", &kvcache_append_not_built);
}
#endif
#ifndef TK_HAS_MATMUL
TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("matmul", &matmul_not_built);
}
#endif
#ifndef TK_HAS_BASED
TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("based_fwd_sm80", &based_fwd_sm80_not_built);
    m.impl("based_fwd_sm90", &based_fwd_sm90_not_built);
    m.impl("based_bwd_sm80", &based_bwd_sm80_not_built);
    m.impl("based_bwd_sm90", &based_bwd_sm90_not_built);
    m.impl("based_step_sm80", &based_step_sm80_not_built);
    m.impl("based_step_inplace_sm80", &based_step_inplace_sm80_not_built);
}
#endif
#ifndef TK_HAS_FFTCONV
TORCH_LIBRARY_IMPL(tk, CUDA, m) {
    m.impl("fftconv_fwd_sm80", &fftconv_fwd_sm80_not_built);
    m.impl("fftconv_fwd_sm90", &fftconv_fwd_sm90_not_built);
    m.impl("fftconv_filter_grad_sm80", &fftconv_filter_grad_sm80_not_built);
    m.impl("fftconv_filter_rfft", &fftconv_filter_rfft_not_built);
}
TORCH_LIBRARY_IMPL(tk, CompositeImplicitAutograd, m) {
    m.impl("fftconv_filter_spectrum", &fftconv_filter_spectrum_not_built);
}
#endif
