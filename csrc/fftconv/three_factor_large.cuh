// Three factors for the long FFTs: L = R x 16 x 16 with R = 64 (L = 16384, N = 8192) and R = 128
// (L = 32768, N = 16384), the steps of three_factor.cuh (F1, T1; per k_r the 16 x 16 FFTs, the
// filter, and back; G1), laid out so that a pair of sequences fits one block's shared memory:
//
// - One buffer. The pair's frequency tiles (R x 256 complex 16-bit: 64 KiB at R = 64, 128 KiB at
//   R = 128) are also where its input lands and its output is staged: column p of the buffer
//   (every k_r at that p) belongs to one warp in phases 1 and 3, so x[r, p, :] arrives in rows
//   r < R/2 of column p (the pregate in rows R/2 .. R - 1), F1 reads the column into registers
//   and overwrites it, and G1's result goes back into rows r < R/2 of the column on its way to
//   global memory. The next pair's input is issued into a column as soon as its warp has stored
//   the column's output. The cost: no prefetch of a whole pair ahead (a separate input stage,
//   and its pregate, would not fit beside the spectrum).
// - Half the spectrum. The filter is real, so K[L - f] = conj(K[f]); with f = k_r + R k_p +
//   16 R k_q that maps tile k_r to tile R - k_r read backwards ((k_p, k_q) -> (15 - k_p,
//   15 - k_q)). Tiles 0 .. R/2 are kept, in phase 2's fragment order; a tile past R/2 reads its
//   mirror: in fragment order lane 31 - lane, register 3 - k, the pair's two values swapped
//   (stored_tile_value; a slot holds K[min(f, L - f)] and its reader conjugates it above L/2,
//   spectrum_signs), still 512 contiguous bytes per warp access. At R = 64 they
//   are gathered into shared memory (66 KiB in fp32) when the head changes; at R = 128 (133 KiB
//   beside 128 KiB of tiles and 66 KiB of tables) a small kernel arranges them in global memory
//   before the convolution (arrange_spectrum), and phase 2 reads a tile's values into registers
//   from there (L2: a head's 133 KiB serve all of its pairs) before it transforms the tile.
// - F1 and G1 a 16 x 16 block of the DFT matrix at a time. The R x R/2 DFT matrix (64 registers
//   per lane for its real and imaginary parts at R = 64) is read from shared memory a block per
//   product, so phase 1 holds one input column and one 16 x 16 accumulator, phase 3 one 16-row
//   chunk of the column and the R/2 x 16 result.
//
// The filter gradient splits each head over R/32 blocks by frequency (PARTS): block part c
// transforms every pair of the head but computes and keeps only the k_r in [32 c, 32 c + 32)
// (F1's strips of those rows), accumulates their S = sum fft(dy) conj(fft(u)) in fp32 registers
// (32 tiles over 8 warps: 64 registers, as the 8-warp N = 4096 kernel), and at the head's end
// adds its part of G1's sum over k_r into grad (G1 is linear in the k_r; each part scales its
// own S to 16 bits). A part's buffer has R/2 rows per column, the input's, so the input lands in
// it as in the forward (at R = 128 the part's tiles use half of them).
#pragma once
#include "fftconv/three_factor.cuh"

