// What the two Based backward kernels share (backward_dq_sm80.cu, backward_sm80.cu): the running
// state in registers and its public layout, the state's 16-bit copy in shared memory, and the
// gradient of the feature map (its Jacobian) on register fragments.
//
// Both kernels walk a (batch, head) in chunks of 64 rows, as the forward does (forward_sm80.cu),
// with one warp per 16 value columns (4 warps for Dv = 64, 8 for Dv = 128) in two roles:
//  - value-column role: warp w keeps the running state of value columns 16 w .. 16 w + 15 in fp32
//    registers, as pair tiles (pair_features.cuh: 136 quadratic features instead of 256),
//    transposed (value columns as rows): S = sum phi(k) v^T for dq, R = sum phi(q) do^T for dk and
//    dv, and computes the outputs that are local to its value columns (dv).
//  - row role: the gradients of q and k contract over all value columns, so they are computed by
//    rows: warp w takes the chunk's 16-row tile w % 4 and the 64 value columns w / 4, reading the
//    whole state as a 16-bit copy that every warp writes to shared memory once per chunk. (Per
//    value slice, the feature map's Jacobian would be applied Dv / 16 times to partial sums.)
//    With Dv = 128 two warps share a row tile and add their halves through shared memory.
//
// The state's internal scaling: with s = q.k unscaled and p(s) = 1 + c1 s + c2 s^2 (c1 = scale,
// c2 = scale^2 / 2), the quadratic term is c2 sum_d weight_d sum_b QQ_d[b] KK_d[b] over the pair
// tiles; the state holds the unscaled sums (of k v^T, KK_d^T v, ...), and its 16-bit copy carries
// c1 (linear tile) and c2 weight_d (pair tile d), as the forward's operands do.
//
// The Jacobian of the quadratic features. For a row x (q or k) and G_d[b] = the state's 16-bit
// copy contracted with the row's value-side vector (do for dq, v for dk) at feature column b of
// pair tile d (feature x_{(b+d) mod 16} x_b), the gradient is
//     dx[b] += G_d[b] x[(b + d) mod 16]          (direct: in place, the partner gathered)
//     dx[(b + d) mod 16] += G_d[b] x[b]          (rotated: the column moves by d)
// (for d = 0 both are 2 G_0[b] x[b]). The rotated term is (G_d * x) P_d on the tensor cores,
// with P_d the 16x16 permutation P_d[b][(b + d) mod 16] = 1 and G_d * x rounded to 16 bits once:
// a column rotation crosses lanes, and two small products cost less than the shuffles.
#pragma once
#include "kittens/kittens.cuh"
#include "based/backward_params.h"
#include "based/column_sums.cuh"
#include "based/state_rows.cuh"
#include "based/pair_features.cuh"

