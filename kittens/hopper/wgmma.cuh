// wgmma (sm_90a): warpgroup matrix multiply-accumulate with both operands in shared
// memory, described by 64-bit matrix descriptors over the core's swizzled shared tiles.
//
// The accumulator of m64nNk16 gives each warp 16 rows x N in exactly the fragment
// order of a row-layout rt_fl<16, N> (base tile j holds result columns 16j..16j+15 as
// registers 8j..8j+7), so a warp's share of the result is an ordinary register tile.
#pragma once
#include <cstdint>
#include "../types/register/rt.cuh"
#include "../types/shared/st.cuh"

namespace kittens::wgmma {

// Descriptor of a shared tile (or view) as a wgmma operand, at its first element; the k-steps
// advance it (mma_k_steps). The swizzle itself is applied by the hardware from address bits,
// which is why tiles are 1024-byte aligned. A view starts at a row that is a multiple of 8.
// K-major (rows = M or N, K along the row): rows advance by the swizzle span, 8-row groups by
// 8 spans. (The leading field is unused with these swizzles; it is 16 bytes.)
template <typename ST>
__device__ __forceinline__ uint64_t descriptor_k_major(const ST& tile) {
    return layout_math::wgmma_descriptor(tile.address(0, 0), 16, 8 * ST::row_bytes, ST::row_bytes);
}

// MN-major: a K x N tile stored row-major (N along the row). Within a panel, 8-row groups are
// 8 spans apart (the stride field); the next panel of N columns is the parent tile's panel
// stride further (the leading field), also for a view.
template <typename ST>
__device__ __forceinline__ uint64_t descriptor_mn_major(const ST& tile) {
    return layout_math::wgmma_descriptor(tile.address(0, 0), ST::panel_bytes, 8 * ST::row_bytes, ST::row_bytes);
}

namespace detail {

// One m64nNk16 instruction per N, A from shared memory (SS) or registers (RS), B K-major
// (TRANS_B 0) or MN-major (TRANS_B 1). Generated: the operand lists are N/2 registers long.
#define KITTENS_WGMMA_SS_16(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, %12;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))
#define KITTENS_WGMMA_RS_16(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B))
template <half_precision T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void mma_64x16x16(float (&d)[8], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_SS_16("bf16");
    else KITTENS_WGMMA_SS_16("f16");
}
template <half_precision T, int TRANS_B>
__device__ __forceinline__ void mma_64x16x16(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_RS_16("bf16");
    else KITTENS_WGMMA_RS_16("f16");
}
#undef KITTENS_WGMMA_SS_16
#undef KITTENS_WGMMA_RS_16

#define KITTENS_WGMMA_SS_32(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, %20;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))
#define KITTENS_WGMMA_RS_32(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B))
template <half_precision T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void mma_64x32x16(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_SS_32("bf16");
    else KITTENS_WGMMA_SS_32("f16");
}
template <half_precision T, int TRANS_B>
__device__ __forceinline__ void mma_64x32x16(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_RS_32("bf16");
    else KITTENS_WGMMA_RS_32("f16");
}
#undef KITTENS_WGMMA_SS_32
#undef KITTENS_WGMMA_RS_32

#define KITTENS_WGMMA_SS_64(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))
#define KITTENS_WGMMA_RS_64(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B))
template <half_precision T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void mma_64x64x16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_SS_64("bf16");
    else KITTENS_WGMMA_SS_64("f16");
}
template <half_precision T, int TRANS_B>
__device__ __forceinline__ void mma_64x64x16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_RS_64("bf16");
    else KITTENS_WGMMA_RS_64("f16");
}
#undef KITTENS_WGMMA_SS_64
#undef KITTENS_WGMMA_RS_64