namespace tk::fftconv {
namespace {

template <typename T, int R_, int WARPS_ = 16>
struct ThreeFactorLarge {
    using dtype = T;
    static constexpr bool THREE_FACTORS = true;
    static constexpr bool LARGE = true;
    static constexpr int R = R_, P = 16, Q = 16, PQ = P * Q, L = R * PQ, N = L / 2, HALF = R / 2;
    static constexpr int WARPS = WARPS_, THREADS = WARPS * kt::WARP_THREADS;
    static_assert(P % WARPS == 0 && R % WARPS == 0 && HALF % kt::TILE_DIM == 0);
    static constexpr int XR = HALF;                // F1's K (no padding rows: R >= 32)
    static constexpr int STRIPS = R / kt::TILE_DIM;  // F1's output rows, G1's K, in 16-row strips
    static constexpr int KR_PER_WARP = R / WARPS;  // phase 2: warp w owns k_r = w + WARPS j
    static constexpr int P_PER_WARP = P / WARPS;   // phases 1 and 3: warp w owns p = w + WARPS j
    static constexpr int STORED_TILES = R / 2 + 1;  // spectrum tiles 0 .. R/2
    static constexpr int STORED = STORED_TILES * PQ;  // their complex values
    // Where phase 2 reads them: shared memory, or global memory arranged by arrange_spectrum.
    static constexpr bool SPECTRUM_IN_SHARED = R <= 64;
    // At R = 128 the forward's 128 registers do not hold phases 1 and 3 (twice R = 64's
    // accumulators and inputs) beside F_16's 16: it reloads F_16 from shared memory for each
    // phase 2, and runs phase 2's k_r one at a time (unrolled, it spills).
    static constexpr bool F16_FROM_SHARED = R > 64;
    static constexpr int PHASE2_UNROLL = R <= 64 ? KR_PER_WARP : 1;
    // The R = 128 forward (16 warps, 128 registers) spills in its task loop with stmatrix's
    // stores (their runs' addresses live at once): pair stores there.
    static constexpr bool PAIR_STORES = R > 64 && WARPS == 16;
    using buffer = frequency_tiles<T, R>;
    using sub16 = kt::rt<T, kt::TILE_DIM, kt::TILE_DIM>;
    using sub16_b = kt::rt<T, kt::TILE_DIM, kt::TILE_DIM, kt::col_l>;
    using acc16 = kt::rt_fl<kt::TILE_DIM, kt::TILE_DIM>;
    using column_acc = kt::rt_fl<XR, kt::TILE_DIM>;  // phase 3's output: rows r, 16 columns q
    struct Tables {                      // once per block: ThreeFactor's
        kt::st<T, R, XR> fr[2];          // F_R[:, :R/2] / sqrt(R) (re, im)
        float4 twiddle_frag[R * Q / 2];  // w_L^(k_r q) in the fragment order of R x 16 tiles
        float4 twiddle2[PQ / 2];         // w_256^(k_p q), fragment order of a 16 x 16 tile
        float2 twiddle_p[R * P];         // w_L^(Q k_r p), row-major [k_r][p]
        kt::st<T, kt::TILE_DIM, kt::TILE_DIM> f16[2];  // F_16 / 4 (re, im) where F16_FROM_SHARED
    };

    struct SharedWithSpectrum {
        buffer buf[2];                           // re, im; input and output staging too
        float4 spectrum[STORED / 2];             // tiles 0 .. R/2, phase 2's fragment order
        Tables tab;
    };
    struct SharedWithoutSpectrum {
        buffer buf[2];
        Tables tab;
    };
    using Shared = std::conditional_t<SPECTRUM_IN_SHARED, SharedWithSpectrum, SharedWithoutSpectrum>;
    // Filter gradient: a block's part of the k_r, 32 of them.
    static constexpr int PART_ROWS = 32, PARTS = R / PART_ROWS, PART_STRIPS = PART_ROWS / kt::TILE_DIM;
    static constexpr int KR_PART_PER_WARP = PART_ROWS / WARPS;
    static_assert(PART_ROWS <= XR && PART_ROWS % WARPS == 0);
    using part_buffer = frequency_tiles<T, XR>;  // the input's rows; the part's tiles in the first PART_ROWS
    struct GradShared {
        part_buffer bu[2], bd[2];  // u's and dy's tiles of the part (re, im); their inputs too
        Tables tab;
        float scratch[WARPS];
    };
    // The pair's postgates, where staged (after Shared): rows r < R/2 of each column, loaded with
    // the column's input.
    using post_buffer = frequency_tiles<T, HALF>;
    using PostStage = post_buffer[2];
    static constexpr int shared_bytes = kt::shared_bytes_for<Shared>();
    static constexpr int pregate_bytes = 0;  // the pregate lands in the buffer
    static constexpr int postgate_bytes = kt::added_shared_bytes_for<PostStage>();
    static constexpr int grad_shared_bytes = kt::shared_bytes_for<GradShared>();
};

template <typename C>
inline constexpr bool is_large = requires { requires C::LARGE; };

// Whether C's forward reads the spectrum arranged in global memory (arrange_spectrum).
template <typename C>
inline constexpr bool reads_arranged_spectrum = requires { requires !C::SPECTRUM_IN_SHARED; };

__device__ __forceinline__ uint4 load_shared_16(uint32_t address) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(address));
    return v;
}