namespace tk::based::backward {

namespace kt = kittens;

inline constexpr int CHUNK = 64;                        // sequence rows per step
inline constexpr int ROW_TILES = CHUNK / kt::TILE_DIM;  // 16-row tiles per chunk
inline constexpr int WARP_COLS = kt::TILE_DIM;          // value columns of a warp's state
inline constexpr int GROUP_COLS = 64;                   // value columns of a warp in the row role
inline constexpr int STAGES = 2;
inline constexpr int STATE_TILES = PAIR_TILES + 1;      // the pair tiles, then the linear tile
inline constexpr int LINEAR_TILE = PAIR_TILES;
inline constexpr int PERMUTATIONS = HALF_TILE - 1;      // P_1 .. P_7 (the half tile needs none)

template <int DV>
struct Shape {
    static_assert(DV == 64 || DV == 128, "value dim 64 or 128");
    static constexpr int warps = DV / WARP_COLS;
    static constexpr int threads = warps * kt::WARP_THREADS;
    static constexpr int groups = DV / GROUP_COLS;  // warps per row tile in the row role
    static constexpr int min_blocks = 8 / warps;    // 8 warps per SM: registers bound them
};

using acc_tile = kt::rt_fl<16, 16>;
template <typename T> using tile = kt::rt<T, 16, 16>;                  // A operands, B of A B^T
template <typename T> using col_tile = kt::rt<T, 16, 16, kt::col_l>;   // B operands, A of A^T B
template <typename T> using group_rows = kt::rt<T, 16, GROUP_COLS>;    // 16 rows x 64 value columns

template <typename T> using qk_tile = kt::st<T, CHUNK, FEATURE_DIM>;
template <typename T, int DV> using value_tile = kt::st<T, CHUNK, DV>;
// 16-bit state copy, one per state tile: rows = value columns, columns = the tile's features.
template <typename T, int DV> using state_copy = kt::st<T, DV, kt::TILE_DIM>;
// P_1 .. P_7, tile d - 1 in rows 16 (d - 1) .. 16 d - 1.
template <typename T> using permutation_tiles = kt::st<T, PERMUTATIONS * kt::TILE_DIM, kt::TILE_DIM>;
// A row tile's gradient (dq or dk) on its way to global memory: 16 rows per row tile.
template <typename T> using row_out_tile = kt::st<T, CHUNK, FEATURE_DIM>;

struct Constants {
    float c1, c2;                    // p(s) = 1 + c1 s + c2 s^2 for the unscaled s = q.k
    float sqrt_scale, kappa;         // the public state's factors: linear rows, quadratic rows
    float inv_sqrt_scale, half_inv_kappa;
};

inline Constants make_constants(float scale) {
    const float sqrt_scale = sqrtf(scale), kappa = scale * 0.70710678118654752f;
    return {scale, scale * scale * 0.5f, sqrt_scale, kappa, 1.f / sqrt_scale, 0.5f / kappa};
}

// dst = src * factor in dst's 16-bit type, for the first REGISTERS registers (a half tile: 2).
template <int REGISTERS = 4, typename RT>
__device__ __forceinline__ void scaled_copy(RT& dst, const acc_tile& src, float factor) {
#pragma unroll
    for (int k = 0; k < REGISTERS; k++) {
        const float2 x = src.tiles[0][0].data[k];
        dst.tiles[0][0].data[k] = kt::convert_pair<typename RT::dtype, float>(make_float2(x.x * factor, x.y * factor));
    }
}

// A warp's running state: rows = its 16 value columns.
struct State {
    acc_tile pair[PAIR_TILES];  // column b = feature (pair_partner(b, d), b); the half tile's registers 0, 1
    acc_tile linear;            // column a = feature a
    column_values constant;     // the constant feature
};

__device__ __forceinline__ void zero_state(State& s) {
    kt::static_for<PAIR_TILES>([&](auto d) { kt::zero(s.pair[d]); });
    kt::zero(s.linear);
    s.constant = {};
}

// The state of value columns value_col .. value_col + 15 from a public one (its quadratic block's
// symmetric part: all that phi(x)^T S sees).
__device__ __forceinline__ void read_state(State& s, const StateRows& in, int value_col, const Constants& c) {
    const int lane_col = 2 * (kt::lane_id() % 4);
#pragma unroll
    for (int half = 0; half < 2; half++)
        s.constant.half[half] =
            make_float2(in(0, value_col + lane_col + 8 * half), in(0, value_col + lane_col + 8 * half + 1));
    kt::for_each_element(s.linear, [&](int, int, int k, int h, float& e) {
        e = in(1 + acc_tile::col_in_base(k, h), value_col + acc_tile::row_in_base(k, h)) * c.inv_sqrt_scale;
    });
    kt::static_for<PAIR_TILES>([&](auto d) {
        kt::for_each_element(s.pair[d], [&](int, int, int k, int h, float& e) {
            const int b = acc_tile::col_in_base(k, h);
            e = k < pair_registers(d) ? in.quad(pair_partner(b, d), b, value_col + acc_tile::row_in_base(k, h), c)
                                      : 0.f;
        });
    });
}

// The state of value columns value_col .. value_col + 15 into a public one (both halves of the
// quadratic block).
__device__ __forceinline__ void write_state(const State& s, const StateRows& out, int value_col, const Constants& c) {
    const int lane = kt::lane_id(), lane_col = 2 * (lane % 4);
    if (lane < 4) {  // one writer per column of the column sums
#pragma unroll
        for (int half = 0; half < 2; half++) {
            out(0, value_col + lane_col + 8 * half) = s.constant.half[half].x;
            out(0, value_col + lane_col + 8 * half + 1) = s.constant.half[half].y;
        }
    }
    kt::for_each_element(s.linear, [&](int, int, int k, int h, const float& e) {
        out(1 + acc_tile::col_in_base(k, h), value_col + acc_tile::row_in_base(k, h)) = e * c.sqrt_scale;
    });
    kt::static_for<PAIR_TILES>([&](auto d) {
        kt::for_each_element(s.pair[d], [&](int, int, int k, int h, const float& e) {
            if (k >= pair_registers(d)) return;
            const int b = acc_tile::col_in_base(k, h), a = pair_partner(b, d);
            const int col = value_col + acc_tile::row_in_base(k, h);
            out(17 + 16 * a + b, col) = e * c.kappa;
            if (d != 0) out(17 + 16 * b + a, col) = e * c.kappa;
        });
    });
}

// The state's 16-bit copy of this warp's value columns (rows 16 warp .. 16 warp + 15 of every
// state tile), scaled for use: c2 weight_d (pair tiles; the half tile's columns 8..15 zero) and
// c1 (linear). Visible to the block after a barrier.
template <typename T, int DV>
__device__ __forceinline__ void write_state_copy(state_copy<T, DV> (&dst)[STATE_TILES], const State& s, int warp,
                                                 const Constants& c) {
    kt::static_for<PAIR_TILES>([&](auto d) {
        constexpr int D = decltype(d)::value;
        tile<T> x;
        scaled_copy<pair_registers(D)>(x, s.pair[D], c.c2 * pair_weight(D));
        if constexpr (pair_registers(D) < 4) {
            x.tiles[0][0].data[2] = kt::convert_pair<T, float>(make_float2(0.f, 0.f));
            x.tiles[0][0].data[3] = x.tiles[0][0].data[2];
        }
        kt::store(kt::subtile<16, 16>(dst[D], warp, 0), x);
    });
    tile<T> x;
    scaled_copy(x, s.linear, c.c1);
    kt::store(kt::subtile<16, 16>(dst[LINEAR_TILE], warp, 0), x);
}

// P_1 .. P_7 into shared memory (all threads of the block; visible after a barrier).
template <typename T>
__device__ __forceinline__ void fill_permutations(permutation_tiles<T>& p) {
    constexpr int elements = PERMUTATIONS * kt::TILE_DIM * kt::TILE_DIM;
    for (int i = threadIdx.x; i < elements; i += blockDim.x) {
        const int row = i / kt::TILE_DIM, col = i % kt::TILE_DIM;
        const int d = row / kt::TILE_DIM + 1, b = row % kt::TILE_DIM;
        *p.ptr(row, col) = kt::convert<T>(col == pair_partner(b, d) ? 1.f : 0.f);
    }
}

// dst = the partner factors of pair tile D for the 16 chunk rows of row tile `row_tile`:
// element (row j, column b) = x[j][(b + D) mod 16], row layout (pair_tile's gather without its
// product).
template <int D, kt::half_precision T>
__device__ __forceinline__ void gather_partners(tile<T>& dst, uint32_t base, int row_tile) {
    uint32_t r[4];
    based::detail::ldmatrix<4, true>(
        r, base + uint32_t(D * transposed_chunk<T>::PITCH_BYTES + row_tile * 16 * int(sizeof(T))));
#pragma unroll
    for (int k = 0; k < 4; k++) dst.tiles[0][0].data[k] = *reinterpret_cast<kt::packed<T>*>(&r[k]);
}

// A row tile x (the 16 rows whose gradient `out` is) and its values in fp32, for the Jacobian.
template <typename T>
struct RowFactors {
    const tile<T>& x;
    float2 xf[4];
    uint32_t gather;  // gather_base of x^T's transposed chunk
    int row_tile;
    __device__ RowFactors(const tile<T>& x_, uint32_t gather_, int row_tile_)
        : x(x_), gather(gather_), row_tile(row_tile_) {
#pragma unroll
        for (int k = 0; k < 4; k++) xf[k] = kt::convert_pair<float, T>(x.tiles[0][0].data[k]);
    }
};

// out += the Jacobian of pair tile D's features at row factors f, applied to g (16 rows x the
// tile's 16 feature columns, fp32): see the file comment.
template <int D, typename T>
__device__ __forceinline__ void add_pair_jacobian(acc_tile& out, const acc_tile& g, const RowFactors<T>& f,
                                                  const permutation_tiles<T>& permutations) {
    auto& o = out.tiles[0][0].data;
    const auto& gd = g.tiles[0][0].data;
    if constexpr (D == 0) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            o[k].x = fmaf(2.f * gd[k].x, f.xf[k].x, o[k].x);
            o[k].y = fmaf(2.f * gd[k].y, f.xf[k].y, o[k].y);
        }
    } else if constexpr (D == HALF_TILE) {
        // Columns b < 8 only (g's registers 0 and 1), partner b + 8: the same lane's registers
        // k and k + 2 hold columns b and b + 8 of the same row, so both terms stay in the lane.
#pragma unroll
        for (int k = 0; k < 2; k++) {
            o[k].x = fmaf(gd[k].x, f.xf[k + 2].x, o[k].x);
            o[k].y = fmaf(gd[k].y, f.xf[k + 2].y, o[k].y);
            o[k + 2].x = fmaf(gd[k].x, f.xf[k].x, o[k + 2].x);
            o[k + 2].y = fmaf(gd[k].y, f.xf[k].y, o[k + 2].y);
        }
    } else {
        tile<T> partner, rotated_part;
        gather_partners<D>(partner, f.gather, f.row_tile);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 p = kt::convert_pair<float, T>(partner.tiles[0][0].data[k]);
            o[k].x = fmaf(gd[k].x, p.x, o[k].x);
            o[k].y = fmaf(gd[k].y, p.y, o[k].y);
            rotated_part.tiles[0][0].data[k] =
                kt::convert_pair<T, float>(make_float2(gd[k].x * f.xf[k].x, gd[k].y * f.xf[k].y));
        }
        col_tile<T> permutation;
        kt::load(permutation, kt::subtile<16, 16>(const_cast<permutation_tiles<T>&>(permutations), D - 1, 0));
        kt::mma_AB(out, rotated_part, permutation, out);
    }
}

