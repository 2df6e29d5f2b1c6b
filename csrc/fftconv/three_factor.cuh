// Three factors: L = R x 16 x 16 (L = 4096, 8192), x[r, p, q] = x[q + 16 p + 256 r], frequency
// k = k_r + R k_p + 16 R k_q.
//
//   F1  Y[k_r, p, q] = sum_r F_R[k_r, r] x[r, p, q]        (r < R/2: u is zero past N)
//   T1  Y *= w_L^(k_r (q + 16 p))
//   F2  Z[k_r, k_p, q] = sum_p F_16[k_p, p] Y[k_r, p, q]
//   T2  Z *= w_256^(k_p q)
//   F3  W[k_r, k_p, k_q] = sum_q Z[k_r, k_p, q] F_16[q, k_q] = fft(x)[k]
//   and back: G3, T2*, G2, T1*, G1 (rows r < R/2 only).
//
// A block of WARPS warps runs a pair of sequences in three phases with the data in shared
// memory between them: phase 1 (F1, T1) and phase 3 (G1) split the columns p over the warps,
// phase 2 (the 16 x 16 FFTs of each k_r, the product, and back) splits k_r.
#pragma once
#include "fftconv/kernel_common.cuh"

namespace tk::fftconv {
namespace {

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

// Whether C folds T1 into its matrices (ThreeFactor's FOLDED; ThreeFactorLarge does not).
template <typename C>
concept folds_twiddles = C::FOLDED;

// FOLDED: T1 (and T1*) multiplied into the matrices of F2 and F3 (G2 and G3), one 16-bit tile per
// k_r each:
//   M_k_r = F_16 diag(w_L^(16 k_r p)) / 4   (rows k_p, cols p: T1's p part, contracted by F2)
//   N_k_r = diag(w_L^(k_r q)) F_16 / 4      (rows q, cols k_q: T1's q part, which commutes with F2
//                                            and is contracted by F3)
// G2 takes conj(M_k_r^T) and G3 conj(N_k_r^T) (T1*'s q part commutes with T2*). Phase 1 is then
// F1 alone and phase 2 multiplies each element three times (T2, the spectrum, T2*), where
// unfolded T1 and T1* take two complex multiplies per element each (the twiddle formed from its
// two table factors, then applied); each matrix entry is one exact angle rounded once, like
// F_16's. The folded forward also keeps the filter's spectrum tiles 0 .. R/2 only (the others
// read mirrored, stored_tile_value). Unfolded, the full layout: every spectrum tile, T1's two factors from fp32
// tables, for the filter gradients and for a GPU whose blocks cannot hold the folded tables
// (configs.cuh).
template <typename T, int R_, int WARPS_ = 16, bool FOLDED_ = false>
struct ThreeFactor {
    using dtype = T;
    static constexpr bool THREE_FACTORS = true;
    static constexpr bool FOLDED = FOLDED_;
    static constexpr int R = R_, P = 16, Q = 16, PQ = P * Q, L = R * PQ, N = L / 2, HALF = R / 2;
    static constexpr int WARPS = WARPS_, THREADS = WARPS * kt::WARP_THREADS;
    static_assert(P % WARPS == 0 && R % WARPS == 0);
    static constexpr int XR = HALF < kt::TILE_DIM ? kt::TILE_DIM : HALF;  // F1's K, padded to 16
    // The spectrum positions kept: tiles 0 .. R/2 (folded) or all.
    static constexpr int SPECTRUM_POSITIONS = FOLDED ? (R / 2 + 1) * PQ : L;
    static constexpr int KR_PER_WARP = R / WARPS;  // phase 2: warp w owns k_r = w + WARPS j
    static constexpr int P_PER_WARP = P / WARPS;   // phases 1 and 3: warp w owns p = w + WARPS j
    // The next pair's input lands during the three phases of the current one.
    static constexpr int STAGES = 2;
    using seq_tile = kt::st<T, XR, PQ>;  // rows r, columns (p, q); rows >= R/2 zero
    using buffer = frequency_tiles<T, R>;
    using sub16 = kt::rt<T, kt::TILE_DIM, kt::TILE_DIM>;
    using sub16_b = kt::rt<T, kt::TILE_DIM, kt::TILE_DIM, kt::col_l>;
    using acc16 = kt::rt_fl<kt::TILE_DIM, kt::TILE_DIM>;
    using column_acc = kt::rt_fl<XR, kt::TILE_DIM>;  // phase 3's output: rows r, 16 columns q

