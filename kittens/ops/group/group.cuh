// Operations shared by a group of N consecutive warps (group<1> is one warp,
// group<4> a warpgroup): collaborative global <-> shared tile copies, synchronous
// or through cp.async, with out-of-range elements zero-filled on load and skipped
// on store.
//
// Preconditions for the 16-byte paths: the global base pointer is 16-byte aligned
// and the row stride is a multiple of 16 bytes (kernels check this on the host).
#pragma once
#include "../../types/global/gl.cuh"
#include "../../types/shared/st.cuh"
#include "../../types/shared/sv.cuh"

namespace kittens {

// Wait until at most N committed cp.async groups of this thread are in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N_WARPS>
struct group {
    static constexpr int warps = N_WARPS;
    static constexpr int threads = N_WARPS * WARP_THREADS;
    __device__ static int thread() { return threadIdx.x % threads; }
    __device__ static int warp() { return (threadIdx.x / WARP_THREADS) % N_WARPS; }

    // Barrier over this group only (named barrier `id`, 1..15; 0 is __syncthreads).
    __device__ static void sync(int id) {
        if constexpr (N_WARPS == 1) __syncwarp();
        else asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(threads) : "memory");
    }

    // Barrier `id` shared with other groups: a barrier of THREADS threads in all, which this
    // group either waits on (sync_with) or only signals (arrive_at) without waiting. Two
    // groups that take turns use it: each waits on its own barrier and signals the other's.
    template <int THREADS> __device__ static void sync_with(int id) {
        asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
    }
    template <int THREADS> __device__ static void arrive_at(int id) {
        asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
    }

    // Visit the tile's 16-byte chunks, spread over the group's threads so that
    // consecutive threads touch consecutive chunks of a row (coalesced).
    // f(row, col, global_pointer, valid_elements): valid_elements < 16 bytes' worth
    // only at the tensor's edge, where an out-of-range chunk gets 0 and the tensor's
    // base pointer (a valid address that is never read).
    // A tile wholly inside the tensor (every tile but the last in each dim) takes a
    // branch with no per-chunk bounds arithmetic: one pointer add per chunk.
    template <typename ST, typename GL, typename F>
    __device__ static void for_each_chunk(const GL& g, coord at, F&& f) {
        using T = typename ST::dtype;
        constexpr int per_chunk = 16 / int(sizeof(T));
        constexpr int chunks_per_row = ST::cols / per_chunk;
        constexpr int chunks = ST::rows * chunks_per_row;
        const int row0 = at.r * ST::rows, col0 = at.c * ST::cols;
        T* const tile = g.ptr(at.b, at.h, row0, col0);
        const int64_t row_stride = g.row_stride;
        if (row0 + ST::rows <= g.rows() && col0 + ST::cols <= g.cols()) {
            if constexpr (threads % chunks_per_row == 0) {
                // Each thread keeps one column and steps down a fixed number of rows:
                // the global pointer advances by a constant (no per-chunk multiply).
                constexpr int rows_per_step = threads / chunks_per_row;
                const int r0 = thread() / chunks_per_row, c = (thread() % chunks_per_row) * per_chunk;
                T* p = tile + r0 * row_stride + c;
                const int64_t step = rows_per_step * row_stride;
#pragma unroll
                for (int k = 0; k < ceil_div(ST::rows, rows_per_step); k++)
                    if (ST::rows % rows_per_step == 0 || r0 + k * rows_per_step < ST::rows)
                        f(r0 + k * rows_per_step, c, p + k * step, per_chunk);
            } else {
#pragma unroll
                for (int i = thread(); i < chunks; i += threads) {
                    const int r = i / chunks_per_row, c = (i % chunks_per_row) * per_chunk;
                    f(r, c, tile + r * row_stride + c, per_chunk);
                }
            }
        } else {
#pragma unroll
            for (int i = thread(); i < chunks; i += threads) {
                const int r = i / chunks_per_row, c = (i % chunks_per_row) * per_chunk;
                const int in_cols = g.cols() - (col0 + c);
                const int valid = row0 + r < g.rows() ? (in_cols < 0 ? 0 : in_cols < per_chunk ? in_cols : per_chunk) : 0;
                f(r, c, valid > 0 ? tile + r * row_stride + c : g.raw, valid);
            }
        }
    }