// Two 16-bit values (a packed pair) from shared memory.
template <typename Pk>
__device__ __forceinline__ Pk load_shared_pair(uint32_t address) {
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(address));
    return *reinterpret_cast<const Pk*>(&v);
}

__device__ __forceinline__ void store_shared_16(uint32_t address, const uint4& v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// f(j, r, h, e) for each 16-byte chunk of column p's rows r < HALF that this lane moves: sequence
// j (re 0, im 1), row r, columns q = 8 h .. 8 h + 7, sequence element e = 256 r + 16 p + 8 h. A
// warp's lanes cover the column's 4 HALF chunks, two lanes per 32-byte row piece.
template <int HALF, typename F>
__device__ __forceinline__ void for_column_chunks(int p, F&& f) {
    constexpr int CHUNKS = 2 * HALF * 2;
    static_assert(CHUNKS % kt::WARP_THREADS == 0);
    const uint32_t lane = uint32_t(kt::lane_id());
#pragma unroll
    for (int i = 0; i < CHUNKS / kt::WARP_THREADS; i++) {
        const uint32_t c = lane + uint32_t(i * kt::WARP_THREADS);
        const int j = int(c / (2 * HALF)), r = int((c / 2) % HALF), h = int(c % 2);
        f(j, r, h, uint32_t(r * 256 + 16 * p + 8 * h));
    }
}

// cp.async of elements x[r, p, :] (r < HALF) of the pair's sequences into rows row0 + r of column
// p of buf (re, im); elements at or past seqlen, or of a missing sequence, land as zeros.
// `fallback` is any valid global address (never read).
template <int HALF, typename Buf, typename T>
__device__ __forceinline__ void load_column_async(Buf (&buf)[2], const Pair<const T>& seq, int seqlen,
                                                  const void* fallback, int p, int row0) {
    const uint32_t base[2] = {buf[0].base(), buf[1].base()};
    for_column_chunks<HALF>(p, [&](int j, int r, int h, uint32_t e) {
        const bool in = seq.seq[j] != nullptr && e < uint32_t(seqlen);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(base[j] + Buf::offset(row0 + r, p, 8 * h)),
                     "l"(in ? static_cast<const void*>(seq.seq[j] + e) : fallback), "r"(in ? 16 : 0)
                     : "memory");
    });
}

// Rows r < HALF of column p *= rows HALF + r (the pregate), in the 16-bit type (one rounding of
// the exact product, as apply_gate), on the chunks this lane loaded: its own cp.async wait is
// enough.
template <int HALF, typename T, typename Buf>
__device__ __forceinline__ void gate_column(Buf (&buf)[2], int p) {
    using Pk = typename kt::packed_of<T>::type;
    const uint32_t base[2] = {buf[0].base(), buf[1].base()};
    for_column_chunks<HALF>(p, [&](int j, int r, int h, uint32_t) {
        const uint32_t x_at = base[j] + Buf::offset(r, p, 8 * h);
        uint4 x = load_shared_16(x_at);
        const uint4 g = load_shared_16(base[j] + Buf::offset(HALF + r, p, 8 * h));
        Pk* px = reinterpret_cast<Pk*>(&x);
        const Pk* pg = reinterpret_cast<const Pk*>(&g);
#pragma unroll
        for (int i = 0; i < 4; i++) px[i] = __hmul2(px[i], pg[i]);
        store_shared_16(x_at, x);
    });
}

// multiply_by_gates for acc (rows r, 16 columns q of column p) with the postgates staged in
// column p of g (re, im; zeros where the pair has no second sequence).
template <typename T, int PQ, typename RT, typename Buf>
__device__ __forceinline__ void apply_column_postgate(complex_tile<RT>& acc, const Buf (&g)[2], int seqlen, int p) {
    using Pk = typename kt::packed_of<T>::type;
    const uint32_t base[2] = {g[0].base(), g[1].base()};
    multiply_by_gates(
        acc, seqlen, [&](int row, int col) { return row * PQ + kt::TILE_DIM * p + col; },
        [&](int row, int col, int) {
            return gate_pairs{kt::convert_pair<float, T>(load_shared_pair<Pk>(base[0] + Buf::offset(row, p, col))),
                              kt::convert_pair<float, T>(load_shared_pair<Pk>(base[1] + Buf::offset(row, p, col)))};
        });
}

