// The feature rows and the running state of the Based wgmma kernels (forward_sm90.cu,
// backward_sm90.cu), in the forward's layout: a chunk's features as 160 rows x 64 chunk rows in
// shared memory, the state transposed as a wgmma accumulator (value columns as rows, features as
// columns) in fp32 registers. C is the kernel's constants (c1, c2, sqrt_scale, kappa).
//
// The 160 feature rows of a 16-dim x (the pair tiles of pair_features.cuh: each product x_a x_b,
// a <= b, once):
//   rows 16 d + b, d = 0..7      x_{(b + d) mod 16} x_b               (state scale c2 weight_d)
//   rows 128 + b, b = 0..7       x_{b + 8} x_b (the half pair tile)   (c2 * 2)
//   row 136                      the constant feature: 1 where build_features is told so, else 0
//   rows 137..143                0
//   rows 144 + a                 x_a                                  (c1)
#pragma once
#include "kittens/kittens.cuh"
#include "based/pair_features.cuh"
#include "based/state_rows.cuh"

namespace tk::based::sm90 {

namespace kt = kittens;

constexpr int FEATURES = 160;        // feature rows
constexpr int PAIR_FEATURES = 128;   // the full pair tiles, d = 0..7
constexpr int HALF_PAIR = 128;       // first row of the half pair tile
constexpr int CONSTANT = 136;        // the constant feature
constexpr int LINEAR = 144;          // first linear feature
// Each of the four warps that build a chunk's features builds one half of one tensor's rows.
constexpr int FEATURES_PER_WARP = FEATURES / 2;

// The state transposed (rows: this warp's 16 value columns; columns: features), fp32.
struct State {
    kt::rt_fl<16, PAIR_FEATURES> pairs;        // features 0..127
    kt::rt_fl<16, FEATURES - PAIR_FEATURES> rest;  // 128..159: half pair tile, constant, linear
};

__device__ __forceinline__ uint4 load_shared_16(uint32_t address) {
    uint4 x;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w) : "r"(address));
    return x;
}
__device__ __forceinline__ void store_shared_4(uint32_t address, uint32_t x) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(x) : "memory");
}
template <typename T>
__device__ __forceinline__ uint32_t multiply_pairs(uint32_t a, uint32_t b) {
    const kt::packed<T> p = __hmul2(*reinterpret_cast<const kt::packed<T>*>(&a), *reinterpret_cast<const kt::packed<T>*>(&b));
    return *reinterpret_cast<const uint32_t*>(&p);
}

// Feature rows [80 HALF, 80 HALF + 80) of one chunk (KEYS: of k, with the constant feature) from
// x (chunk rows x 16), for chunk rows 2 lane and 2 lane + 1 of this warp: one 4-byte store per
// feature row, and a warp's 32 stores of a row are its 128 contiguous bytes (no bank conflict).
template <typename T, int HALF, bool KEYS, typename FT, typename XT>
__device__ __forceinline__ void build_features(FT& dst, const XT& x) {
    const int lane = kt::lane_id();
    // pair[a] = (x[2 lane][a], x[2 lane + 1][a]), the two rows' feature a as one 16-bit pair.
    uint32_t pair[FEATURE_DIM];
    {
        uint32_t rows[2][FEATURE_DIM / 2];  // each row's features as pairs (a, a + 1)
#pragma unroll
        for (int r = 0; r < 2; r++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const uint4 v = load_shared_16(x.address(2 * lane + r, 8 * half));
                rows[r][4 * half + 0] = v.x, rows[r][4 * half + 1] = v.y;
                rows[r][4 * half + 2] = v.z, rows[r][4 * half + 3] = v.w;
            }
        }
#pragma unroll
        for (int i = 0; i < FEATURE_DIM / 2; i++) {
            pair[2 * i] = __byte_perm(rows[0][i], rows[1][i], 0x5410);      // low halves
            pair[2 * i + 1] = __byte_perm(rows[0][i], rows[1][i], 0x7632);  // high halves
        }
    }
    const kt::packed<T> ones = kt::convert_pair<T, float>(make_float2(1.f, 1.f));
    const uint32_t one_pair = *reinterpret_cast<const uint32_t*>(&ones);
    kt::static_for<FEATURES_PER_WARP>([&](auto i) {
        constexpr int f = HALF * FEATURES_PER_WARP + decltype(i)::value;
        uint32_t value;
        if constexpr (f < PAIR_FEATURES) value = multiply_pairs<T>(pair[pair_partner(f % 16, f / 16)], pair[f % 16]);
        else if constexpr (f < CONSTANT) value = multiply_pairs<T>(pair[f - HALF_PAIR + 8], pair[f - HALF_PAIR]);
        else if constexpr (f == CONSTANT) value = KEYS ? one_pair : 0u;
        else if constexpr (f < LINEAR) value = 0u;
        else value = pair[f - LINEAR];
        store_shared_4(dst.address(f, 2 * lane), value);
    });
}

