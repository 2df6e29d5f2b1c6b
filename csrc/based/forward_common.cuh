// Pieces of the Based forward shared by its kernels (forward_sm80.cu, forward_sm90.cu): the call's
// constants and the normaliser z (the state's v = 1 column) kept in shared memory, with the
// denominators it gives. The math is in params.h.
#pragma once
#include "kittens/kittens.cuh"
#include "based/column_sums.cuh"
#include "based/state_rows.cuh"
#include "based/params.h"

namespace tk::based {

constexpr int CHUNK = 64;  // sequence rows per step of the forward kernels

struct Constants {
    float c1, c2;                   // p(s) = 1 + c1 s + c2 s^2 for the unscaled s = q.k
    float eps;
    float sqrt_scale, kappa;        // the state's factors: sqrt(scale) (linear rows), scale / sqrt(2) (quadratic)
    float inv_sqrt_scale, half_inv_kappa;
    const float* initial_state;     // (B, H, 273, Dv + 1) or null
    float* final_state;             // (B, H, 273, Dv + 1) or null
};

inline Constants make_constants(const ForwardParams& p) {
    const float sqrt_scale = sqrtf(p.scale), kappa = p.scale * 0.70710678118654752f;
    return Constants{p.scale,          p.scale * p.scale * 0.5f, p.eps,          sqrt_scale,   kappa,
                     1.f / sqrt_scale, 0.5f / kappa,             p.initial_state, p.final_state};
}

using acc_tile = kittens::rt_fl<16, 16>;

// A forward kernel file's entry: checks what the op layer checks (a direct caller gets an error
// instead of a wrong launch; block_cols is the kernel's value columns per block), then runs
// launch.template operator()<T, NORMALIZE, Z_STATE>() for the call's element type and flags
// (normalize and a final state both need the z state).
template <typename Launch>
cudaError_t dispatch_forward(const ForwardParams& p, int block_cols, Launch&& launch) {
    if (p.len < 1 || p.batch < 1 || p.heads < 1 || p.value_dim < block_cols || p.value_dim % block_cols != 0 ||
        !(p.scale > 0.f))
        return cudaErrorInvalidValue;
    auto with_flags = [&]<typename T>() {
        if (p.normalize) return launch.template operator()<T, true, true>();
        if (p.final_state != nullptr) return launch.template operator()<T, false, true>();
        return launch.template operator()<T, false, false>();
    };
    return p.dtype == ElementType::bf16 ? with_flags.template operator()<kittens::bf16>()
                                        : with_flags.template operator()<kittens::half>();
}

// The normaliser state z and this chunk's denominators. Fragment-ordered: element [k][l] is
// register k (or column half k) of lane l, so every access of a warp is one contiguous 256 bytes.
struct NormaliserState {
    float2 quad[4][kittens::WARP_THREADS];    // Z2 = sum k k^T, as a 16x16 accumulator tile
    float2 linear[2][kittens::WARP_THREADS];  // sum of k, as column_values
    float constant;                           // rows so far
    float denominator[CHUNK];                 // this chunk's rows (normalize)
};

// z into shared memory (one warp): from the initial state's last column, or zero.
__device__ __forceinline__ void read_normaliser(NormaliserState& z, const StateRows& in, bool present, int value_dim,
                                                const Constants& c) {
    const int lane = kittens::lane_id(), lane_col = 2 * (lane % 4);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int row = acc_tile::row_in_base(k, 0), col = acc_tile::col_in_base(k, 0);
        z.quad[k][lane] = present ? make_float2(in.quad(row, col, value_dim, c), in.quad(row, col + 1, value_dim, c))
                                  : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int col = lane_col + 8 * half;
        z.linear[half][lane] = present ? make_float2(in(1 + col, value_dim) * c.inv_sqrt_scale,
                                                     in(2 + col, value_dim) * c.inv_sqrt_scale)
                                       : make_float2(0.f, 0.f);
    }
    if (lane == 0) z.constant = present ? in(0, value_dim) : 0.f;
}

// z from shared memory into the final state's last column (one warp).
__device__ __forceinline__ void write_normaliser(const NormaliserState& z, const StateRows& out, int value_dim,
                                                 const Constants& c) {
    const int lane = kittens::lane_id(), lane_col = 2 * (lane % 4);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int row = acc_tile::row_in_base(k, 0), col = acc_tile::col_in_base(k, 0);
        out(17 + 16 * row + col, value_dim) = z.quad[k][lane].x * c.kappa;
        out(17 + 16 * row + col + 1, value_dim) = z.quad[k][lane].y * c.kappa;
    }
    if (lane < 4) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            out(1 + lane_col + 8 * half, value_dim) = z.linear[half][lane].x * c.sqrt_scale;
            out(2 + lane_col + 8 * half, value_dim) = z.linear[half][lane].y * c.sqrt_scale;
        }
    }
    if (lane == 0) out(0, value_dim) = z.constant;
}

