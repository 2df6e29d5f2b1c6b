// Element-wise operations as functors, so every map, broadcast and reduction in
// the core is one template instantiated with one of these.
#pragma once
#include "../common/base_types.cuh"

namespace kittens::base_ops {

struct copy  { template <typename T> __device__ static T op(T a) { return a; } };
struct neg   { template <typename T> __device__ static T op(T a) { return -a; } };
struct abs   { template <typename T> __device__ static T op(T a) { return fabsf(a); } };
struct exp   { template <typename T> __device__ static T op(T a) { return __expf(a); } };
struct exp2  { template <typename T> __device__ static T op(T a) { return exp2f(a); } };
struct log   { template <typename T> __device__ static T op(T a) { return __logf(a); } };
struct log2  { template <typename T> __device__ static T op(T a) { return __log2f(a); } };
struct relu  { template <typename T> __device__ static T op(T a) { return a > T(0) ? a : T(0); } };

// Binary ops used by reductions also give their identity element.
struct add { template <typename T> __device__ static T op(T a, T b) { return a + b; }
             __device__ static constexpr float identity() { return 0.f; } };
struct sub { template <typename T> __device__ static T op(T a, T b) { return a - b; } };
struct mul { template <typename T> __device__ static T op(T a, T b) { return a * b; } };
// A product rounded on its own, never fused with a following add into one FMA: equal inputs
// give bitwise equal products wherever they are computed.
struct mul_rn { __device__ static float op(float a, float b) { return __fmul_rn(a, b); } };
struct div { template <typename T> __device__ static T op(T a, T b) { return a / b; } };
struct max { template <typename T> __device__ static T op(T a, T b) { return fmaxf(a, b); }
             __device__ static constexpr float identity() { return -__builtin_huge_valf(); } };
struct min { template <typename T> __device__ static T op(T a, T b) { return fminf(a, b); }
             __device__ static constexpr float identity() { return __builtin_huge_valf(); } };

}  // namespace kittens::base_ops