// The state as the A operand of O^T += A^T F_q: each feature column times its scale (c2 weight
// for the pair features, c1 for the linear ones), in 16 bits; 0 for the constant (added in fp32)
// and the padding. It goes through shared memory: in registers, beside the state and O^T, it
// left ptxas too few for the products in flight (spills, and wgmma serialised: C7512). Base tile j holds features 16 j .. 16 j + 15, in the accumulator's layout
// (which is the A operand's): registers 0, 1 columns 0..7, registers 2, 3 columns 8..15.
template <typename T, typename C>
__device__ __forceinline__ void state_operand(kt::rt<T, 16, FEATURES>& a, const State& s, const C& c) {
    auto scaled = [](float2 x, float factor) { return kt::convert_pair<T, float>(make_float2(x.x * factor, x.y * factor)); };
#pragma unroll
    for (int d = 0; d < PAIR_FEATURES / 16; d++)
#pragma unroll
        for (int k = 0; k < 4; k++) a.tiles[0][d].data[k] = scaled(s.pairs.tiles[0][d].data[k], c.c2 * pair_weight(d));
#pragma unroll
    for (int k = 0; k < 4; k++) {
        a.tiles[0][HALF_PAIR / 16].data[k] =
            scaled(s.rest.tiles[0][0].data[k], k < pair_registers(HALF_TILE) ? c.c2 * pair_weight(HALF_TILE) : 0.f);
        a.tiles[0][LINEAR / 16].data[k] = scaled(s.rest.tiles[0][1].data[k], c.c1);
    }
}

// a0 (the sum of v so far) of this lane's two value rows, lane / 4 and lane / 4 + 8 of the warp's
// 16: column 136 (column 8 of rest's first base tile), which lanes 4 i hold, in registers 2 (row
// lane / 4) and 3 (row lane / 4 + 8).
__device__ __forceinline__ float2 constant_rows(const State& s) {
    const int holder = kt::lane_id() & ~3;
    return make_float2(__shfl_sync(kt::FULL_MASK, s.rest.tiles[0][0].data[2].x, holder),
                       __shfl_sync(kt::FULL_MASK, s.rest.tiles[0][0].data[3].x, holder));
}

// The state's feature f (a column of State) as rows of the (B, H, 273, Dv + 1) state, and the
// factor between them: calls f(row, other_row, factor) with other_row the symmetric partner of a
// quadratic row (or -1), and factor the state's scale (the internal columns are unscaled).
template <typename C, typename F>
__device__ __forceinline__ void feature_rows(int feature, const C& c, F&& f) {
    if (feature < CONSTANT) {  // a pair feature: x_a x_b at 17 + 16 a + b (and 17 + 16 b + a)
        const int d = feature < PAIR_FEATURES ? feature / 16 : HALF_TILE, b = feature % 16;
        const int a = pair_partner(b, d);
        f(17 + 16 * a + b, d == 0 ? -1 : 17 + 16 * b + a, c.kappa);
    } else if (feature == CONSTANT) {
        f(0, -1, 1.f);
    } else if (feature >= LINEAR) {
        f(1 + feature - LINEAR, -1, c.sqrt_scale);
    }
}

template <typename RT, typename F>
__device__ __forceinline__ void for_each_state_element(RT& tile, int first_feature, F&& f) {
    kt::for_each_element(tile, [&](int, int j, int k, int h, auto& e) {
        f(RT::row_in_base(k, h), first_feature + 16 * j + RT::col_in_base(k, h), e);
    });
}

// The state of value columns [value_col, value_col + 16) (this warp's rows) from an initial
// state, over the internal scale (the quadratic block through its symmetric part); the padding
// columns 137..143 zero.
template <typename C>
__device__ __forceinline__ void read_state(State& s, const StateRows& in, int value_col, const C& c) {
    auto read = [&](int row, int feature, float& e) {
        e = 0.f;
        feature_rows(feature, c, [&](int r, int other, float factor) {
            const float x = other < 0 ? in(r, value_col + row) : 0.5f * (in(r, value_col + row) + in(other, value_col + row));
            e = x / factor;
        });
    };
    for_each_state_element(s.pairs, 0, read);
    for_each_state_element(s.rest, PAIR_FEATURES, read);
}

// The final state of this warp's value columns: every row of the quadratic block written
// (both halves of the symmetric block from one pair feature).
template <typename C>
__device__ __forceinline__ void write_state(const State& s, const StateRows& out, int value_col, const C& c) {
    auto write = [&](int row, int feature, const float& e) {
        feature_rows(feature, c, [&](int r, int other, float factor) {
            out(r, value_col + row) = e * factor;
            if (other >= 0) out(other, value_col + row) = e * factor;
        });
    };
    for_each_state_element(s.pairs, 0, write);
    for_each_state_element(s.rest, PAIR_FEATURES, write);
}

}  // namespace tk::based::sm90
