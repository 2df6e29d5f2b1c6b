// Complex arithmetic on the tile core's register tiles, and the memory movement of the FFT
// convolution kernels. A complex tile is a pair of real tiles of one shape and layout: the
// tensor cores multiply real 16-bit matrices, so a complex product is four real products with
// fp32 accumulation. The imaginary part of one operand enters one of them negated; the kernels
// negate a data operand (one logic op per register) rather than keep negated copies of the DFT
// matrices in registers.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kittens/kittens.cuh"

namespace tk::fftconv {

namespace kt = kittens;

template <typename Tile>
struct complex_tile {
    Tile re, im;
};

// e^{-2 pi i m / n} in fp32; m is reduced mod n in integers first, so the angle is exact.
__device__ __forceinline__ float2 unit_root(int m, int n) {
    float s, c;
    sincospif(2.f * float(((m % n) + n) % n) / float(n), &s, &c);
    return make_float2(c, -s);
}

// ---------------------------------------------------------------------------------------------
// Element-wise
// ---------------------------------------------------------------------------------------------

// t(row, col) = f(row, col) (a float2 (re, im)), rounded to the tile's element type.
template <typename RT, typename F>
__device__ __forceinline__ void fill_complex(complex_tile<RT>& t, F&& f) {
    using T = typename RT::dtype;
    kt::for_each_element(t.re, [&](int i, int j, int k, int h, T& e) {
        const int row = i * kt::TILE_DIM + RT::row_in_base(k, h), col = j * kt::TILE_DIM + RT::col_in_base(k, h);
        const float2 v = f(row, col);
        e = kt::convert<T>(v.x);
        auto& pair = t.im.tiles[i][j].data[k];
        (h ? pair.y : pair.x) = kt::convert<T>(v.y);
    });
}

// dst = -src for 16-bit tiles: the sign bits flipped, exact.
template <kt::register_tile RT>
__device__ __forceinline__ void negate(RT& dst, const RT& src) {
    static_assert(kt::half_precision<typename RT::dtype>, "negate: 16-bit tiles");
    kt::for_each_pair(dst, [&](int i, int j, int k, auto& pair) {
        using P = std::remove_reference_t<decltype(pair)>;
        uint32_t bits = *reinterpret_cast<const uint32_t*>(&src.tiles[i][j].data[k]) ^ 0x80008000u;
        pair = *reinterpret_cast<const P*>(&bits);
    });
}

// a *= b (CONJ: a *= conj(b)) for fp32 complex tiles: four multiply(-add)s per element.
template <bool CONJ = false, typename RT>
__device__ __forceinline__ void cmul(complex_tile<RT>& a, const complex_tile<RT>& b) {
    static_assert(std::same_as<typename RT::dtype, float>, "cmul: fp32 tiles");
    kt::for_each_pair(a.re, [&](int i, int j, int k, float2& ar) {
        float2& ai = a.im.tiles[i][j].data[k];
        const float2 br = b.re.tiles[i][j].data[k], bi = b.im.tiles[i][j].data[k];
        const float2 re = CONJ ? make_float2(fmaf(ar.x, br.x, ai.x * bi.x), fmaf(ar.y, br.y, ai.y * bi.y))
                               : make_float2(fmaf(ar.x, br.x, -ai.x * bi.x), fmaf(ar.y, br.y, -ai.y * bi.y));
        const float2 im = CONJ ? make_float2(fmaf(ai.x, br.x, -ar.x * bi.x), fmaf(ai.y, br.y, -ar.y * bi.y))
                               : make_float2(fmaf(ai.x, br.x, ar.x * bi.x), fmaf(ai.y, br.y, ar.y * bi.y));
        ar = re;
        ai = im;
    });
}

// a * b for complex numbers as float2 (re, im).
__device__ __forceinline__ float2 complex_product(float2 a, float2 b) {
    return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}

// A register pair of a complex tile (re, im: elements x and y) times w0 (x) and w1 (y), or
// (CONJ) times their conjugates.
template <bool CONJ>
__device__ __forceinline__ void cmul_pair(float2& re, float2& im, float2 w0, float2 w1) {
    const float2 r = re, m = im;
    re = CONJ ? make_float2(fmaf(r.x, w0.x, m.x * w0.y), fmaf(r.y, w1.x, m.y * w1.y))
              : make_float2(fmaf(r.x, w0.x, -m.x * w0.y), fmaf(r.y, w1.x, -m.y * w1.y));
    im = CONJ ? make_float2(fmaf(m.x, w0.x, -r.x * w0.y), fmaf(m.y, w1.x, -r.y * w1.y))
              : make_float2(fmaf(r.x, w0.y, m.x * w0.x), fmaf(r.y, w1.y, m.y * w1.x));
}

// a *= w (CONJ: a *= conj(w)) for an fp32 complex tile a of 16 columns (row layout), value(i, k)
// giving w at register k of base tile i of this lane: (re, im, re, im) of its pair.
template <bool CONJ = false, typename RT, typename Value>
__device__ __forceinline__ void cmul_values(complex_tile<RT>& a, Value&& value) {
    static_assert(std::same_as<typename RT::dtype, float> && std::same_as<typename RT::layout, kt::row_l> &&
                  RT::width == 1, "cmul_values: fp32 row-layout tiles of 16 columns");
    kt::for_each_pair(a.re, [&](int i, int, int k, float2& ar) {
        const float4 w = value(i, k);
        cmul_pair<CONJ>(ar, a.im.tiles[i][0].data[k], make_float2(w.x, w.y), make_float2(w.z, w.w));
    });
}

// cmul_values with w from b, a table in a's fragment order: float4 (i * 4 + k) * 32 + lane
// holds register k of base tile i of that lane, so a warp reads 512 contiguous bytes per access.
template <bool CONJ = false, typename RT>
__device__ __forceinline__ void cmul_fragments(complex_tile<RT>& a, const float4* b) {
    const int lane = kt::lane_id();
    cmul_values<CONJ>(a, [&](int i, int k) { return b[(i * 4 + k) * kt::WARP_THREADS + lane]; });
}

// ---------------------------------------------------------------------------------------------
// Complex products, d += op(a) * op(b). B operands are col-layout tiles (K x N); A operands are
// row-layout (M x K) or col-layout (K x M, i.e. the product uses its transpose).
// ---------------------------------------------------------------------------------------------

template <typename D, typename A, typename B>
__device__ __forceinline__ void mma_acc(D& d, const A& a, const B& b) {
    if constexpr (std::same_as<typename A::layout, kt::row_l>) kt::mma_AB(d, a, b, d);
    else kt::mma_AtB(d, a, b, d);
}

// d += a * b; b's imaginary part also given negated.
template <typename D, typename A, typename B>
__device__ __forceinline__ void cmma(complex_tile<D>& d, const complex_tile<A>& a, const complex_tile<B>& b,
                                     const B& b_im_neg) {
    mma_acc(d.re, a.re, b.re);
    mma_acc(d.im, a.re, b.im);
    mma_acc(d.re, a.im, b_im_neg);
    mma_acc(d.im, a.im, b.re);
}

// d += conj(a) * b; b's real part also given negated.
template <typename D, typename A, typename B>
__device__ __forceinline__ void cmma_conj_a(complex_tile<D>& d, const complex_tile<A>& a,
                                            const complex_tile<B>& b, const B& b_re_neg) {
    mma_acc(d.re, a.re, b.re);
    mma_acc(d.im, a.re, b.im);
    mma_acc(d.re, a.im, b.im);
    mma_acc(d.im, a.im, b_re_neg);
}

// d += a * b; a's imaginary part also given negated.
template <typename D, typename A, typename B>
__device__ __forceinline__ void cmma_neg_a(complex_tile<D>& d, const complex_tile<A>& a, const A& a_im_neg,
                                           const complex_tile<B>& b) {
    mma_acc(d.re, a.re, b.re);
    mma_acc(d.im, a.re, b.im);
    mma_acc(d.re, a_im_neg, b.im);
    mma_acc(d.im, a.im, b.re);
}

// d += a * conj(b); a's real part also given negated.
template <typename D, typename A, typename B>
__device__ __forceinline__ void cmma_conj_b(complex_tile<D>& d, const complex_tile<A>& a, const A& a_re_neg,
                                            const complex_tile<B>& b) {
    mma_acc(d.re, a.re, b.re);
    mma_acc(d.im, a.im, b.re);
    mma_acc(d.re, a.im, b.im);
    mma_acc(d.im, a_re_neg, b.im);
}

// ---------------------------------------------------------------------------------------------
// Shared memory in layouts of the kernels' own: loads and stores through an address function
// addr(row, col) -> 32-bit shared address of element (row, col) of the tile being moved.
// ---------------------------------------------------------------------------------------------

// 16-bit register tile from shared memory with ldmatrix (.trans for col layout), used as the
// mma operand its layout is natural for (row: A, col: B). Each 8-element row chunk that
// ldmatrix reads must be contiguous and 16-byte aligned in the layout.
template <kt::register_tile RT, typename Addr>
__device__ __forceinline__ void load_from(RT& dst, Addr&& addr) {
    static_assert(kt::half_precision<typename RT::dtype>, "load_from: 16-bit tiles");
    constexpr bool trans = std::same_as<typename RT::layout, kt::col_l>;
    const int lane = kt::lane_id(), quadrant = lane / 8;
    const int r = lane % 8 + 8 * (quadrant % 2), c = 8 * (quadrant / 2);
#pragma unroll
    for (int i = 0; i < RT::height; i++)
#pragma unroll
        for (int j = 0; j < RT::width; j++) {
            uint32_t regs[4];
            kt::detail::ldmatrix_x4(regs, addr(i * kt::TILE_DIM + r, j * kt::TILE_DIM + c), trans);
#pragma unroll
            for (int k = 0; k < 4; k++)
                dst.tiles[i][j].data[k] = *reinterpret_cast<typename kt::packed_of<typename RT::dtype>::type*>(&regs[k]);
        }
}

// A row-layout register tile (any element type) into 16-bit shared memory, pair by pair
// (4-byte stores), converted to T.
template <typename T, kt::register_tile RT, typename Addr>
__device__ __forceinline__ void store_to(const RT& src, Addr&& addr) {
    static_assert(std::same_as<typename RT::layout, kt::row_l>, "store_to: row-layout tiles");
    kt::for_each_pair(src, [&](int i, int j, int k, const auto& pair) {
        const int row = i * kt::TILE_DIM + RT::row_in_base(k, 0), col = j * kt::TILE_DIM + RT::col_in_base(k, 0);
        kt::detail::store_shared(addr(row, col), kt::convert_pair<T, typename RT::dtype>(pair));
    });
}

// A row-layout register tile into 16-bit shared memory with stmatrix (sm_90), converted to T,
// 8-element runs at a time: run(row, col) is the address of the run that starts at the tile's
// element (row, col) and goes along its row, or with TRANSPOSED down its column (the memory then
// holds the tile's columns contiguously: a transposed layout for the price of a plain store).
// Each run must be 16 contiguous, 16-byte aligned bytes.
template <bool TRANSPOSED, typename T, kt::register_tile RT, typename Run>
__device__ __forceinline__ void store_runs(const RT& src, Run&& run) {
    static_assert(std::same_as<typename RT::layout, kt::row_l> && kt::half_precision<T>, "store_runs: row-layout tiles into 16 bits");
    // Register k of a base tile is its 8 x 8 quadrant (k % 2, k / 2); stmatrix takes the address
    // of row i of matrix k (transposed: of its column i) from lane 8k + i.
    const int lane = kt::lane_id(), k = lane / 8, i = lane % 8;
    const int row = 8 * (k % 2) + (TRANSPOSED ? 0 : i), col = 8 * (k / 2) + (TRANSPOSED ? i : 0);
#pragma unroll
    for (int ti = 0; ti < RT::height; ti++)
#pragma unroll
        for (int tj = 0; tj < RT::width; tj++) {
            uint32_t regs[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const auto pair = kt::convert_pair<T, typename RT::dtype>(src.tiles[ti][tj].data[r]);
                regs[r] = *reinterpret_cast<const uint32_t*>(&pair);
            }
            const uint32_t address = run(ti * kt::TILE_DIM + row, tj * kt::TILE_DIM + col);
            if constexpr (TRANSPOSED) kt::detail::stmatrix_x4_trans(address, regs);
            else kt::detail::stmatrix_x4(address, regs);
        }
}

// A row-layout register tile into 16-bit shared memory through addr(row, col), converted to T:
// with stmatrix where the GPU has it (sm_90: a 16 x 16 tile per instruction, so every 8-element
// run along a row, from a column that is a multiple of 8, must be 16 contiguous, 16-byte aligned
// bytes), pair by pair elsewhere.
template <typename T, kt::register_tile RT, typename Addr>
__device__ __forceinline__ void store_tile_to(const RT& src, Addr&& addr) {
    if constexpr (kt::detail::has_stmatrix) store_runs<false, T>(src, addr);
    else store_to<T>(src, addr);
}

// ---------------------------------------------------------------------------------------------
// Sequences <-> shared tiles. A shared tile ST holds elements [0, ELEMS) of one sequence
// row-major (element e at row e / ST::cols, column e % ST::cols). Sequences are 16-byte aligned
// and `valid` (the sequence length) is a multiple of 8, so a 16-byte chunk is either wholly
// inside or wholly past the end.
// ---------------------------------------------------------------------------------------------

template <typename ST, int ELEMS = ST::rows * ST::cols>
struct sequence_chunks {
    static constexpr int per_chunk = 16 / int(sizeof(typename ST::dtype));
    static constexpr int count = ELEMS / per_chunk;
    static_assert(ELEMS % per_chunk == 0 && ELEMS <= ST::rows * ST::cols && ST::cols % per_chunk == 0);
    // f(element, row, col) for each chunk this thread (0 <= thread < THREADS) handles. A loop of
    // a fixed trip count in unsigned arithmetic: these run for every task, and a loop bounded at
    // run time with signed divisions cost hundreds of instructions per task.
    template <int THREADS, typename F>
    __device__ static void for_mine(int thread, F&& f) {
#pragma unroll
        for (int i = 0; i < (count + THREADS - 1) / THREADS; i++) {
            const uint32_t c = uint32_t(thread) + uint32_t(i * THREADS);
            if (count % THREADS == 0 || c < uint32_t(count)) {
                const uint32_t e = c * per_chunk;
                f(int(e), int(e / ST::cols), int(e % ST::cols));
            }
        }
    }
};

// cp.async the sequence into `tile`; elements at or past `valid`, or all of them when seq is
// nullptr, land as zeros. `fallback` is any valid global address (never read). The pointer and
// length checks are made once per sequence, so a chunk costs one compare and one select.
template <int THREADS, int ELEMS, typename ST>
__device__ __forceinline__ void load_sequence_async(ST& tile, const typename ST::dtype* seq, int valid,
                                                    const void* fallback, int thread) {
    using T = typename ST::dtype;
    const uint32_t length = seq != nullptr ? uint32_t(valid) : 0u;
    const T* source = seq != nullptr ? seq : static_cast<const T*>(fallback);
    sequence_chunks<ST, ELEMS>::template for_mine<THREADS>(thread, [&](int e, int row, int col) {
        const bool in = uint32_t(e) < length;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(tile.address(row, col)),
                     "l"(source + (in ? uint32_t(e) : 0u)), "r"(in ? 16 : 0)
                     : "memory");
    });
}

