// A model of the three-consumer d128 forward's serial step (forward_sm90.cu: SERIAL_STEPS), run on
// fixed shared tiles with no producer and no copies, to see what the step costs on its own:
//   S = Q K^T (SS wgmma, 8 k-steps of m64n128k16), wait, the forward's online softmax of an
//   unmasked tile (kittens ops, without the guard for rows that saw no key),
//   O = O * alpha + P V (RS wgmma), wait
// by 1, 2 or 3 warpgroups of one block per SM at once. Prints clock cycles per step and the tensor
// pipe's share (each warpgroup's two products are 1024 cycles of it at 4096 flops a cycle).
//
//   nvcc -O3 -std=c++20 --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math -I. \
//       -gencode arch=compute_90a,code=sm_90a -o /tmp/serial_step_bench scripts/serial_step_bench.cu
//   /tmp/serial_step_bench       (on the H200: under a second)
//
// Session 28 (benchmarks/NOTES.md): three warpgroups took 4184 cycles a step (73%), as the
// forward itself (~4200); without the exponentials 3398-3419 (90%). Some variants are bistable
// (8 of 64 exponentials on the FMA pipe: 3713 or 4312 with the same SASS, by how the warpgroups
// start; see `stagger`), so read a variant's number over several starts before trusting it.
#include <cstdio>

#include "kittens/kittens.cuh"
#include "kittens/hopper/hopper.cuh"

using namespace kittens;
using T = bf16;
constexpr int ITERATIONS = 256;
// Stands in for the softmax's scale * log2(e) (the forward's is 1 / sqrt(128) * log2(e) = 0.1275 at
// d128): the value does not change the step's instructions.
constexpr float SCALE_LOG2 = 0.18f;
struct Tiles {
    st<T, 192, 128> q;  // three warpgroups' 64 rows each
    st<T, 128, 128> k, v;
};

// 2^x on the FMA pipe for finite x <= 0: round(x) into the exponent bits, a cubic for 2^f of the
// rest (relative error 1.0e-4). Not used by the forward (session 28: slower there).
__device__ __forceinline__ float exp2_on_fma(float x) {
    constexpr float ROUNDER = 12582912.f;  // 1.5 * 2^23
    x = fmaxf(x, -126.f);
    const float rounded = __fadd_rn(x, ROUNDER);
    const float f = __fsub_rn(x, __fsub_rn(rounded, ROUNDER));
    const float two_to_f = fmaf(fmaf(fmaf(0.05500898f, f, 0.24221097f), f, 0.6932829f), f, 1.f);
    return __uint_as_float(__float_as_uint(two_to_f) + (__float_as_uint(rounded) << 23));
}

// The block's shared tiles, filled with small values and visible to wgmma.
__device__ Tiles& filled_tiles(char* smem) {
    shared_allocator alloc(smem);
    Tiles& sh = alloc.allocate<Tiles>();
    T* values = reinterpret_cast<T*>(&sh);
    for (int i = threadIdx.x; i < int(sizeof(Tiles) / sizeof(T)); i += blockDim.x)
        values[i] = __float2bfloat16(0.01f * ((i * 7) % 13) - 0.06f);
    fence_async_proxy();
    __syncthreads();
    return sh;
}

// Warpgroup w starts w * stagger cycles after warpgroup 0 (all start together by default).
__device__ void hold_back(int warpgroup, int stagger) {
    for (const long long t0 = clock64(); clock64() - t0 < warpgroup * stagger;) {
    }
}

// The warpgroup's cycles out; `keep` (its results) written only if it is a value no run gives,
// so that the compiler keeps the work that made it.
__device__ void report(long long* cycles, float* sink, float keep, long long elapsed, int warpgroup) {
    if (keep == 12345.f) sink[threadIdx.x] = keep;
    if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 3 + warpgroup] = elapsed;
}

// The start of the online softmax, as the forward's for rows that have seen a key (the model
// has no masked or empty rows): the new running max (already in new_max), each row's shift
// (max * c) and the factor alpha that O and the row sums are rescaled by.
template <typename V>
__device__ __forceinline__ void row_shift_and_rescale(V& shift, V& rescale, const V& running_max, const V& new_max, float c) {
    for_each_slot(rescale, [&](int t, int i, float& alpha) {
        const float m_new = new_max.data[t][i];
        shift.data[t][i] = m_new * c;
        alpha = exp2f((running_max.data[t][i] - m_new) * c);
    });
}

