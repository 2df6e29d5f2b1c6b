// Causal FFT convolution forward on mma.sync + cp.async (sm_80 and newer: A100, RTX 3090/4090,
// and Hopper when forced), written in the tile core's warp ops.
//
// y = irfft(rfft(u * pregate, L) * K, L)[:n] * postgate with L = 2N for kernel length N. The FFT
// of length L = R * P * Q is the Monarch (four-step) factorisation: with n = q + Q p + Q P r and
// k = k_r + R k_p + R P k_q,
//   F1  Y[k_r, p, q] = sum_r F_R[k_r, r] x[r, p, q]        (r < R/2: u is zero past N)
//   T1  Y *= w_L^(k_r (q + Q p))
//   F2  Z[k_r, k_p, q] = sum_p F_P[k_p, p] Y[k_r, p, q]    (three factors only)
//   T2  Z *= w_PQ^(k_p q)
//   F3  W[k_r, k_p, k_q] = sum_q Z[k_r, k_p, q] F_Q[q, k_q] = fft(x)[k]
// then W *= K (the filter's spectrum, precomputed in this order) and the inverse runs the same
// steps backwards with conjugate matrices and twiddles, computing only the rows r < R/2 of the
// last product (the output's first half). Every DFT matrix carries 1/sqrt(size), so the
// inverse's 1/L is spread over the stages and every intermediate stays near the input's or
// the output's magnitude (fp16 has little range).
//
// Two real sequences of one head (batches 2i and 2i + 1) travel as one complex sequence
// z = u_2i + i u_2i+1: the filter is real, so the inverse gives y_2i + i y_2i+1.
//
// Products are 16-bit (the input's type) with fp32 accumulation; twiddles, the spectrum and the
// gates multiply in fp32, and each intermediate is rounded to 16 bits once, where it becomes an
// mma operand. csrc/fftconv/model.py is a Python model of exactly these steps and roundings.
//
// Two kernels:
//  - two factors (L <= 2048, P = 1): a block of R/16 warps (one for L = 512) runs a pair at a
//    time; each warp owns 16-row strips of k_r and runs F1 .. G3 of its strips in registers (F1's
//    output rows are F3's A operand as they are), then the strips meet in shared memory for the
//    last product, which sums over k_r;
//  - three factors (L = 4096, 8192; P = Q = 16): a block of 16 warps; F1 and the last product
//    split the columns (warp = p), the steps in between split k_r (each k_r is a 16 x 16 FFT of
//    its own), with the data in shared memory between the phases.
// The grid is one wave of persistent blocks, each running an equal share of the (head, pair of
// batches) tasks in order, with the next tasks' inputs in flight (cp.async) while the current one
// computes. A block computes its DFT matrices and twiddles once; the filter's spectrum comes
// through a shared-memory slot that is refilled when the head changes.
#include "fftconv/complex_tiles.cuh"
#include "fftconv/params.h"

namespace tk::fftconv {
namespace {

template <typename T>
struct Args {
    const T* u;
    int64_t u_stride_b, u_stride_h;
    const T* pregate;
    int64_t pre_stride_b, pre_stride_h;
    const T* postgate;
    int64_t post_stride_b, post_stride_h;
    T* y;
    int64_t y_stride_b, y_stride_h;
    const float* spectrum;
    int batch, heads, seqlen;
    int pairs;           // per head: ceil(batch / 2)
    int tasks;           // heads * pairs; task t = (head t / pairs, pair t % pairs)
    int tasks_per_block; // block b runs tasks [b * tasks_per_block, ...) in order

