// Two factors: L = R x Q (L <= 2048), x[r, q] = x[q + Q r]. A block of R/16 warps (one for
// L = 512) runs a pair of sequences at a time; each warp owns 16-row strips of k_r and runs
// F1 .. F3 of its strips in registers (F1's output rows are F3's A operand as they are), the
// inverse's G3 and T1* likewise, then the strips meet in shared memory for the last product
// (G1), which sums over k_r.
//
//   F1  Y[k_r, q] = sum_r F_R[k_r, r] x[r, q]          (r < R/2: u is zero past N)
//   T1  Y *= w_L^(k_r q)
//   F3  W[k_r, k_q] = sum_q Y[k_r, q] F_Q[q, k_q] = fft(x)[k_r + R k_q]
//   G3, T1*, G1: the same backwards with conjugate matrices, rows r < R/2 of G1 only.
#pragma once
#include "fftconv/kernel_common.cuh"

namespace tk::fftconv {
namespace {

template <typename T, int R_, int Q_, int WARPS_>
struct TwoFactor {
    using dtype = T;
    static constexpr bool THREE_FACTORS = false;
    static constexpr int R = R_, P = 1, Q = Q_, WARPS = WARPS_, THREADS = WARPS * kt::WARP_THREADS;
    static constexpr int L = R * Q, N = L / 2, HALF = R / 2;
    static constexpr int STRIPS = R / kt::TILE_DIM / WARPS;  // 16-row strips of k_r per warp
    static constexpr int OUT_TILES = (HALF / kt::TILE_DIM) * (Q / kt::TILE_DIM);  // 16x16 tiles of y
    static constexpr int OUT_PER_WARP = OUT_TILES / WARPS;
    static_assert(STRIPS >= 1 && R % (kt::TILE_DIM * WARPS) == 0 && OUT_TILES % WARPS == 0);
    // Pairs in flight: the current one and three ahead. A pair is 2N elements per sequence and
    // these kernels are memory-bound: fewer ahead leave too few bytes in flight per SM to cover
    // the memory latency.
    static constexpr int STAGES = 4;

    using seq_tile = kt::st<T, HALF, Q>;                     // one sequence's N elements, rows of Q
    using x_tile = kt::rt<T, HALF, Q, kt::col_l>;            // F1's B operand (K = r)
    using strip_acc = kt::rt_fl<kt::TILE_DIM, Q>;            // a strip: 16 rows k_r, all k_q (or q)
    using strip_op = kt::rt<T, kt::TILE_DIM, Q>;             // the same as a 16-bit A operand
    using column_op = kt::rt<T, R, kt::TILE_DIM, kt::col_l>; // G1's operands: all k_r x 16 columns
    using out_acc = kt::rt_fl<kt::TILE_DIM, kt::TILE_DIM>;   // a 16x16 tile of y

    struct Matrices {              // once per block
        kt::st<T, R, HALF> fr[2];  // F_R[:, :R/2] / sqrt(R) (re, im); F_R is symmetric
        kt::st<T, Q, Q> fq[2];     // F_Q / sqrt(Q)
    };
    using FrequencyRows = kt::st<T, R, Q>[2];  // the inverse's last input (re, im), rows k_r