// The denominators of chunk rows [16 w, 16 w + 16) (w = this warp's row tile) into
// z.denominator, from z (the earlier chunks) and the chunk's q and k (64 x 16 shared tiles).
// Earlier chunks' part z0 + q . (c1 z1 + c2 Z2 q), c2 Z2 as a 16-bit high part plus the 16-bit
// remainder (about 16 significant bits); then this chunk's scores of the row tile (recomputed
// here, where few registers are live, rather than summed in a kernel's main products), rounded
// to 16 bits as the numerator's P V product reads them: o_i is then a weighted mean of the
// chunk's values with the same weights above and below (one key: o = v exactly), so the
// backward's value and normaliser terms cancel where the exact ones do.
template <typename T, typename QK>
__device__ __forceinline__ void chunk_denominators(NormaliserState& z, const QK& q_chunk, const QK& k_chunk, int w,
                                                   const Constants& c) {
    namespace kt = kittens;
    using tile = kt::rt<T, 16, 16>;
    const int lane = kt::lane_id();
    tile z_high, z_low;
    {
        acc_tile scaled, high;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 x = z.quad[k][lane];
            scaled.tiles[0][0].data[k] = make_float2(x.x * c.c2, x.y * c.c2);
        }
        kt::copy(z_high, scaled);
        kt::copy(high, z_high);
        kt::sub(scaled, scaled, high);
        kt::copy(z_low, scaled);
    }
    tile q_own;
    kt::load(q_own, kt::subtile<16, 16>(q_chunk, w, 0));
    acc_tile r;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 x = z.linear[k / 2][lane];
        r.tiles[0][0].data[k] = make_float2(x.x * c.c1, x.y * c.c1);
    }
    kt::mma_ABt(r, q_own, z_high, r);
    kt::mma_ABt(r, q_own, z_low, r);
    typename acc_tile::col_vec row_sum;  // this lane's share of each of its two rows' sums
    kt::zero(row_sum);
    kt::for_each_element(r, [&](int, int, int k, int half, float& e) {
        const auto& pair = q_own.tiles[0][0].data[k];
        row_sum.data[0][k % 2] += e * kt::convert<float>(half ? pair.y : pair.x);
    });
#pragma unroll 1
    for (int j = 0; j <= w; j++) {
        tile k_rows;
        kt::load<kt::mma_operand::b>(k_rows, kt::subtile<16, 16>(k_chunk, j, 0));
        acc_tile s;
        kt::zero(s);
        kt::mma_ABt(s, q_own, k_rows, s);
        kt::for_each_element(s, [&](int, int, int, int, float& e) {
            e = kt::convert<float>(kt::convert<T>(fmaf(e, fmaf(e, c.c2, c.c1), 1.f)));
        });
        if (j == w) kt::mask_cols_after(s, [](int row) { return row; }, 0.f);
        kt::row_sum_lane_partial(row_sum, s, row_sum);
    }
    kt::reduce_across_lanes<kt::base_ops::add>(row_sum);
    if (lane % 4 == 0) {
        const float earlier_rows = z.constant;
#pragma unroll
        for (int slot = 0; slot < 2; slot++)
            z.denominator[kt::TILE_DIM * w + acc_tile::row_in_base(slot, 0)] = row_sum.data[0][slot] + earlier_rows + c.eps;
    }
}

// z's update by chunk `chunk` of a sequence of `len` rows (rows past the end are zeros), from k
// held as four col-layout 16x16 tiles of chunk rows: warp 0 adds K^T K to Z2, warp 1 the column
// sums of K to z1 and the chunk's rows to z0 (other warps: nothing). Every warp must have read
// this chunk's z before.
template <typename T>
__device__ __forceinline__ void update_normaliser(NormaliserState& z, const kittens::rt<T, 16, 16, kittens::col_l> (&k_cols)[4],
                                                  const kittens::rt<T, 16, 16>& ones, int warp, int len, int chunk) {
    const int lane = kittens::lane_id();
    if (warp == 0) {
        acc_tile quad;
#pragma unroll
        for (int k = 0; k < 4; k++) quad.tiles[0][0].data[k] = z.quad[k][lane];
#pragma unroll
        for (int j = 0; j < 4; j++) kittens::mma_AtB(quad, k_cols[j], k_cols[j], quad);
#pragma unroll
        for (int k = 0; k < 4; k++) z.quad[k][lane] = quad.tiles[0][0].data[k];
    } else if (warp == 1) {
        column_values linear{{z.linear[0][lane], z.linear[1][lane]}};
        add_column_sums(linear, ones, k_cols);
        z.linear[0][lane] = linear.half[0];
        z.linear[1][lane] = linear.half[1];
        if (lane == 0) z.constant += float(min(CHUNK, len - chunk * CHUNK));
    }
}

}  // namespace tk::based
