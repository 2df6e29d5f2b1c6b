// Tensor memory accelerator (sm_90): tile copies between a global layout and a
// shared tile by the copy engine, described by a tensor map.
//
// A shared tile is stored as column panels exactly one swizzle span wide
// (layout_math.cuh), which is the box layout TMA writes with the matching swizzle
// mode; a tile of several panels is one copy per panel. Out-of-range elements are
// zero-filled on load and skipped on store, so partial tiles need no padding.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cstdint>
#include "../common/base_types.cuh"
#include "../types/global/gl.cuh"
#include "../types/shared/st.cuh"
#include "semaphore.cuh"

namespace kittens::tma {

// ---------------------------------------------------------------------------
// Host: tensor maps.
// ---------------------------------------------------------------------------

template <typename T> constexpr CUtensorMapDataType data_type();
template <> constexpr CUtensorMapDataType data_type<bf16>() { return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; }
template <> constexpr CUtensorMapDataType data_type<half>() { return CU_TENSOR_MAP_DATA_TYPE_FLOAT16; }
template <> constexpr CUtensorMapDataType data_type<float>() { return CU_TENSOR_MAP_DATA_TYPE_FLOAT32; }

constexpr CUtensorMapSwizzle swizzle_mode(int swizzle_bytes) {
    return swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
         : swizzle_bytes == 64  ? CU_TENSOR_MAP_SWIZZLE_64B
                                : CU_TENSOR_MAP_SWIZZLE_32B;
}

// The driver's encoder, found through the runtime so the extension needs no -lcuda.
inline PFN_cuTensorMapEncodeTiled_v12000 encoder() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult status{};
        // The 12.0 ABI of the function, matching PFN_cuTensorMapEncodeTiled_v12000.
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status) !=
                cudaSuccess ||
            status != cudaDriverEntryPointSuccess)
            p = nullptr;
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// Tensor map for copying ST-shaped tiles (one panel per copy) of `g`. Returns
// CUDA_ERROR_* from the driver: strides must be multiples of 16 bytes and the base
// 16-byte aligned (the callers check, with a clear message, before getting here).
// `promotion`: how much L2 fetches around each request it misses (a performance hint); the
// default is the attention maps' (matmul asks for 128 bytes).
constexpr CUtensorMapL2promotion DEFAULT_L2_PROMOTION = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
template <typename ST, typename GL>
CUresult make_tensor_map(CUtensorMap* map, const GL& g, CUtensorMapL2promotion promotion = DEFAULT_L2_PROMOTION) {
    using T = typename ST::dtype;
    static_assert(std::same_as<T, typename GL::dtype>, "make_tensor_map: tile and tensor element types differ");
    static_assert(ST::rows <= 256 && ST::panel_cols <= 256, "make_tensor_map: TMA boxes are at most 256 per dim");
    auto encode = encoder();
    if (encode == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    // The encoder is a driver call: it needs a current context on this thread, which a thread
    // has only once some runtime call has made the device's primary context current. Torch's
    // autograd threads (and a user's own threads) may reach us before any such call, and the
    // encode then fails with CUDA_ERROR_INVALID_CONTEXT. Setting the runtime's device does it.
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess)
        return CUDA_ERROR_INVALID_CONTEXT;
    const cuuint64_t dims[4] = {cuuint64_t(g.cols()), cuuint64_t(g.rows()), cuuint64_t(g.heads()),
                                cuuint64_t(g.batch())};
    const cuuint64_t strides[3] = {cuuint64_t(g.row_stride) * sizeof(T), cuuint64_t(g.head_stride) * sizeof(T),
                                   cuuint64_t(g.batch_stride) * sizeof(T)};
    const cuuint32_t box[4] = {cuuint32_t(ST::panel_cols), cuuint32_t(ST::rows), 1, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    return encode(map, data_type<T>(), 4, static_cast<void*>(g.raw), dims, strides, box, element_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_mode(ST::swizzle_bytes), promotion,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// ---------------------------------------------------------------------------
// Device: copies. One thread issues them; `at` counts tiles in rows/cols.
// ---------------------------------------------------------------------------

// Bytes a full tile load adds to its semaphore (out-of-range parts count too: they
// arrive as zeros).
template <typename ST> constexpr uint32_t tile_bytes() { return uint32_t(ST::rows * ST::cols * sizeof(typename ST::dtype)); }

// An L2 cache policy for the bytes a copy reads or writes (createpolicy).
struct cache_policy { uint64_t value; };
// Lines L2 should drop before others: data a kernel streams past while it rereads other data.
__device__ __forceinline__ cache_policy evict_first_policy() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));  // not volatile: may be hoisted
    return {p};
}