// out += the gradient, at the 16 rows of f, of phi(x)^T S y summed over the 64 value columns
// `group` (y = those rows' value-side vectors, `rows`; S = the state copy without its constant
// feature, which has no gradient): the contraction G = y S on the tensor cores, then the
// Jacobian per tile.
template <typename T, int DV>
__device__ __forceinline__ void add_state_gradient(acc_tile& out, const group_rows<T>& rows,
                                                   const state_copy<T, DV> (&copy)[STATE_TILES], int group,
                                                   const RowFactors<T>& f, const permutation_tiles<T>& permutations) {
    using state_cols = kt::rt<T, GROUP_COLS, 16, kt::col_l>;  // K = value columns, N = features
    kt::static_for<PAIR_TILES>([&](auto d) {
        constexpr int D = decltype(d)::value;
        state_cols s;
        kt::load(s, kt::subtile<GROUP_COLS, 16>(const_cast<state_copy<T, DV>&>(copy[D]), group, 0));
        acc_tile g;
        kt::zero(g);
        if constexpr (D == HALF_TILE) {  // its 8 feature columns: the first n8 half of each product
            auto& acc = g.tiles[0][0].data;
#pragma unroll
            for (int k = 0; k < GROUP_COLS / kt::TILE_DIM; k++) {
                kt::packed<T> a[4], b[4];
                kt::detail::a_fragment(a, rows.tiles[0][k]);
                kt::detail::b_fragment(b, s.tiles[k][0]);
                kt::detail::mma_16x8x16<T>(acc[0], acc[1], a, b[0], b[1], acc[0], acc[1]);
            }
        } else {
            kt::mma_AB(g, rows, s, g);
        }
        add_pair_jacobian<D>(out, g, f, permutations);
    });
    state_cols s;
    kt::load(s, kt::subtile<GROUP_COLS, 16>(const_cast<state_copy<T, DV>&>(copy[LINEAR_TILE]), group, 0));
    kt::mma_AB(out, rows, s, out);  // the linear feature's Jacobian is the identity (c1 is in the copy)
}

