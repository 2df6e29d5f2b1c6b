// Work split over blocks whose last finisher combines the parts (the attention forward's split
// key ranges): each part's warp writes its results to global memory and arrives at a counter;
// only the warp whose arrival completes the count reads all the parts back.
#pragma once
#include "../../../common/util.cuh"
#include "../../../types/register/rt.cuh"

namespace kittens {

// One warp's arrival at `counter` (int32 in global memory, zero at launch). The warp's global
// writes before the call are made visible at GPU scope before its arrival counts. Returns, in
// every lane, whether this arrival was the `arrivals`-th, i.e. the last; if so, the other
// arrivals' writes are visible to this warp's reads after the call. Read them through L2
// (e.g. __ldcg): another SM wrote them.
__device__ __forceinline__ bool arrive_last(int* counter, int arrivals) {
    __threadfence();
    __syncwarp();
    int before = 0;
    if (lane_id() == 0) before = atomicAdd(counter, 1);
    const bool last = __shfl_sync(0xffffffffu, before, 0) == arrivals - 1;
    if (last) __threadfence();
    return last;
}

namespace detail {
// f(index, pairs) for each 16-byte chunk of a float tile's registers: `pairs` its first
// register pair (the chunk is pairs[0], pairs[1]), `index` its float4 index in the part.
template <typename RT, typename F>
__device__ __forceinline__ void for_each_part_chunk(RT& tile, F&& f) {
    using Tile = std::remove_const_t<RT>;
    static_assert(std::same_as<typename Tile::dtype, float>, "store_part / load_part: float tiles");
#pragma unroll
    for (int i = 0; i < Tile::height; i++)
#pragma unroll
        for (int j = 0; j < Tile::width; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                f(((i * Tile::width + j) * 2 + h) * 32 + lane_id(), &tile.tiles[i][j].data[2 * h]);
}
}  // namespace detail

// A part that is a float register tile goes out and comes back in its own fragment order:
// 16-byte chunk q of lane l (its register pairs 2q and 2q + 1) at float4 index 32 q + l of
// `part`, so every access of the warp covers 512 contiguous bytes. Only a warp at the same
// tile position (the same lane -> element map) can read it back; `part` is 16-byte aligned and
// holds RT::rows * RT::cols floats. Through a row-major layout (kt::store, kt::load) a 16 x 128
// tile took 64 scalar accesses per lane, each warp access using half of its 32-byte sectors;
// this way it takes 16.
template <register_tile RT>
__device__ __forceinline__ void store_part(float* part, const RT& src) {
    float4* chunks = reinterpret_cast<float4*>(part);
    detail::for_each_part_chunk(src, [&](int index, const float2* pairs) {
        chunks[index] = make_float4(pairs[0].x, pairs[0].y, pairs[1].x, pairs[1].y);
    });
}

// The tile store_part wrote, read through L2 (another SM wrote it: see arrive_last).
template <register_tile RT>
__device__ __forceinline__ void load_part(RT& dst, const float* part) {
    const float4* chunks = reinterpret_cast<const float4*>(part);
    detail::for_each_part_chunk(dst, [&](int index, float2* pairs) {
        const float4 c = __ldcg(chunks + index);
        pairs[0] = make_float2(c.x, c.y);
        pairs[1] = make_float2(c.z, c.w);
    });
}

}  // namespace kittens