    // Forward convolution.
    struct Stage {
        seq_tile x[2];  // batch 2i (real part), 2i + 1 (imaginary part); y staged here after use
    };
    using PreStages = seq_tile[STAGES][2];  // their pregates: allocated after Shared, only with one
    using PostStages = seq_tile[STAGES][2]; // their postgates, where staged: after those
    struct Shared {
        Stage stage[STAGES];
        FrequencyRows u;
        Matrices m;
        float2 spectrum[L / 2 + 2];  // the current head's K[0 .. L/2] (the last entry: padding)
    };
    // Filter gradient.
    struct GradStage {
        seq_tile x[2], d[2];  // the pair's u (re, im) and dy (re, im)
    };
    struct GradShared {
        GradStage stage[STAGES];
        FrequencyRows u;
        Matrices m;
        float scratch[WARPS];
    };
    using GradGates = GradStage[STAGES];  // their gates, where given: allocated after GradShared
    static constexpr int shared_bytes = kt::shared_bytes_for<Shared>();
    static constexpr int pregate_bytes = kt::added_shared_bytes_for<PreStages>();
    static constexpr int postgate_bytes = kt::added_shared_bytes_for<PostStages>();
    static constexpr int grad_shared_bytes = kt::shared_bytes_for<GradShared>();
    static constexpr int grad_gate_bytes = kt::added_shared_bytes_for<GradGates>();
};

template <typename C>
__device__ __forceinline__ void init_matrices(typename C::Matrices& m, int thread) {
    using T = typename C::dtype;
    constexpr int R = C::R, Q = C::Q, HALF = C::HALF;
    const float r_scale = rsqrtf(float(R)), q_scale = rsqrtf(float(Q));
    for (int e = thread; e < R * HALF; e += C::THREADS) {
        const int row = e / HALF, col = e % HALF;
        const float2 w = unit_root(row * col, R);
        *m.fr[0].ptr(row, col) = kt::convert<T>(w.x * r_scale);
        *m.fr[1].ptr(row, col) = kt::convert<T>(w.y * r_scale);
    }
    for (int e = thread; e < Q * Q; e += C::THREADS) {
        const int row = e / Q, col = e % Q;
        const float2 w = unit_root(row * col, Q);
        *m.fq[0].ptr(row, col) = kt::convert<T>(w.x * q_scale);
        *m.fq[1].ptr(row, col) = kt::convert<T>(w.y * q_scale);
    }
}

// A warp's constants for its strips, in registers for the block's lifetime: its strips of F_R
// (F1's A operand), F_Q (B operand of F3 and, conjugated, G3), and the twiddles w_L^(k_r q).
template <typename C>
struct TwoFactorWarp {
    using T = typename C::dtype;
    using strip_acc = typename C::strip_acc;
    using strip_op = typename C::strip_op;
    using x_tile = typename C::x_tile;
    complex_tile<kt::rt<T, kt::TILE_DIM, C::HALF>> f1[C::STRIPS];
    complex_tile<strip_acc> twiddle[C::STRIPS];
    complex_tile<kt::rt<T, C::Q, C::Q, kt::col_l>> fq;

    __device__ __forceinline__ void init(typename C::Matrices& m, int warp) {
        kt::load(fq.re, m.fq[0]);
        kt::load(fq.im, m.fq[1]);
#pragma unroll
        for (int st = 0; st < C::STRIPS; st++) {
            const int strip = warp * C::STRIPS + st;
            kt::load(f1[st].re, kt::subtile<kt::TILE_DIM, C::HALF>(m.fr[0], strip, 0));
            kt::load(f1[st].im, kt::subtile<kt::TILE_DIM, C::HALF>(m.fr[1], strip, 0));
            kt::for_each_pair(twiddle[st].re, [&](int i, int j, int k, float2& re) {
                const int row = strip * kt::TILE_DIM + i * kt::TILE_DIM + strip_acc::row_in_base(k, 0);
                const int col = j * kt::TILE_DIM + strip_acc::col_in_base(k, 0);
                const float2 w0 = unit_root(row * col, C::L), w1 = unit_root(row * (col + 1), C::L);
                re = make_float2(w0.x, w1.x);
                twiddle[st].im.tiles[i][j].data[k] = make_float2(w0.y, w1.y);
            });
        }
    }

    // acc = strip st of fft(x) / sqrt(L): rows k_r, columns k_q (F1, T1, F3). x is the pair's
    // sequence as F1's B operand, its imaginary part also given negated.
    __device__ __forceinline__ void forward(complex_tile<strip_acc>& acc, int st, const complex_tile<x_tile>& x,
                                            const x_tile& x_im_neg) const {
        complex_tile<strip_acc> a;
        kt::zero(a.re);
        kt::zero(a.im);
        cmma(a, f1[st], x, x_im_neg);  // F1
        cmul(a, twiddle[st]);          // T1
        complex_tile<strip_op> y;
        strip_op y_neg;
        kt::copy(y.re, a.re);
        kt::copy(y.im, a.im);
        negate(y_neg, y.im);
        kt::zero(acc.re);
        kt::zero(acc.im);
        cmma_neg_a(acc, y, y_neg, fq);  // F3
    }

