// Register tile maps, broadcasts, masks, fills and reductions on 32 x 64 tiles.
// One kernel per (element type, layout) with a run-time op id keeps the number of
// instantiations (and the build time) small; the ids are mirrored in
// tests/test_core_gpu.py (TILE_OPS).
#include "common.cuh"

namespace tk_test {

constexpr int kRows = 32, kCols = 64;

// Op ids. Families of six binary ops share one numbering: add, sub, mul, div, max, min.
enum tile_op_id : int {
    OP_COPY = 0, OP_EXP, OP_EXP2, OP_LOG, OP_LOG2, OP_ABS, OP_RELU, OP_NEG,  // unary 0..7
    OP_BIN_TILE = 8,     // 8..13   d = a (op) b
    OP_BIN_SCALAR = 14,  // 14..19  d = a (op) s
    OP_BIN_ROW = 20,     // 20..25  d = a (op) v[row]   (add_row, ...)
    OP_BIN_COL = 26,     // 26..31  d = a (op) u[col]   (add_col, ...)
    OP_BROADCAST_ROW = 32, OP_BROADCAST_COL, OP_MASK, OP_ZERO, OP_ONE, OP_NEG_INFTY,  // 32..37
    OP_MASK_AFTER = 38,   // columns past 2 row - 5 become s
    OP_MASK_BEFORE = 39,  // columns before 60 - 2 row become s
    OP_REDUCE = 40,      // 40..45  row_max, row_min, row_sum, col_max, col_min, col_sum
    OP_REDUCE_ACC = 46,  // 46..51  same, folded with v (row) / u (col)
    OP_REDUCE_ACC_IDENTITY = 52,  // 52..57  same as 46..51, partials started at the identity
};

template <typename RT>
__device__ void binary(int which, RT& d, const RT& a, const RT& b) {
    switch (which) {
        case 0: add(d, a, b); break;
        case 1: sub(d, a, b); break;
        case 2: mul(d, a, b); break;
        case 3: kittens::div(d, a, b); break;
        case 4: kittens::max(d, a, b); break;
        case 5: kittens::min(d, a, b); break;
    }
}
template <typename RT>
__device__ void binary(int which, RT& d, const RT& a, float s) {
    switch (which) {
        case 0: add(d, a, s); break;
        case 1: sub(d, a, s); break;
        case 2: mul(d, a, s); break;
        case 3: kittens::div(d, a, s); break;
        case 4: kittens::max(d, a, s); break;
        case 5: kittens::min(d, a, s); break;
    }
}
template <typename RT>
__device__ void binary_row(int which, RT& d, const RT& a, const typename RT::col_vec& v) {
    switch (which) {
        case 0: add_row(d, a, v); break;
        case 1: sub_row(d, a, v); break;
        case 2: mul_row(d, a, v); break;
        case 3: div_row(d, a, v); break;
        case 4: max_row(d, a, v); break;
        case 5: min_row(d, a, v); break;
    }
}
template <typename RT>
__device__ void binary_col(int which, RT& d, const RT& a, const typename RT::row_vec& u) {
    switch (which) {
        case 0: add_col(d, a, u); break;
        case 1: sub_col(d, a, u); break;
        case 2: mul_col(d, a, u); break;
        case 3: div_col(d, a, u); break;
        case 4: max_col(d, a, u); break;
        case 5: min_col(d, a, u); break;
    }
}

// Reductions write a vector; returns after storing it to vec_out. which: op - OP_REDUCE.
template <typename RT>
__device__ void reduce(int which, const RT& a, const typename RT::col_vec& v, const typename RT::row_vec& u,
                       const gl<float>& vec_out) {
    typename RT::col_vec rv_out;  // one value per row
    typename RT::row_vec cv_out;  // one value per column
    constexpr reduce_start ID = reduce_start::identity;
    switch (which) {
        case 0: row_max(rv_out, a); break;
        case 1: row_min(rv_out, a); break;
        case 2: row_sum(rv_out, a); break;
        case 3: col_max(cv_out, a); break;
        case 4: col_min(cv_out, a); break;
        case 5: col_sum(cv_out, a); break;
        case 6: row_max(rv_out, a, v); break;
        case 7: row_min(rv_out, a, v); break;
        case 8: row_sum(rv_out, a, v); break;
        case 9: col_max(cv_out, a, u); break;
        case 10: col_min(cv_out, a, u); break;
        case 11: col_sum(cv_out, a, u); break;
        case 12: row_max<ID>(rv_out, a, v); break;
        case 13: row_min<ID>(rv_out, a, v); break;
        case 14: row_sum<ID>(rv_out, a, v); break;
        case 15: col_max<ID>(cv_out, a, u); break;
        case 16: col_min<ID>(cv_out, a, u); break;
        case 17: col_sum<ID>(cv_out, a, u); break;
    }
    if (which % 6 < 3) store(vec_out, rv_out, coord{});
    else store(vec_out, cv_out, coord{});
}

template <typename T, typename L>
__global__ void __launch_bounds__(32) tile_op_kernel(gl<T> a_gl, gl<T> b_gl, gl<float> v_gl, gl<float> u_gl, float s,
                                                     gl<T> out, gl<float> vec_out, int op) {
    using RT = rt<T, kRows, kCols, L>;
    RT a, b, d;
    typename RT::col_vec v;
    typename RT::row_vec u;
    load(a, a_gl, coord{});
    load(b, b_gl, coord{});
    load(v, v_gl, coord{});
    load(u, u_gl, coord{});

    if (op >= OP_REDUCE) {
        reduce(op - OP_REDUCE, a, v, u, vec_out);
        return;
    }
    switch (op) {
        case OP_COPY: copy(d, a); break;
        case OP_EXP: kittens::exp(d, a); break;
        case OP_EXP2: kittens::exp2(d, a); break;
        case OP_LOG: kittens::log(d, a); break;
        case OP_LOG2: kittens::log2(d, a); break;
        case OP_ABS: kittens::abs(d, a); break;
        case OP_RELU: relu(d, a); break;
        case OP_NEG: neg(d, a); break;
        case OP_BROADCAST_ROW: broadcast_row(d, v); break;
        case OP_BROADCAST_COL: broadcast_col(d, u); break;
        case OP_MASK:  // causal: keep col <= row, others become s
            copy(d, a);
            mask(d, [](int r, int c) { return c <= r; }, s);
            break;
        case OP_ZERO: zero(d); break;
        case OP_ONE: one(d); break;
        case OP_NEG_INFTY: neg_infty(d); break;
        case OP_MASK_AFTER:
            copy(d, a);
            mask_cols_after(d, [](int r) { return 2 * r - 5; }, s);
            break;
        case OP_MASK_BEFORE:
            copy(d, a);
            mask_cols_before(d, [](int r) { return 60 - 2 * r; }, s);
            break;
        default:
            if (op < OP_BIN_SCALAR) binary(op - OP_BIN_TILE, d, a, b);
            else if (op < OP_BIN_ROW) binary(op - OP_BIN_SCALAR, d, a, s);
            else if (op < OP_BIN_COL) binary_row(op - OP_BIN_ROW, d, a, v);
            else binary_col(op - OP_BIN_COL, d, a, u);
    }
    store(out, d, coord{});
}

void tile_op(int dtype, int layout, int op, const gl_args& a, const gl_args& b, const gl_args& v, const gl_args& u,
             float s, const gl_args& out, const gl_args& vec_out, int64_t stream) {
    with_dtype(dtype, [&]<typename T>(std::type_identity<T>) {
        auto kernel = layout == 0 ? tile_op_kernel<T, row_l> : tile_op_kernel<T, col_l>;
        kernel<<<1, 32, 0, as_stream(stream)>>>(make_gl<T>(a), make_gl<T>(b), make_gl<float>(v), make_gl<float>(u), s,
                                                make_gl<T>(out), make_gl<float>(vec_out), op);
        check_launch("tile_op");
    });
}

}  // namespace tk_test
