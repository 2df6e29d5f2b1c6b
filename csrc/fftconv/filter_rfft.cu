// rfft(k, L) of each head's filter in fp32 (params.h, FilterRfftParams): one kernel that reads k
// once and writes the half spectrum once, where the route through torch writes the zero-padded
// rows and cuFFT's r2c reads them back. A plain CUDA-core kernel (any GPU the extension targets).
//
// The real sequence x of length L (k, zeros past its length) is packed as z[n] = x[2n] + i x[2n + 1],
// M = L / 2 complex points of which only the first M / 2 can be nonzero (k is at most L / 2 long).
// Z = FFT_M(z) in shared memory by Stockham passes (each pass reads every value before any
// thread writes, then stores its outputs where the next pass reads them, in natural order after
// the last), then the transforms of the even and of the odd samples,
//   E[f] = (Z[f] + conj Z[M - f]) / 2,   O[f] = (Z[f] - conj Z[M - f]) / 2i,
// give X[f] = E[f] + w_L^f O[f] for f = 0 .. M (indices of Z mod M).
#include <utility>

#include "fftconv/complex_tiles.cuh"
#include "fftconv/params.h"
#include "kittens/common/launch.cuh"

namespace tk::fftconv {
namespace {

// Each thread holds 16 complex values through a pass: radix-16 passes give a head M / 16 threads.
constexpr int kValuesPerThread = 16;
// Short transforms put several heads in a block, so that a block has at least this many threads.
constexpr int kMinThreads = 128;

__device__ __forceinline__ float2 operator+(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float2 operator-(float2 a, float2 b) { return make_float2(a.x - b.x, a.y - b.y); }

// cos and sin of 2 pi j / 32, j = 0 .. 15: the twiddles of the radix-16 transform (w_16^j =
// w_32^(2j)) and of the spectrum's output rows (w_L^(i M / 16) = w_32^i).
__device__ constexpr float kCos32[16] = {1.f, 0.98078528040323043f, 0.92387953251128674f, 0.83146961230254524f,
                                         0.70710678118654752f, 0.55557023301960218f, 0.38268343236508977f,
                                         0.19509032201612826f, 0.f, -0.19509032201612826f, -0.38268343236508977f,
                                         -0.55557023301960218f, -0.70710678118654752f, -0.83146961230254524f,
                                         -0.92387953251128674f, -0.98078528040323043f};
__device__ constexpr float kSin32[16] = {0.f, 0.19509032201612826f, 0.38268343236508977f, 0.55557023301960218f,
                                         0.70710678118654752f, 0.83146961230254524f, 0.92387953251128674f,
                                         0.98078528040323043f, 1.f, 0.98078528040323043f, 0.92387953251128674f,
                                         0.83146961230254524f, 0.70710678118654752f, 0.55557023301960218f,
                                         0.38268343236508977f, 0.19509032201612826f};

// v * exp(-2 pi i j / R) for a compile-time j < R / 2 (R <= 16): no multiply for j = 0, a swap for
// a quarter turn.
template <int R, int J>
__device__ __forceinline__ float2 rotate(float2 v) {
    constexpr int j32 = J * (32 / R);
    if constexpr (j32 == 0) return v;
    else if constexpr (j32 == 8) return make_float2(v.y, -v.x);
    else {
        const float c = kCos32[j32], s = kSin32[j32];
        return make_float2(v.x * c + v.y * s, v.y * c - v.x * s);
    }
}

// The forward DFT of R values held in registers (R a power of two, at most 16), in place and in
// natural order: the transforms of the even and the odd values, combined (radix 2, unrolled).
template <int R>
__device__ __forceinline__ void dft(float2 (&v)[R]) {
    if constexpr (R > 1) {
        float2 even[R / 2], odd[R / 2];
#pragma unroll
        for (int i = 0; i < R / 2; i++) even[i] = v[2 * i], odd[i] = v[2 * i + 1];
        dft(even);
        dft(odd);
        [&]<int... J>(std::integer_sequence<int, J...>) {
            ((v[J] = even[J] + rotate<R, J>(odd[J]), v[J + R / 2] = even[J] - rotate<R, J>(odd[J])), ...);
        }(std::make_integer_sequence<int, R / 2>{});
    }
}

// Shared-memory slot of value i: one pad slot after every 16 values, so that the first pass's
// stores (16 consecutive values per thread) fall on distinct banks across a half warp.
__device__ __forceinline__ int slot(int i) { return i + (i >> 4); }

template <int M>
struct Transform {
    static constexpr int POINTS = M;  // complex points: fft_size / 2
    static constexpr int THREADS_PER_HEAD = M / kValuesPerThread;
    static constexpr int HEADS = THREADS_PER_HEAD >= kMinThreads ? 1 : kMinThreads / THREADS_PER_HEAD;
    static constexpr int THREADS = HEADS * THREADS_PER_HEAD;
    static constexpr int SLOTS = M + M / 16;  // per head
    static constexpr int shared_bytes = HEADS * SLOTS * int(sizeof(float2));
};

// f(Transform<fft_size / 2>{}) for a kernel size (512 .. 32768), `none` for any other.
template <typename R, typename F>
R with_transform(int fft_size, R none, F&& f) {
    switch (fft_size) {
        case 512: return f(Transform<256>{});
        case 1024: return f(Transform<512>{});
        case 2048: return f(Transform<1024>{});
        case 4096: return f(Transform<2048>{});
        case 8192: return f(Transform<4096>{});
        case 16384: return f(Transform<8192>{});
        case 32768: return f(Transform<16384>{});
    }
    return none;
}

// One Stockham pass of radix R over values that NS-point transforms have combined so far: the
// butterfly j (thread t takes j = t, t + threads, ...) reads values j + r M / R, multiplies them
// by w_(NS R)^(r (j % NS)), transforms them, and stores them at (j / NS) NS R + j % NS + r NS.
template <int M, int R, int NS>
__device__ __forceinline__ void stockham_pass(float2* data, int t) {
    constexpr int THREADS = M / kValuesPerThread, PER_THREAD = kValuesPerThread / R;
    float2 v[PER_THREAD][R];
#pragma unroll
    for (int b = 0; b < PER_THREAD; b++) {
        const int j = t + b * THREADS;
#pragma unroll
        for (int r = 0; r < R; r++) v[b][r] = data[slot(j + r * (M / R))];
    }
    __syncthreads();
#pragma unroll
    for (int b = 0; b < PER_THREAD; b++) {
        const int j = t + b * THREADS, k = j % NS;
        // w^(2^i) from sincospif (an exact angle), the other powers as products of those.
        float2 power[4];
#pragma unroll
        for (int i = 0; (1 << i) < R; i++) {
            float s, c;
            sincospif(float(k << i) * (-2.f / float(NS * R)), &s, &c);  // exact: NS R is a power of two
            power[i] = make_float2(c, s);
        }
#pragma unroll
        for (int r = 1; r < R; r++) {
            float2 w = make_float2(1.f, 0.f);
#pragma unroll
            for (int i = 0; (1 << i) < R; i++)  // r's bits from the lowest: w_(NS R)^(k r)
                if (r & (1 << i)) w = (r & ((1 << i) - 1)) ? complex_product(w, power[i]) : power[i];
            v[b][r] = complex_product(v[b][r], w);
        }
        dft(v[b]);
        const int base = (j / NS) * NS * R + k;
#pragma unroll
        for (int r = 0; r < R; r++) data[slot(base + r * NS)] = v[b][r];
    }
    __syncthreads();
}

// The passes after the first (radix 16 while 16 divides what is left, then the remainder).
template <int M, int NS>
__device__ __forceinline__ void remaining_passes(float2* data, int t) {
    if constexpr (NS < M) {
        constexpr int R = M / NS >= 16 ? 16 : M / NS;
        stockham_pass<M, R, NS>(data, t);
        remaining_passes<M, NS * R>(data, t);
    }
}

// X[f] = E[f] + w O[f] (w = w_L^f) from Z in shared memory (see the top of the file).
template <int M>
__device__ __forceinline__ float2 spectrum_value(const float2* data, int f, float2 w) {
    const float2 a = data[slot(f & (M - 1))], z = data[slot((M - f) & (M - 1))];
    const float2 e = make_float2(0.5f * (a.x + z.x), 0.5f * (a.y - z.y));   // (a + conj z) / 2
    const float2 o = make_float2(0.5f * (a.y + z.y), -0.5f * (a.x - z.x));  // (a - conj z) / 2i
    return e + complex_product(w, o);
}

// Block b transforms heads b * HEADS .. (one per group of THREADS_PER_HEAD threads).
template <typename T, int M>
__global__ void __launch_bounds__(Transform<M>::THREADS)
    filter_rfft(const T* __restrict__ k, int64_t stride_h, int64_t stride_t, int64_t heads, int length,
                float2* __restrict__ out) {
    using C = Transform<M>;
    extern __shared__ float2 shared[];
    const int group = int(threadIdx.x) / C::THREADS_PER_HEAD, t = int(threadIdx.x) % C::THREADS_PER_HEAD;
    const int64_t h = int64_t(blockIdx.x) * C::HEADS + group;
    float2* data = shared + group * C::SLOTS;

    // The first pass (radix 16, no twiddles) from global memory: values j + r M / 16 with r >= 8
    // are past M / 2, zeros, so the DFT of the 16 is two 8-point DFTs of the 8 loaded values,
    // one of them twiddled (the even and the odd outputs).
    {
        float2 even[8], odd[8];
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const int n = t + r * (M / 16);
            float x0 = 0.f, x1 = 0.f;
            if (h < heads) {
                const T* row = k + h * stride_h;
                if (2 * n < length) x0 = kt::convert<float>(row[int64_t(2 * n) * stride_t]);
                if (2 * n + 1 < length) x1 = kt::convert<float>(row[int64_t(2 * n + 1) * stride_t]);
            }
            even[r] = make_float2(x0, x1);
        }
        [&]<int... J>(std::integer_sequence<int, J...>) {
            ((odd[J] = rotate<16, J>(even[J])), ...);
        }(std::make_integer_sequence<int, 8>{});
        dft(even);
        dft(odd);
#pragma unroll
        for (int m = 0; m < 8; m++) {
            data[slot(t * 16 + 2 * m)] = even[m];
            data[slot(t * 16 + 2 * m + 1)] = odd[m];
        }
        __syncthreads();
    }
    remaining_passes<M, 16>(data, t);

    if (h >= heads) return;
    // Thread t writes f = t + i M / 16: w_L^f = w_L^t w_32^i, one sincospif per thread.
    float2* row = out + h * (M + 1);
    float s, c;
    sincospif(float(t) * (-1.f / float(M)), &s, &c);  // w_L^t, L = 2 M
    const float2 wt = make_float2(c, s);
#pragma unroll 4  // whole, at 1024 threads (64 registers) the hoisted loads spilled
    for (int i = 0; i < 16; i++) {
        const int f = t + i * C::THREADS_PER_HEAD;
        const float2 w = i == 0 ? wt : complex_product(wt, make_float2(kCos32[i], -kSin32[i]));
        row[f] = spectrum_value<M>(data, f, w);
    }
    if (t == 0) row[M] = spectrum_value<M>(data, M, make_float2(-1.f, 0.f));
}

template <typename T, int M>
cudaError_t launch(const FilterRfftParams& p, cudaStream_t stream) {
    using C = Transform<M>;
    auto* kernel = filter_rfft<T, M>;
    if (cudaError_t e = kt::allow_dynamic_shared_memory(kernel, C::shared_bytes)) return e;
    const int64_t blocks = (p.heads + C::HEADS - 1) / C::HEADS;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    kernel<<<unsigned(blocks), C::THREADS, C::shared_bytes, stream>>>(static_cast<const T*>(p.k), p.k_stride_h,
                                                                     p.k_stride_t, p.heads, p.length,
                                                                     reinterpret_cast<float2*>(p.out));
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_for_size(const FilterRfftParams& p, cudaStream_t stream) {
    return with_transform(p.fft_size, cudaErrorInvalidValue,
                          [&](auto c) { return launch<T, decltype(c)::POINTS>(p, stream); });
}

}  // namespace

int fftconv_filter_rfft_shared_bytes(int fft_size) {
    return with_transform(fft_size, 0, [](auto c) { return decltype(c)::shared_bytes; });
}

cudaError_t fftconv_filter_rfft(const FilterRfftParams& p, cudaStream_t stream) {
    if (p.heads < 1 || p.length < 1 || p.length > p.fft_size / 2) return cudaErrorInvalidValue;
    switch (p.type) {
        case FilterType::fp32: return launch_for_size<float>(p, stream);
        case FilterType::bf16: return launch_for_size<kt::bf16>(p, stream);
        case FilterType::fp16: return launch_for_size<kt::half>(p, stream);
    }
    return cudaErrorInvalidValue;
}

}  // namespace tk::fftconv