#define KITTENS_WGMMA_SS_96(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1, %51, %52;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]) \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))
#define KITTENS_WGMMA_RS_96(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p, 1, 1, %54;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B))
template <half_precision T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void mma_64x96x16(float (&d)[48], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_SS_96("bf16");
    else KITTENS_WGMMA_SS_96("f16");
}
template <half_precision T, int TRANS_B>
__device__ __forceinline__ void mma_64x96x16(float (&d)[48], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_RS_96("bf16");
    else KITTENS_WGMMA_RS_96("f16");
}
#undef KITTENS_WGMMA_SS_96
#undef KITTENS_WGMMA_RS_96

#define KITTENS_WGMMA_SS_128(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))
#define KITTENS_WGMMA_RS_128(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B))
template <half_precision T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void mma_64x128x16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_SS_128("bf16");
    else KITTENS_WGMMA_SS_128("f16");
}
template <half_precision T, int TRANS_B>
__device__ __forceinline__ void mma_64x128x16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_RS_128("bf16");
    else KITTENS_WGMMA_RS_128("f16");
}
#undef KITTENS_WGMMA_SS_128
#undef KITTENS_WGMMA_RS_128

#define KITTENS_WGMMA_SS_256(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, %131, %132;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))
#define KITTENS_WGMMA_RS_256(TYPE)                                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B))
template <half_precision T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void mma_64x256x16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_SS_256("bf16");
    else KITTENS_WGMMA_SS_256("f16");
}
template <half_precision T, int TRANS_B>
__device__ __forceinline__ void mma_64x256x16(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    if constexpr (std::same_as<T, bf16>) KITTENS_WGMMA_RS_256("bf16");
    else KITTENS_WGMMA_RS_256("f16");
}
#undef KITTENS_WGMMA_SS_256
#undef KITTENS_WGMMA_RS_256

// N-dispatch of one k-step; A is a descriptor (SS, K-major or with TRANS_A MN-major) or
// this warp's 16 x 16 fragment (RS, always K-major).
template <half_precision T, int TRANS_A, int TRANS_B, int N, typename AOperand>
__device__ __forceinline__ void mma_step(float (&d)[N / 2], const AOperand& a, uint64_t desc_b, int accumulate) {
    static_assert(N == 16 || N == 32 || N == 64 || N == 96 || N == 128 || N == 256,
                  "wgmma: N is 16, 32, 64, 96, 128 or 256");
    if constexpr (std::same_as<AOperand, uint64_t>) {
        if constexpr (N == 16) mma_64x16x16<T, TRANS_A, TRANS_B>(d, a, desc_b, accumulate);
        else if constexpr (N == 32) mma_64x32x16<T, TRANS_A, TRANS_B>(d, a, desc_b, accumulate);
        else if constexpr (N == 64) mma_64x64x16<T, TRANS_A, TRANS_B>(d, a, desc_b, accumulate);
        else if constexpr (N == 96) mma_64x96x16<T, TRANS_A, TRANS_B>(d, a, desc_b, accumulate);
        else if constexpr (N == 128) mma_64x128x16<T, TRANS_A, TRANS_B>(d, a, desc_b, accumulate);
        else mma_64x256x16<T, TRANS_A, TRANS_B>(d, a, desc_b, accumulate);
    } else {
        static_assert(TRANS_A == 0, "wgmma: a register A operand is always K-major");
        if constexpr (N == 16) mma_64x16x16<T, TRANS_B>(d, a, desc_b, accumulate);
        else if constexpr (N == 32) mma_64x32x16<T, TRANS_B>(d, a, desc_b, accumulate);
        else if constexpr (N == 64) mma_64x64x16<T, TRANS_B>(d, a, desc_b, accumulate);
        else if constexpr (N == 96) mma_64x96x16<T, TRANS_B>(d, a, desc_b, accumulate);
        else if constexpr (N == 128) mma_64x128x16<T, TRANS_B>(d, a, desc_b, accumulate);
        else mma_64x256x16<T, TRANS_B>(d, a, desc_b, accumulate);
    }
}

