// Element-wise operations on register vectors (per-row / per-column values).
#pragma once
#include "../../../types/register/rv.cuh"
#include "../../base_ops.cuh"

namespace kittens {

template <register_vector V, typename F>
__device__ __forceinline__ void for_each_slot(V& v, F&& f) {
#pragma unroll
    for (int t = 0; t < V::tiles; t++)
#pragma unroll
        for (int s = 0; s < V::slots; s++) f(t, s, v.data[t][s]);
}

template <register_vector V>
__device__ __forceinline__ void fill(V& dst, float value) {
    using T = typename V::dtype;
    for_each_slot(dst, [&](int, int, T& e) { e = convert<T>(value); });
}
template <register_vector V> __device__ __forceinline__ void zero(V& dst) { fill(dst, 0.f); }
template <register_vector V> __device__ __forceinline__ void neg_infty(V& dst) { fill(dst, neg_infinity()); }

template <typename Op, register_vector V>
__device__ __forceinline__ void unary_map(V& dst, const V& src) {
    using T = typename V::dtype;
    for_each_slot(dst, [&](int t, int s, T& e) { e = convert<T>(Op::op(convert<float>(src.data[t][s]))); });
}
template <typename Op, register_vector V>
__device__ __forceinline__ void bin_map(V& dst, const V& a, const V& b) {
    using T = typename V::dtype;
    for_each_slot(dst, [&](int t, int s, T& e) {
        e = convert<T>(Op::op(convert<float>(a.data[t][s]), convert<float>(b.data[t][s])));
    });
}
template <typename Op, register_vector V>
__device__ __forceinline__ void bin_map(V& dst, const V& a, float b) {
    using T = typename V::dtype;
    for_each_slot(dst, [&](int t, int s, T& e) { e = convert<T>(Op::op(convert<float>(a.data[t][s]), b)); });
}

#define KITTENS_VEC_UNARY(name, Op) \
    template <register_vector V> __device__ __forceinline__ void name(V& dst, const V& src) { unary_map<Op>(dst, src); }
KITTENS_VEC_UNARY(copy, base_ops::copy)
KITTENS_VEC_UNARY(exp, base_ops::exp)
KITTENS_VEC_UNARY(exp2, base_ops::exp2)
KITTENS_VEC_UNARY(log, base_ops::log)
KITTENS_VEC_UNARY(log2, base_ops::log2)
#undef KITTENS_VEC_UNARY

#define KITTENS_VEC_BINARY(name, Op)                                                                             \
    template <register_vector V> __device__ __forceinline__ void name(V& dst, const V& a, const V& b) {          \
        bin_map<Op>(dst, a, b);                                                                                  \
    }                                                                                                            \
    template <register_vector V> __device__ __forceinline__ void name(V& dst, const V& a, float b) {             \
        bin_map<Op>(dst, a, b);                                                                                  \
    }
KITTENS_VEC_BINARY(add, base_ops::add)
KITTENS_VEC_BINARY(sub, base_ops::sub)
KITTENS_VEC_BINARY(mul, base_ops::mul)
KITTENS_VEC_BINARY(div, base_ops::div)
KITTENS_VEC_BINARY(max, base_ops::max)
KITTENS_VEC_BINARY(min, base_ops::min)
#undef KITTENS_VEC_BINARY

}  // namespace kittens