    // dst = src tile at `at` (synchronous: visible after a group sync).
    template <typename STRef, global_layout GL>
        requires shared_tile<std::remove_cvref_t<STRef>>
    __device__ static void load(STRef&& dst, const GL& src, coord at) {  // a tile or a temporary view
        using ST = std::remove_cvref_t<STRef>;
        using T = typename ST::dtype;
        static_assert(std::same_as<T, typename GL::dtype>, "load: shared and global element types differ");
        for_each_chunk<ST>(src, at, [&](int r, int c, const T* s, int valid) {
            T* d = dst.ptr(r, c);
            if (valid == 16 / int(sizeof(T))) {
                *reinterpret_cast<float4*>(d) = *reinterpret_cast<const float4*>(s);
            } else {
                for (int e = 0; e < 16 / int(sizeof(T)); e++) d[e] = e < valid ? s[e] : convert<T>(0.f);
            }
        });
    }

    // Same through cp.async: returns at once; complete it with cp_async_commit(),
    // cp_async_wait<n>() and a sync. Partial chunks are zero-filled by the copy
    // engine (src-size < 16).
    template <typename STRef, global_layout GL>
        requires shared_tile<std::remove_cvref_t<STRef>>
    __device__ static void load_async(STRef&& dst, const GL& src, coord at) {  // a tile or a temporary view
        using ST = std::remove_cvref_t<STRef>;
        using T = typename ST::dtype;
        static_assert(std::same_as<T, typename GL::dtype>, "load_async: shared and global element types differ");
        for_each_chunk<ST>(src, at, [&](int r, int c, const T* s, int valid) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst.address(r, c)), "l"(s),
                         "r"(valid * int(sizeof(T)))
                         : "memory");
        });
    }

    // dst tile at `at` = src; elements outside dst are not written.
    template <global_layout GL, shared_tile ST>
    __device__ static void store(const GL& dst, const ST& src, coord at) {
        using T = typename ST::dtype;
        static_assert(std::same_as<T, typename GL::dtype>, "store: shared and global element types differ");
        for_each_chunk<ST>(dst, at, [&](int r, int c, T* d, int valid) {
            const T* s = src.ptr(r, c);
            if (valid == 16 / int(sizeof(T))) {
                *reinterpret_cast<float4*>(d) = *reinterpret_cast<const float4*>(s);
            } else {
                for (int e = 0; e < valid; e++) d[e] = s[e];
            }
        });
    }

    // Shared vectors <-> global: a vector lies along a row of the global layout (element
    // n at column at.c * N + n of row at.r), like register vectors. Element-wise and
    // bounds-checked: vectors are small, so this favours simplicity over 16-byte moves.
    template <typename SV, global_layout GL>
        requires shared_vector<SV>
    __device__ static void load(SV& dst, const GL& src, coord at) {
        using T = typename SV::dtype;
        for (int n = thread(); n < SV::length; n += threads) {
            const int c = at.c * SV::length + n;
            dst[n] = at.r < src.rows() && c < src.cols() ? convert<T>(*src.ptr(at.b, at.h, at.r, c)) : convert<T>(0.f);
        }
    }
    template <global_layout GL, typename SV>
        requires shared_vector<SV>
    __device__ static void store(const GL& dst, const SV& src, coord at) {
        for (int n = thread(); n < SV::length; n += threads) {
            const int c = at.c * SV::length + n;
            if (at.r < dst.rows() && c < dst.cols()) *dst.ptr(at.b, at.h, at.r, c) = convert<typename GL::dtype>(src[n]);
        }
    }
};

}  // namespace kittens

namespace kittens {
using warp = group<1>;
using warpgroup = group<4>;
}  // namespace kittens