template <typename D>
__device__ __forceinline__ auto& accumulator_registers(D& d) {
    static_assert(std::same_as<typename D::dtype, float> && std::same_as<typename D::layout, row_l> && D::rows == 16,
                  "wgmma: d is a warp's float row-layout 16 x N tile");
    return *reinterpret_cast<float(*)[D::cols / 2]>(&d.tiles[0][0].data[0]);
}

// This warp's A fragment for k-step k: registers of base tile (0, k) in A order.
template <typename RA>
__device__ __forceinline__ void a_fragment(uint32_t (&out)[4], const RA& a, int k) {
#pragma unroll
    for (int r = 0; r < 4; r++) out[r] = *reinterpret_cast<const uint32_t*>(&a.tiles[0][k].data[r]);
}
}  // namespace detail

// Orders this warp's earlier register writes (e.g. a zeroed accumulator) before wgmma
// reads them; call before the first mma of a group.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed groups are in flight; only then may the accumulator
// registers be read or written.
template <int N> __device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Tells the compiler that wgmma may have changed (or may still read) these registers: call on
// an accumulator after wait<N>() before reading it, and on a register A operand after the
// wait that ends its last read, so that neither a stale copy of the registers nor a reuse of
// them slips across the wait. (An mma's asm statement shows the compiler the registers only
// at issue time.)
template <register_tile RT>
__device__ __forceinline__ void fence_operand(RT& t) {
    for_each_pair(t, [](int, int, int, auto& pair) {
        static_assert(sizeof(pair) == 4 || sizeof(pair) == 8, "fence_operand: packed pairs of 16- or 32-bit");
        if constexpr (sizeof(pair) == 8) {
            asm volatile("" : "+f"(pair.x), "+f"(pair.y)::"memory");
        } else {
            asm volatile("" : "+r"(*reinterpret_cast<uint32_t*>(&pair))::"memory");
        }
    });
}

// In all forms d is this warp's 16 rows (rt_fl<16, N>) of the warpgroup's 64 x N
// result, `accumulate` adds to d instead of overwriting it, all four warps of a
// warpgroup issue the call, and it is asynchronous until commit() + wait<0>().
// a is 64 x K in shared memory (K-major), or this warp's 16 x K row-layout register
// tile (rows 16 * warp-in-group of the 64).

namespace detail {
// Start-address step of k-step k of a shared operand (layout_math::wgmma_k_step). A K-major
// view must span whole column panels, so that its first column starts one.
template <int MN_MAJOR, typename ST>
constexpr uint32_t k_step(int k) {
    constexpr int element_bytes = int(sizeof(typename ST::dtype));
    static_assert(MN_MAJOR || ST::cols % (ST::row_bytes / element_bytes) == 0,
                  "wgmma: a K-major view spans whole column panels");
    return layout_math::wgmma_k_step(MN_MAJOR, k, ST::row_bytes, ST::panel_bytes, element_bytes);
}

// The k-steps of one call. A is a shared tile (64 x K K-major, or with TRANS_A a K x 64
// tile stored row-major, i.e. MN-major) or this warp's register tile (fragment k); B is a
// shared tile, K-major or (TRANS_B) MN-major. Each shared operand's descriptor is built
// once and advanced by a constant per k-step (built per k-step, its address masking and
// shifting cost ~10 instructions around every wgmma).
template <int TRANS_A, int TRANS_B, register_tile D, typename A, typename SB>
__device__ __forceinline__ void mma_k_steps(D& d, const A& a, const SB& b, bool accumulate) {
    using T = typename A::dtype;
    auto& regs = accumulator_registers(d);
    constexpr int k_extent = TRANS_A ? A::rows : A::cols;
    const uint64_t b0 = TRANS_B ? descriptor_mn_major(b) : descriptor_k_major(b);
    auto b_at = [&](int k) { return layout_math::wgmma_descriptor_advance(b0, k_step<TRANS_B, SB>(k)); };
    if constexpr (register_tile<A>) {
        static_assert(A::rows == 16 && std::same_as<typename A::layout, row_l>, "wgmma: register a is 16 x K, row layout");
#pragma unroll
        for (int k = 0; k < k_extent / TILE_DIM; k++) {
            uint32_t af[4];
            a_fragment(af, a, k);
            mma_step<T, 0, TRANS_B, D::cols>(regs, af, b_at(k), (accumulate || k > 0) ? 1 : 0);
        }
    } else {
        static_assert(!TRANS_A || A::cols == 64, "wgmma: a transposed shared a has the warpgroup's 64 rows as columns");
        static_assert(TRANS_A || A::rows == 64, "wgmma: shared a has the warpgroup's 64 rows");
        const uint64_t a0 = TRANS_A ? descriptor_mn_major(a) : descriptor_k_major(a);
#pragma unroll
        for (int k = 0; k < k_extent / TILE_DIM; k++) {
            const uint64_t a_k = layout_math::wgmma_descriptor_advance(a0, k_step<TRANS_A, A>(k));
            mma_step<T, TRANS_A, TRANS_B, D::cols>(regs, a_k, b_at(k), (accumulate || k > 0) ? 1 : 0);
        }
    }
}

template <typename A, typename SB>
constexpr void check_operand_types() {
    static_assert(half_precision<typename SB::dtype> && std::same_as<typename SB::dtype, typename A::dtype>,
                  "wgmma: bf16 or fp16 operands of one type");
}
}  // namespace detail

