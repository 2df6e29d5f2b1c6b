// What the FFT convolution kernels share: their arguments, the split of (head, pair of batches)
// tasks over persistent blocks, shared-memory carving, the filter spectrum's loads and the
// postgate, and the launch.
#pragma once
#include "fftconv/complex_tiles.cuh"
#include "fftconv/params.h"

namespace tk::fftconv {
namespace {

template <typename P>
struct Pair {
    P* seq[2];
};

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
    const float2* spectrum;  // (heads, L / 2 + 1): rfft(k, L)
    const float4* arranged_spectrum;  // where a kernel reads it from global memory: arrange_spectrum's
    bool conjugate;
    const T* dy;             // filter gradient: the output's gradient, (batch, heads, seqlen)
    int64_t dy_stride_b, dy_stride_h;
    const T* u_gate;         // filter gradient: u and dy multiplied by these where given
    int64_t u_gate_stride_b, u_gate_stride_h;
    const T* dy_gate;
    int64_t dy_gate_stride_b, dy_gate_stride_h;
    float* grad;             // filter gradient: (heads, seqlen), added into
    int batch, heads, seqlen;
    int pairs;           // per head: ceil(batch / 2)
    int parts;           // blocks' shares of a head's frequencies (filter gradient; else 1)
    int tasks;           // heads * parts * pairs; task t = (head and part t / pairs, pair t % pairs)
    int tasks_per_block; // block b runs tasks [b * tasks_per_block, ...) in order

    // The sequences (2 pair, h) and (2 pair + 1, h) of a tensor, the second nullptr past the
    // last batch (the odd one out of a pair).
    template <typename P>
    __device__ __forceinline__ Pair<P> pair_of(P* base, int64_t stride_b, int64_t stride_h, int pair, int h) const {
        if (base == nullptr) return {{nullptr, nullptr}};  // no such tensor (a gate not given)
        // Unsigned widening of the (non-negative) indices: no sign extensions per task.
        P* first = base + (int64_t(uint32_t(2 * pair)) * stride_b + int64_t(uint32_t(h)) * stride_h);
        return {{first, 2 * pair + 1 < batch ? first + stride_b : nullptr}};
    }
};

// The block's tasks [first, last): consecutive pairs of a head, then of the next head. A block
// sets up its DFT matrices and twiddles once and keeps them for all of them.
struct Tasks {
    int first, last;
};
template <typename T>
__device__ __forceinline__ Tasks tasks_of(const Args<T>& a) {
    const int first = blockIdx.x * a.tasks_per_block;
    return {first, min(first + a.tasks_per_block, a.tasks)};
}

// Task t's head (h = t / pairs) and pair (t % pairs), stepped from one task to the next: a
// division by the run-time pair count costs about 20 instructions, once per task.
struct task_position {
    int h, pair;
    __device__ __forceinline__ task_position(int t, int pairs) : h(t / pairs), pair(t % pairs) {}
    __device__ __forceinline__ task_position next(int pairs) const {
        task_position n = *this;
        if (++n.pair == pairs) {
            n.pair = 0;
            n.h++;
        }
        return n;
    }
};

// Carves the dynamic shared memory into 1024-byte aligned objects. Offsets are added to the
// __shared__ array itself, never through an integer, so the compiler sees that every pointer
// into it is a shared-memory one and emits shared loads and stores (LDS/STS) for them rather
// than generic ones.
struct shared_carver {
    char* next;
    __device__ explicit shared_carver(char* base)
        : next(base + ((1024u - (kt::shared_address(base) & 1023u)) & 1023u)) {}
    template <typename S>
    __device__ S& allocate() {
        S* p = reinterpret_cast<S*>(next);
        next += (sizeof(S) + 1023) & ~size_t(1023);
        return *p;
    }
};

// ---- the filter's spectrum ------------------------------------------------------------------

// cp.async of spectrum[h] (K[0 .. L/2], L/2 + 1 complex; 8-byte aligned only: each row is
// (L/2 + 1) * 8 bytes) into `slot`.
template <int THREADS, int L, typename T>
__device__ __forceinline__ void load_spectrum_async(float2* slot, const Args<T>& a, int h, int thread) {
    const float2* src = a.spectrum + int64_t(h) * (L / 2 + 1);
#pragma unroll
    for (int i = 0; i < (L / 2 + THREADS) / THREADS; i++) {
        const int c = thread + i * THREADS;
        if (c <= L / 2)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(kt::shared_address(slot + c)), "l"(src + c)
                         : "memory");
    }
}

