// Memory movement tests: global <-> shared (warp / warpgroup, sync / cp.async,
// bounded), shared <-> register (ldmatrix and element paths, sub-tile views),
// global <-> register tiles and vectors (bounded), and arrive_last (parts combined by the last
// block to finish) with store_part / load_part (a float tile as a part, in fragment order).
#include "common.cuh"

namespace tk_test {

// ---------------------------------------------------------------------------
// global -> shared -> register -> shared -> global. Register tiles are RR x RC
// sub-tiles (views) of the R x C shared tile unless they cover it whole, so one
// warp never holds more than ~64 registers of data.
// ---------------------------------------------------------------------------
constexpr int kRoundtripWarps = 4;

template <typename L, int R, int C, int RR, int RC, typename ST>
__device__ void through_registers(ST& a, ST& b, const gl<typename ST::dtype>& dump, int si, int sj) {
    rt<typename ST::dtype, RR, RC, L> reg;
    if constexpr (RR == R && RC == C) {
        load(reg, a);
        store(b, reg);
    } else {
        auto view = subtile<RR, RC>(a, si, sj);  // a named view (const ST& path) ...
        load(reg, view);
        store(subtile<RR, RC>(b, si, sj), reg);  // ... and a temporary one (forwarding store)
    }
    store(dump, reg, coord{0, 0, si, sj});  // register -> global, unbounded (dump is R x C)
}

template <typename G, typename T>
__device__ void copy_in(T& tile, const gl<typename T::dtype>& src, coord at, bool async) {
    if (async) {
        G::load_async(tile, src, at);
        cp_async_commit();
        cp_async_wait<0>();
    } else {
        G::load(tile, src, at);
    }
}

template <typename T, int R, int C, int RR, int RC>
__global__ void __launch_bounds__(kRoundtripWarps * 32)
    roundtrip_kernel(gl<T> in, gl<T> out, gl<T> dump, coord at, int mode, int layout) {
    extern __shared__ char smem[];
    shared_allocator alloc(smem);
    auto& a = alloc.allocate<st<T, R, C>>();
    auto& b = alloc.allocate<st<T, R, C>>();
    const bool warpgroup_copy = mode & 1, async = mode & 2;

    if (warpgroup_copy) copy_in<warpgroup>(a, in, at, async);
    else if (warp_id() == 0) copy_in<warp>(a, in, at, async);
    __syncthreads();

    constexpr int tiles_w = C / RC, tiles = (R / RR) * tiles_w;
    for (int s = warp_id(); s < tiles; s += kRoundtripWarps) {
        if (layout == 0) through_registers<row_l, R, C, RR, RC>(a, b, dump, s / tiles_w, s % tiles_w);
        else through_registers<col_l, R, C, RR, RC>(a, b, dump, s / tiles_w, s % tiles_w);
    }
    __syncthreads();

    if (warpgroup_copy) warpgroup::store(out, b, at);
    else if (warp_id() == 0) warp::store(out, b, at);
}

template <typename T, int R, int C, int RR, int RC>
bool try_roundtrip(int rows, int cols, const gl_args& in, const gl_args& out, const gl_args& dump,
                   const coord_args& at, int mode, int layout, int64_t stream) {
    if (rows != R || cols != C) return false;
    auto kernel = roundtrip_kernel<T, R, C, RR, RC>;
    const int smem = shared_bytes_for<st<T, R, C>, st<T, R, C>>();
    allow_shared(kernel, smem);
    kernel<<<1, kRoundtripWarps * 32, smem, as_stream(stream)>>>(make_gl<T>(in), make_gl<T>(out), make_gl<T>(dump),
                                                                  make_coord(at), mode, layout);
    check_launch("roundtrip");
    return true;
}

void roundtrip(int dtype, int rows, int cols, const gl_args& in, const gl_args& out, const gl_args& dump,
               const coord_args& at, int mode, int layout, int64_t stream) {
    with_dtype(dtype, [&]<typename T>(std::type_identity<T>) {
        // (R, C, RR, RC): tile shapes and the register sub-tile each is moved through.
        const bool done = try_roundtrip<T, 16, 16, 16, 16>(rows, cols, in, out, dump, at, mode, layout, stream) ||
                          try_roundtrip<T, 32, 64, 32, 64>(rows, cols, in, out, dump, at, mode, layout, stream) ||
                          try_roundtrip<T, 64, 128, 32, 64>(rows, cols, in, out, dump, at, mode, layout, stream) ||
                          try_roundtrip<T, 128, 64, 64, 32>(rows, cols, in, out, dump, at, mode, layout, stream) ||
                          try_roundtrip<T, 16, 256, 16, 128>(rows, cols, in, out, dump, at, mode, layout, stream);
        if (!done) throw std::runtime_error("roundtrip: no instance for this tile shape");
    });
}

// ---------------------------------------------------------------------------
// global <-> register tiles (32 x 64), registers in type T, global in type G.
// ---------------------------------------------------------------------------
template <typename G, typename T>
__global__ void __launch_bounds__(32)
    register_global_kernel(gl<G> in, gl<G> out, gl<G> out_t, gl<G> dump, coord at, int layout) {
    auto run = [&]<typename L>(L) {
        rt<T, 32, 64, L> reg;
        load(reg, in, at);
        store(out, reg, at);
        store_transposed(out_t, reg, at);
        store(dump, reg, coord{});
    };
    if (layout == 0) run(row_l{});
    else run(col_l{});
}

void register_global(int dtype, int reg_dtype, const gl_args& in, const gl_args& out, const gl_args& out_t,
                     const gl_args& dump, const coord_args& at, int layout, int64_t stream) {
    with_dtype(dtype, [&]<typename G>(std::type_identity<G>) {
        with_dtype(reg_dtype, [&]<typename T>(std::type_identity<T>) {
            // Register precision other than the global one only through float.
            if constexpr (std::same_as<G, T> || std::same_as<G, float> || std::same_as<T, float>) {
                register_global_kernel<G, T><<<1, 32, 0, as_stream(stream)>>>(
                    make_gl<G>(in), make_gl<G>(out), make_gl<G>(out_t), make_gl<G>(dump), make_coord(at), layout);
                check_launch("register_global");
            } else {
                throw std::runtime_error("register_global: 16-bit <-> 16-bit pairs are not instantiated");
            }
        });
    });
}

// ---------------------------------------------------------------------------
// global <-> register vectors (float, length 64) in both vector layouts.
// ---------------------------------------------------------------------------
// through_shared: global -> shared vector (warp::load) -> register -> shared -> global
// (warp::store) instead of the direct global <-> register path.
template <typename G>
__global__ void __launch_bounds__(32)
    vector_global_kernel(gl<G> in, gl<G> out, gl<G> dump, coord at, int layout, bool through_shared) {
    __shared__ sv<G, 64> staged_in, staged_out;
    auto run = [&]<vec_layout VL>(std::integral_constant<vec_layout, VL>) {
        rv<float, 64, VL> v;
        if (through_shared) {
            warp::load(staged_in, in, at);
            __syncwarp();
            load(v, staged_in);
            store(staged_out, v);
            __syncwarp();
            warp::store(out, staged_out, at);
        } else {
            load(v, in, at);
            store(out, v, at);
        }
        store(dump, v, coord{});
    };
    if (layout == 0) run(std::integral_constant<vec_layout, vec_layout::pairs>{});
    else run(std::integral_constant<vec_layout, vec_layout::quads>{});
}

void vector_global(int dtype, const gl_args& in, const gl_args& out, const gl_args& dump, const coord_args& at,
                   int layout, bool through_shared, int64_t stream) {
    with_dtype(dtype, [&]<typename G>(std::type_identity<G>) {
        vector_global_kernel<G><<<1, 32, 0, as_stream(stream)>>>(make_gl<G>(in), make_gl<G>(out), make_gl<G>(dump),
                                                                  make_coord(at), layout, through_shared);
        check_launch("vector_global");
    });
}

// ---------------------------------------------------------------------------
// arrive_last: warp w of every block writes its value to parts[block][w] and arrives at
// counters[w]; the last warp to arrive for w sums all blocks' parts in block order into
// sums[w], and counts itself in lasts[w] (which must end at 1).
// ---------------------------------------------------------------------------
constexpr int kArrivalWarps = 4;

__global__ void __launch_bounds__(kArrivalWarps * 32)
    last_arrival_kernel(const float* values, float* parts, int* counters, float* sums, int* lasts) {
    const int w = warp_id(), slot = blockIdx.x * kArrivalWarps + w;
    if (lane_id() == 0) parts[slot] = values[slot];
    if (!arrive_last(counters + w, gridDim.x)) return;
    if (lane_id() == 0) {
        float sum = 0.f;
        for (int b = 0; b < int(gridDim.x); b++) sum += __ldcg(parts + b * kArrivalWarps + w);
        sums[w] = sum;
        atomicAdd(lasts + w, 1);
    }
}

void last_arrival(int64_t values, int64_t parts, int64_t counters, int64_t sums, int64_t lasts, int blocks,
                  int64_t stream) {
    last_arrival_kernel<<<blocks, kArrivalWarps * 32, 0, as_stream(stream)>>>(
        reinterpret_cast<const float*>(values), reinterpret_cast<float*>(parts), reinterpret_cast<int*>(counters),
        reinterpret_cast<float*>(sums), reinterpret_cast<int*>(lasts));
    check_launch("last_arrival");
}

// ---------------------------------------------------------------------------
// store_part / load_part: warp w loads row tile w (32 x 64 floats) of `in` and writes it to
// part w (`parts` + w * 32 * 64) in its fragment order; a second launch's warp w reads part w
// back (through L2) and stores it as row tile w of `out`.
// ---------------------------------------------------------------------------
constexpr int kPartRows = 32, kPartCols = 64;

__global__ void __launch_bounds__(kArrivalWarps * 32) part_store_kernel(gl<float> in, float* parts) {
    rt_fl<kPartRows, kPartCols> tile;
    load(tile, in, coord{0, 0, warp_id(), 0});
    store_part(parts + warp_id() * kPartRows * kPartCols, tile);
}

__global__ void __launch_bounds__(kArrivalWarps * 32) part_load_kernel(const float* parts, gl<float> out) {
    rt_fl<kPartRows, kPartCols> tile;
    load_part(tile, parts + warp_id() * kPartRows * kPartCols);
    store(out, tile, coord{0, 0, warp_id(), 0});
}

void part_roundtrip(const gl_args& in, int64_t parts, const gl_args& out, int64_t stream) {
    part_store_kernel<<<1, kArrivalWarps * 32, 0, as_stream(stream)>>>(make_gl<float>(in), reinterpret_cast<float*>(parts));
    check_launch("part_store");
    part_load_kernel<<<1, kArrivalWarps * 32, 0, as_stream(stream)>>>(reinterpret_cast<const float*>(parts),
                                                                       make_gl<float>(out));
    check_launch("part_load");
}

}  // namespace tk_test