namespace detail {
// One bulk tensor load per panel; HINT adds `policy` as the loads' L2 cache hint.
template <bool HINT, typename ST>
__device__ __forceinline__ void load_panels(ST& dst, const CUtensorMap* map, coord at, semaphore& sem,
                                            cache_policy policy) {
    const uint64_t map_address = reinterpret_cast<uint64_t>(map);
#pragma unroll
    for (int p = 0; p < ST::cols / ST::panel_cols; p++) {
        const int c = at.c * ST::cols + p * ST::panel_cols, r = at.r * ST::rows;
        const uint32_t panel = dst.address(0, p * ST::panel_cols), bar = shared_address(&sem);
        if constexpr (HINT)
            asm volatile(
                "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(panel),
                "l"(map_address), "r"(c), "r"(r), "r"(at.h), "r"(at.b), "r"(bar), "l"(policy.value) : "memory");
        else
            asm volatile(
                "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(panel),
                "l"(map_address), "r"(c), "r"(r), "r"(at.h), "r"(at.b), "r"(bar) : "memory");
    }
}
}  // namespace detail

// dst = tile `at` of the tensor behind `map`; completes on `sem` (call
// expect_bytes(sem, tile_bytes<ST>()) in the same phase).
template <typename ST>
__device__ __forceinline__ void load_async(ST& dst, const CUtensorMap* map, coord at, semaphore& sem) {
    detail::load_panels<false>(dst, map, at, sem, {});
}
// The same with an L2 cache policy.
template <typename ST>
__device__ __forceinline__ void load_async(ST& dst, const CUtensorMap* map, coord at, semaphore& sem, cache_policy policy) {
    detail::load_panels<true>(dst, map, at, sem, policy);
}

// Panel `panel` of load_async's tile, copied into several blocks of a cluster at once
// (multicast): it lands at the same shared-memory offset, and completes on the semaphore at
// the same offset, in every block whose rank is a bit of `blocks`, for one read of L2. Blocks
// that share a tile each load some of its panels this way; each block's semaphore then
// expects the whole tile_bytes<ST>().
template <typename ST>
__device__ __forceinline__ void load_panel_multicast(ST& dst, const CUtensorMap* map, coord at, int panel,
                                                     semaphore& sem, uint16_t blocks) {
    const int c = at.c * ST::cols + panel * ST::panel_cols, r = at.r * ST::rows;
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst.address(0, panel * ST::panel_cols)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c), "r"(r), "r"(at.h), "r"(at.b), "r"(shared_address(&sem)),
        "h"(blocks) : "memory");
}

// dst[0, bytes) = src[0, bytes): a plain (1-D) bulk copy, no tensor map. Both addresses
// 16-byte aligned, bytes a multiple of 16; completes on `sem` like load_async (count the bytes
// in expect_bytes).
__device__ __forceinline__ void load_bytes_async(void* dst, const void* src, uint32_t bytes, semaphore& sem) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     shared_address(dst)),
                 "l"(src), "r"(bytes), "r"(shared_address(&sem))
                 : "memory");
}

namespace detail {
// One bulk tensor store per panel; ADD makes the copy engine add into global memory, HINT adds
// `policy` as the stores' L2 cache hint.
template <bool ADD, bool HINT, typename ST>
__device__ __forceinline__ void store_panels(const CUtensorMap* map, const ST& src, coord at, cache_policy policy) {
    // (PTX has a hinted reduce-add too; no caller wants one yet, so it is not written.)
    static_assert(!(ADD && HINT), "store_panels: no cache hint on reduce-add stores");
    const uint64_t map_address = reinterpret_cast<uint64_t>(map);
#pragma unroll
    for (int p = 0; p < ST::cols / ST::panel_cols; p++) {
        const int c = at.c * ST::cols + p * ST::panel_cols, r = at.r * ST::rows;
        const uint32_t panel = src.address(0, p * ST::panel_cols);
        if constexpr (ADD)
            asm volatile(
                "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                    map_address), "r"(c), "r"(r), "r"(at.h), "r"(at.b), "r"(panel) : "memory");
        else if constexpr (HINT)
            asm volatile(
                "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group.L2::cache_hint [%0, {%1, %2, %3, %4}], [%5], %6;\n" ::"l"(
                    map_address), "r"(c), "r"(r), "r"(at.h), "r"(at.b), "r"(panel), "l"(policy.value) : "memory");
        else
            asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                             map_address), "r"(c), "r"(r), "r"(at.h), "r"(at.b), "r"(panel) : "memory");
    }
}
}  // namespace detail

// Tile `at` of the tensor = src; parts outside the tensor are not written. Completes
// asynchronously: store_commit() then store_wait_read<0>() before src is reused.
template <typename ST>
__device__ __forceinline__ void store_async(const CUtensorMap* map, const ST& src, coord at) {
    detail::store_panels<false, false>(map, src, at, {});
}
// The same with an L2 cache policy for the written lines.
template <typename ST>
__device__ __forceinline__ void store_async(const CUtensorMap* map, const ST& src, coord at, cache_policy policy) {
    detail::store_panels<false, true>(map, src, at, policy);
}

// Tile `at` of the tensor += src (element-wise add done by the copy engine).
template <typename ST>
__device__ __forceinline__ void store_add_async(const CUtensorMap* map, const ST& src, coord at) {
    detail::store_panels<true, false>(map, src, at, {});
}

__device__ __forceinline__ void store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Wait until at most N committed store groups still read their shared source.
template <int N> __device__ __forceinline__ void store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Wait until at most N committed store groups are still writing global memory.
template <int N> __device__ __forceinline__ void store_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace kittens::tma