// g_i, the block-local denominators' gradient (backward_params.h), of the 16 queries from
// first_query as a register vector V of a 16x16 tile: one value per row (dq: queries as rows) or
// per column (dk); 0 past the sequence's end, and everywhere when g is null.
template <typename V>
__device__ __forceinline__ void load_denominator_gradient(V& out, const float* g, int first_query, int len) {
#pragma unroll
    for (int slot = 0; slot < V::slots; slot++) {
        const int query = first_query + V::index(0, slot);
        out.data[0][slot] = g != nullptr && query < len ? g[query] : 0.f;
    }
}

// p'(s) scaled: ds = dp * (c1 + 2 c2 s) elementwise (dp, s: 16x16 fp32 tiles of the same rows).
__device__ __forceinline__ void scale_by_derivative(acc_tile& dp, const acc_tile& s, const Constants& c) {
    const float two_c2 = 2.f * c.c2;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        dp.tiles[0][0].data[k].x *= fmaf(two_c2, s.tiles[0][0].data[k].x, c.c1);
        dp.tiles[0][0].data[k].y *= fmaf(two_c2, s.tiles[0][0].data[k].y, c.c1);
    }
}

// x as a 16-bit high part plus the 16-bit remainder (about 16 significant bits together): the
// chunk's ds = dP * p'(s) as an mma operand. Rounded once to 16 bits, it was the largest error of
// dq and dk at short lengths (where the chunk is all there is), above PyTorch's own in-dtype error
// for some inputs; the second product costs two mma per 16x16 block.
template <typename T>
__device__ __forceinline__ void split_high_low(tile<T>& high, tile<T>& low, const acc_tile& x) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 v = x.tiles[0][0].data[k];
        high.tiles[0][0].data[k] = kt::convert_pair<T, float>(v);
        const float2 h = kt::convert_pair<float, T>(high.tiles[0][0].data[k]);
        low.tiles[0][0].data[k] = kt::convert_pair<T, float>(make_float2(v.x - h.x, v.y - h.y));
    }
}

