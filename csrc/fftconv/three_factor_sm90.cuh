// Three factors on Hopper: the transform of three_factor.cuh (L = R x 16 x 16, R = 16 or 32,
// x[r, p, q] = x[q + 16 p + 256 r], frequency k = k_r + R k_p + 16 R k_q) with every product a
// warpgroup's wgmma. A product contracts one index of the pair's R x 16 x 16 array; the other
// two are its M rows, 64 per warpgroup (16 per warp). Where the next product contracts across
// warps, a step stores its result with stmatrix (plain or transposed) in the layout wgmma reads
// next; where it contracts a warp's own rows, the 16 x 16 result is transposed in registers and
// becomes the next product's A operand.
//
//   phase 1, warpgroup g (warp w: p = 4 v + w for its views v = g, g + WARPGROUPS, ... < 4):
//     F1  Y[(p, q), k_r] = sum_r x[r, (p, q)] F_R[k_r, r]      (r < R/2)
//     T1  Y *= w_L^(k_r (q + 16 p))                     -> y[p][(k_r, q)]   (shared)
//   phase 2, warpgroup g (warp w: k_r = 4 (g + WARPGROUPS j) + w for each of its jobs j):
//     F2  Z[(k_r, q), k_p] = sum_p y[p][(k_r, q)] F_16[k_p, p]
//     T2  Z *= w_256^(k_p q), transposed in registers
//     F3  W[(k_r, k_p), k_q] = sum_q Z^T[k_p, q] F_16[k_q, q]   = fft(x)[k]
//         W *= K (the filter's spectrum)
//     G3  V[(k_r, k_p), q] = sum_k_q W[k_p, k_q] conj(F_16[k_q, q])
//     T2* V *= conj(w_256^(k_p q)), transposed in registers
//     G2  U[(k_r, q), p] = sum_k_p V^T[q, k_p] conj(F_16[p, k_p])
//     T1* U *= conj(w_L^(k_r (q + 16 p)))                -> u[k_r][(p, q)]   (shared)
//   phase 3, warpgroup g (warp w: p = 4 v + w for its views v, as in phase 1):
//     G1  out[(p, q), r] = sum_k_r u[k_r][(p, q)] conj(F_R[r, k_r])   (r < R/2)
//
// Phases 1 and 3 need every p (resp. k_r) of the pair: block barriers around phase 2, which
// needs none. The DFT matrices carry the scales, and each intermediate is rounded to 16 bits
// where it becomes an operand, as in three_factor.cuh (the same roundings; only the order of
// the fp32 accumulation inside a product may differ). The spectrum's order, the task loop and
// the input ring are three_factor_forward's.
#pragma once
#include "fftconv/three_factor.cuh"
#include "kittens/hopper/hopper.cuh"

namespace tk::fftconv {
namespace {

// WARPGROUPS_ = 4: one block of 16 warps per SM; 2: two blocks of 8 (their phases and barriers
// interleave), where two fit the SM's shared memory.
template <typename T, int R_, int WARPGROUPS_ = 4>
struct ThreeFactorWgmma {
    using dtype = T;
    static constexpr bool THREE_FACTORS = true;
    static constexpr int R = R_, P = 16, Q = 16, PQ = P * Q, L = R * PQ, N = L / 2, HALF = R / 2;
    static constexpr int XR = HALF < kt::TILE_DIM ? kt::TILE_DIM : HALF;
    static constexpr int WARPGROUPS = WARPGROUPS_, WARPS = 4 * WARPGROUPS, THREADS = WARPS * kt::WARP_THREADS;
    static_assert(WARPGROUPS == 2 || WARPGROUPS == 4);
    static constexpr int BLOCKS_PER_SM = 4 / WARPGROUPS;
    static constexpr int VIEWS = 4;  // phases 1 and 3: 64 columns (p, q) = 4 values of p each
    static constexpr int TWIDDLE_ROW = 18;
    // Phase 2 takes 4 k_r (one per warp of a warpgroup, 64 rows) per job.
    static constexpr int KR_GROUPS = R / 4;
    // R = 64 would need more than 320 KiB of shared memory in this layout.
    static_assert(R == 16 || R == 32, "ThreeFactorWgmma: R = 16 or 32");
    static constexpr int STAGES = 2;
    using seq_tile = kt::st<T, XR, PQ>;           // rows r, columns (p, q); rows >= R/2 zero
    using p_rows = kt::st<T, P, R * Q>;           // y: rows p (then k_p), columns (k_r, q)
    using kr_rows = kt::st<T, R, PQ>;             // u: rows k_r, columns (p, q)
    using acc16 = kt::rt_fl<kt::TILE_DIM, kt::TILE_DIM>;
    using sub16 = kt::rt<T, kt::TILE_DIM, kt::TILE_DIM>;