// Where K[f], 0 <= f < L, of a real filter is kept in K[0 .. L/2]: at min(f, L - f) (above L/2
// conjugated: K[f] = conj(K[L - f])).
template <int L>
__host__ __device__ constexpr int half_spectrum_index(int f) {
    return f > L / 2 ? L - f : f;
}

// K[f] for 0 <= f < L (conj(K[f]) when `conjugate`) from K[0 .. L/2] of a real filter.
template <int L>
__device__ __forceinline__ float2 spectrum_value(const float2* half, int f, bool conjugate) {
    float2 v = half[half_spectrum_index<L>(f)];
    if ((f > L / 2) != conjugate) v.y = -v.y;
    return v;
}

// ---- a task's inputs --------------------------------------------------------------------------

// cp.async of a pair's two sequences into x[0] (re) and x[1] (im; zeros for a missing one).
template <int THREADS, int ELEMS, typename ST, typename T>
__device__ __forceinline__ void load_pair_async(ST* x, const Pair<const T>& seqs, const Args<T>& a, int thread) {
    for (int j = 0; j < 2; j++) load_sequence_async<THREADS, ELEMS>(x[j], seqs.seq[j], a.seqlen, a.u, thread);
}

// cp.async of task t's pair of input sequences into x[0] (re), x[1] (im), and of its pregate's
// into pre[0], pre[1] when pre is given (nullptr: no pregate): a forward kernel's stage loads.
template <int THREADS, int ELEMS, typename ST, typename T>
__device__ __forceinline__ void load_task_inputs_async(ST (&x)[2], ST* pre, const Args<T>& a, task_position task,
                                                       int thread) {
    const int h = task.h, pair = task.pair;
    load_pair_async<THREADS, ELEMS>(x, a.pair_of(a.u, a.u_stride_b, a.u_stride_h, pair, h), a, thread);
    if (pre != nullptr)
        load_pair_async<THREADS, ELEMS>(pre, a.pair_of(a.pregate, a.pre_stride_b, a.pre_stride_h, pair, h), a, thread);
}

// cp.async of task t's postgates into g[0], g[1]: the staged-postgate forwards' loads.
template <int THREADS, int ELEMS, typename ST, typename T>
__device__ __forceinline__ void load_postgates_async(ST (&g)[2], const Args<T>& a, int h, int pair, int thread) {
    load_pair_async<THREADS, ELEMS>(g, a.pair_of(a.postgate, a.post_stride_b, a.post_stride_h, pair, h), a, thread);
}

// cp.async of the filter gradient's task t (pair t % pairs of head t / pairs): the pair of u into
// x[0], x[1] and of dy into d[0], d[1].
template <int THREADS, int ELEMS, typename ST, typename T>
__device__ __forceinline__ void load_grad_task_inputs_async(ST (&x)[2], ST (&d)[2], const Args<T>& a, int t,
                                                            int thread) {
    const int h = t / a.pairs, pair = t - h * a.pairs;
    const Pair<const T> u = a.pair_of(a.u, a.u_stride_b, a.u_stride_h, pair, h);
    const Pair<const T> dy = a.pair_of(a.dy, a.dy_stride_b, a.dy_stride_h, pair, h);
    for (int j = 0; j < 2; j++) {
        load_sequence_async<THREADS, ELEMS>(x[j], u.seq[j], a.seqlen, a.u, thread);
        load_sequence_async<THREADS, ELEMS>(d[j], dy.seq[j], a.seqlen, a.u, thread);
    }
}

