// Appends new keys and values to preallocated caches in place: row i of k_new / v_new of
// sequence b goes to row seqlens[b] + i of the cache (the lengths are read on the device, so a
// decoding step needs no host sync and replays in a CUDA graph with changing lengths). Rows that
// would land outside the cache are dropped. One thread per 16-byte chunk, a row's chunks on
// neighbouring threads (coalesced).
#include <cstdint>

#include "attention/decode_params.h"

namespace tk::attention {
namespace {

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS) append_kernel(const __grid_constant__ AppendParams p, int64_t chunks) {
    int64_t index = int64_t(blockIdx.x) * THREADS + threadIdx.x;
    if (index >= chunks) return;
    const int per_row = p.head_dim * p.element_bytes / 16;
    const int chunk = int(index % per_row);
    index /= per_row;
    const int i = int(index % p.len_new);
    index /= p.len_new;
    const int h = int(index % p.heads);
    index /= p.heads;
    const int b = int(index % p.batch);
    const bool is_v = index >= p.batch;
    const int64_t row = int64_t(p.seqlens[b]) + i;
    if (row < 0 || row >= p.capacity) return;
    const char* src = static_cast<const char*>(is_v ? p.v_new : p.k_new) +
                      (is_v ? b * p.vn_stride_b + h * p.vn_stride_h + i * p.vn_stride_l
                            : b * p.kn_stride_b + h * p.kn_stride_h + i * p.kn_stride_l) * p.element_bytes;
    char* dst = static_cast<char*>(is_v ? p.v_cache : p.k_cache) +
                (is_v ? b * p.vc_stride_b + h * p.vc_stride_h + row * p.vc_stride_l
                      : b * p.kc_stride_b + h * p.kc_stride_h + row * p.kc_stride_l) * p.element_bytes;
    reinterpret_cast<uint4*>(dst)[chunk] = reinterpret_cast<const uint4*>(src)[chunk];
}

}  // namespace

cudaError_t kvcache_append(const AppendParams& p, cudaStream_t stream) {
    const int64_t chunks = 2 * int64_t(p.batch) * p.heads * p.len_new * (p.head_dim * p.element_bytes / 16);
    const int64_t blocks = (chunks + THREADS - 1) / THREADS;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    if (blocks == 0) return cudaSuccess;
    append_kernel<<<unsigned(blocks), THREADS, 0, stream>>>(p, chunks);
    return cudaGetLastError();
}

}  // namespace tk::attention