// d (+)= a * b^T, b an N x K K-major shared tile.
template <register_tile D, typename A, typename SB>
__device__ __forceinline__ void mma_ABt(D& d, const A& a, const SB& b, bool accumulate) {
    detail::check_operand_types<A, SB>();
    static_assert(SB::rows == D::cols && A::cols == SB::cols, "wgmma::mma_ABt: shapes (64 x K)(N x K)");
    detail::mma_k_steps<0, 0>(d, a, b, accumulate);
}

// d (+)= a * b, b a K x N shared tile stored row-major (MN-major for wgmma).
template <register_tile D, typename A, typename SB>
__device__ __forceinline__ void mma_AB(D& d, const A& a, const SB& b, bool accumulate) {
    detail::check_operand_types<A, SB>();
    static_assert(SB::cols == D::cols && A::cols == SB::rows, "wgmma::mma_AB: shapes (64 x K)(K x N)");
    detail::mma_k_steps<0, 1>(d, a, b, accumulate);
}

// d (+)= a^T * b^T: a a K x 64 shared tile (its transpose is the warpgroup's 64 rows),
// b an N x K K-major shared tile.
template <register_tile D, typename SA, typename SB>
__device__ __forceinline__ void mma_AtBt(D& d, const SA& a, const SB& b, bool accumulate) {
    detail::check_operand_types<SA, SB>();
    static_assert(shared_tile<SA>, "wgmma::mma_AtBt: a transposed a lives in shared memory");
    static_assert(SB::rows == D::cols && SA::rows == SB::cols, "wgmma::mma_AtBt: shapes (K x 64)(N x K)");
    detail::mma_k_steps<1, 0>(d, a, b, accumulate);
}

// d (+)= a^T * b: a a K x 64 shared tile, b a K x N shared tile stored row-major.
template <register_tile D, typename SA, typename SB>
__device__ __forceinline__ void mma_AtB(D& d, const SA& a, const SB& b, bool accumulate) {
    detail::check_operand_types<SA, SB>();
    static_assert(shared_tile<SA>, "wgmma::mma_AtB: a transposed a lives in shared memory");
    static_assert(SB::cols == D::cols && SA::rows == SB::rows, "wgmma::mma_AtB: shapes (K x 64)(K x N)");
    detail::mma_k_steps<1, 1>(d, a, b, accumulate);
}

}  // namespace kittens::wgmma