// A filter-gradient kernel's input stages (C::GradStage: the pair of u in x, of dy in d) and,
// with GATED, their gates (a.u_gate, a.dy_gate, either may be absent) in stages of their own,
// allocated after C::GradShared: a task's loads issued together, one cp.async group.
template <typename C, bool GATED>
struct grad_inputs {
    static constexpr int THREADS = C::THREADS, N = C::N;
    using Stage = typename C::GradStage;
    Stage* stages;
    Stage* gates;  // GATED only

    __device__ __forceinline__ grad_inputs(Stage* stages_, shared_carver& carve) : stages(stages_), gates(nullptr) {
        if constexpr (GATED) gates = carve.allocate<typename C::GradGates>();
    }
    // cp.async of task t's inputs (and gates) into `stage`.
    template <typename T>
    __device__ __forceinline__ void issue(const Args<T>& a, int t, int stage, int thread) const {
        load_grad_task_inputs_async<THREADS, N>(stages[stage].x, stages[stage].d, a, t, thread);
        if constexpr (GATED) {
            const int h = t / a.pairs, pair = t - h * a.pairs;
            if (a.u_gate != nullptr)
                load_pair_async<THREADS, N>(gates[stage].x, a.pair_of(a.u_gate, a.u_gate_stride_b, a.u_gate_stride_h, pair, h),
                                            a, thread);
            if (a.dy_gate != nullptr)
                load_pair_async<THREADS, N>(gates[stage].d,
                                            a.pair_of(a.dy_gate, a.dy_gate_stride_b, a.dy_gate_stride_h, pair, h), a, thread);
        }
    }
    // Once this thread's loads of `stage` landed: its chunks times their gates, in the 16-bit type
    // (as the forward's pregate, apply_gate); the thread's own wait is enough.
    template <typename T>
    __device__ __forceinline__ void apply_gates(const Args<T>& a, int stage, int thread) const {
        if constexpr (GATED) {
            for (int j = 0; j < 2; j++) {
                if (a.u_gate != nullptr) apply_gate<THREADS, N>(stages[stage].x[j], gates[stage].x[j], thread);
                if (a.dy_gate != nullptr) apply_gate<THREADS, N>(stages[stage].d[j], gates[stage].d[j], thread);
            }
        }
    }
};

// ---- gates ------------------------------------------------------------------------------------

// Two neighbouring gate values for each sequence of a pair, as fp32.
struct gate_pairs {
    float2 re, im;
};

// acc *= the postgates at the tile's elements: element (row, col) of `acc` is sequence element
// element_of(row, col) of the pair's two sequences (re, im), and gates_at(row, col, n) gives the
// two gates' values there and at n + 1 as {re's, im's}. Elements at or past seqlen are left (not
// stored either).
template <typename RT, typename Element, typename Gates>
__device__ __forceinline__ void multiply_by_gates(complex_tile<RT>& acc, int seqlen, Element&& element_of,
                                                  Gates&& gates_at) {
    kt::for_each_pair(acc.re, [&](int i, int j, int k, float2& re) {
        const int row = i * kt::TILE_DIM + RT::row_in_base(k, 0), col = j * kt::TILE_DIM + RT::col_in_base(k, 0);
        const int n = element_of(row, col);
        if (n >= seqlen) return;
        float2& im = acc.im.tiles[i][j].data[k];
        const gate_pairs g = gates_at(row, col, n);
        re.x *= g.re.x;
        re.y *= g.re.y;
        im.x *= g.im.x;
        im.y *= g.im.y;
    });
}

// Two neighbouring values of a 16-bit gate as fp32.
template <typename T>
__device__ __forceinline__ float2 gate_pair(const T* at) {
    return kt::convert_pair<float, T>(*reinterpret_cast<const typename kt::packed_of<T>::type*>(at));
}

