// Element types the core works with, their packed (two-element) forms, and
// conversions between them.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <concepts>
#include <type_traits>

namespace kittens {

using bf16 = __nv_bfloat16;
using half = __half;
using bf16_2 = __nv_bfloat162;
using half_2 = __half2;

template <typename T>
concept element = std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, half>;

// 16-bit types are what the tensor cores and ldmatrix consume.
template <typename T>
concept half_precision = std::same_as<T, bf16> || std::same_as<T, half>;

template <typename T> struct packed_of;
template <> struct packed_of<float> { using type = float2; };
template <> struct packed_of<bf16> { using type = bf16_2; };
template <> struct packed_of<half> { using type = half_2; };
template <typename T> using packed = typename packed_of<T>::type;

// Scalar and pair conversions (round to nearest even).
template <typename To, typename From>
__device__ __forceinline__ To convert(From x) {
    if constexpr (std::same_as<To, From>) return x;
    else if constexpr (std::same_as<From, float>) {
        if constexpr (std::same_as<To, bf16>) return __float2bfloat16_rn(x);
        else return __float2half_rn(x);
    } else if constexpr (std::same_as<To, float>) {
        if constexpr (std::same_as<From, bf16>) return __bfloat162float(x);
        else return __half2float(x);
    } else {
        return convert<To>(convert<float>(x));  // bf16 <-> half through float
    }
}

template <typename To, typename From>
__device__ __forceinline__ packed<To> convert_pair(packed<From> x) {
    if constexpr (std::same_as<To, From>) return x;
    else if constexpr (std::same_as<From, float>) {
        if constexpr (std::same_as<To, bf16>) return __float22bfloat162_rn(x);
        else return __float22half2_rn(x);
    } else if constexpr (std::same_as<To, float>) {
        if constexpr (std::same_as<From, bf16>) return __bfloat1622float2(x);
        else return __half22float2(x);
    } else {
        return convert_pair<To, float>(convert_pair<float, From>(x));
    }
}

// Access to the two halves of a packed pair, whatever its element type.
template <typename P> __device__ __forceinline__ auto& first(P& p) { return p.x; }
template <typename P> __device__ __forceinline__ auto& second(P& p) { return p.y; }

// Constants in any element type.
template <element T> __device__ __forceinline__ T constant(float x) { return convert<T>(x); }
__device__ __forceinline__ constexpr float neg_infinity() { return -__builtin_huge_valf(); }

}  // namespace kittens