// Rows r < HALF of column p to the pair's output sequences (16-byte stores), skipping elements at
// or past seqlen and a missing sequence.
template <int HALF, typename Buf, typename T>
__device__ __forceinline__ void store_column(const Pair<T>& out, int seqlen, Buf (&buf)[2], int p) {
    const uint32_t base[2] = {buf[0].base(), buf[1].base()};
    for_column_chunks<HALF>(p, [&](int j, int r, int h, uint32_t e) {
        if (out.seq[j] != nullptr && e < uint32_t(seqlen))
            *reinterpret_cast<uint4*>(out.seq[j] + e) = load_shared_16(base[j] + Buf::offset(r, p, 8 * h));
    });
}

// The spectrum tiles 0 .. R/2 of every head in phase 2's fragment order, K[min(f, L - f)] at each
// position f as the gathers leave it (conjugated for the correlation; see spectrum_signs):
// `arranged` (heads, STORED) complex, for the kernels that read it from global memory. A block
// per head and ARRANGE_POSITIONS consecutive positions of every stored tile, transposed through
// shared memory: at one position consecutive tiles are consecutive frequencies (f = k_r + R k_p
// + 16 R k_q), so the reads take runs of STORED_TILES values, and the writes runs of
// ARRANGE_POSITIONS of a tile (a thread per position and tile would read 8 bytes of a sector
// for each value).
inline constexpr int ARRANGE_POSITIONS = 32;
inline constexpr int ARRANGE_THREADS = 256;

template <typename C>
inline constexpr int arrange_groups = C::PQ / ARRANGE_POSITIONS;

template <typename C>
__global__ void __launch_bounds__(ARRANGE_THREADS) arrange_spectrum(const float2* __restrict__ spectrum,
                                                                    float2* __restrict__ arranged, bool conjugate) {
    constexpr int L = C::L, PQ = C::PQ, TILES = C::STORED_TILES, VALUES = ARRANGE_POSITIONS * TILES;
    // [position][tile], rows of an odd number of float2: the reads' consecutive tiles and the
    // writes' consecutive positions (a row apart) both fall in distinct banks.
    static_assert(TILES % 2 == 1);
    __shared__ float2 values[ARRANGE_POSITIONS][TILES];
    const int h = int(blockIdx.x) / arrange_groups<C>;
    const int first = int(blockIdx.x) % arrange_groups<C> * ARRANGE_POSITIONS;
    const float2* row = spectrum + int64_t(h) * (L / 2 + 1);
    for (int e = int(threadIdx.x); e < VALUES; e += ARRANGE_THREADS) {
        const int position = e / TILES, kr = e % TILES;
        float2 v = row[half_spectrum_index<L>(spectrum_frequency<C>(kr * PQ + first + position))];
        if (conjugate) v.y = -v.y;
        values[position][kr] = v;
    }
    __syncthreads();
    float2* out = arranged + int64_t(h) * C::STORED;
    for (int e = int(threadIdx.x); e < VALUES; e += ARRANGE_THREADS) {
        const int kr = e / ARRANGE_POSITIONS, position = e % ARRANGE_POSITIONS;
        out[kr * PQ + first + position] = values[position][kr];
    }
}