    struct FoldedTables {  // once per block
        kt::st<T, R, XR> fr[2];     // F_R[:, :R/2] / sqrt(R) (re, im), zero columns >= R/2
        float4 twiddle2[PQ / 2];    // w_256^(k_p q), fragment order of a 16 x 16 tile
        kt::st<T, R * kt::TILE_DIM, kt::TILE_DIM> f2[2], f3[2];  // M_k_r and N_k_r (re, im) at rows 16 k_r
    };
    struct FullTables {
        kt::st<T, R, XR> fr[2];
        float4 twiddle_frag[R * Q / 2];  // w_L^(k_r q) in the fragment order of R x 16 tiles
        float4 twiddle_rows[R * Q / 2];  // the same, row-major [k_r][q]
        float4 twiddle2[PQ / 2];
        float2 twiddle_p[R * P];         // w_L^(Q k_r p), row-major [k_r][p]
    };
    using Tables = std::conditional_t<FOLDED, FoldedTables, FullTables>;
    // Forward convolution.
    struct Stage {
        seq_tile x[2];  // batch 2i (re), 2i + 1 (im); y staged here after F1
    };
    using PreStages = seq_tile[STAGES][2];  // their pregates: allocated after Shared, only with one
    using PostStage = seq_tile[2];          // the pair's postgates, where staged: after those
    struct Shared {
        Stage stage[STAGES];
        buffer buf[2];                // re, im
        float4 spectrum[SPECTRUM_POSITIONS / 2];  // the filter's (two complex per float4), in phase 2's fragment order
        Tables tab;
    };
    // Filter gradient.
    struct GradStage {
        seq_tile x[2], d[2];  // the pair's u (re, im) and dy (re, im)
    };
    struct GradShared {
        GradStage stage[STAGES];
        buffer bu[2], bd[2];  // u's and dy's spectra (re, im)
        Tables tab;
        float scratch[WARPS];
    };
    using GradGates = GradStage[STAGES];  // their gates, where given: allocated after GradShared
    static constexpr int shared_bytes = kt::shared_bytes_for<Shared>();
    static constexpr int pregate_bytes = kt::added_shared_bytes_for<PreStages>();
    static constexpr int postgate_bytes = kt::added_shared_bytes_for<PostStage>();
    static constexpr int grad_shared_bytes = kt::shared_bytes_for<GradShared>();
    static constexpr int grad_gate_bytes = kt::added_shared_bytes_for<GradGates>();
};

// Entry e of the w_256^(k_p q) table in the fragment order of a 16 x 16 row-layout tile (lane
// e % 32, register e / 32: its two columns' values), which twiddle2_fragment (and the wgmma
// kernel's cmul_fragments) reads.
__device__ __forceinline__ float4 twiddle2_value(int e) {
    const int l = e % 32, k = e / 32;
    const int row = 8 * (k % 2) + l / 4, col = 8 * (k / 2) + 2 * (l % 4);
    const float2 w0 = unit_root(row * col, 256), w1 = unit_root(row * (col + 1), 256);
    return make_float4(w0.x, w0.y, w1.x, w1.y);
}

template <typename C>
__device__ __forceinline__ void init_tables(typename C::Tables& tab, int thread) {
    using T = typename C::dtype;
    constexpr int R = C::R, Q = C::Q, L = C::L, PQ = C::PQ, XR = C::XR, HALF = C::HALF;
    // Unfolded, twiddles w_L^(k_r q): in the fragment order of F1's accumulator (R x 16, row
    // layout: float4 (i * 4 + k) * 32 + lane holds its register k of base tile i), and row-major
    // where the configuration has that table.
    for (int e = thread; e < R * Q / 2; e += C::THREADS) {
        if constexpr (requires { tab.twiddle_frag; }) {
            const int l = e % 32, k = (e / 32) % 4, i = e / 128;
            const int row = kt::TILE_DIM * i + 8 * (k % 2) + l / 4, col = 8 * (k / 2) + 2 * (l % 4);
            const float2 w0 = unit_root(row * col, L), w1 = unit_root(row * (col + 1), L);
            tab.twiddle_frag[e] = make_float4(w0.x, w0.y, w1.x, w1.y);
        }
        if constexpr (requires { tab.twiddle_rows; }) {
            const int row2 = e / (Q / 2), col2 = (e % (Q / 2)) * 2;
            const float2 v0 = unit_root(row2 * col2, L), v1 = unit_root(row2 * (col2 + 1), L);
            tab.twiddle_rows[e] = make_float4(v0.x, v0.y, v1.x, v1.y);
        }
        if (e < PQ / 2) tab.twiddle2[e] = twiddle2_value(e);
    }
    // F1's A operand (and, transposed and conjugated, G1's), and T1's parts.
    const float r_scale = rsqrtf(float(R));
    for (int e = thread; e < R * XR; e += C::THREADS) {
        const int row = e / XR, col = e % XR;
        const float2 w = unit_root(row * col, R);
        *tab.fr[0].ptr(row, col) = kt::convert<T>(col < HALF ? w.x * r_scale : 0.f);
        *tab.fr[1].ptr(row, col) = kt::convert<T>(col < HALF ? w.y * r_scale : 0.f);
    }
    if constexpr (requires { tab.twiddle_p; }) {
        for (int e = thread; e < R * C::P; e += C::THREADS)
            tab.twiddle_p[e] = unit_root(Q * (e / C::P) * (e % C::P), L);
    } else {
        // Entry (row, col) of tile k_r is w_L^(angle(k_r, row, col)) / 4: one exact angle, one
        // rounding to 16 bits.
        auto fill = [&](auto (&table)[2], auto&& angle) {
            for (int e = thread; e < R * PQ; e += C::THREADS) {
                const int kr = e / PQ, row = (e / kt::TILE_DIM) % kt::TILE_DIM, col = e % kt::TILE_DIM;
                const float2 w = unit_root(angle(kr, row, col), L);
                *table[0].ptr(kt::TILE_DIM * kr + row, col) = kt::convert<T>(w.x * 0.25f);
                *table[1].ptr(kt::TILE_DIM * kr + row, col) = kt::convert<T>(w.y * 0.25f);
            }
        };
        // M_k_r[k_p, p] = w_16^(k_p p) w_L^(16 k_r p) / 4 = w_L^((L / 16 k_p + 16 k_r) p) / 4.
        fill(tab.f2, [](int kr, int kp, int p) { return ((L / 16) * kp + 16 * kr) * p; });
        // N_k_r[q, k_q] = w_L^(k_r q) w_16^(q k_q) / 4 = w_L^((k_r + L / 16 k_q) q) / 4.
        fill(tab.f3, [](int kr, int q, int kq) { return (kr + (L / 16) * kq) * q; });
    }
}

// R = 16: rows R/2 .. 15 of an input tile are F1's zero padding (K = 8 padded to 16); no load
// touches them, and the output staging writes zeros there.
template <typename C>
__device__ __forceinline__ void zero_padding_rows(typename C::seq_tile& tile, int thread) {
    if constexpr (C::XR > C::HALF) {
        constexpr int chunks = (C::XR - C::HALF) * C::PQ * int(sizeof(typename C::dtype)) / 16;
        for (int c = thread; c < chunks; c += C::THREADS) {
            const int e = (c % chunks) * 8;
            *reinterpret_cast<uint4*>(tile.ptr(C::HALF + e / C::PQ, e % C::PQ)) = make_uint4(0, 0, 0, 0);
        }
    }
}

// F_16 / 4 as an A operand (F2, G2) and, being symmetric, the same registers renamed as a
// B operand (F3, G3).
template <typename C>
struct F16 {
    complex_tile<typename C::sub16> a;
    complex_tile<typename C::sub16_b> b;
    __device__ __forceinline__ F16() {
        fill_complex(a, [&](int row, int col) {
            const float2 w = unit_root(row * col, 16);
            return make_float2(w.x * 0.25f, w.y * 0.25f);
        });
        kt::transpose_sep(b.re, a.re);
        kt::transpose_sep(b.im, a.im);
    }
    // From a shared copy (store_f16's), for a kernel that loads it for each phase 2 rather than
    // keep its 16 registers through the other phases.
    template <typename ST>
    __device__ __forceinline__ explicit F16(const ST (&shared)[2]) {
        kt::load(a.re, shared[0]);
        kt::load(a.im, shared[1]);
        kt::load(b.re, shared[0]);  // ldmatrix.trans: F_16 is symmetric
        kt::load(b.im, shared[1]);
    }
    template <typename ST>
    __device__ __forceinline__ void store(ST (&shared)[2]) const {
        kt::store(shared[0], a.re);
        kt::store(shared[1], a.im);
    }
};

// An fp32 tile into a frequency buffer (or the output staging) as 16-bit values: stmatrix where
// the GPU has it, pair stores for a configuration that asks for them (PAIR_STORES).
template <typename C, typename RT, typename Addr>
__device__ __forceinline__ void store_frequency_tile(const RT& src, Addr&& addr) {
    if constexpr (requires { requires C::PAIR_STORES; }) store_to<typename C::dtype>(src, addr);
    else store_tile_to<typename C::dtype>(src, addr);
}

// T2's twiddles w_256^(k_p q) at this lane's fragment of a 16 x 16 tile, the same for every k_r:
// read once for a tile's T2 and T2* (or once for all of a warp's tiles) rather than per use.
struct twiddle2_fragment {
    float4 v[4];
    __device__ __forceinline__ explicit twiddle2_fragment(const float4* table) {
        const int lane = kt::lane_id();
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = table[k * kt::WARP_THREADS + lane];
    }
};

// Tile k_r (rows 16 k_r ..) of a folded configuration's per-k_r matrix table (f2 or f3, re and
// im) as a register tile of RT's layout, its registers in the order of the mma operand USE.
template <typename RT, kt::mma_operand USE = kt::natural_operand<RT>, typename ST>
__device__ __forceinline__ complex_tile<RT> matrix_tile(ST (&table)[2], int kr) {
    complex_tile<RT> t;
    kt::load<USE>(t.re, kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(table[0], kr, 0));
    kt::load<USE>(t.im, kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(table[1], kr, 0));
    return t;
}

// Phase 1 for columns (p, *): F1 and T1 of the pair's sequence x (re, im) into buf.
template <typename C>
__device__ __forceinline__ void phase1(typename C::Tables& tab, typename C::seq_tile (&x)[2],
                                       typename C::buffer (&buf)[2], int p) {
    using T = typename C::dtype;
    constexpr int R = C::R, XR = C::XR;
    const int lane = kt::lane_id();
    complex_tile<kt::rt<T, XR, kt::TILE_DIM, kt::col_l>> xb;
    kt::rt<T, XR, kt::TILE_DIM, kt::col_l> x_neg;
    kt::load(xb.re, kt::subtile<XR, kt::TILE_DIM>(x[0], 0, p));
    kt::load(xb.im, kt::subtile<XR, kt::TILE_DIM>(x[1], 0, p));
    negate(x_neg, xb.im);
    complex_tile<kt::rt<T, R, XR>> a1;
    kt::load(a1.re, tab.fr[0]);
    kt::load(a1.im, tab.fr[1]);
    complex_tile<kt::rt_fl<R, kt::TILE_DIM>> acc;
    kt::zero(acc.re);
    kt::zero(acc.im);
    cmma(acc, a1, xb, x_neg);
    // T1 = w_L^(k_r q) w_L^(16 k_r p): the first from the fragment-order table, the second one
    // value per row (this p); folded, in F2's and F3's matrices.
    if constexpr (!folds_twiddles<C>) {
        kt::for_each_pair(acc.re, [&](int ti, int, int k, float2& re) {
            const float2 c = tab.twiddle_p[(ti * kt::TILE_DIM + 8 * (k % 2) + lane / 4) * C::P + p];
            const float4 v = tab.twiddle_frag[(ti * 4 + k) * kt::WARP_THREADS + lane];
            cmul_pair<false>(re, acc.im.tiles[ti][0].data[k], complex_product(make_float2(v.x, v.y), c),
                             complex_product(make_float2(v.z, v.w), c));
        });
    }
    const uint32_t re = buf[0].base(), im = buf[1].base();
    store_frequency_tile<C>(acc.re, [&](int row, int col) { return re + C::buffer::offset(row, p, col); });
    store_frequency_tile<C>(acc.im, [&](int row, int col) { return im + C::buffer::offset(row, p, col); });
}

// Phase 2, forward: acc = spectrum tile k_r (rows k_p, cols k_q, fp32) of the pair in buf:
// F2, T2, F3.
// `slot` is the tile's index in buf (k_r, or its place in a buffer of part of the k_r; k_r in a
// folded configuration).
template <typename C, typename Buf>
__device__ __forceinline__ void tile_forward(complex_tile<typename C::acc16>& acc, const F16<C>& f16,
                                             typename C::Tables& tab, Buf (&buf)[2], int slot,
                                             const twiddle2_fragment& t2) {
    using sub16 = typename C::sub16;
    using sub16_b = typename C::sub16_b;
    const uint32_t re = buf[0].base(), im = buf[1].base();
    complex_tile<sub16_b> yb;
    sub16_b yb_neg;
    load_from(yb.re, [&](int row, int col) { return re + Buf::offset(slot, row, col); });
    load_from(yb.im, [&](int row, int col) { return im + Buf::offset(slot, row, col); });
    negate(yb_neg, yb.im);
    kt::zero(acc.re);
    kt::zero(acc.im);
    if constexpr (folds_twiddles<C>) {
        cmma(acc, matrix_tile<sub16>(tab.f2, slot), yb, yb_neg);  // F2 and T1's p part (M_k_r): rows k_p, cols q
    } else {
        cmma(acc, f16.a, yb, yb_neg);  // F2: rows k_p, cols q
    }
    cmul_values(acc, [&](int, int k) { return t2.v[k]; });  // T2
    complex_tile<sub16> z;
    sub16 z_neg;
    kt::copy(z.re, acc.re);
    kt::copy(z.im, acc.im);
    negate(z_neg, z.im);
    kt::zero(acc.re);
    kt::zero(acc.im);
    if constexpr (folds_twiddles<C>) {
        // F3 and T1's q part (N_k_r): rows k_p, cols k_q
        cmma_neg_a(acc, z, z_neg, matrix_tile<sub16_b>(tab.f3, slot));
    } else {
        cmma_neg_a(acc, z, z_neg, f16.b);  // F3: rows k_p, cols k_q
    }
}

// w_L^(k_r q) and w_L^(k_r (q + 1)) for an even q: from the row-major table where the
// configuration has one, else from the fragment-order one (the same values). Either way a warp
// (one k_r, its lanes' q) reads 4 float4s per access.
template <typename C>
__device__ __forceinline__ float4 twiddle_at(const typename C::Tables& tab, int kr, int q) {
    if constexpr (requires { tab.twiddle_rows; }) {
        return tab.twiddle_rows[kr * (C::Q / 2) + q / 2];
    } else {
        const int k = (kr % kt::TILE_DIM) / 8 + 2 * (q / 8), lane = (kr % 8) * 4 + (q % 8) / 2;
        return tab.twiddle_frag[((kr / kt::TILE_DIM) * 4 + k) * kt::WARP_THREADS + lane];
    }
}

// Phase 2, inverse: the spectrum tile z (16-bit) of k_r back into tile `slot` of buf: G3, T2*,
// G2, T1*. The tile is overwritten in place: the caller's warp read it (tile_forward) in this phase.
template <typename C, typename Buf>
__device__ __forceinline__ void tile_inverse(const complex_tile<typename C::sub16>& z, const F16<C>& f16,
                                             typename C::Tables& tab, Buf (&buf)[2], int kr, int slot,
                                             const twiddle2_fragment& t2) {
    using T = typename C::dtype;
    using sub16 = typename C::sub16;
    using sub16_b = typename C::sub16_b;
    using acc16 = typename C::acc16;
    sub16 z_neg;
    negate(z_neg, z.re);
    complex_tile<acc16> acc;
    kt::zero(acc.re);
    kt::zero(acc.im);
    if constexpr (folds_twiddles<C>) {
        // G3 and T1*'s q part (which commutes with T2*): conj(N_k_r^T), N_k_r loaded as a row-layout
        // tile (its registers in B^T's order) and renamed as the col-layout tile of its transpose.
        const complex_tile<sub16> n = matrix_tile<sub16, kt::mma_operand::b>(tab.f3, kr);
        complex_tile<sub16_b> nt;
        kt::transpose_sep(nt.re, n.re);
        kt::transpose_sep(nt.im, n.im);
        cmma_conj_b(acc, z, z_neg, nt);  // rows k_p, cols q
    } else {
        cmma_conj_b(acc, z, z_neg, f16.b);  // G3: rows k_p, cols q
    }
    cmul_values<true>(acc, [&](int, int k) { return t2.v[k]; });  // T2*
    complex_tile<sub16> v;
    kt::copy(v.re, acc.re);
    kt::copy(v.im, acc.im);
    complex_tile<sub16_b> vb;  // G2 sums over k_p: the rows, so a B operand
    sub16_b vb_neg;
    kt::swap_layout(vb.re, v.re);
    kt::swap_layout(vb.im, v.im);
    negate(vb_neg, vb.re);
    kt::zero(acc.re);
    kt::zero(acc.im);
    if constexpr (folds_twiddles<C>) {
        // G2 and T1*'s p part: conj(M_k_r^T), M_k_r loaded transposed (a col-layout A operand).
        cmma_conj_a(acc, matrix_tile<sub16_b, kt::mma_operand::a>(tab.f2, kr), vb, vb_neg);  // rows p, cols q
    } else {
        cmma_conj_a(acc, f16.a, vb, vb_neg);  // G2: rows p, cols q
        kt::for_each_pair(acc.re, [&](int, int, int k, float2& re) {  // T1*: conj w_L^(k_r (q + 16 p))
            const int row = acc16::row_in_base(k, 0), col = acc16::col_in_base(k, 0);
            const float2 c = tab.twiddle_p[kr * C::P + row];
            const float4 w = twiddle_at<C>(tab, kr, col);
            cmul_pair<true>(re, acc.im.tiles[0][0].data[k], complex_product(make_float2(w.x, w.y), c),
                            complex_product(make_float2(w.z, w.w), c));
        });
    }
    // Each lane stores into rows that other lanes' ldmatrix read in tile_forward, so those
    // reads must be done first (a write-after-read within the warp).
    __syncwarp();
    const uint32_t re = buf[0].base(), im = buf[1].base();
    store_frequency_tile<C>(acc.re, [&](int row, int col) { return re + Buf::offset(slot, row, col); });
    store_frequency_tile<C>(acc.im, [&](int row, int col) { return im + Buf::offset(slot, row, col); });
}

// Phase 3 for columns (p, *): acc[r, q] = sum_k_r conj(F_R[r, k_r]) buf[k_r, p, q] / sqrt(R)
// for r < XR (rows r >= R/2 are exact zeros: g1's are).
template <typename C>
__device__ __forceinline__ void phase3(complex_tile<typename C::column_acc>& acc, typename C::Tables& tab,
                                       typename C::buffer (&buf)[2], int p) {
    using T = typename C::dtype;
    constexpr int R = C::R, XR = C::XR;
    complex_tile<kt::rt<T, R, kt::TILE_DIM, kt::col_l>> ub;
    kt::rt<T, R, kt::TILE_DIM, kt::col_l> ub_neg;
    const uint32_t re = buf[0].base(), im = buf[1].base();
    load_from(ub.re, [&](int row, int col) { return re + C::buffer::offset(row, p, col); });
    load_from(ub.im, [&](int row, int col) { return im + C::buffer::offset(row, p, col); });
    negate(ub_neg, ub.re);
    complex_tile<kt::rt<T, R, XR, kt::col_l>> g1;  // K = k_r, M = r
    if constexpr (folds_twiddles<C>) {
        // Registers in mma's A order: no moves before the products. The unfolded kernels keep the
        // plain load: the R = 16 filter gradient measured slower with this one (its schedule
        // moved; docs/performance.md).
        kt::load<kt::mma_operand::a>(g1.re, tab.fr[0]);
        kt::load<kt::mma_operand::a>(g1.im, tab.fr[1]);
    } else {
        kt::load(g1.re, tab.fr[0]);
        kt::load(g1.im, tab.fr[1]);
    }
    kt::zero(acc.re);
    kt::zero(acc.im);
    cmma_conj_a(acc, g1, ub, ub_neg);
}

// The frequency at complex position c of the spectrum in phase 2's order: tile k_r at 256 k_r,
// inside it the fragment order of a 16 x 16 row-layout tile (rows k_p, cols k_q), element
// (8 rh + rl, 8 ch + 2 cm + e) at ((ch * 2 + rh) * 32 + rl * 4 + cm) * 2 + e, so cmul_spectrum_tile
// reads a tile as 16-byte chunks, 512 contiguous bytes per warp access.
template <typename C>
__host__ __device__ constexpr int spectrum_frequency(int c) {
    const int kr = c >> 8, e = c & 1, cm = (c >> 1) & 3, rl = (c >> 3) & 7, rh = (c >> 6) & 1, ch = (c >> 7) & 1;
    return kr + C::R * (8 * rh + rl) + C::R * C::P * (8 * ch + 2 * cm + e);
}

// Every frequency has exactly one position (checked at compile time for each configuration).
template <typename C>
constexpr bool spectrum_order_is_a_permutation() {
    bool seen[C::L] = {};
    for (int c = 0; c < C::L; c++) {
        const int f = spectrum_frequency<C>(c);
        if (f < 0 || f >= C::L || seen[f]) return false;
        seen[f] = true;
    }
    return true;
}

// Position c of phase 2's order is in register (c / 64) % 4 of its lane's fragment (float4 c / 2
// = (k_r * 4 + k) * 32 + lane): registers 2 and 3 hold exactly the positions with f > L/2 (and
// f = L/2), which spectrum_signs relies on.
template <typename C>
constexpr bool upper_half_is_registers_2_and_3() {
    for (int c = 0; c < C::L; c++) {
        const int f = spectrum_frequency<C>(c), k = (c / 64) % 4;
        if ((f > C::L / 2 && k < 2) || (f < C::L / 2 && k >= 2)) return false;
    }
    return true;
}

// The spectrum slots hold K[min(f, L - f)] at each position f (conjugated for the correlation):
// what a gather copies, with no pass over the slot to fix signs. A reader conjugates it where
// f > L/2 (a real filter's K[f] = conj(K[L - f])): in phase 2's order that is register k >= 2 of
// a lane's fragment (columns k_q >= 8); f = L/2 itself, also there, has a real K.
__device__ __forceinline__ float4 spectrum_signs(float4 v, int k) {
    return k >= 2 ? make_float4(v.x, -v.y, v.z, -v.w) : v;
}

// cmul_values by a spectrum tile in phase 2's fragment order (all of a configuration's tiles kept).
template <typename RT>
__device__ __forceinline__ void cmul_spectrum_tile(complex_tile<RT>& a, const float4* tile) {
    const int lane = kt::lane_id();
    cmul_values(a, [&](int i, int k) { return spectrum_signs(tile[(i * 4 + k) * kt::WARP_THREADS + lane], k); });
}

// K at spectrum tile kr for register k of this lane's fragment of a 16 x 16 accumulator: (re,
// im, re, im) of its two columns. `load(i)` reads float4 i of the stored tiles 0 .. R/2 (phase
// 2's order); a tile from R/2 on is the stored tile R - kr read backwards (see the top of
// three_factor_large.cuh; tile R/2 is its own mirror), the same K[min(f, L - f)]. With
// k_r = warp + WARPS j the choice is then fixed for each j where the compiler knows warp < WARPS.
template <typename C, typename Load>
__device__ __forceinline__ float4 stored_tile_value(int kr, int k, Load&& load) {
    const int lane = kt::lane_id();
    if (kr < C::R / 2) return spectrum_signs(load((kr * 4 + k) * kt::WARP_THREADS + lane), k);
    const float4 m = load(((C::R - kr) * 4 + 3 - k) * kt::WARP_THREADS + (kt::WARP_THREADS - 1 - lane));
    return spectrum_signs(make_float4(m.z, m.w, m.x, m.y), k);  // columns c, c + 1
}

// The gathers' order: unit u (a thread's i-th one is thread + i * THREADS) copies position
// gathered_position(u), so lanes take 4 consecutive tiles (k_r .. k_r + 3, at f .. f + 3: one or
// two 32-byte sectors of K) at 8 consecutive positions of a tile, where lanes on consecutive
// positions of one tile read a sector each for 8 bytes. Units past the last group of
// SECTOR_TILES tiles give positions past it.
//
// SECTOR_TILES consecutive tiles' values at one position are consecutive frequencies, which
// share a 32-byte sector of K.
inline constexpr int SECTOR_TILES = 32 / int(sizeof(float2));

template <typename C>
__host__ __device__ constexpr int gathered_position(int unit) {
    constexpr int PQ = C::PQ;
    return (unit / (SECTOR_TILES * PQ) * SECTOR_TILES + unit % SECTOR_TILES) * PQ + (unit / SECTOR_TILES) % PQ;
}

template <typename C, int COUNT>
inline constexpr int gather_units = (COUNT + SECTOR_TILES * C::PQ - 1) / (SECTOR_TILES * C::PQ) * SECTOR_TILES * C::PQ;

// Every position c < COUNT is gathered by exactly one unit.
template <typename C, int COUNT>
constexpr bool gathers_cover_each_position_once() {
    int seen[COUNT] = {};
    for (int u = 0; u < gather_units<C, COUNT>; u++) {
        const int c = gathered_position<C>(u);
        if (c < COUNT) seen[c]++;
    }
    for (int c = 0; c < COUNT; c++)
        if (seen[c] != 1) return false;
    return true;
}

// f(c) for each spectrum position c < COUNT that this thread gathers.
template <typename C, int COUNT, typename F>
__device__ __forceinline__ void for_gathered_positions(int thread, F&& f) {
    static_assert(gathers_cover_each_position_once<C, COUNT>());
    constexpr int UNITS = gather_units<C, COUNT>;
    // Rolled: unrolled, the compiler hoists every iteration's offsets out of the task loop and
    // the forwards spill.
#pragma unroll 1
    for (int i = 0; i < (UNITS + C::THREADS - 1) / C::THREADS; i++) {
        const int unit = thread + i * C::THREADS;
        const int c = gathered_position<C>(unit);
        // A unit past the last group gives c >= UNITS >= COUNT; every unit is a position in range
        // where the units are the positions and fill the threads' iterations.
        if ((COUNT == UNITS && UNITS % C::THREADS == 0) || c < COUNT) f(c);
    }
}

// cp.async of head h's spectrum into `slot` in phase 2's order: K[min(f, L - f)] at each position
// f (see spectrum_signs). COUNT: the first COUNT positions (tiles k_r < COUNT / 256) only.
template <typename C, typename T, int COUNT = C::L>
__device__ __forceinline__ void gather_spectrum_async(float4* slot, const Args<T>& a, int h, int thread) {
    constexpr int L = C::L;
    float2* dst = reinterpret_cast<float2*>(slot);
    const float2* src = a.spectrum + int64_t(h) * (L / 2 + 1);
    for_gathered_positions<C, COUNT>(thread, [&](int c) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(kt::shared_address(dst + c)),
                     "l"(src + half_spectrum_index<L>(spectrum_frequency<C>(c)))
                     : "memory");
    });
}