enum Softmax { NONE, FORWARD, NO_EXPONENTIALS, SPLIT_PV };

// O += P_half V[rows 64 FIRST_HALF ...]: P_half a 16 x 64 register tile (keys of one half),
// the k-steps of V's rows from 64 * FIRST_HALF on (RS wgmma, V MN-major).
template <int FIRST_HALF, typename O, typename P, typename V>
__device__ __forceinline__ void pv_half(O& o, const P& p_half, const V& v) {
    auto& regs = wgmma::detail::accumulator_registers(o);
    const uint64_t v0 = wgmma::descriptor_mn_major(v);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t a[4];
        wgmma::detail::a_fragment(a, p_half, k);
        wgmma::detail::mma_step<T, 0, 1, 128>(
            regs, a, layout_math::wgmma_descriptor_advance(v0, wgmma::detail::k_step<1, V>(4 * FIRST_HALF + k)), 1);
    }
}

// The serial step with S and P in halves of 64 keys: S as two m64n64 chains (one wait), the row
// max over both, then per half its exponentials, row sums and P, and its four P V k-steps issued
// at once, so that the second half's exponentials run while the first half's products do.
__global__ void __launch_bounds__(384, 1) split_pv_steps(long long* cycles, float* sink, int warpgroups, int stagger) {
    extern __shared__ char smem[];
    Tiles& sh = filled_tiles(smem);
    const int warpgroup = threadIdx.x / 128;
    if (warpgroup >= warpgroups) return;
    const auto q = subtile<64, 128>(sh.q, warpgroup, 0);
    const auto k_lo = subtile<64, 128>(sh.k, 0, 0), k_hi = subtile<64, 128>(sh.k, 1, 0);
    using half_tile = rt_fl<16, 64>;
    half_tile s_lo, s_hi;
    rt_fl<16, 128> o;
    rt<T, 16, 64> p_lo, p_hi;
    typename half_tile::col_vec running_max, row_sum, new_max, shift, rescale;
    neg_infty(running_max);
    zero(row_sum);
    zero(o);
    const float c = SCALE_LOG2;
    hold_back(warpgroup, stagger);
    const long long start = clock64();
    for (int it = 0; it < ITERATIONS; it++) {
        wgmma::fence();
        wgmma::mma_ABt(s_lo, q, k_lo, false);
        wgmma::mma_ABt(s_hi, q, k_hi, false);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operand(s_lo);
        wgmma::fence_operand(s_hi);
        row_max(new_max, s_lo, running_max);
        row_max(new_max, s_hi, new_max);
        row_shift_and_rescale(shift, rescale, running_max, new_max, c);
        copy(running_max, new_max);
        mul_row(o, o, rescale);
        mul(row_sum, row_sum, rescale);
        auto half = [&]<int H>(half_tile& s_half, rt<T, 16, 64>& p_half) {
            mul(s_half, s_half, c);
            sub_row(s_half, s_half, shift);
            exp2(s_half, s_half);
            row_sum_lane_partial(row_sum, s_half, row_sum);
            copy(p_half, s_half);
            wgmma::fence();
            pv_half<H>(o, p_half, sh.v);
            wgmma::commit();
        };
        half.template operator()<0>(s_lo, p_lo);
        half.template operator()<1>(s_hi, p_hi);
        wgmma::wait<0>();
        wgmma::fence_operand(o);
        wgmma::fence_operand(p_lo);
        wgmma::fence_operand(p_hi);
    }
    const long long elapsed = clock64() - start;
    float keep = o.tiles[0][0].data[0].x;
    for_each_slot(row_sum, [&](int, int, float& v) { keep += v; });
    report(cycles, sink, keep, elapsed, warpgroup);
}