    struct Tables {                    // once per block
        kt::st<T, R, XR> fr[3];        // F_R[k_r, r] / sqrt(R) for r < R/2 (else 0): re, im, -im
        kt::st<T, XR, R> fr_t[3];      // its transpose, F_R[r, k_r] / sqrt(R) for r < R/2
        kt::st<T, 16, 16> f16[3];      // F_16 / 4 (symmetric): re, im, -im
        // Rows of TWIDDLE_ROW (18) float2: T1's lanes read 4 k_r (rows) at 8 q or one p, and
        // with this stride each half-warp's 64-bit reads fall in distinct banks (16 would put
        // the 4 rows in one bank).
        float2 twiddle_kp[R * TWIDDLE_ROW];  // w_L^(16 k_r p), [k_r][p]
        float2 twiddle_kq[R * TWIDDLE_ROW];  // w_L^(k_r q), [k_r][q]
        float4 twiddle2[PQ / 2];         // w_256^(k_p q), fragment order of a 16 x 16 tile
    };
    struct Shared {
        seq_tile x[STAGES][2];          // the pair's input (re, im), then its output's staging
        p_rows y[2];
        kr_rows u[2];
        float4 spectrum[L / 2];         // the filter's, in phase 2's fragment order (three_factor.cuh)
        Tables tab;
    };
    using PreStages = seq_tile[STAGES][2];
    static constexpr int shared_bytes = kt::shared_bytes_for<Shared>();
    static constexpr int pregate_bytes = kt::added_shared_bytes_for<PreStages>();
};

template <typename C>
__device__ __forceinline__ void init_wgmma_tables(typename C::Tables& tab, int thread) {
    using T = typename C::dtype;
    constexpr int R = C::R, Q = C::Q, L = C::L, XR = C::XR, HALF = C::HALF, PQ = C::PQ;
    for (int e = thread; e < R * Q; e += C::THREADS) {
        const int kr = e / Q, j = e % Q;  // P == Q
        tab.twiddle_kq[kr * C::TWIDDLE_ROW + j] = unit_root(kr * j, L);
        tab.twiddle_kp[kr * C::TWIDDLE_ROW + j] = unit_root(Q * kr * j, L);
    }
    for (int e = thread; e < PQ / 2; e += C::THREADS) tab.twiddle2[e] = twiddle2_value(e);
    const float r_scale = rsqrtf(float(R));
    for (int e = thread; e < R * XR; e += C::THREADS) {
        const int kr = e / XR, r = e % XR;
        const float2 w = unit_root(kr * r, R);
        const float re = r < HALF ? w.x * r_scale : 0.f, im = r < HALF ? w.y * r_scale : 0.f;
        *tab.fr[0].ptr(kr, r) = kt::convert<T>(re);
        *tab.fr[1].ptr(kr, r) = kt::convert<T>(im);
        *tab.fr[2].ptr(kr, r) = kt::convert<T>(-im);
        *tab.fr_t[0].ptr(r, kr) = kt::convert<T>(re);
        *tab.fr_t[1].ptr(r, kr) = kt::convert<T>(im);
        *tab.fr_t[2].ptr(r, kr) = kt::convert<T>(-im);
    }
    for (int e = thread; e < 256; e += C::THREADS) {
        const int row = e / 16, col = e % 16;
        const float2 w = unit_root(row * col, 16);
        *tab.f16[0].ptr(row, col) = kt::convert<T>(w.x * 0.25f);
        *tab.f16[1].ptr(row, col) = kt::convert<T>(w.y * 0.25f);
        *tab.f16[2].ptr(row, col) = kt::convert<T>(-w.y * 0.25f);
    }
}

// d = a * b (complex; b a K-major shared operand given as re, im, -im) as one committed wgmma
// group, still in flight on return. MODE: 0 d = a b, 1 d = a conj(b). a is a transposed shared
// operand (K x 64) or this warp's register tiles.
template <int MODE, typename D, typename A, typename ST>
__device__ __forceinline__ void issue_complex(complex_tile<D>& d, const A& a_re, const A& a_im, const ST (&b)[3]) {
    auto product = [](D& acc, const A& a, const ST& bt, bool accumulate) {
        if constexpr (kt::register_tile<A>) kt::wgmma::mma_ABt(acc, a, bt, accumulate);
        else kt::wgmma::mma_AtBt(acc, a, bt, accumulate);
    };
    kt::wgmma::fence();
    if constexpr (MODE == 0) {  // (a_re + i a_im)(b_re + i b_im)
        product(d.re, a_re, b[0], false);
        product(d.re, a_im, b[2], true);
        product(d.im, a_re, b[1], false);
        product(d.im, a_im, b[0], true);
    } else {                    // (a_re + i a_im)(b_re - i b_im)
        product(d.re, a_re, b[0], false);
        product(d.re, a_im, b[1], true);
        product(d.im, a_im, b[0], false);
        product(d.im, a_re, b[2], true);
    }
    kt::wgmma::commit();
}

// After the wgmma group that wrote d (and read the register operand a) has completed: d may be
// read, a overwritten.
template <typename D>
__device__ __forceinline__ void landed(complex_tile<D>& d) {
    kt::wgmma::fence_operand(d.re);
    kt::wgmma::fence_operand(d.im);
}
template <typename D, typename A>
__device__ __forceinline__ void landed(complex_tile<D>& d, complex_tile<A>& a) {
    landed(d);
    landed(a);
}

// dst = src^T rounded to 16 bits: a product's result as the A operand of one that contracts
// its rows.
template <typename T>
__device__ __forceinline__ void transposed_operand(complex_tile<kt::rt<T, 16, 16>>& dst,
                                                   const complex_tile<kt::rt_fl<16, 16>>& src) {
    kt::rt<T, 16, 16> t;
    kt::copy(t, src.re);
    kt::transpose(dst.re, t);
    kt::copy(t, src.im);
    kt::transpose(dst.im, t);
}

// Phase 1 for view v (columns 64 v ..): F1 and T1 of the pair's input x (re, im) into y; this
// warp's rows are p = 4 v + warp in group.
template <typename C>
__device__ __forceinline__ void wgmma_phase1(typename C::Tables& tab, typename C::seq_tile (&x)[2],
                                             typename C::p_rows (&y)[2], int v, int p) {
    using T = typename C::dtype;
    using acc = kt::rt_fl<kt::TILE_DIM, C::R>;
    constexpr int Q = C::Q;
    complex_tile<acc> d;
    issue_complex<0>(d, kt::subtile<C::XR, 64>(x[0], 0, v), kt::subtile<C::XR, 64>(x[1], 0, v), tab.fr);
    kt::wgmma::wait<0>();
    landed(d);
    kt::for_each_pair(d.re, [&](int, int j, int k, float2& re) {  // rows q, cols k_r
        const int q = acc::row_in_base(k, 0), kr = j * kt::TILE_DIM + acc::col_in_base(k, 0);
        // w_L^(k_r q) w_L^(16 k_r p) for k_r and k_r + 1
        constexpr int ROW = C::TWIDDLE_ROW;
        const float2 w0 = complex_product(tab.twiddle_kq[kr * ROW + q], tab.twiddle_kp[kr * ROW + p]);
        const float2 w1 = complex_product(tab.twiddle_kq[(kr + 1) * ROW + q], tab.twiddle_kp[(kr + 1) * ROW + p]);
        cmul_pair<false>(re, d.im.tiles[0][j].data[k], w0, w1);
    });
    for (int j = 0; j < 2; j++)
        store_runs<true, T>(j ? d.im : d.re, [&](int q, int kr) { return y[j].address(p, kr * Q + q); });
}

// Phase 2 for JOBS of warpgroup `group`'s jobs, from job `first`: job j takes k_r = 4 (group +
// WARPGROUPS j) + warp in group, a chain of products with its operands in registers (F3 and G2
// take their input transposed in registers, F2 and G3 read y and the DFT tables from shared
// memory). Two jobs' chains interleave: one's products run while the other's twiddles do.
template <typename C, int JOBS>
__device__ __forceinline__ void wgmma_phase2_jobs(typename C::Tables& tab, typename C::p_rows (&y)[2],
                                                  typename C::kr_rows (&u)[2], const float4* spectrum, int group,
                                                  int first) {
    using T = typename C::dtype;
    using acc16 = typename C::acc16;
    constexpr int Q = C::Q, PQ = C::PQ;
    static_assert(JOBS == 1 || JOBS == 2);
    const int in_group = kt::warp_id() % 4;
    group += C::WARPGROUPS * first;
    complex_tile<acc16> d[JOBS];
    complex_tile<typename C::sub16> a[JOBS];
    // Groups in flight: at most one per job, issued in job order, so the older one is job j's.
    auto wait_older = [] {
        if constexpr (JOBS == 2) kt::wgmma::wait<1>();
        else kt::wgmma::wait<0>();
    };
#pragma unroll
    for (int j = 0; j < JOBS; j++) {  // F2: rows q, cols k_p
        const int G = group + C::WARPGROUPS * j;
        issue_complex<0>(d[j], kt::subtile<16, 64>(y[0], 0, G), kt::subtile<16, 64>(y[1], 0, G), tab.f16);
    }
#pragma unroll
    for (int j = 0; j < JOBS; j++) {
        wait_older();
        landed(d[j]);
        cmul_fragments(d[j], tab.twiddle2);  // T2
        transposed_operand(a[j], d[j]);      // rows k_p, cols q
        issue_complex<0>(d[j], a[j].re, a[j].im, tab.f16);  // F3: rows k_p, cols k_q
    }
#pragma unroll
    for (int j = 0; j < JOBS; j++) {
        wait_older();
        landed(d[j], a[j]);
        const int kr = 4 * (group + C::WARPGROUPS * j) + in_group;
        cmul_spectrum_tile(d[j], spectrum + kr * (PQ / 2));  // times the filter's spectrum
        kt::copy(a[j].re, d[j].re);
        kt::copy(a[j].im, d[j].im);
        issue_complex<1>(d[j], a[j].re, a[j].im, tab.f16);  // G3: rows k_p, cols q
    }
#pragma unroll
    for (int j = 0; j < JOBS; j++) {
        wait_older();
        landed(d[j], a[j]);
        cmul_fragments<true>(d[j], tab.twiddle2);  // T2*
        transposed_operand(a[j], d[j]);            // rows q, cols k_p
        issue_complex<1>(d[j], a[j].re, a[j].im, tab.f16);  // G2: rows q, cols p
    }
#pragma unroll
    for (int j = 0; j < JOBS; j++) {
        if (j + 1 < JOBS) wait_older();
        else kt::wgmma::wait<0>();
        landed(d[j], a[j]);
        const int kr = 4 * (group + C::WARPGROUPS * j) + in_group;
        kt::for_each_pair(d[j].re, [&](int, int, int k, float2& re) {  // T1*: conj w_L^(k_r (q + 16 p))
            const int q = acc16::row_in_base(k, 0), p = acc16::col_in_base(k, 0);
            const float2 w = tab.twiddle_kq[kr * C::TWIDDLE_ROW + q];
            const float4 c = *reinterpret_cast<const float4*>(&tab.twiddle_kp[kr * C::TWIDDLE_ROW + p]);  // p even
            cmul_pair<true>(re, d[j].im.tiles[0][0].data[k], complex_product(w, make_float2(c.x, c.y)), complex_product(w, make_float2(c.z, c.w)));
        });
        for (int c = 0; c < 2; c++)
            store_runs<true, T>(c ? d[j].im : d[j].re, [&](int q, int p) { return u[c].address(kr, p * Q + q); });
    }
}

// Phase 2 for warpgroup `group`: its jobs two at a time (16 + 8 live registers per job).
template <typename C>
__device__ __forceinline__ void wgmma_phase2(typename C::Tables& tab, typename C::p_rows (&y)[2],
                                             typename C::kr_rows (&u)[2], const float4* spectrum, int group) {
    constexpr int JOBS = C::KR_GROUPS / C::WARPGROUPS;
    if constexpr (JOBS == 1) {
        wgmma_phase2_jobs<C, 1>(tab, y, u, spectrum, group, 0);
    } else {
#pragma unroll 1
        for (int first = 0; first < JOBS; first += 2) wgmma_phase2_jobs<C, 2>(tab, y, u, spectrum, group, first);
    }
}

template <typename T, int R, int WARPGROUPS>
__global__ void __launch_bounds__(ThreeFactorWgmma<T, R, WARPGROUPS>::THREADS,
                                  ThreeFactorWgmma<T, R, WARPGROUPS>::BLOCKS_PER_SM)
    three_factor_wgmma_forward(const __grid_constant__ Args<T> a) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // Compiled for a GPU without sm_90a features: no body (the host launches it only on sm_90).
#else
    using C = ThreeFactorWgmma<T, R, WARPGROUPS>;
    static_assert(spectrum_order_is_a_permutation<C>() && upper_half_is_registers_2_and_3<C>());
    constexpr int N = C::N, HALF = C::HALF, Q = C::Q, PQ = C::PQ, THREADS = C::THREADS;
    extern __shared__ char smem[];
    shared_carver carve(smem);
    auto& s = carve.allocate<typename C::Shared>();
    typename C::PreStages* pre = a.pregate != nullptr ? &carve.allocate<typename C::PreStages>() : nullptr;
    const int warp = kt::warp_id(), thread = threadIdx.x, group = warp / 4;
    const Tasks tasks = tasks_of(a);
    if (tasks.first >= tasks.last) return;