    // The inverse's G3 and T1* on strip st of a spectrum z (16-bit), into its rows of u.
    __device__ __forceinline__ void inverse(const complex_tile<strip_op>& z, int st, typename C::FrequencyRows& u,
                                            int warp) const {
        strip_op z_neg;
        negate(z_neg, z.re);
        complex_tile<strip_acc> a;
        kt::zero(a.re);
        kt::zero(a.im);
        cmma_conj_b(a, z, z_neg, fq);  // G3
        cmul<true>(a, twiddle[st]);    // T1*
        const int strip = warp * C::STRIPS + st;
        kt::store(kt::subtile<kt::TILE_DIM, C::Q>(u[0], strip, 0), a.re);
        kt::store(kt::subtile<kt::TILE_DIM, C::Q>(u[1], strip, 0), a.im);
    }
};

// G1 for output tile column tile_col: out[r, q] = sum_k_r conj(F_R[r, k_r]) u[k_r, q] / sqrt(R)
// over 16 rows r (the columns of F_R that g1 holds) and 16 columns q.
template <typename C>
__device__ __forceinline__ void g1_product(complex_tile<typename C::out_acc>& out,
                                           const complex_tile<typename C::column_op>& g1,
                                           typename C::FrequencyRows& u, int tile_col) {
    complex_tile<typename C::column_op> uu;
    typename C::column_op uu_neg;
    kt::load(uu.re, kt::subtile<C::R, kt::TILE_DIM>(u[0], 0, tile_col));
    kt::load(uu.im, kt::subtile<C::R, kt::TILE_DIM>(u[1], 0, tile_col));
    negate(uu_neg, uu.re);
    kt::zero(out.re);
    kt::zero(out.im);
    cmma_conj_a(out, g1, uu, uu_neg);
}

// The columns of F_R that G1's output tile row tile_row needs (its 16 rows r), as G1's A
// operand (transposed).
template <typename C>
__device__ __forceinline__ void load_g1(complex_tile<typename C::column_op>& g1, typename C::Matrices& m,
                                        int tile_row) {
    kt::load(g1.re, kt::subtile<C::R, kt::TILE_DIM>(m.fr[0], 0, tile_row));
    kt::load(g1.im, kt::subtile<C::R, kt::TILE_DIM>(m.fr[1], 0, tile_row));
}

// STAGED_POSTGATE (a postgate given, and room for it): the pairs' postgates come through shared
// memory with their inputs, as in three_factor_forward: loaded from global memory at the output,
// their latency had nothing to hide behind.
template <typename T, int R, int Q, int WARPS, bool STAGED_POSTGATE = false>
__global__ void __launch_bounds__(WARPS * kt::WARP_THREADS)
    two_factor_forward(const __grid_constant__ Args<T> a) {
    using C = TwoFactor<T, R, Q, WARPS>;
    constexpr int L = C::L, N = C::N, THREADS = C::THREADS, STAGES = C::STAGES;
    constexpr int STRIPS = C::STRIPS, OUT_PER_WARP = C::OUT_PER_WARP;
    extern __shared__ char smem[];
    shared_carver carve(smem);
    auto& s = carve.allocate<typename C::Shared>();
    typename C::PreStages* pre = a.pregate != nullptr ? &carve.allocate<typename C::PreStages>() : nullptr;
    typename C::PostStages* post_stages = nullptr;
    if constexpr (STAGED_POSTGATE) post_stages = &carve.allocate<typename C::PostStages>();
    const int warp = kt::warp_id(), thread = threadIdx.x;
    const Tasks tasks = tasks_of(a);
    if (tasks.first >= tasks.last) return;

    // The next task's inputs into stage `stage` (one cp.async group with its gates).
    task_position loading(tasks.first, a.pairs);
    auto issue_loads = [&](int stage) {
        load_task_inputs_async<THREADS, N>(s.stage[stage].x, pre != nullptr ? (*pre)[stage] : nullptr, a, loading, thread);
        if constexpr (STAGED_POSTGATE) {
            load_postgates_async<THREADS, N>((*post_stages)[stage], a, loading.h, loading.pair, thread);
        }
        loading = loading.next(a.pairs);
    };
    load_spectrum_async<THREADS, L>(s.spectrum, a, loading.h, thread);  // with the first task's group
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {
        if (tasks.first + i < tasks.last) issue_loads(i);
        kt::cp_async_commit();
    }
    init_matrices<C>(s.m, thread);
    __syncthreads();

    // In registers for the block's lifetime: the warp's constants, the columns of F_R that the
    // last product's A operand (transposed) needs for this warp's output tiles; the filter's
    // spectrum at its strips, refreshed from the shared slot when the head changes.
    TwoFactorWarp<C> w;
    w.init(s.m, warp);
    complex_tile<typename C::strip_acc> spectrum[STRIPS];
    complex_tile<typename C::column_op> g1[OUT_PER_WARP];
#pragma unroll
    for (int t = 0; t < OUT_PER_WARP; t++) load_g1<C>(g1[t], s.m, (warp * OUT_PER_WARP + t) / (Q / kt::TILE_DIM));

    // The spectrum slot holds the current head's spectrum until every warp has copied it to
    // registers (after the first barrier of the head's first task), then the next head's.
    int spectrum_head = -1;       // whose spectrum the registers hold
    bool next_pending = false;    // the slot's next-head load is in flight
    int groups_since_next = 0;    // cp.async groups committed after that load
    task_position task(tasks.first, a.pairs);
    for (int i = 0, t = tasks.first; t < tasks.last; i++, t++, task = task.next(a.pairs)) {
        const int h = task.h, pair = task.pair;
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
        if (t + STAGES - 1 < tasks.last) issue_loads((i + STAGES - 1) % STAGES);
        kt::cp_async_commit();
        groups_since_next++;
        if (new_head) {  // K[k_r + R k_q] at (row k_r, column k_q) of the strips
#pragma unroll
            for (int sti = 0; sti < STRIPS; sti++) {
                const int strip = warp * STRIPS + sti;
                kt::for_each_pair(spectrum[sti].re, [&](int ti, int tj, int k, float2& re) {
                    const int row = strip * kt::TILE_DIM + ti * kt::TILE_DIM + C::strip_acc::row_in_base(k, 0);
                    const int col = tj * kt::TILE_DIM + C::strip_acc::col_in_base(k, 0);
                    const float2 k0 = spectrum_value<L>(s.spectrum, row + R * col, a.conjugate);
                    const float2 k1 = spectrum_value<L>(s.spectrum, row + R * (col + 1), a.conjugate);
                    re = make_float2(k0.x, k1.x);
                    spectrum[sti].im.tiles[ti][tj].data[k] = make_float2(k0.y, k1.y);
                });
            }
            spectrum_head = h;
            next_pending = false;
        }

        complex_tile<typename C::x_tile> x;
        typename C::x_tile x_im_neg;
        kt::load(x.re, st.x[0]);
        kt::load(x.im, st.x[1]);
        negate(x_im_neg, x.im);
#pragma unroll
        for (int sti = 0; sti < STRIPS; sti++) {
            complex_tile<typename C::strip_acc> acc;
            w.forward(acc, sti, x, x_im_neg);
            cmul(acc, spectrum[sti]);  // times the filter's
            complex_tile<typename C::strip_op> z;
            kt::copy(z.re, acc.re);
            kt::copy(z.im, acc.im);
            w.inverse(z, sti, s.u, warp);
        }
        __syncthreads();  // every strip of u written; every warp has its spectrum registers
        if (new_head && (h + 1) * a.pairs < tasks.last) {  // the next head's spectrum into the slot
            load_spectrum_async<THREADS, L>(s.spectrum, a, h + 1, thread);
            kt::cp_async_commit();
            next_pending = true;
            groups_since_next = 0;
        }

        // G1, this warp's 16x16 tiles of y.
        const Pair<const T> post = a.pair_of(a.postgate, a.post_stride_b, a.post_stride_h, pair, h);
        const Pair<T> out = a.pair_of(a.y, a.y_stride_b, a.y_stride_h, pair, h);
#pragma unroll
        for (int ot = 0; ot < OUT_PER_WARP; ot++) {
            const int tile = warp * OUT_PER_WARP + ot;
            const int tile_row = tile / (Q / kt::TILE_DIM), tile_col = tile % (Q / kt::TILE_DIM);
            complex_tile<typename C::out_acc> acc;
            g1_product<C>(acc, g1[ot], s.u, tile_col);
            if constexpr (STAGED_POSTGATE) {
                apply_staged_postgate(acc, (*post_stages)[i % STAGES], a.seqlen, tile_row * kt::TILE_DIM,
                                      tile_col * kt::TILE_DIM);
            } else if (a.postgate != nullptr) {
                apply_postgate(acc, post.seq[0], post.seq[1], a.seqlen, [&](int row, int col) {
                    return (tile_row * kt::TILE_DIM + row) * Q + tile_col * kt::TILE_DIM + col;
                });
            }
            // Through this stage's input tiles (free since F1) for 16-byte stores.
            kt::store(kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(st.x[0], tile_row, tile_col), acc.re);
            kt::store(kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(st.x[1], tile_row, tile_col), acc.im);
            __syncwarp();
            for (int j = 0; j < 2; j++)
                if (out.seq[j] != nullptr)
                    warp_store_sequence<kt::TILE_DIM, kt::TILE_DIM>(out.seq[j], a.seqlen, st.x[j],
                                                                   tile_row * kt::TILE_DIM, tile_col * kt::TILE_DIM);
        }
    }
    kt::cp_async_wait<0>();
}

// The filter's gradient: per head, S = sum over the pairs of fft(dy pair) * conj(fft(u pair)),
// accumulated in fp32 registers (each warp its strips), then one inverse transform whose real
// part is the sum of both batches' correlations (the imaginary parts of the packed sequences
// cancel: Re(conj(a + ib)(c + id)) = ac + bd), added into grad. GATED: u and dy times their gates
// (grad_inputs).
template <typename T, int R, int Q, int WARPS, bool GATED = false>
__global__ void __launch_bounds__(WARPS * kt::WARP_THREADS)
    two_factor_filter_grad(const __grid_constant__ Args<T> a) {
    using C = TwoFactor<T, R, Q, WARPS>;
    constexpr int L = C::L, N = C::N, THREADS = C::THREADS, STAGES = C::STAGES;
    constexpr int STRIPS = C::STRIPS, OUT_PER_WARP = C::OUT_PER_WARP;
    extern __shared__ char smem[];
    shared_carver carve(smem);
    auto& s = carve.allocate<typename C::GradShared>();
    const grad_inputs<C, GATED> inputs(s.stage, carve);
    const int warp = kt::warp_id(), thread = threadIdx.x;
    const Tasks tasks = tasks_of(a);
    if (tasks.first >= tasks.last) return;

    auto issue_loads = [&](int t, int stage) { inputs.issue(a, t, stage, thread); };
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {
        if (tasks.first + i < tasks.last) issue_loads(tasks.first + i, i);
        kt::cp_async_commit();
    }
    init_matrices<C>(s.m, thread);
    __syncthreads();
    TwoFactorWarp<C> w;
    w.init(s.m, warp);

    complex_tile<typename C::strip_acc> sum[STRIPS];
#pragma unroll
    for (int sti = 0; sti < STRIPS; sti++) {
        kt::zero(sum[sti].re);
        kt::zero(sum[sti].im);
    }
    for (int i = 0, t = tasks.first; t < tasks.last; i++, t++) {
        const int h = t / a.pairs;
        auto& st = s.stage[i % STAGES];
        kt::cp_async_wait<STAGES - 2>();
        inputs.apply_gates(a, i % STAGES, thread);
        __syncthreads();  // task t's input visible; every warp is done with task t - 1
        if (t + STAGES - 1 < tasks.last) issue_loads(t + STAGES - 1, (i + STAGES - 1) % STAGES);
        kt::cp_async_commit();

        complex_tile<typename C::strip_acc> spectrum_u[STRIPS];
        {
            complex_tile<typename C::x_tile> x;
            typename C::x_tile x_im_neg;
            kt::load(x.re, st.x[0]);
            kt::load(x.im, st.x[1]);
            negate(x_im_neg, x.im);
#pragma unroll
            for (int sti = 0; sti < STRIPS; sti++) w.forward(spectrum_u[sti], sti, x, x_im_neg);
        }
        {
            complex_tile<typename C::x_tile> x;
            typename C::x_tile x_im_neg;
            kt::load(x.re, st.d[0]);
            kt::load(x.im, st.d[1]);
            negate(x_im_neg, x.im);
#pragma unroll
            for (int sti = 0; sti < STRIPS; sti++) {
                complex_tile<typename C::strip_acc> spectrum_d;
                w.forward(spectrum_d, sti, x, x_im_neg);
                cmac_conj(sum[sti], spectrum_d, spectrum_u[sti]);
            }
        }
        if (t + 1 < tasks.last && (t + 1) % a.pairs != 0) continue;

        // The head's last task in this block: its share of the gradient. Uniform over the block.
        const float scale = inverse_of_sums<typename C::strip_op, WARPS>(
            sum, s.scratch, [&](complex_tile<typename C::strip_op>& z, int sti) { w.inverse(z, sti, s.u, warp); });
        __syncthreads();  // every strip of u written
        // Forward and inverse carry 1/sqrt(L) each, the product of two forward transforms 1/L:
        // the inverse's output is scale * ifft(S) / sqrt(L).
        const float out_scale = sqrtf(float(L)) / scale;
        float* grad = a.grad + int64_t(h) * a.seqlen;
#pragma unroll
        for (int ot = 0; ot < OUT_PER_WARP; ot++) {
            const int tile = warp * OUT_PER_WARP + ot;
            const int tile_row = tile / (Q / kt::TILE_DIM), tile_col = tile % (Q / kt::TILE_DIM);
            complex_tile<typename C::column_op> g1;
            load_g1<C>(g1, s.m, tile_row);
            complex_tile<typename C::out_acc> acc;
            g1_product<C>(acc, g1, s.u, tile_col);
            add_to_grad(grad, acc.re, out_scale, a.seqlen, [&](int row, int col) {
                return (tile_row * kt::TILE_DIM + row) * Q + tile_col * kt::TILE_DIM + col;
            });
        }
    }
    kt::cp_async_wait<0>();
}

}  // namespace
}  // namespace tk::fftconv