// For the correlation, after this thread's gather_spectrum_async landed: conj(K) at the positions
// it gathered.
template <typename C, int COUNT = C::L>
__device__ __forceinline__ void conjugate_gathered(float4* slot, int thread) {
    float2* v = reinterpret_cast<float2*>(slot);
    for_gathered_positions<C, COUNT>(thread, [&](int c) { v[c].y = -v[c].y; });
}

// How many of the spectrum's positions a configuration keeps (the first ones, in phase 2's order).
template <typename C>
constexpr int stored_positions() {
    if constexpr (requires { C::SPECTRUM_POSITIONS; }) return C::SPECTRUM_POSITIONS;
    else return C::L;
}

// A block's copy of the filter's spectrum through its tasks, in a shared-memory slot in phase 2's
// order: gathered right after the first task's input, conjugated for the correlation once it has
// landed, and gathered again for the next head once every warp's last read of the slot for a head is done.
// The cp.async groups in flight are [task t's input][the spectrum] or [task t's input].
template <typename C, typename T>
struct spectrum_slot {
    static constexpr int COUNT = stored_positions<C>();
    float4* values;
    bool pending;  // a gather in flight, not yet waited for

    // Call after committing the first task's input (of head h).
    __device__ __forceinline__ spectrum_slot(float4* slot, const Args<T>& a, int h, int thread)
        : values(slot), pending(true) {
        gather_spectrum_async<C, T, COUNT>(values, a, h, thread);
        kt::cp_async_commit();
    }
    // This thread's loads of the current task's input have landed (the spectrum may still land).
    __device__ __forceinline__ void wait_for_input() const {
        if (pending) kt::cp_async_wait<1>();
        else kt::cp_async_wait<0>();
    }
    // After the next task's input was committed: this thread's part of the spectrum landed (and is
    // conjugated for the correlation; a barrier before phase 2 makes it visible).
    __device__ __forceinline__ void settle(const Args<T>& a, int thread) {
        if (!pending) return;
        kt::cp_async_wait<1>();
        if (a.conjugate) conjugate_gathered<C, COUNT>(values, thread);
        pending = false;
    }
    // After the barrier that ends task t's phase 2: the next head's spectrum, where task t + 1
    // starts one.
    __device__ __forceinline__ void refill_after(const Args<T>& a, const Tasks& tasks, int t, task_position task,
                                                 int thread) {
        if (t + 1 < tasks.last && task.pair + 1 == a.pairs) {
            gather_spectrum_async<C, T, COUNT>(values, a, task.h + 1, thread);
            kt::cp_async_commit();
            pending = true;
        }
    }
};