    auto issue_loads = [&](task_position task, int stage) {
        load_task_inputs_async<THREADS, N>(s.x[stage], pre != nullptr ? (*pre)[stage] : nullptr, a, task, thread);
    };
    task_position task(tasks.first, a.pairs);
    issue_loads(task, 0);
    kt::cp_async_commit();
    spectrum_slot<C, T> spectrum(s.spectrum, a, task.h, thread);
    for (int i = 0; i < C::STAGES; i++) {
        zero_padding_rows<C>(s.x[i][0], thread);
        zero_padding_rows<C>(s.x[i][1], thread);
    }
    init_wgmma_tables<C>(s.tab, thread);

    for (int i = 0, t = tasks.first; t < tasks.last; i++, t++, task = task.next(a.pairs)) {
        const int h = task.h, pair = task.pair;
        auto& x = s.x[i % C::STAGES];
        spectrum.wait_for_input();
        if (pre != nullptr) {
            apply_gate<THREADS, N>(x[0], (*pre)[i % C::STAGES][0], thread);
            apply_gate<THREADS, N>(x[1], (*pre)[i % C::STAGES][1], thread);
        }
        kt::fence_async_proxy();  // the input (and the tables), before wgmma reads them
        __syncthreads();          // task t's input visible; every warp is done with task t - 1
        if (t + 1 < tasks.last) issue_loads(task.next(a.pairs), (i + 1) % C::STAGES);
        kt::cp_async_commit();

        for (int v = group; v < C::VIEWS; v += WARPGROUPS) wgmma_phase1<C>(s.tab, x, s.y, v, 4 * v + warp % 4);
        spectrum.settle(a, thread);
        kt::fence_async_proxy();
        __syncthreads();  // y complete

        wgmma_phase2<C>(s.tab, s.y, s.u, s.spectrum, group);
        kt::fence_async_proxy();
        __syncthreads();  // u complete
        spectrum.refill_after(a, tasks, t, task, thread);

        // Phase 3: G1 for this warp's p, the postgate, and out through x (rows r, columns (p, q)).
        const Pair<const T> post = a.pair_of(a.postgate, a.post_stride_b, a.post_stride_h, pair, h);
        const Pair<T> out = a.pair_of(a.y, a.y_stride_b, a.y_stride_h, pair, h);
        for (int v = group; v < C::VIEWS; v += WARPGROUPS) {
            const int p = 4 * v + warp % 4;
            using out_acc = kt::rt_fl<kt::TILE_DIM, C::XR>;
            complex_tile<out_acc> d;
            issue_complex<1>(d, kt::subtile<R, 64>(s.u[0], 0, v), kt::subtile<R, 64>(s.u[1], 0, v), s.tab.fr_t);
            // The postgate at d's elements (rows q, columns r), loaded while G1 runs.
            auto element_of = [&](int q, int r) { return r * PQ + Q * p + q; };
            gate_values<out_acc> gate[2];
            for (int j = 0; j < 2; j++)
                if (post.seq[j] != nullptr) gate[j].load(post.seq[j], a.seqlen, element_of);
            kt::wgmma::wait<0>();
            landed(d);
            for (int j = 0; j < 2; j++)
                if (post.seq[j] != nullptr) gate[j].apply(j ? d.im : d.re);
            // Rows r >= R/2 are exact zeros (fr_t's), which R = 16 needs in its padding rows.
            for (int j = 0; j < 2; j++)
                store_runs<true, T>(j ? d.im : d.re, [&](int q, int r) { return x[j].address(r, Q * p + q); });
            __syncwarp();
            for (int j = 0; j < 2; j++)
                if (out.seq[j] != nullptr) warp_store_sequence<HALF, kt::TILE_DIM>(out.seq[j], a.seqlen, x[j], 0, Q * p);
        }
    }
    kt::cp_async_wait<0>();
#endif
}

}  // namespace
}  // namespace tk::fftconv
