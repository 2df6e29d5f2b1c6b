// Host: a process-wide cache of TMA tensor maps.
//
// Encoding a map goes through the driver (microseconds), and a training loop calls the same
// kernels on the same shapes over and over. A map depends only on the values in MapKey (the
// address, dims, strides, tile box, element type and L2 promotion; the element size and the
// swizzle follow from those), so reusing one for a recycled address is still exact. (The type,
// not just its size: an fp16 map served for bf16 data would copy the same bits, but reduce-adds
// with it would add the wrong numbers.) Thread-safe; bounded, since a long-running process sees
// many addresses.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "tma.cuh"

namespace kittens::tma {

namespace detail {
struct MapKey {
    const void* data;
    int64_t dims[4], strides[3];
    int box_rows, box_cols, element_type, promotion;  // CUtensorMapDataType, CUtensorMapL2promotion
    bool operator==(const MapKey&) const = default;
};
struct MapKeyHash {
    size_t operator()(const MapKey& k) const {
        size_t h = std::hash<const void*>()(k.data);
        auto mix = [&](int64_t v) { h = h * 1000003u ^ std::hash<int64_t>()(v); };
        for (int64_t v : k.dims) mix(v);
        for (int64_t v : k.strides) mix(v);
        mix(k.box_rows), mix(k.box_cols), mix(k.element_type), mix(k.promotion);
        return h;
    }
};
}  // namespace detail

// make_tensor_map<ST>(map, g, promotion), served from the cache when the same map was made before.
template <typename ST, typename GL>
CUresult cached_tensor_map(CUtensorMap* map, const GL& g, CUtensorMapL2promotion promotion = DEFAULT_L2_PROMOTION) {
    static std::mutex mutex;
    static std::unordered_map<detail::MapKey, CUtensorMap, detail::MapKeyHash> cache;
    constexpr size_t kMaxEntries = 4096;
    const detail::MapKey key{g.raw,
                             {g.batch(), g.heads(), g.rows(), g.cols()},
                             {g.batch_stride, g.head_stride, g.row_stride},
                             ST::rows,
                             ST::panel_cols,
                             int(data_type<typename ST::dtype>()),
                             int(promotion)};
    std::lock_guard<std::mutex> lock(mutex);
    if (auto found = cache.find(key); found != cache.end()) {
        *map = found->second;
        return CUDA_SUCCESS;
    }
    const CUresult r = make_tensor_map<ST>(map, g, promotion);
    if (r == CUDA_SUCCESS) {
        if (cache.size() >= kMaxEntries) cache.clear();
        cache.emplace(key, *map);
    }
    return r;
}

}  // namespace kittens::tma