// A row tile's gradient with Dv = 128: the two warps of the row tile (value columns 0..63 and
// 64..127) add their parts; the second hands its part over through shared memory in fragment
// order. Returns whether this warp holds the sum (and stores it).
struct PartExchange {
    float2 part[ROW_TILES][4][kt::WARP_THREADS];
};

template <int GROUPS>
__device__ __forceinline__ bool combine_groups(acc_tile& out, PartExchange& exchange, int row_tile, int group) {
    if constexpr (GROUPS == 1) {
        return true;
    } else {
        static_assert(GROUPS == 2);
        const int lane = kt::lane_id();
        // Named barrier 1 + row_tile, for the row tile's two warps: the writer's part is in shared
        // memory before the reader reads it, and the reader has read it before the next chunk's
        // block-wide barrier lets the writer on. Both sides wait (bar.sync): with the writer only
        // arriving, compute-sanitizer's racecheck reported hazards on the stages around it.
        if (group == 1) {
#pragma unroll
            for (int k = 0; k < 4; k++) exchange.part[row_tile][k][lane] = out.tiles[0][0].data[k];
            kt::warp::sync_with<2 * kt::WARP_THREADS>(1 + row_tile);
            return false;
        }
        kt::warp::sync_with<2 * kt::WARP_THREADS>(1 + row_tile);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 x = exchange.part[row_tile][k][lane];
            out.tiles[0][0].data[k].x += x.x;
            out.tiles[0][0].data[k].y += x.y;
        }
        return true;
    }
}

// out (a row tile's gradient) to rows 16 row_tile .. of `chunk` in dst, through the warp's
// 16-row slice of the staging tile; rows past the end are not stored.
template <typename T, typename GL>
__device__ __forceinline__ void store_row_tile(const GL& dst, row_out_tile<T>& staging, const acc_tile& out,
                                               int batch, int head, int chunk, int row_tile) {
    tile<T> x;
    kt::copy(x, out);
    kt::store(kt::subtile<16, 16>(staging, row_tile, 0), x);
    __syncwarp();
    kt::warp::store(dst, kt::subtile<16, 16>(staging, row_tile, 0), {batch, head, chunk * ROW_TILES + row_tile, 0});
}

}  // namespace tk::based::backward