// Phase 1 for column p: F1 and T1 of the input in rows r < R/2 of the column, for the k_r of
// strips first_strip .. first_strip + STRIPS - 1, into rows 0 .. 16 STRIPS - 1 of the column (in
// place: the input is in registers before the first store).
template <typename C, int STRIPS, typename Buf>
__device__ __forceinline__ void phase1_strips(typename C::Tables& tab, Buf (&buf)[2], int p, int first_strip) {
    using T = typename C::dtype;
    constexpr int XR = C::XR;
    const int lane = kt::lane_id();
    const uint32_t re = buf[0].base(), im = buf[1].base();
    complex_tile<kt::rt<T, XR, kt::TILE_DIM, kt::col_l>> xb;  // K = r, N = q
    kt::rt<T, XR, kt::TILE_DIM, kt::col_l> x_neg;
    load_from(xb.re, [&](int row, int col) { return re + Buf::offset(row, p, col); });
    load_from(xb.im, [&](int row, int col) { return im + Buf::offset(row, p, col); });
    negate(x_neg, xb.im);
    __syncwarp();  // every lane's reads of the column are done before any lane overwrites it
#pragma unroll
    for (int s = 0; s < STRIPS; s++) {
        const int strip = first_strip + s;
        complex_tile<typename C::acc16> acc;
        kt::zero(acc.re);
        kt::zero(acc.im);
#pragma unroll
        for (int c = 0; c < XR / kt::TILE_DIM; c++) {  // 16 r at a time: the strip's F_R whole is 32 registers
            complex_tile<typename C::sub16> a1;  // F_R[k_r, r] / sqrt(R), this strip's k_r, these r
            kt::load(a1.re, kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(tab.fr[0], strip, c));
            kt::load(a1.im, kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(tab.fr[1], strip, c));
            complex_tile<typename C::sub16_b> x;
            typename C::sub16_b neg;
            x.re.tiles[0][0] = xb.re.tiles[c][0];
            x.im.tiles[0][0] = xb.im.tiles[c][0];
            neg.tiles[0][0] = x_neg.tiles[c][0];
            cmma(acc, a1, x, neg);
        }
        // T1 = w_L^(k_r q) w_L^(16 k_r p), as phase1 in three_factor.cuh.
        kt::for_each_pair(acc.re, [&](int, int, int k, float2& v_re) {
            const int kr = strip * kt::TILE_DIM + 8 * (k % 2) + lane / 4;
            const float2 c = tab.twiddle_p[kr * C::P + p];
            const float4 v = tab.twiddle_frag[(strip * 4 + k) * kt::WARP_THREADS + lane];
            cmul_pair<false>(v_re, acc.im.tiles[0][0].data[k], complex_product(make_float2(v.x, v.y), c),
                             complex_product(make_float2(v.z, v.w), c));
        });
        store_frequency_tile<C>(acc.re, [&](int row, int col) { return re + Buf::offset(s * kt::TILE_DIM + row, p, col); });
        store_frequency_tile<C>(acc.im, [&](int row, int col) { return im + Buf::offset(s * kt::TILE_DIM + row, p, col); });
    }
}

// Phase 3 for column p: acc[r, q] = sum over the k_r of strips first_strip .. first_strip +
// CHUNKS - 1 (rows 0 .. 16 CHUNKS - 1 of the column) of conj(F_R[r, k_r]) buf[k_r, p, q] / sqrt(R),
// r < R/2, a 16-row chunk of k_r at a time.
template <typename C, int CHUNKS, typename Buf>
__device__ __forceinline__ void phase3_chunks(complex_tile<typename C::column_acc>& acc, typename C::Tables& tab,
                                              Buf (&buf)[2], int p, int first_strip) {
    using T = typename C::dtype;
    constexpr int XR = C::XR;
    const uint32_t re = buf[0].base(), im = buf[1].base();
    kt::zero(acc.re);
    kt::zero(acc.im);
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
        complex_tile<typename C::sub16_b> ub;  // K = k_r, N = q
        typename C::sub16_b ub_neg;
        load_from(ub.re, [&](int row, int col) { return re + Buf::offset(c * kt::TILE_DIM + row, p, col); });
        load_from(ub.im, [&](int row, int col) { return im + Buf::offset(c * kt::TILE_DIM + row, p, col); });
        negate(ub_neg, ub.re);
#pragma unroll
        for (int m = 0; m < XR / kt::TILE_DIM; m++) {  // 16 r at a time: the chunk's F_R whole is 32 registers
            complex_tile<kt::rt<T, kt::TILE_DIM, kt::TILE_DIM, kt::col_l>> g1;  // K = k_r, M = r
            kt::load(g1.re, kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(tab.fr[0], first_strip + c, m));
            kt::load(g1.im, kt::subtile<kt::TILE_DIM, kt::TILE_DIM>(tab.fr[1], first_strip + c, m));
            complex_tile<typename C::acc16> rows;  // acc's rows 16 m .. 16 m + 15
            rows.re.tiles[0][0] = acc.re.tiles[m][0];
            rows.im.tiles[0][0] = acc.im.tiles[m][0];
            cmma_conj_a(rows, g1, ub, ub_neg);
            acc.re.tiles[m][0] = rows.re.tiles[0][0];
            acc.im.tiles[m][0] = rows.im.tiles[0][0];
        }
    }
}