// multiply_by_gates with the postgates read from global memory at sequence element n (gate1 null
// where the pair has no second sequence: its im part, not stored, is left).
template <typename T, typename RT, typename Element>
__device__ __forceinline__ void apply_postgate(complex_tile<RT>& acc, const T* gate0, const T* gate1, int seqlen,
                                               Element&& element_of) {
    using P = typename kt::packed_of<T>::type;
    multiply_by_gates(acc, seqlen, element_of, [&](int, int, int n) {
        return gate_pairs{kt::convert_pair<float, T>(__ldg(reinterpret_cast<const P*>(gate0 + n))),
                          gate1 != nullptr ? kt::convert_pair<float, T>(__ldg(reinterpret_cast<const P*>(gate1 + n)))
                                           : make_float2(1.f, 1.f)};
    });
}

// multiply_by_gates with the postgates staged in shared memory: element (row, col) of `acc` at
// element (row0 + row, col0 + col) of the sequence tiles g[0] (re) and g[1] (im; zeros where the
// pair has no second sequence).
template <typename RT, typename ST>
__device__ __forceinline__ void apply_staged_postgate(complex_tile<RT>& acc, const ST (&g)[2], int seqlen, int row0,
                                                      int col0) {
    multiply_by_gates(
        acc, seqlen, [&](int row, int col) { return (row0 + row) * ST::cols + col0 + col; },
        [&](int row, int col, int) {
            return gate_pairs{gate_pair(g[0].ptr(row0 + row, col0 + col)), gate_pair(g[1].ptr(row0 + row, col0 + col))};
        });
}

// A gate's values at the elements of a tile (RT's shape; element (row, col) is sequence element
// element_of(row, col), 1 at or past seqlen), for tiles whose pairs are not neighbours in the
// sequence: loaded element by element ahead of the product whose result they multiply, so that
// their latency hides behind it.
template <typename RT>
struct gate_values {
    float2 v[RT::height][RT::width][4];
    template <typename T, typename Element>
    __device__ __forceinline__ void load(const T* gate, int seqlen, Element&& element_of) {
#pragma unroll
        for (int i = 0; i < RT::height; i++)
#pragma unroll
            for (int j = 0; j < RT::width; j++)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float e[2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int n = element_of(i * kt::TILE_DIM + RT::row_in_base(k, h), j * kt::TILE_DIM + RT::col_in_base(k, h));
                        e[h] = n < seqlen ? kt::convert<float>(__ldg(gate + n)) : 1.f;
                    }
                    v[i][j][k] = make_float2(e[0], e[1]);
                }
    }
    __device__ __forceinline__ void apply(RT& t) const {
        kt::for_each_pair(t, [&](int i, int j, int k, float2& x) {
            x.x *= v[i][j][k].x;
            x.y *= v[i][j][k].y;
        });
    }
};

// ---- the filter gradient's accumulated spectrum ------------------------------------------------

// s += d * conj(u), element-wise on fp32 complex tiles.
template <typename RT>
__device__ __forceinline__ void cmac_conj(complex_tile<RT>& s, const complex_tile<RT>& d, const complex_tile<RT>& u) {
    kt::for_each_pair(s.re, [&](int i, int j, int k, float2& sr) {
        float2& si = s.im.tiles[i][j].data[k];
        const float2 dr = d.re.tiles[i][j].data[k], di = d.im.tiles[i][j].data[k];
        const float2 ur = u.re.tiles[i][j].data[k], ui = u.im.tiles[i][j].data[k];
        sr.x = fmaf(dr.x, ur.x, fmaf(di.x, ui.x, sr.x));
        sr.y = fmaf(dr.y, ur.y, fmaf(di.y, ui.y, sr.y));
        si.x = fmaf(di.x, ur.x, fmaf(-dr.x, ui.x, si.x));
        si.y = fmaf(di.y, ur.y, fmaf(-dr.y, ui.y, si.y));
    });
}