// f(p) for the columns p = warp + WARPS j that this warp owns in phases 1 and 3.
template <typename C, typename F>
__device__ __forceinline__ void for_each_column(int warp, F&& f) {
#pragma unroll
    for (int j = 0; j < C::P_PER_WARP; j++) f(warp + C::WARPS * j);
}

// 16 warps per SM at 128 registers each: one block of 16 or two of 8.
//
// STAGED_POSTGATE (a postgate given, and room for it): the pair's postgates come through shared
// memory, a cp.async group issued at the top of the task and waited for before phase 3, instead
// of global loads in phase 3 whose latency nothing else covered there. A separate instantiation,
// so that the kernels without one keep their schedule. The op runs it where it holds as many
// blocks per SM as the kernel without the stage (fftconv_sm80.cu): 8 warps of it then run alone
// on an SM (a pregate's stages already take half of it), so they may take more registers (at
// 128 they spilled).
template <typename T, int R, int WARPS, bool FOLDED, bool STAGED_POSTGATE = false>
__global__ void __launch_bounds__(ThreeFactor<T, R, WARPS>::THREADS, STAGED_POSTGATE ? 1 : 16 / WARPS)
    three_factor_forward(const __grid_constant__ Args<T> a) {
    using C = ThreeFactor<T, R, WARPS, FOLDED>;
    static_assert(spectrum_order_is_a_permutation<C>() && upper_half_is_registers_2_and_3<C>());
    constexpr int N = C::N, HALF = C::HALF, XR = C::XR, PQ = C::PQ, Q = C::Q;
    constexpr int THREADS = C::THREADS;
    extern __shared__ char smem[];
    shared_carver carve(smem);
    auto& s = carve.allocate<typename C::Shared>();
    typename C::PreStages* pre = a.pregate != nullptr ? &carve.allocate<typename C::PreStages>() : nullptr;
    typename C::PostStage* post_stage = nullptr;
    if constexpr (STAGED_POSTGATE) post_stage = &carve.allocate<typename C::PostStage>();
    const int warp = kt::warp_id(), thread = threadIdx.x;
    if constexpr (FOLDED) __builtin_assume(warp < WARPS);  // phase 2 then knows which spectrum tiles are mirrored
    const Tasks tasks = tasks_of(a);
    if (tasks.first >= tasks.last) return;

    auto issue_loads = [&](task_position task, int stage) {
        load_task_inputs_async<THREADS, N>(s.stage[stage].x, pre != nullptr ? (*pre)[stage] : nullptr, a, task, thread);
    };
    task_position task(tasks.first, a.pairs);
    issue_loads(task, 0);
    kt::cp_async_commit();
    spectrum_slot<C, T> spectrum(s.spectrum, a, task.h, thread);

    for (int i = 0; i < C::STAGES; i++) {
        zero_padding_rows<C>(s.stage[i].x[0], thread);
        zero_padding_rows<C>(s.stage[i].x[1], thread);
    }
    init_tables<C>(s.tab, thread);
    const F16<C> f16;
    __syncthreads();  // the tables
    // T2's twiddles, held through the task loop where T1 is folded; the full layout, which holds
    // F16 instead, spills with them and reads them where each of phase 2's passes uses them.
    const twiddle2_fragment t2_held(s.tab.twiddle2);
    for (int i = 0, t = tasks.first; t < tasks.last; i++, t++, task = task.next(a.pairs)) {
        const int h = task.h, pair = task.pair;
        auto& st = s.stage[i % C::STAGES];
        spectrum.wait_for_input();
        if (pre != nullptr) {
            apply_gate<THREADS, N>(st.x[0], (*pre)[i % C::STAGES][0], thread);
            apply_gate<THREADS, N>(st.x[1], (*pre)[i % C::STAGES][1], thread);
        }
        __syncthreads();  // task t's input visible; every warp is done with task t - 1
        if constexpr (STAGED_POSTGATE) {  // a group older than the next task's input
            load_postgates_async<THREADS, N>(*post_stage, a, h, pair, thread);
            kt::cp_async_commit();
        }
        if (t + 1 < tasks.last) issue_loads(task.next(a.pairs), (i + 1) % C::STAGES);
        kt::cp_async_commit();

        for_each_column<C>(warp, [&](int p) { phase1<C>(s.tab, st.x, s.buf, p); });
        spectrum.settle(a, thread);
        __syncthreads();

        // Phase 2 in two passes over the warp's tiles, every forward before any inverse: an
        // inverse ends in stores to shared memory, which the next tile's loads cannot move above
        // (the compiler cannot tell the addresses apart), so tile by tile the next tile's chain of
        // dependent products could not start until the last one's had ended.
        complex_tile<typename C::sub16> spectra[C::KR_PER_WARP];  // 16-bit, for G3
#pragma unroll
        for (int j = 0; j < C::KR_PER_WARP; j++) {
            const int kr = warp + WARPS * j;
            complex_tile<typename C::acc16> acc;
            const twiddle2_fragment t2 = FOLDED ? t2_held : twiddle2_fragment(s.tab.twiddle2);
            tile_forward<C>(acc, f16, s.tab, s.buf, kr, t2);
            if constexpr (FOLDED) {  // times the filter's spectrum
                cmul_values(acc, [&](int, int k) {
                    return stored_tile_value<C>(kr, k, [&](int i) { return s.spectrum[i]; });
                });
            } else {
                cmul_spectrum_tile(acc, s.spectrum + kr * (PQ / 2));
            }
            kt::copy(spectra[j].re, acc.re);
            kt::copy(spectra[j].im, acc.im);
        }
#pragma unroll
        for (int j = 0; j < C::KR_PER_WARP; j++) {
            const int kr = warp + WARPS * j;
            const twiddle2_fragment t2 = FOLDED ? t2_held : twiddle2_fragment(s.tab.twiddle2);
            tile_inverse<C>(spectra[j], f16, s.tab, s.buf, kr, kr, t2);
        }
        // This thread's postgate chunks (the next task's input may still be in flight), then,
        // past the barrier, everyone's.
        if constexpr (STAGED_POSTGATE) kt::cp_async_wait<1>();
        __syncthreads();
        spectrum.refill_after(a, tasks, t, task, thread);

        const Pair<const T> post = a.pair_of(a.postgate, a.post_stride_b, a.post_stride_h, pair, h);
        const Pair<T> out = a.pair_of(a.y, a.y_stride_b, a.y_stride_h, pair, h);
        for_each_column<C>(warp, [&](int p) {
            complex_tile<typename C::column_acc> acc;
            phase3<C>(acc, s.tab, s.buf, p);
            if constexpr (STAGED_POSTGATE) {
                apply_staged_postgate(acc, *post_stage, a.seqlen, 0, Q * p);
            } else if (a.postgate != nullptr) {
                apply_postgate(acc, post.seq[0], post.seq[1], a.seqlen,
                               [&](int row, int col) { return row * PQ + Q * p + col; });
            }
            // Staged in this stage's input tiles (free since F1) for 16-byte stores; rows >= R/2
            // are exact zeros, which R = 16 needs in its padding rows.
            kt::store(kt::subtile<XR, kt::TILE_DIM>(st.x[0], 0, p), acc.re);
            kt::store(kt::subtile<XR, kt::TILE_DIM>(st.x[1], 0, p), acc.im);
            __syncwarp();
            for (int j = 0; j < 2; j++)
                if (out.seq[j] != nullptr) warp_store_sequence<HALF, kt::TILE_DIM>(out.seq[j], a.seqlen, st.x[j], 0, Q * p);
        });
    }
    kt::cp_async_wait<0>();
}