// STAGED_POSTGATE: the pair's postgates come with each column's input into a stage of their own,
// as in three_factor_forward (where the stage fits: N = 8192).
template <typename T, int R, int WARPS, bool STAGED_POSTGATE = false>
__global__ void __launch_bounds__(ThreeFactorLarge<T, R, WARPS>::THREADS, 1)
    three_factor_large_forward(const __grid_constant__ Args<T> a) {
    using C = ThreeFactorLarge<T, R, WARPS>;
    static_assert(spectrum_order_is_a_permutation<C>() && upper_half_is_registers_2_and_3<C>());
    constexpr int HALF = C::HALF, PQ = C::PQ, Q = C::Q, STORED = C::STORED;
    extern __shared__ char smem[];
    shared_carver carve(smem);
    auto& s = carve.allocate<typename C::Shared>();
    typename C::PostStage* post_stage = nullptr;
    if constexpr (STAGED_POSTGATE) post_stage = &carve.allocate<typename C::PostStage>();
    const int warp = kt::warp_id(), thread = threadIdx.x;
    const Tasks tasks = tasks_of(a);
    if (tasks.first >= tasks.last) return;
    const bool gated = a.pregate != nullptr;

    // Task t's input (and gates) for this warp's column p.
    auto load_column = [&](int t, int p) {
        const int h = t / a.pairs, pair = t - h * a.pairs;
        load_column_async<HALF>(s.buf, a.pair_of(a.u, a.u_stride_b, a.u_stride_h, pair, h), a.seqlen, a.u, p, 0);
        if (gated)
            load_column_async<HALF>(s.buf, a.pair_of(a.pregate, a.pre_stride_b, a.pre_stride_h, pair, h), a.seqlen,
                                    a.u, p, HALF);
        if constexpr (STAGED_POSTGATE)
            load_column_async<HALF>(*post_stage, a.pair_of(a.postgate, a.post_stride_b, a.post_stride_h, pair, h),
                                    a.seqlen, a.u, p, 0);
    };
#pragma unroll
    for (int jp = 0; jp < C::P_PER_WARP; jp++) load_column(tasks.first, warp + WARPS * jp);
    kt::cp_async_commit();
    bool spectrum_pending = false;  // a gather in flight, not yet waited for
    if constexpr (C::SPECTRUM_IN_SHARED) {
        gather_spectrum_async<C, T, STORED>(s.spectrum, a, tasks.first / a.pairs, thread);
        kt::cp_async_commit();
        spectrum_pending = true;
    }
    init_tables<C>(s.tab, thread);
    const F16<C> f16_kept;  // in registers through the task loop unless F16_FROM_SHARED
    if (C::F16_FROM_SHARED && warp == 0) f16_kept.store(s.tab.f16);
    __syncthreads();  // the tables

    for (int t = tasks.first; t < tasks.last; t++) {
        // Divided out of t rather than stepped (task_position): held through this loop, a position
        // spills (R = 128).
        const int h = t / a.pairs, pair = t - h * a.pairs;
        // In flight: this thread's chunks of task t's input, and the spectrum if the head changed.
        kt::cp_async_wait<0>();
        if constexpr (C::SPECTRUM_IN_SHARED) {
            if (spectrum_pending) {
                if (a.conjugate) conjugate_gathered<C, STORED>(s.spectrum, thread);
                spectrum_pending = false;
            }
        }
        if (gated) {
#pragma unroll
            for (int jp = 0; jp < C::P_PER_WARP; jp++) gate_column<HALF, T>(s.buf, warp + WARPS * jp);
        }
        __syncwarp();  // the warp's columns landed (and are gated) for every lane's ldmatrix
#pragma unroll
        for (int jp = 0; jp < C::P_PER_WARP; jp++) phase1_strips<C, C::STRIPS>(s.tab, s.buf, warp + WARPS * jp, 0);
        __syncthreads();  // every column's F1; the spectrum's signs

        const F16<C> f16 = C::F16_FROM_SHARED ? F16<C>(s.tab.f16) : f16_kept;
#pragma unroll C::PHASE2_UNROLL
        for (int j = 0; j < C::KR_PER_WARP; j++) {
            const int kr = warp + WARPS * j;
            complex_tile<typename C::acc16> acc;
            if constexpr (C::SPECTRUM_IN_SHARED) {  // times the filter's spectrum
                tile_forward<C>(acc, f16, s.tab, s.buf, kr, twiddle2_fragment(s.tab.twiddle2));
                cmul_values(acc, [&](int, int k) {
                    return stored_tile_value<C>(kr, k, [&](int i) { return s.spectrum[i]; });
                });
            } else {  // from L2: loaded before the transform, whose work covers the latency
                const float4* head = a.arranged_spectrum + int64_t(h) * (STORED / 2);
                float4 k_values[4];
#pragma unroll
                for (int k = 0; k < 4; k++) k_values[k] = stored_tile_value<C>(kr, k, [&](int i) { return __ldg(head + i); });
                tile_forward<C>(acc, f16, s.tab, s.buf, kr, twiddle2_fragment(s.tab.twiddle2));
                cmul_values(acc, [&](int, int k) { return k_values[k]; });
            }
            complex_tile<typename C::sub16> z;
            kt::copy(z.re, acc.re);
            kt::copy(z.im, acc.im);
            tile_inverse<C>(z, f16, s.tab, s.buf, kr, kr, twiddle2_fragment(s.tab.twiddle2));
        }
        __syncthreads();  // every tile back in the buffer; the spectrum free
        if constexpr (C::SPECTRUM_IN_SHARED) {
            if (t + 1 < tasks.last && (t + 1) % a.pairs == 0) {  // the next head's spectrum
                gather_spectrum_async<C, T, STORED>(s.spectrum, a, h + 1, thread);
                kt::cp_async_commit();
                spectrum_pending = true;
            }
        }

        const Pair<const T> post = a.pair_of(a.postgate, a.post_stride_b, a.post_stride_h, pair, h);
        const Pair<T> out = a.pair_of(a.y, a.y_stride_b, a.y_stride_h, pair, h);
        const uint32_t re = s.buf[0].base(), im = s.buf[1].base();
#pragma unroll
        for (int jp = 0; jp < C::P_PER_WARP; jp++) {
            const int p = warp + WARPS * jp;
            complex_tile<typename C::column_acc> acc;
            phase3_chunks<C, C::STRIPS>(acc, s.tab, s.buf, p, 0);
            if constexpr (STAGED_POSTGATE) {  // this warp's own loads, landed at the top of the task
                apply_column_postgate<T, PQ>(acc, *post_stage, a.seqlen, p);
            } else if (a.postgate != nullptr) {
                apply_postgate(acc, post.seq[0], post.seq[1], a.seqlen,
                               [&](int row, int col) { return row * PQ + Q * p + col; });
            }
            __syncwarp();  // every lane's reads of the column are done before it is overwritten
            store_frequency_tile<C>(acc.re, [&](int row, int col) { return re + C::buffer::offset(row, p, col); });
            store_frequency_tile<C>(acc.im, [&](int row, int col) { return im + C::buffer::offset(row, p, col); });
            __syncwarp();
            store_column<HALF>(out, a.seqlen, s.buf, p);
            __syncwarp();  // the column is read out before the next input lands in it
            if (t + 1 < tasks.last) load_column(t + 1, p);
        }
        kt::cp_async_commit();
    }
    kt::cp_async_wait<0>();
}