// grad[n] += scale * re at the tile's elements, element (row, col) being sequence element
// element_of(row, col) (-1 for none); elements at or past seqlen are left. seqlen is even, so an
// element pair is wholly inside or wholly past it.
template <typename RT, typename Element>
__device__ __forceinline__ void add_to_grad(float* grad, const RT& re, float scale, int seqlen, Element&& element_of) {
    kt::for_each_pair(re, [&](int i, int j, int k, const float2& v) {
        const int n = element_of(i * kt::TILE_DIM + RT::row_in_base(k, 0), j * kt::TILE_DIM + RT::col_in_base(k, 0));
        if (n >= 0 && n < seqlen) {
            atomicAdd(grad + n, v.x * scale);
            atomicAdd(grad + n + 1, v.y * scale);
        }
    });
}

// The largest |re| or |im| over the tiles.
template <typename RT>
__device__ __forceinline__ float max_abs(const complex_tile<RT>& t, float m) {
    kt::for_each_pair(t.re, [&](int i, int j, int k, const float2& r) {
        const float2 im = t.im.tiles[i][j].data[k];
        m = fmaxf(m, fmaxf(fmaxf(fabsf(r.x), fabsf(r.y)), fmaxf(fabsf(im.x), fabsf(im.y))));
    });
    return m;
}

// A power of two that brings the block's largest spectrum value m into [32, 64): the
// accumulated spectrum becomes a 16-bit mma operand for the inverse transform, and fp16 has
// little range (a small gradient times a small input would lose its digits to subnormals).
// Every thread passes its own m; `scratch` holds one float per warp. Two barriers.
template <int WARPS>
__device__ __forceinline__ float block_scale(float m, float* scratch) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    if (kt::lane_id() == 0) scratch[kt::warp_id()] = m;
    __syncthreads();
    m = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) m = fmaxf(m, scratch[w]);
    if (!(m > 0.f) || !isfinite(m)) return 1.f;
    int e;
    frexpf(m, &e);  // m = f * 2^e, f in [0.5, 1)
    return ldexpf(1.f, 6 - min(max(e, -100), 120));
}

// scale * t, element-wise, into the 16-bit tiles d.
template <typename D, typename RT>
__device__ __forceinline__ void scaled_copy(complex_tile<D>& d, const complex_tile<RT>& t, float scale) {
    kt::for_each_pair(t.re, [&](int i, int j, int k, const float2& r) {
        const float2 im = t.im.tiles[i][j].data[k];
        d.re.tiles[i][j].data[k] = kt::convert_pair<typename D::dtype, float>(make_float2(r.x * scale, r.y * scale));
        d.im.tiles[i][j].data[k] = kt::convert_pair<typename D::dtype, float>(make_float2(im.x * scale, im.y * scale));
    });
}

// A head's (or a head part's) accumulated spectra sum[0 .. COUNT), scaled by one block-uniform
// power of two (block_scale) into the 16-bit tiles that inverse(z, j) transforms, then zeroed
// for the next head. Returns the scale; block_scale's barriers come first, so every warp is done
// with the task before.
template <typename Op, int WARPS, typename Acc, int COUNT, typename Inverse>
__device__ __forceinline__ float inverse_of_sums(complex_tile<Acc> (&sum)[COUNT], float* scratch,
                                                 Inverse&& inverse) {
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < COUNT; j++) m = max_abs(sum[j], m);
    const float scale = block_scale<WARPS>(m, scratch);
#pragma unroll
    for (int j = 0; j < COUNT; j++) {
        complex_tile<Op> z;
        scaled_copy(z, sum[j], scale);
        inverse(z, j);
        kt::zero(sum[j].re);
        kt::zero(sum[j].im);
    }
    return scale;
}

// ---------------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------------

// Dynamic shared memory one block may have on sm_90 (A100: 163 KB, sm_86/89: 99 KB; the op
// checks the device's own limit).
constexpr int kMaxSharedBytes = 227 * 1024;
// Shared memory of an sm_90 SM, which its blocks share.
constexpr int kSharedPerSm90 = 228 * 1024;