// x *= gate, element-wise in the 16-bit type (one rounding of the exact product), on the
// chunks this thread loaded with load_sequence_async (same THREADS and ELEMS), so it needs
// only this thread's cp.async wait, no barrier.
template <int THREADS, int ELEMS, typename ST>
__device__ __forceinline__ void apply_gate(ST& x, const ST& gate, int thread) {
    using T = typename ST::dtype;
    using P = typename kt::packed_of<T>::type;
    sequence_chunks<ST, ELEMS>::template for_mine<THREADS>(thread, [&](int, int row, int col) {
        uint4 a = *reinterpret_cast<const uint4*>(x.ptr(row, col));
        const uint4 g = *reinterpret_cast<const uint4*>(gate.ptr(row, col));
        P* pa = reinterpret_cast<P*>(&a);
        const P* pg = reinterpret_cast<const P*>(&g);
#pragma unroll
        for (int i = 0; i < 4; i++) pa[i] = __hmul2(pa[i], pg[i]);
        *reinterpret_cast<uint4*>(x.ptr(row, col)) = a;
    });
}

// One warp stores rows [row0, row0 + ROWS) x columns [col0, col0 + COLS) of `tile` to the
// sequence (element row * ST::cols + col), 16-byte chunks, skipping elements at or past `valid`.
// Lanes take 8 consecutive rows at one chunk, then the next chunk: a quarter warp's 16-byte reads
// then fall in 8 distinct bank groups of a swizzled tile (chunk XOR row % 8); in row-major order
// two rows' chunk pairs share their groups, which doubles the reads' wavefronts.
template <int ROWS, int COLS, typename ST>
__device__ __forceinline__ void warp_store_sequence(typename ST::dtype* seq, int valid, const ST& tile, int row0,
                                                    int col0) {
    constexpr int per_chunk = 16 / int(sizeof(typename ST::dtype));
    constexpr int chunks_per_row = COLS / per_chunk, chunks = ROWS * chunks_per_row;
    static_assert(COLS % per_chunk == 0 && ROWS % 8 == 0);
#pragma unroll
    for (int i = 0; i < (chunks + kt::WARP_THREADS - 1) / kt::WARP_THREADS; i++) {
        const uint32_t c = uint32_t(kt::lane_id() + i * kt::WARP_THREADS);
        if (chunks % kt::WARP_THREADS != 0 && c >= uint32_t(chunks)) break;
        const int row = row0 + int(c % 8 + c / (8 * chunks_per_row) * 8);
        const int col = col0 + int(c / 8 % chunks_per_row) * per_chunk;
        const uint32_t e = uint32_t(row * ST::cols + col);  // unsigned: no 64-bit sign extension to keep live
        if (e < uint32_t(valid)) *reinterpret_cast<uint4*>(seq + e) = *reinterpret_cast<const uint4*>(tile.ptr(row, col));
    }
}

}  // namespace tk::fftconv