// The filter's gradient (see two_factor_filter_grad): per head, S = sum over the pairs of
// fft(dy pair) * conj(fft(u pair)) in fp32 registers (each warp its k_r tiles), then one
// inverse transform whose real part is added into grad. GATED: as two_factor_filter_grad's.
template <typename T, int R, int WARPS, bool GATED = false>
__global__ void __launch_bounds__(ThreeFactor<T, R, WARPS>::THREADS, 1)
    three_factor_filter_grad(const __grid_constant__ Args<T> a) {
    using C = ThreeFactor<T, R, WARPS>;
    constexpr int L = C::L, N = C::N, HALF = C::HALF, PQ = C::PQ, Q = C::Q;
    constexpr int THREADS = C::THREADS, KR_PER_WARP = C::KR_PER_WARP;
    extern __shared__ char smem[];
    shared_carver carve(smem);
    auto& s = carve.allocate<typename C::GradShared>();
    const grad_inputs<C, GATED> inputs(s.stage, carve);
    const int warp = kt::warp_id(), thread = threadIdx.x;
    const Tasks tasks = tasks_of(a);
    if (tasks.first >= tasks.last) return;

    auto issue_loads = [&](int t, int stage) { inputs.issue(a, t, stage, thread); };
    issue_loads(tasks.first, 0);
    kt::cp_async_commit();
    for (int i = 0; i < C::STAGES; i++)
        for (int j = 0; j < 2; j++) {
            zero_padding_rows<C>(s.stage[i].x[j], thread);
            zero_padding_rows<C>(s.stage[i].d[j], thread);
        }
    init_tables<C>(s.tab, thread);
    const F16<C> f16;

    complex_tile<typename C::acc16> sum[KR_PER_WARP];
#pragma unroll
    for (int j = 0; j < KR_PER_WARP; j++) {
        kt::zero(sum[j].re);
        kt::zero(sum[j].im);
    }
    for (int i = 0, t = tasks.first; t < tasks.last; i++, t++) {
        const int h = t / a.pairs;
        auto& st = s.stage[i % C::STAGES];
        kt::cp_async_wait<0>();
        inputs.apply_gates(a, i % C::STAGES, thread);
        __syncthreads();  // task t's input visible; every warp is done with task t - 1
        if (t + 1 < tasks.last) issue_loads(t + 1, (i + 1) % C::STAGES);
        kt::cp_async_commit();

#pragma unroll
        for (int j = 0; j < C::P_PER_WARP; j++) {
            phase1<C>(s.tab, st.x, s.bu, warp + WARPS * j);
            phase1<C>(s.tab, st.d, s.bd, warp + WARPS * j);
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < KR_PER_WARP; j++) {
            const int kr = warp + WARPS * j;
            complex_tile<typename C::acc16> spectrum_u, spectrum_d;
            const twiddle2_fragment t2(s.tab.twiddle2);
            tile_forward<C>(spectrum_u, f16, s.tab, s.bu, kr, t2);
            tile_forward<C>(spectrum_d, f16, s.tab, s.bd, kr, t2);
            cmac_conj(sum[j], spectrum_d, spectrum_u);
        }
        if (t + 1 < tasks.last && (t + 1) % a.pairs != 0) continue;

        // The head's last task in this block: its share of the gradient. Uniform over the block.
        const float scale = inverse_of_sums<typename C::sub16, WARPS>(
            sum, s.scratch, [&](complex_tile<typename C::sub16>& z, int j) {
                tile_inverse<C>(z, f16, s.tab, s.bu, warp + WARPS * j, warp + WARPS * j, twiddle2_fragment(s.tab.twiddle2));
            });
        __syncthreads();
        const float out_scale = sqrtf(float(L)) / scale;  // see two_factor_filter_grad
        float* grad = a.grad + int64_t(h) * a.seqlen;
#pragma unroll
        for (int jp = 0; jp < C::P_PER_WARP; jp++) {
            const int p = warp + WARPS * jp;
            complex_tile<typename C::column_acc> acc;
            phase3<C>(acc, s.tab, s.bu, p);
            add_to_grad(grad, acc.re, out_scale, a.seqlen,
                        [&](int row, int col) { return row < HALF ? row * PQ + Q * p + col : -1; });
        }
    }
    kt::cp_async_wait<0>();
}

}  // namespace
}  // namespace tk::fftconv