// ON_FMA: how many of each lane's 64 exponentials go to exp2_on_fma.
template <Softmax SOFTMAX, int ON_FMA>
__global__ void __launch_bounds__(384, 1) serial_steps(long long* cycles, float* sink, int warpgroups, int stagger) {
    extern __shared__ char smem[];
    Tiles& sh = filled_tiles(smem);
    const int warpgroup = threadIdx.x / 128;
    if (warpgroup >= warpgroups) return;
    const auto q = subtile<64, 128>(sh.q, warpgroup, 0);
    using score_tile = rt_fl<16, 128>;
    score_tile s;
    rt_fl<16, 128> o;
    rt<T, 16, 128> p;
    typename score_tile::col_vec running_max, row_sum, new_max, shift, rescale;
    neg_infty(running_max);
    zero(row_sum);
    zero(o);
    const float c = SCALE_LOG2;
    hold_back(warpgroup, stagger);
    const long long start = clock64();
    for (int it = 0; it < ITERATIONS; it++) {
        wgmma::fence();
        wgmma::mma_ABt(s, q, sh.k, false);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operand(s);
        if constexpr (SOFTMAX != NONE) {
            row_max(new_max, s, running_max);
            row_shift_and_rescale(shift, rescale, running_max, new_max, c);
            mul(s, s, c);
            sub_row(s, s, shift);
            if constexpr (SOFTMAX == FORWARD) {
                for_each_pair(s, [&](int, int j, int k, auto& pair) {
                    const int at = (j * 4 + k) * 2;
                    pair.x = at < ON_FMA ? exp2_on_fma(pair.x) : exp2f(pair.x);
                    pair.y = at + 1 < ON_FMA ? exp2_on_fma(pair.y) : exp2f(pair.y);
                });
            }
            copy(running_max, new_max);
            mul(row_sum, row_sum, rescale);
            row_sum_lane_partial(row_sum, s, row_sum);
            mul_row(o, o, rescale);
        }
        copy(p, s);
        wgmma::fence();
        wgmma::mma_AB(o, p, sh.v, true);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operand(o);
        wgmma::fence_operand(p);
    }
    const long long elapsed = clock64() - start;
    float keep = o.tiles[0][0].data[0].x;  // results stay live
    for_each_slot(row_sum, [&](int, int, float& v) { keep += v; });
    report(cycles, sink, keep, elapsed, warpgroup);
}

template <Softmax SOFTMAX, int ON_FMA = 0>
void run(const char* name, long long* cycles, float* sink, int sms, int stagger = 0) {
    const int smem = sizeof(Tiles) + 1024;
    auto kernel = [] {
        if constexpr (SOFTMAX == SPLIT_PV) return split_pv_steps;
        else return serial_steps<SOFTMAX, ON_FMA>;
    }();
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    for (int warpgroups = 1; warpgroups <= 3; warpgroups++) {
        cudaMemset(cycles, 0, sizeof(long long) * 3 * sms);
        for (int rep = 0; rep < 2; rep++) kernel<<<sms, 384, smem>>>(cycles, sink, warpgroups, stagger);
        if (cudaError_t e = cudaDeviceSynchronize()) {
            printf("%s: %s\n", name, cudaGetErrorString(e));
            return;
        }
        long long host[3 * 1024], most = 0;
        cudaMemcpy(host, cycles, sizeof(long long) * 3 * sms, cudaMemcpyDeviceToHost);
        for (int i = 0; i < 3 * sms; i++) most = host[i] > most ? host[i] : most;
        const double per_step = double(most) / ITERATIONS;
        printf("%-44s stagger %4d, %d warpgroups: %5.0f cycles a step, tensor pipe %5.1f%%\n", name, stagger, warpgroups, per_step,
               100.0 * 1024 * warpgroups / per_step);
    }
}

int main() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    if (sms > 1024) sms = 1024;
    long long* cycles;
    float* sink;
    cudaMalloc(&cycles, sizeof(long long) * 3 * sms);
    cudaMalloc(&sink, sizeof(float) * 384);
    run<NONE>("S, P V (no softmax)", cycles, sink, sms);
    run<FORWARD>("S, softmax, P V", cycles, sink, sms);
    run<NO_EXPONENTIALS>("S, softmax without exponentials, P V", cycles, sink, sms);
    run<FORWARD, 4>("S, softmax (4 of 64 exp2 on FMA), P V", cycles, sink, sms);
    run<FORWARD, 8>("S, softmax (8 of 64 exp2 on FMA), P V", cycles, sink, sms);
    run<SPLIT_PV>("S, softmax with P V in two halves", cycles, sink, sms);
    for (int stagger : {350, 700, 1050, 1400, 2100}) {
        run<FORWARD>("S, softmax, P V", cycles, sink, sms, stagger);
        run<FORWARD, 8>("S, softmax (8 of 64 exp2 on FMA), P V", cycles, sink, sms, stagger);
    }
    return 0;
}