// The filter's gradient (see two_factor_filter_grad and the top of this file): task t is pair
// t % pairs of the virtual head t / pairs = PARTS h + part.
template <typename T, int R, int WARPS>
__global__ void __launch_bounds__(ThreeFactorLarge<T, R, WARPS>::THREADS, 1)
    three_factor_large_filter_grad(const __grid_constant__ Args<T> a) {
    using C = ThreeFactorLarge<T, R, WARPS>;
    constexpr int L = C::L, HALF = C::HALF, PQ = C::PQ, Q = C::Q, PARTS = C::PARTS;
    constexpr int PART_ROWS = C::PART_ROWS, PART_STRIPS = C::PART_STRIPS, KR_PER_WARP = C::KR_PART_PER_WARP;
    extern __shared__ char smem[];
    shared_carver carve(smem);
    auto& s = carve.allocate<typename C::GradShared>();
    const int warp = kt::warp_id(), thread = threadIdx.x;
    const Tasks tasks = tasks_of(a);
    if (tasks.first >= tasks.last) return;

    auto issue_loads = [&](int t) {
        const int v = t / a.pairs, h = v / PARTS, pair = t - v * a.pairs;
        const Pair<const T> u = a.pair_of(a.u, a.u_stride_b, a.u_stride_h, pair, h);
        const Pair<const T> dy = a.pair_of(a.dy, a.dy_stride_b, a.dy_stride_h, pair, h);
#pragma unroll
        for (int jp = 0; jp < C::P_PER_WARP; jp++) {
            load_column_async<HALF>(s.bu, u, a.seqlen, a.u, warp + WARPS * jp, 0);
            load_column_async<HALF>(s.bd, dy, a.seqlen, a.u, warp + WARPS * jp, 0);
        }
        kt::cp_async_commit();
    };
    issue_loads(tasks.first);
    init_tables<C>(s.tab, thread);
    const F16<C> f16;
    __syncthreads();  // the tables

    complex_tile<typename C::acc16> sum[KR_PER_WARP];
#pragma unroll
    for (int j = 0; j < KR_PER_WARP; j++) {
        kt::zero(sum[j].re);
        kt::zero(sum[j].im);
    }
    for (int t = tasks.first; t < tasks.last; t++) {
        const int v = t / a.pairs, h = v / PARTS, part = v - h * PARTS;
        kt::cp_async_wait<0>();
        __syncwarp();  // the warp's columns landed, for every lane's ldmatrix
#pragma unroll 1
        for (int jp = 0; jp < C::P_PER_WARP; jp++) {
            phase1_strips<C, PART_STRIPS>(s.tab, s.bu, warp + WARPS * jp, part * PART_STRIPS);
            phase1_strips<C, PART_STRIPS>(s.tab, s.bd, warp + WARPS * jp, part * PART_STRIPS);
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < KR_PER_WARP; j++) {
            const int slot = warp + WARPS * j;
            complex_tile<typename C::acc16> spectrum_u, spectrum_d;
            const twiddle2_fragment t2(s.tab.twiddle2);
            tile_forward<C>(spectrum_u, f16, s.tab, s.bu, slot, t2);
            tile_forward<C>(spectrum_d, f16, s.tab, s.bd, slot, t2);
            cmac_conj(sum[j], spectrum_d, spectrum_u);
        }
        if (t + 1 < tasks.last && (t + 1) % a.pairs != 0) {
            __syncthreads();  // every warp's reads of the tiles are done before the next input lands
            issue_loads(t + 1);
            continue;
        }

        // The part's last task in this block: its share of the gradient. Uniform over the block.
        // block_scale's barrier inside: phase 2's reads of s.bu are done before the inverse writes it.
        const float scale = inverse_of_sums<typename C::sub16, WARPS>(
            sum, s.scratch, [&](complex_tile<typename C::sub16>& z, int j) {
                const int slot = warp + WARPS * j;
                tile_inverse<C>(z, f16, s.tab, s.bu, part * PART_ROWS + slot, slot, twiddle2_fragment(s.tab.twiddle2));
            });
        __syncthreads();
        const float out_scale = sqrtf(float(L)) / scale;  // see two_factor_filter_grad
        float* grad = a.grad + int64_t(h) * a.seqlen;
#pragma unroll
        for (int jp = 0; jp < C::P_PER_WARP; jp++) {
            const int p = warp + WARPS * jp;
            complex_tile<typename C::column_acc> acc;
            phase3_chunks<C, PART_STRIPS>(acc, s.tab, s.bu, p, part * PART_STRIPS);
            add_to_grad(grad, acc.re, out_scale, a.seqlen, [&](int row, int col) { return row * PQ + Q * p + col; });
        }
        __syncwarp();  // the warp's reads of its columns are done before the next input lands
        if (t + 1 < tasks.last) issue_loads(t + 1);
    }
    kt::cp_async_wait<0>();
}

}  // namespace
}  // namespace tk::fftconv