    // Sequence (b, h) of a tensor, nullptr past the last batch (the odd one out of a pair).
    template <typename P>
    __device__ P* at(P* base, int64_t stride_b, int64_t stride_h, int b, int h) const {
        return b < batch ? base + b * stride_b + h * stride_h : nullptr;
    }
};

// The block's tasks [first, last): consecutive pairs of a head, then of the next head. A block
// sets up its DFT matrices and twiddles once and keeps them for all of them; the filter's
// spectrum changes with the head.
struct Tasks {
    int first, last;
};
template <typename T>
__device__ __forceinline__ Tasks tasks_of(const Args<T>& a) {
    const int first = blockIdx.x * a.tasks_per_block;
    return {first, min(first + a.tasks_per_block, a.tasks)};
}

// cp.async of head h's spectrum (L complex fp32, L / 2 16-byte chunks) into `slot`.
template <int THREADS, int L, typename T>
__device__ __forceinline__ void load_spectrum_async(float4* slot, const Args<T>& a, int h, int thread) {
    const float4* src = reinterpret_cast<const float4*>(a.spectrum + int64_t(h) * L * 2);
    for (int c = thread; c < L / 2; c += THREADS)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(kt::shared_address(slot + c)), "l"(src + c)
                     : "memory");
}

// acc *= postgate at the tile's elements: element (row, col) of `acc` is sequence element
// element_of(row, col) of batches b0 (re) and b1 (im); elements at or past seqlen are left.
template <typename T, typename RT, typename Element>
__device__ __forceinline__ void apply_postgate(complex_tile<RT>& acc, const T* gate0, const T* gate1, int seqlen,
                                               Element&& element_of) {
    using P = typename kt::packed_of<T>::type;
    kt::for_each_pair(acc.re, [&](int i, int j, int k, float2& re) {
        const int n = element_of(i * kt::TILE_DIM + RT::row_in_base(k, 0), j * kt::TILE_DIM + RT::col_in_base(k, 0));
        if (n >= seqlen) return;
        const float2 g0 = kt::convert_pair<float, T>(__ldg(reinterpret_cast<const P*>(gate0 + n)));
        re.x *= g0.x;
        re.y *= g0.y;
        if (gate1 != nullptr) {
            float2& im = acc.im.tiles[i][j].data[k];
            const float2 g1 = kt::convert_pair<float, T>(__ldg(reinterpret_cast<const P*>(gate1 + n)));
            im.x *= g1.x;
            im.y *= g1.y;
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Two factors: L = R x Q, x[r, q] = x[q + Q r].
// ---------------------------------------------------------------------------------------------

template <typename T, int R_, int Q_, int WARPS_>
struct TwoFactor {
    static constexpr int R = R_, Q = Q_, WARPS = WARPS_, THREADS = WARPS * kt::WARP_THREADS;
    static constexpr int L = R * Q, N = L / 2, HALF = R / 2;
    static constexpr int STRIPS = R / kt::TILE_DIM / WARPS;  // 16-row strips of k_r per warp
    static constexpr int OUT_TILES = (HALF / kt::TILE_DIM) * (Q / kt::TILE_DIM);  // 16x16 tiles of y
    static constexpr int OUT_PER_WARP = OUT_TILES / WARPS;
    static_assert(STRIPS >= 1 && R % (kt::TILE_DIM * WARPS) == 0 && OUT_TILES % WARPS == 0);
    // Pairs in flight: the current one and three ahead. A pair is 2N elements per sequence and
    // these kernels are memory-bound: fewer ahead leave too few bytes in flight per SM to cover
    // the memory latency.
    static constexpr int STAGES = 4;
    using seq_tile = kt::st<T, HALF, Q>;  // one sequence's N elements, rows of Q
    struct Stage {
        seq_tile x[2];  // batch 2i (real part), 2i + 1 (imaginary part); y staged here after use
    };
    using PreStages = seq_tile[STAGES][2];  // their pregates: allocated after Shared, only with one
    struct Shared {
        Stage stage[STAGES];
        kt::st<T, R, Q> u[2];      // the inverse's last input (re, im), rows k_r
        kt::st<T, R, HALF> fr[2];  // F_R[:, :R/2] / sqrt(R) (re, im); F_R is symmetric
        kt::st<T, Q, Q> fq[2];     // F_Q / sqrt(Q)
        float4 spectrum[L / 2];    // a head's spectrum (params.h's layout), two complex per float4
    };
    static constexpr int shared_bytes = kt::shared_bytes_for<Shared>();
    static constexpr int pregate_bytes = kt::shared_bytes_for<PreStages>() - 1024;
};

template <typename T, int R, int Q, int WARPS>
__global__ void __launch_bounds__(WARPS * kt::WARP_THREADS)
    two_factor_kernel(const __grid_constant__ Args<T> a) {
    using C = TwoFactor<T, R, Q, WARPS>;
    constexpr int L = C::L, N = C::N, HALF = C::HALF, THREADS = C::THREADS, STAGES = C::STAGES;
    constexpr int STRIPS = C::STRIPS, OUT_PER_WARP = C::OUT_PER_WARP;
    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    auto& s = alloc.allocate<typename C::Shared>();
    typename C::PreStages* pre = a.pregate != nullptr ? &alloc.allocate<typename C::PreStages>() : nullptr;
    const int warp = kt::warp_id(), thread = threadIdx.x;
    const Tasks tasks = tasks_of(a);
    if (tasks.first >= tasks.last) return;

    // Task t's inputs into stage `stage`.
    auto issue_loads = [&](int t, int stage) {
        const int h = t / a.pairs, pair = t - h * a.pairs;
        auto& st = s.stage[stage];
        for (int j = 0; j < 2; j++) {
            load_sequence_async<THREADS, N>(st.x[j], a.at(a.u, a.u_stride_b, a.u_stride_h, 2 * pair + j, h), a.seqlen,
                                            a.u, thread);
            if (pre != nullptr)
                load_sequence_async<THREADS, N>((*pre)[stage][j], a.at(a.pregate, a.pre_stride_b, a.pre_stride_h,
                                                                      2 * pair + j, h),
                                                a.seqlen, a.u, thread);
        }
    };
    load_spectrum_async<THREADS, L>(s.spectrum, a, tasks.first / a.pairs, thread);  // with the first task's group
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {
        if (tasks.first + i < tasks.last) issue_loads(tasks.first + i, i);
        kt::cp_async_commit();
    }

    // DFT matrices, once per block.
    const float r_scale = rsqrtf(float(R)), q_scale = rsqrtf(float(Q));
    for (int e = thread; e < R * HALF; e += THREADS) {
        const int row = e / HALF, col = e % HALF;
        const float2 w = unit_root(row * col, R);
        *s.fr[0].ptr(row, col) = kt::convert<T>(w.x * r_scale);
        *s.fr[1].ptr(row, col) = kt::convert<T>(w.y * r_scale);
    }
    for (int e = thread; e < Q * Q; e += THREADS) {
        const int row = e / Q, col = e % Q;
        const float2 w = unit_root(row * col, Q);
        *s.fq[0].ptr(row, col) = kt::convert<T>(w.x * q_scale);
        *s.fq[1].ptr(row, col) = kt::convert<T>(w.y * q_scale);
    }
    __syncthreads();

    // This warp's constants, in registers for the block's lifetime: its strips of F_R (F1's A
    // operand), F_Q (B operand of F3 and, conjugated, G3), the twiddles w_L^(k_r q) at its
    // strips, and the columns of F_R that the last product's A operand (transposed) needs for
    // its output tiles. The filter's spectrum at its strips is in registers too, refreshed from
    // shared memory when the head changes.
    complex_tile<kt::rt<T, kt::TILE_DIM, HALF>> f1[STRIPS];
    complex_tile<kt::rt_fl<kt::TILE_DIM, Q>> twiddle[STRIPS], spectrum[STRIPS];
    complex_tile<kt::rt<T, Q, Q, kt::col_l>> fq;
    complex_tile<kt::rt<T, R, kt::TILE_DIM, kt::col_l>> g1[OUT_PER_WARP];
    kt::load(fq.re, s.fq[0]);
    kt::load(fq.im, s.fq[1]);
#pragma unroll
    for (int st = 0; st < STRIPS; st++) {
        const int strip = warp * STRIPS + st;
        kt::load(f1[st].re, kt::subtile<kt::TILE_DIM, HALF>(s.fr[0], strip, 0));
        kt::load(f1[st].im, kt::subtile<kt::TILE_DIM, HALF>(s.fr[1], strip, 0));
        kt::for_each_pair(twiddle[st].re, [&](int i, int j, int k, float2& re) {
            const int row = strip * kt::TILE_DIM + i * kt::TILE_DIM + kt::rt_fl<16, Q>::row_in_base(k, 0);
            const int col = j * kt::TILE_DIM + kt::rt_fl<16, Q>::col_in_base(k, 0);
            const float2 w0 = unit_root(row * col, L), w1 = unit_root(row * (col + 1), L);
            re = make_float2(w0.x, w1.x);
            twiddle[st].im.tiles[i][j].data[k] = make_float2(w0.y, w1.y);
        });
    }
#pragma unroll
    for (int t = 0; t < OUT_PER_WARP; t++) {
        const int out_row = (warp * OUT_PER_WARP + t) / (Q / kt::TILE_DIM);  // its 16 rows r of y
        kt::load(g1[t].re, kt::subtile<R, kt::TILE_DIM>(s.fr[0], 0, out_row));
        kt::load(g1[t].im, kt::subtile<R, kt::TILE_DIM>(s.fr[1], 0, out_row));
    }

    // The spectrum slot holds the current head's spectrum until every warp has copied it to
    // registers (after the first barrier of the head's first task), then the next head's.
    int spectrum_head = -1;       // whose spectrum the registers hold
    bool next_pending = false;    // the slot's next-head load is in flight
    int groups_since_next = 0;    // cp.async groups committed after that load
    for (int i = 0, t = tasks.first; t < tasks.last; i++, t++) {
        const int h = t / a.pairs, pair = t - h * a.pairs;
        const bool new_head = h != spectrum_head;
        auto& st = s.stage[i % STAGES];
        // Task t's input (and, at a new head, the slot's load, which may be among the last
        // STAGES - 2 groups when the previous head had few tasks here).
        if (new_head && next_pending && groups_since_next < STAGES - 2) kt::cp_async_wait<0>();
        else kt::cp_async_wait<STAGES - 2>();
        if (pre != nullptr) {
            apply_gate<THREADS, N>(st.x[0], (*pre)[i % STAGES][0], thread);
            apply_gate<THREADS, N>(st.x[1], (*pre)[i % STAGES][1], thread);
        }
        __syncthreads();  // task t's input visible; every warp is done with task t - 1
        if (t + STAGES - 1 < tasks.last) issue_loads(t + STAGES - 1, (i + STAGES - 1) % STAGES);
        kt::cp_async_commit();
        groups_since_next++;
        if (new_head) {
#pragma unroll
            for (int sti = 0; sti < STRIPS; sti++) {
                const int strip = warp * STRIPS + sti;
                kt::for_each_pair(spectrum[sti].re, [&](int ti, int tj, int k, float2& re) {
                    const int row = strip * kt::TILE_DIM + ti * kt::TILE_DIM + kt::rt_fl<16, Q>::row_in_base(k, 0);
                    const int col = tj * kt::TILE_DIM + kt::rt_fl<16, Q>::col_in_base(k, 0);
                    const float4 kv = s.spectrum[(row * Q + col) / 2];
                    re = make_float2(kv.x, kv.z);
                    spectrum[sti].im.tiles[ti][tj].data[k] = make_float2(kv.y, kv.w);
                });
            }
            spectrum_head = h;
            next_pending = false;
        }

        complex_tile<kt::rt<T, HALF, Q, kt::col_l>> x;  // F1's B operand (K = r)
        kt::rt<T, HALF, Q, kt::col_l> x_im_neg;
        kt::load(x.re, st.x[0]);
        kt::load(x.im, st.x[1]);
        negate(x_im_neg, x.im);
#pragma unroll
        for (int sti = 0; sti < STRIPS; sti++) {
            const int strip = warp * STRIPS + sti;
            complex_tile<kt::rt_fl<kt::TILE_DIM, Q>> acc;
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma(acc, f1[sti], x, x_im_neg);  // F1
            cmul(acc, twiddle[sti]);          // T1
            complex_tile<kt::rt<T, kt::TILE_DIM, Q>> y;
            kt::rt<T, kt::TILE_DIM, Q> y_neg;
            kt::copy(y.re, acc.re);
            kt::copy(y.im, acc.im);
            negate(y_neg, y.im);
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma_neg_a(acc, y, y_neg, fq);    // F3: the spectrum, rows k_r, cols k_q
            cmul(acc, spectrum[sti]);         // times the filter's
            kt::copy(y.re, acc.re);
            kt::copy(y.im, acc.im);
            negate(y_neg, y.re);
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma_conj_b(acc, y, y_neg, fq);   // G3
            cmul<true>(acc, twiddle[sti]);    // T1*
            kt::store(kt::subtile<kt::TILE_DIM, Q>(s.u[0], strip, 0), acc.re);
            kt::store(kt::subtile<kt::TILE_DIM, Q>(s.u[1], strip, 0), acc.im);
        }
        __syncthreads();  // every strip of u written; every warp has its spectrum registers
        if (new_head && (h + 1) * a.pairs < tasks.last) {  // the next head's spectrum into the slot
            load_spectrum_async<THREADS, L>(s.spectrum, a, h + 1, thread);
            kt::cp_async_commit();
            next_pending = true;
            groups_since_next = 0;
        }

        // G1: y[r, q] = sum_k_r conj(F_R[r, k_r]) u[k_r, q], this warp's 16x16 tiles of it.
        const T* post0 = nullptr;
        const T* post1 = nullptr;
        if (a.postgate != nullptr) {
            post0 = a.at(a.postgate, a.post_stride_b, a.post_stride_h, 2 * pair, h);
            post1 = a.at(a.postgate, a.post_stride_b, a.post_stride_h, 2 * pair + 1, h);
        }
#pragma unroll
        for (int ot = 0; ot < OUT_PER_WARP; ot++) {
            const int tile = warp * OUT_PER_WARP + ot;
            const int tile_row = tile / (Q / kt::TILE_DIM), tile_col = tile % (Q / kt::TILE_DIM);
            complex_tile<kt::rt<T, R, kt::TILE_DIM, kt::col_l>> uu;
            kt::rt<T, R, kt::TILE_DIM, kt::col_l> uu_neg;
            kt::load(uu.re, kt::subtile<R, kt::TILE_DIM>(s.u[0], 0, tile_col));
            kt::load(uu.im, kt::subtile<R, kt::TILE_DIM>(s.u[1], 0, tile_col));
            negate(uu_neg, uu.re);
            complex_tile<kt::rt_fl<kt::TILE_DIM, kt::TILE_DIM>> acc;
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma_conj_a(acc, g1[ot], uu, uu_neg);
            if (post0 != nullptr)
                apply_postgate(acc, post0, post1, a.seqlen, [&](int row, int col) {
                    return (tile_row * kt::TILE_DIM + row) * Q + tile_col * kt::TILE_DIM + col;
                });
            // Through this stage's input tiles (free since F1) for 16-byte stores.
            kt::store(kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(st.x[0], tile_row, tile_col), acc.re);
            kt::store(kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(st.x[1], tile_row, tile_col), acc.im);
            __syncwarp();
            for (int j = 0; j < 2; j++) {
                T* out = a.at(a.y, a.y_stride_b, a.y_stride_h, 2 * pair + j, h);
                if (out != nullptr)
                    warp_store_sequence<kt::TILE_DIM, kt::TILE_DIM>(out, a.seqlen, st.x[j], tile_row * kt::TILE_DIM,
                                                                   tile_col * kt::TILE_DIM);
            }
        }
    }
    kt::cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------------
// Three factors: L = R x 16 x 16, x[r, p, q] = x[q + 16 p + 256 r].
// ---------------------------------------------------------------------------------------------

// The spectrum-side data of one pair between the phases: R tiles of 16 x 16 16-bit values,
// tile k_r holding [p or k_p][q or k_q]. Swizzled so that each access pattern of the kernel
// hits 8 distinct 16-byte bank groups per 8 rows: 8 consecutive k_r at one (p, 8 columns)
// (F1's stores, G1's ldmatrix) and 8 consecutive p at one (k_r, 8 columns) (the per-k_r steps).
template <typename T, int R>
struct alignas(1024) frequency_tiles {
    static_assert(sizeof(T) == 2);
    T data[R * 256];
    __host__ __device__ static constexpr uint32_t offset(int kr, int p, int q) {
        return uint32_t(kr) * 512 + uint32_t(p ^ (kr & 3)) * 32 +
               (uint32_t((q >> 3) ^ ((p >> 2) & 1) ^ ((kr >> 2) & 1)) << 4) + uint32_t(q & 7) * 2;
    }
    // Shared address of the buffer, computed anew where called (in the task loop): hoisted out
    // of it, the compiler keeps dozens of per-lane addresses live across the loop and spills.
    __device__ uint32_t base() const {
        uint32_t address = kt::shared_address(data);
        asm volatile("" : "+r"(address));
        return address;
    }
};

template <typename T, int R_>
struct ThreeFactor {
    static constexpr int R = R_, P = 16, Q = 16, PQ = P * Q, L = R * PQ, N = L / 2, HALF = R / 2;
    static constexpr int WARPS = 16, THREADS = WARPS * kt::WARP_THREADS;  // warp w owns p = w
    static_assert(P == WARPS && R % WARPS == 0);
    static constexpr int XR = HALF < kt::TILE_DIM ? kt::TILE_DIM : HALF;  // F1's K, padded to 16
    static constexpr int KR_PER_WARP = R / WARPS;
    // The next pair's input lands during the three phases of the current one.
    static constexpr int STAGES = 2;
    using seq_tile = kt::st<T, XR, PQ>;  // rows r, columns (p, q); rows >= R/2 zero
    using buffer = frequency_tiles<T, R>;
    struct Stage {
        seq_tile x[2];  // batch 2i (re), 2i + 1 (im); y staged here after F1
    };
    using PreStages = seq_tile[STAGES][2];  // their pregates: allocated after Shared, only with one
    struct Shared {
        Stage stage[STAGES];
        buffer buf[2];                   // re, im
        float4 spectrum[R * PQ / 2];     // the filter's (two complex per float4), fragment order
        kt::st<T, R, XR> fr[2];          // F_R[:, :R/2] / sqrt(R) (re, im), zero columns >= R/2
        float4 twiddle_frag[R * Q / 2];  // w_L^(k_r q) in the fragment order of R x 16 tiles
        float4 twiddle_rows[R * Q / 2];  // the same, row-major [k_r][q]
        float4 twiddle2[PQ / 2];         // w_256^(k_p q), fragment order of a 16 x 16 tile
        float2 twiddle_p[R * P];         // w_L^(Q k_r p), row-major [k_r][p]
    };
    static constexpr int shared_bytes = kt::shared_bytes_for<Shared>();
    static constexpr int pregate_bytes = kt::shared_bytes_for<PreStages>() - 1024;
};

template <typename T, int R>
__global__ void __launch_bounds__(ThreeFactor<T, R>::THREADS, 1)
    three_factor_kernel(const __grid_constant__ Args<T> a) {
    using C = ThreeFactor<T, R>;
    constexpr int L = C::L, N = C::N, HALF = C::HALF, XR = C::XR, PQ = C::PQ, Q = C::Q;
    constexpr int THREADS = C::THREADS, WARPS = C::WARPS;
    using sub16 = kt::rt<T, kt::TILE_DIM, kt::TILE_DIM>;
    using sub16_b = kt::rt<T, kt::TILE_DIM, kt::TILE_DIM, kt::col_l>;
    using acc16 = kt::rt_fl<kt::TILE_DIM, kt::TILE_DIM>;
    extern __shared__ char smem[];
    kt::shared_allocator alloc(smem);
    auto& s = alloc.allocate<typename C::Shared>();
    typename C::PreStages* pre = a.pregate != nullptr ? &alloc.allocate<typename C::PreStages>() : nullptr;
    const int warp = kt::warp_id(), lane = kt::lane_id(), thread = threadIdx.x;
    const Tasks tasks = tasks_of(a);
    if (tasks.first >= tasks.last) return;

    auto issue_loads = [&](int t, int stage) {
        const int h = t / a.pairs, pair = t - h * a.pairs;
        auto& st = s.stage[stage];
        for (int j = 0; j < 2; j++) {
            load_sequence_async<THREADS, N>(st.x[j], a.at(a.u, a.u_stride_b, a.u_stride_h, 2 * pair + j, h), a.seqlen,
                                            a.u, thread);
            if (pre != nullptr)
                load_sequence_async<THREADS, N>((*pre)[stage][j], a.at(a.pregate, a.pre_stride_b, a.pre_stride_h,
                                                                      2 * pair + j, h),
                                                a.seqlen, a.u, thread);
        }
    };
    // The first head's spectrum, with the first task's input.
    load_spectrum_async<THREADS, L>(s.spectrum, a, tasks.first / a.pairs, thread);
    issue_loads(tasks.first, 0);
    kt::cp_async_commit();

    // R = 16: rows R/2 .. 15 of the input tiles are F1's zero padding (K = 8 padded to 16);
    // no load touches them, and the output staging writes zeros there.
    if constexpr (XR > HALF) {
        constexpr int chunks = (XR - HALF) * PQ * int(sizeof(T)) / 16;
        for (int c = thread; c < chunks * 2 * C::STAGES; c += THREADS) {
            auto& tile = s.stage[c / (2 * chunks)].x[(c / chunks) % 2];
            const int e = (c % chunks) * 8;
            *reinterpret_cast<uint4*>(tile.ptr(HALF + e / PQ, e % PQ)) = make_uint4(0, 0, 0, 0);
        }
    }
    // Twiddles w_L^(k_r q): in the fragment order of F1's accumulator (R x 16, row layout:
    // float4 (i * 4 + k) * 32 + lane holds its register k of base tile i) and row-major.
    for (int e = thread; e < R * Q / 2; e += THREADS) {
        const int l = e % 32, k = (e / 32) % 4, i = e / 128;
        const int row = kt::TILE_DIM * i + 8 * (k % 2) + l / 4, col = 8 * (k / 2) + 2 * (l % 4);
        const float2 w0 = unit_root(row * col, L), w1 = unit_root(row * (col + 1), L);
        s.twiddle_frag[e] = make_float4(w0.x, w0.y, w1.x, w1.y);
        const int row2 = e / (Q / 2), col2 = (e % (Q / 2)) * 2;
        const float2 v0 = unit_root(row2 * col2, L), v1 = unit_root(row2 * (col2 + 1), L);
        s.twiddle_rows[e] = make_float4(v0.x, v0.y, v1.x, v1.y);
        if (e < PQ / 2) {
            const float2 u0 = unit_root(row * col, PQ), u1 = unit_root(row * (col + 1), PQ);
            s.twiddle2[e] = make_float4(u0.x, u0.y, u1.x, u1.y);
        }
    }

    // F1's A operand (and, transposed and conjugated, G1's), and the p part of T1.
    const float r_scale = rsqrtf(float(R));
    for (int e = thread; e < R * XR; e += THREADS) {
        const int row = e / XR, col = e % XR;
        const float2 w = unit_root(row * col, R);
        *s.fr[0].ptr(row, col) = kt::convert<T>(col < HALF ? w.x * r_scale : 0.f);
        *s.fr[1].ptr(row, col) = kt::convert<T>(col < HALF ? w.y * r_scale : 0.f);
    }
    for (int e = thread; e < R * C::P; e += THREADS) s.twiddle_p[e] = unit_root(Q * (e / C::P) * (e % C::P), L);
    const int pw = warp;  // this warp's p in phases 1 and 3
    // F_16 / 4 as an A operand (F2, G2) and, being symmetric, the same registers renamed as a
    // B operand (F3, G3).
    complex_tile<sub16> f16;
    fill_complex(f16, [&](int row, int col) {
        const float2 w = unit_root(row * col, 16);
        return make_float2(w.x * 0.25f, w.y * 0.25f);
    });
    complex_tile<sub16_b> f16b;
    kt::transpose_sep(f16b.re, f16.re);
    kt::transpose_sep(f16b.im, f16.im);
    // The spectrum slot is read by phase 2 of every task of a head; the next head's spectrum
    // loads into it after the last one's phase 2 and is waited for before the next phase 2.
    bool spectrum_pending = false;
    for (int i = 0, t = tasks.first; t < tasks.last; i++, t++) {
        const int h = t / a.pairs, pair = t - h * a.pairs;
        auto& st = s.stage[i % C::STAGES];
        if (spectrum_pending) kt::cp_async_wait<1>();  // the input; the spectrum may still land
        else kt::cp_async_wait<0>();
        if (pre != nullptr) {
            apply_gate<THREADS, N>(st.x[0], (*pre)[i % C::STAGES][0], thread);
            apply_gate<THREADS, N>(st.x[1], (*pre)[i % C::STAGES][1], thread);
        }
        __syncthreads();  // task t's input visible; every warp is done with task t - 1
        if (t + 1 < tasks.last) issue_loads(t + 1, (i + 1) % C::STAGES);
        kt::cp_async_commit();

        // Phase 1 (warp = p): F1 and T1 for columns (p, *) of every k_r.
        {
            complex_tile<kt::rt<T, XR, kt::TILE_DIM, kt::col_l>> x;
            kt::rt<T, XR, kt::TILE_DIM, kt::col_l> x_neg;
            kt::load(x.re, kt::subtile<XR, kt::TILE_DIM>(st.x[0], 0, pw));
            kt::load(x.im, kt::subtile<XR, kt::TILE_DIM>(st.x[1], 0, pw));
            negate(x_neg, x.im);
            complex_tile<kt::rt<T, R, XR>> a1;
            kt::load(a1.re, s.fr[0]);
            kt::load(a1.im, s.fr[1]);
            complex_tile<kt::rt_fl<R, kt::TILE_DIM>> acc;
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma(acc, a1, x, x_neg);
            // T1 = w_L^(k_r q) w_L^(16 k_r p): the first from the fragment-order table, the second
            // one value per row (this warp's p).
            kt::for_each_pair(acc.re, [&](int ti, int, int k, float2& re) {
                float2& im = acc.im.tiles[ti][0].data[k];
                const float2 c = s.twiddle_p[(ti * kt::TILE_DIM + 8 * (k % 2) + lane / 4) * C::P + pw];
                const float4 v = s.twiddle_frag[(ti * 4 + k) * kt::WARP_THREADS + lane];
                const float2 w0 = make_float2(v.x * c.x - v.y * c.y, v.x * c.y + v.y * c.x);
                const float2 w1 = make_float2(v.z * c.x - v.w * c.y, v.z * c.y + v.w * c.x);
                const float2 r0 = re, i0 = im;
                re = make_float2(fmaf(r0.x, w0.x, -i0.x * w0.y), fmaf(r0.y, w1.x, -i0.y * w1.y));
                im = make_float2(fmaf(r0.x, w0.y, i0.x * w0.x), fmaf(r0.y, w1.y, i0.y * w1.x));
            });
            const uint32_t re = s.buf[0].base(), im = s.buf[1].base();
            store_to<T>(acc.re, [&](int row, int col) { return re + C::buffer::offset(row, pw, col); });
            store_to<T>(acc.im, [&](int row, int col) { return im + C::buffer::offset(row, pw, col); });
        }
        if (spectrum_pending) {  // groups: ..., the spectrum, task t + 1's input
            kt::cp_async_wait<1>();
            spectrum_pending = false;
        }
        __syncthreads();

        // Phase 2 (warp owns k_r = warp + 16 j): the 16 x 16 FFTs, the filter, and back.
#pragma unroll
        for (int j = 0; j < C::KR_PER_WARP; j++) {
            const int kr = warp + WARPS * j;
            const uint32_t re = s.buf[0].base(), im = s.buf[1].base();
            auto at_kr = [&](uint32_t b) { return [&, b](int row, int col) { return b + C::buffer::offset(kr, row, col); }; };
            complex_tile<sub16_b> yb;
            sub16_b yb_neg;
            load_from(yb.re, at_kr(re));
            load_from(yb.im, at_kr(im));
            negate(yb_neg, yb.im);
            complex_tile<acc16> acc;
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma(acc, f16, yb, yb_neg);  // F2: rows k_p, cols q
            cmul_fragments(acc, s.twiddle2);  // T2
            complex_tile<sub16> z;
            sub16 z_neg;
            kt::copy(z.re, acc.re);
            kt::copy(z.im, acc.im);
            negate(z_neg, z.im);
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma_neg_a(acc, z, z_neg, f16b);  // F3: rows k_p, cols k_q
            cmul_fragments(acc, s.spectrum + kr * (PQ / 2));  // times the filter's spectrum
            kt::copy(z.re, acc.re);
            kt::copy(z.im, acc.im);
            negate(z_neg, z.re);
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma_conj_b(acc, z, z_neg, f16b);  // G3: rows k_p, cols q
            cmul_fragments<true>(acc, s.twiddle2);  // T2*
            kt::copy(z.re, acc.re);
            kt::copy(z.im, acc.im);
            complex_tile<sub16_b> vb;          // G2 sums over k_p: the rows, so a B operand
            sub16_b vb_neg;
            kt::swap_layout(vb.re, z.re);
            kt::swap_layout(vb.im, z.im);
            negate(vb_neg, vb.re);
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma_conj_a(acc, f16, vb, vb_neg);  // G2: rows p, cols q
            kt::for_each_pair(acc.re, [&](int, int, int k, float2& re) {  // T1*: conj w_L^(k_r (q + 16 p))
                float2& im = acc.im.tiles[0][0].data[k];
                const int row = acc16::row_in_base(k, 0), col = acc16::col_in_base(k, 0);
                const float2 c = s.twiddle_p[kr * C::P + row];
                const float4 v = s.twiddle_rows[kr * (Q / 2) + col / 2];
                const float2 w0 = make_float2(v.x * c.x - v.y * c.y, v.x * c.y + v.y * c.x);
                const float2 w1 = make_float2(v.z * c.x - v.w * c.y, v.z * c.y + v.w * c.x);
                const float2 r0 = re, i0 = im;
                re = make_float2(fmaf(r0.x, w0.x, i0.x * w0.y), fmaf(r0.y, w1.x, i0.y * w1.y));
                im = make_float2(fmaf(i0.x, w0.x, -r0.x * w0.y), fmaf(i0.y, w1.x, -r0.y * w1.y));
            });
            // Tile k_r is overwritten in place: each lane stores into rows that other lanes' ldmatrix
            // read above, so those reads must be done first (a write-after-read within the warp).
            __syncwarp();
            store_to<T>(acc.re, at_kr(re));
            store_to<T>(acc.im, at_kr(im));
        }
        __syncthreads();
        if (t + 1 < tasks.last && (t + 1) % a.pairs == 0) {  // the next head's spectrum
            load_spectrum_async<THREADS, L>(s.spectrum, a, h + 1, thread);
            kt::cp_async_commit();
            spectrum_pending = true;
        }

        // Phase 3 (warp = p): G1, y[r, p, q] = sum_k_r conj(F_R[r, k_r]) u[k_r, p, q] / sqrt(R) for
        // r < R/2.
        {
            complex_tile<kt::rt<T, R, kt::TILE_DIM, kt::col_l>> ub;
            kt::rt<T, R, kt::TILE_DIM, kt::col_l> ub_neg;
            const uint32_t re = s.buf[0].base(), im = s.buf[1].base();
            load_from(ub.re, [&](int row, int col) { return re + C::buffer::offset(row, pw, col); });
            load_from(ub.im, [&](int row, int col) { return im + C::buffer::offset(row, pw, col); });
            negate(ub_neg, ub.re);
            complex_tile<kt::rt<T, R, XR, kt::col_l>> g1;  // K = k_r, M = r: rows r >= R/2 of y are 0
            kt::load(g1.re, s.fr[0]);
            kt::load(g1.im, s.fr[1]);
            complex_tile<kt::rt_fl<XR, kt::TILE_DIM>> acc;
            kt::zero(acc.re);
            kt::zero(acc.im);
            cmma_conj_a(acc, g1, ub, ub_neg);
            if (a.postgate != nullptr)
                apply_postgate(acc, a.at(a.postgate, a.post_stride_b, a.post_stride_h, 2 * pair, h),
                               a.at(a.postgate, a.post_stride_b, a.post_stride_h, 2 * pair + 1, h), a.seqlen,
                               [&](int row, int col) { return row * PQ + Q * pw + col; });
            // Staged in this stage's input tiles (free since F1) for 16-byte stores; rows >= R/2
            // are exact zeros (g1's rows there are), which R = 16 needs in its padding rows.
            kt::store(kt::subtile<XR, kt::TILE_DIM>(st.x[0], 0, pw), acc.re);
            kt::store(kt::subtile<XR, kt::TILE_DIM>(st.x[1], 0, pw), acc.im);
            __syncwarp();
            for (int j = 0; j < 2; j++) {
                T* out = a.at(a.y, a.y_stride_b, a.y_stride_h, 2 * pair + j, h);
                if (out != nullptr) warp_store_sequence<HALF, kt::TILE_DIM>(out, a.seqlen, st.x[j], 0, Q * pw);
            }
        }
    }
    kt::cp_async_wait<0>();
}

// ---------------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------------

// Dynamic shared memory one block may have on sm_80 and sm_90 (A100: 163 KB; Hopper: 227 KB).
// The three-factor kernel for L = 8192 needs more than an A100 has: there the launch fails and
// the op reports it (sm_86/sm_89 have less still).
constexpr int kMaxSharedBytes = 227 * 1024;

template <typename T>
Args<T> make_args(const ForwardParams& p) {
    Args<T> a{};
    a.u = static_cast<const T*>(p.u);
    a.u_stride_b = p.u_stride_b, a.u_stride_h = p.u_stride_h;
    a.pregate = static_cast<const T*>(p.pregate);
    a.pre_stride_b = p.pre_stride_b, a.pre_stride_h = p.pre_stride_h;
    a.postgate = static_cast<const T*>(p.postgate);
    a.post_stride_b = p.post_stride_b, a.post_stride_h = p.post_stride_h;
    a.y = static_cast<T*>(p.y);
    a.y_stride_b = p.y_stride_b, a.y_stride_h = p.y_stride_h;
    a.spectrum = p.spectrum;
    a.batch = p.batch, a.heads = p.heads, a.seqlen = p.seqlen;
    a.pairs = (p.batch + 1) / 2;
    return a;
}

template <typename T, typename Kernel>
cudaError_t launch(Kernel kernel, int threads, int smem, const ForwardParams& p, cudaStream_t stream) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) return e;
    int blocks_per_sm = 0;
    if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, smem)) return e;
    Args<T> a = make_args<T>(p);
    const int64_t tasks = int64_t(p.heads) * a.pairs;
    if (tasks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    a.tasks = int(tasks);
    // One wave of persistent blocks, each running an equal share of the tasks in order: a
    // block's setup (DFT matrices and twiddles from sincospif, the first spectrum) costs about
    // as much as a few tasks, so it is paid once per block.
    const int64_t resident = int64_t(blocks_per_sm > 0 ? blocks_per_sm : 1) * (p.multiprocessors > 0 ? p.multiprocessors : 1);
    const int64_t blocks_wanted = tasks < resident ? tasks : resident;
    a.tasks_per_block = int((tasks + blocks_wanted - 1) / blocks_wanted);
    const int blocks = int((tasks + a.tasks_per_block - 1) / a.tasks_per_block);
    kernel<<<unsigned(blocks), threads, smem, stream>>>(a);
    return cudaGetLastError();
}

template <typename T, int R, int Q, int WARPS>
cudaError_t launch_two_factor(const ForwardParams& p, cudaStream_t stream) {
    using C = TwoFactor<T, R, Q, WARPS>;
    static_assert(decomposition(C::L).r == R && decomposition(C::L).p == 1 && decomposition(C::L).q == Q);
    static_assert(C::shared_bytes + C::pregate_bytes <= kMaxSharedBytes);
    const int smem = C::shared_bytes + (p.pregate != nullptr ? C::pregate_bytes : 0);
    return launch<T>(two_factor_kernel<T, R, Q, WARPS>, C::THREADS, smem, p, stream);
}

template <typename T, int R>
cudaError_t launch_three_factor(const ForwardParams& p, cudaStream_t stream) {
    using C = ThreeFactor<T, R>;
    static_assert(decomposition(C::L).r == R && decomposition(C::L).p == C::P && decomposition(C::L).q == C::Q);
    static_assert(C::shared_bytes + C::pregate_bytes <= kMaxSharedBytes);
    const int smem = C::shared_bytes + (p.pregate != nullptr ? C::pregate_bytes : 0);
    return launch<T>(three_factor_kernel<T, R>, C::THREADS, smem, p, stream);
}

// f(config) for fft_size's kernel configuration (a TwoFactor or ThreeFactor type).
template <typename T, typename F>
auto with_config(int fft_size, F&& f) {
    switch (fft_size) {
        case 512: return f(TwoFactor<T, 32, 16, 1>{});
        case 1024: return f(TwoFactor<T, 32, 32, 2>{});
        case 2048: return f(TwoFactor<T, 64, 32, 4>{});
        case 4096: return f(ThreeFactor<T, 16>{});
        default: return f(ThreeFactor<T, 32>{});
    }
}

template <typename T>
cudaError_t run(const ForwardParams& p, cudaStream_t stream) {
    switch (p.fft_size) {
        case 512: return launch_two_factor<T, 32, 16, 1>(p, stream);
        case 1024: return launch_two_factor<T, 32, 32, 2>(p, stream);
        case 2048: return launch_two_factor<T, 64, 32, 4>(p, stream);
        case 4096: return launch_three_factor<T, 16>(p, stream);
        case 8192: return launch_three_factor<T, 32>(p, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

int fftconv_fwd_sm80_shared_bytes(int fft_size, bool pregate) {
    if (decomposition(fft_size).fft_size == 0) return 0;
    // The same for both element types (16-bit either way).
    return with_config<kt::bf16>(fft_size, [&](auto config) {
        using C = decltype(config);
        return C::shared_bytes + (pregate ? C::pregate_bytes : 0);
    });
}

cudaError_t fftconv_fwd_sm80(const ForwardParams& params, cudaStream_t stream) {
    if (params.batch < 1 || params.heads < 1 || params.seqlen < 1 || params.seqlen % 8 != 0 ||
        params.seqlen > params.fft_size / 2)
        return cudaErrorInvalidValue;
    return params.dtype == ElementType::bf16 ? run<kt::bf16>(params, stream) : run<kt::half>(params, stream);
}

}  // namespace tk::fftconv