// Two blocks of C (its forward without a pregate) fit an SM of shared_per_sm bytes: each block
// also takes 1 KiB of the SM's.
template <typename C>
constexpr bool two_blocks_fit(int shared_per_sm) {
    return 2 * (C::shared_bytes + 1024) <= shared_per_sm;
}

template <typename T>
Args<T> forward_args(const ForwardParams& p) {
    Args<T> a{};
    a.u = static_cast<const T*>(p.u);
    a.u_stride_b = p.u_stride_b, a.u_stride_h = p.u_stride_h;
    a.pregate = static_cast<const T*>(p.pregate);
    a.pre_stride_b = p.pre_stride_b, a.pre_stride_h = p.pre_stride_h;
    a.postgate = static_cast<const T*>(p.postgate);
    a.post_stride_b = p.post_stride_b, a.post_stride_h = p.post_stride_h;
    a.y = static_cast<T*>(p.y);
    a.y_stride_b = p.y_stride_b, a.y_stride_h = p.y_stride_h;
    a.spectrum = reinterpret_cast<const float2*>(p.spectrum);
    a.conjugate = p.conjugate;
    a.batch = p.batch, a.heads = p.heads, a.seqlen = p.seqlen;
    a.pairs = (p.batch + 1) / 2;
    a.parts = 1;
    return a;
}

template <typename T>
Args<T> filter_grad_args(const FilterGradParams& p) {
    Args<T> a{};
    a.u = static_cast<const T*>(p.u);
    a.u_stride_b = p.u_stride_b, a.u_stride_h = p.u_stride_h;
    a.dy = static_cast<const T*>(p.dy);
    a.dy_stride_b = p.dy_stride_b, a.dy_stride_h = p.dy_stride_h;
    a.u_gate = static_cast<const T*>(p.u_gate);
    a.u_gate_stride_b = p.u_gate_stride_b, a.u_gate_stride_h = p.u_gate_stride_h;
    a.dy_gate = static_cast<const T*>(p.dy_gate);
    a.dy_gate_stride_b = p.dy_gate_stride_b, a.dy_gate_stride_h = p.dy_gate_stride_h;
    a.grad = p.grad;
    a.batch = p.batch, a.heads = p.heads, a.seqlen = p.seqlen;
    a.pairs = (p.batch + 1) / 2;
    a.parts = 1;
    return a;
}

// One wave of persistent blocks, each running an equal share of the tasks in order: a block's
// setup (DFT matrices and twiddles from sincospif) costs about as much as a few tasks, so it is
// paid once per block. whole_heads: a block's share is rounded up to whole heads where there
// are at least as many tasks per block as a head has (the filter gradient then sums each head
// in one block, in a fixed order; with parts > 1, each part of a head in one block).
template <typename T, typename Kernel>
cudaError_t launch(Kernel kernel, int threads, int smem, Args<T> a, int multiprocessors, bool whole_heads,
                   cudaStream_t stream) {
    int resident_per_sm = 0;
    if (cudaError_t e = kt::blocks_per_sm(kernel, threads, smem, resident_per_sm)) return e;
    const int64_t tasks = int64_t(a.heads) * a.parts * a.pairs;
    if (tasks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    a.tasks = int(tasks);
    const int64_t resident = int64_t(resident_per_sm > 0 ? resident_per_sm : 1) * (multiprocessors > 0 ? multiprocessors : 1);
    const int64_t blocks_wanted = tasks < resident ? tasks : resident;
    int64_t per_block = (tasks + blocks_wanted - 1) / blocks_wanted;
    if (whole_heads && per_block >= a.pairs) per_block = (per_block + a.pairs - 1) / a.pairs * a.pairs;
    a.tasks_per_block = int(per_block);
    const int blocks = int((tasks + per_block - 1) / per_block);
    kernel<<<unsigned(blocks), threads, smem, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace
}  // namespace tk::fftconv
