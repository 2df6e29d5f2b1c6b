// Hopper (sm_90a) layer of the core: TMA round trips with partial tiles, TMA
// reduce-add, wgmma against torch, and a semaphore-driven two-stage pipeline.
// Built only for sm_90 GPUs (tests/test_core_hopper_gpu.py).
#include "hopper_common.cuh"

namespace tk_test {

template <typename T> using tma_tile = st<T, 64, 256 / int(sizeof(T))>;  // 256-byte rows: two 128-byte panels

// One thread copies; the block checks the result through the tested group paths.
//   dump = tile `at` of in (TMA load, zero fill), via a synchronous group store;
//   tile `at` of out = the tile (TMA store, clipped);  tile `at` of acc += the tile.
// `hinted`: the load and the store carry an L2 evict_first cache policy.
template <typename T>
__global__ void __launch_bounds__(128) tma_kernel(const __grid_constant__ CUtensorMap in_map,
                                                  const __grid_constant__ CUtensorMap out_map,
                                                  const __grid_constant__ CUtensorMap acc_map, gl<T> dump, coord at,
                                                  bool hinted) {
    using ST = tma_tile<T>;
    extern __shared__ char smem[];
    shared_allocator alloc(smem);
    auto& tile = alloc.allocate<ST>();
    auto& sem = alloc.allocate<semaphore>();
    if (threadIdx.x == 0) {
        init_semaphore(sem, 1);
        fence_semaphore_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        expect_bytes(sem, tma::tile_bytes<ST>());
        if (hinted) tma::load_async(tile, &in_map, at, sem, tma::evict_first_policy());
        else tma::load_async(tile, &in_map, at, sem);
    }
    wait(sem, 0);
    warpgroup::store(dump, tile, coord{});
    if (threadIdx.x == 0) {
        if (hinted) tma::store_async(&out_map, tile, at, tma::evict_first_policy());
        else tma::store_async(&out_map, tile, at);
        tma::store_add_async(&acc_map, tile, at);
        tma::store_commit();
        tma::store_wait<0>();
    }
}

void tma_round_trip(int dtype, const gl_args& in, const gl_args& out, const gl_args& acc, const gl_args& dump,
                    const coord_args& at, bool hinted, int64_t stream) {
    with_dtype(dtype, [&]<typename T>(std::type_identity<T>) {
        using ST = tma_tile<T>;
        const int smem = shared_bytes_for<ST, semaphore>();
        auto kernel = tma_kernel<T>;
        allow_shared(kernel, smem);
        kernel<<<1, 128, smem, as_stream(stream)>>>(tensor_map<ST>(make_gl<T>(in)), tensor_map<ST>(make_gl<T>(out)),
                                                    tensor_map<ST>(make_gl<T>(acc)), make_gl<T>(dump),
                                                    make_coord(at), hinted);
        check_launch("tma_round_trip");
    });
}

// d (64 x N) = a (64 x K) * op(b) [+ c], one warpgroup, operands staged by the (tested)
// group copies so only wgmma is under test. variant bit 0: b is K x N row-major (mma_AB)
// instead of N x K (mma_ABt); bit 1: a comes from registers (each warp's 16 rows); bit 2:
// a is given transposed, K x 64 row-major in shared memory (mma_AtB / mma_AtBt).
template <typename T, int N, int K, int VARIANT>
__device__ void wgmma_case(char* smem, const gl<T>& a, const gl<T>& b, const gl<float>& c, const gl<float>& d,
                           bool accumulate) {
    constexpr bool b_row_major = VARIANT & 1, a_in_registers = VARIANT & 2, a_transposed = VARIANT & 4;
    static_assert(!(a_in_registers && a_transposed), "wgmma: a register a is never transposed");
    using SA = std::conditional_t<a_transposed, st<T, K, 64>, st<T, 64, K>>;
    using SB = std::conditional_t<b_row_major, st<T, K, N>, st<T, N, K>>;
    shared_allocator alloc(smem);
    auto& sa = alloc.allocate<SA>();
    auto& sb = alloc.allocate<SB>();
    warpgroup::load(sa, a, coord{});
    warpgroup::load(sb, b, coord{});
    __syncthreads();
    rt_fl<16, N> acc;
    if (accumulate) load(acc, c, coord{0, 0, warp_id(), 0});
    else zero(acc);
    wgmma::fence();
    if constexpr (a_transposed) {
        if constexpr (b_row_major) wgmma::mma_AtB(acc, sa, sb, accumulate);
        else wgmma::mma_AtBt(acc, sa, sb, accumulate);
    } else {
        auto run = [&](const auto& a_operand) {
            if constexpr (b_row_major) wgmma::mma_AB(acc, a_operand, sb, accumulate);
            else wgmma::mma_ABt(acc, a_operand, sb, accumulate);
        };
        if constexpr (a_in_registers) {
            rt<T, 16, K> a_regs;
            load(a_regs, subtile<16, K>(sa, warp_id(), 0));
            run(a_regs);
        } else {
            run(sa);
        }
    }
    wgmma::commit();
    wgmma::wait<0>();
    store(d, acc, coord{0, 0, warp_id(), 0});
}

template <typename T, int N, int K>
__global__ void __launch_bounds__(128)
    wgmma_kernel(gl<T> a, gl<T> b, gl<float> c, gl<float> d, bool accumulate, int variant) {
    extern __shared__ char smem[];
    switch (variant) {
        case 0: wgmma_case<T, N, K, 0>(smem, a, b, c, d, accumulate); break;
        case 1: wgmma_case<T, N, K, 1>(smem, a, b, c, d, accumulate); break;
        case 2: wgmma_case<T, N, K, 2>(smem, a, b, c, d, accumulate); break;
        case 3: wgmma_case<T, N, K, 3>(smem, a, b, c, d, accumulate); break;
        case 4: wgmma_case<T, N, K, 4>(smem, a, b, c, d, accumulate); break;
        case 5: wgmma_case<T, N, K, 5>(smem, a, b, c, d, accumulate); break;
    }
}

template <typename T, int N, int K>
bool try_wgmma(int n, int k, bool accumulate, int variant, const gl_args& a, const gl_args& b, const gl_args& c,
               const gl_args& d, int64_t stream) {
    if (n != N || k != K) return false;
    const int smem = shared_bytes_for<st<T, 64, K>, st<T, N, K>>();  // either operand order: same bytes
    auto kernel = wgmma_kernel<T, N, K>;
    allow_shared(kernel, smem);
    kernel<<<1, 128, smem, as_stream(stream)>>>(make_gl<T>(a), make_gl<T>(b), make_gl<float>(c), make_gl<float>(d),
                                                accumulate, variant);
    check_launch("wgmma");
    return true;
}

void wgmma(int dtype, int n, int k, bool accumulate, int variant, const gl_args& a, const gl_args& b,
           const gl_args& c, const gl_args& d, int64_t stream) {
    auto go = [&]<typename T>(std::type_identity<T>) {
        const bool done = try_wgmma<T, 16, 64>(n, k, accumulate, variant, a, b, c, d, stream) ||
                          try_wgmma<T, 32, 64>(n, k, accumulate, variant, a, b, c, d, stream) ||
                          try_wgmma<T, 64, 64>(n, k, accumulate, variant, a, b, c, d, stream) ||
                          try_wgmma<T, 128, 64>(n, k, accumulate, variant, a, b, c, d, stream) ||
                          try_wgmma<T, 256, 64>(n, k, accumulate, variant, a, b, c, d, stream) ||
                          try_wgmma<T, 128, 128>(n, k, accumulate, variant, a, b, c, d, stream) ||
                          try_wgmma<T, 96, 64>(n, k, accumulate, variant, a, b, c, d, stream) ||
                          try_wgmma<T, 128, 96>(n, k, accumulate, variant, a, b, c, d, stream) ||
                          try_wgmma<T, 96, 128>(n, k, accumulate, variant, a, b, c, d, stream);
        if (!done) throw std::runtime_error("wgmma: no instance for this shape");
    };
    if (dtype == BF16) go(std::type_identity<bf16>{});
    else if (dtype == F16) go(std::type_identity<half>{});
    else throw std::runtime_error("wgmma: operands must be bf16 or fp16");
}

// Two-stage ring over the row tiles of `in` (rows x 64 float, rows a multiple of 64):
// warpgroup 1 is the producer (one thread TMA-loads tile t into stage t % 2 once the
// consumers have released it) and gives registers back; warpgroup 0 consumes (adds every
// tile into registers, releases the stage) with more registers. out (64 x 64) = sum of
// the tiles. Exercises phase parity over many reuses of each semaphore, and setmaxnreg.
__global__ void __launch_bounds__(256, 1) pipeline_kernel(const __grid_constant__ CUtensorMap in_map, int tiles,
                                                          gl<float> out) {
    using ST = st<float, 64, 64>;
    extern __shared__ char smem[];
    shared_allocator alloc(smem);
    auto& stages = alloc.allocate<ST[2]>();
    auto& full = alloc.allocate<semaphore[2]>();
    auto& empty = alloc.allocate<semaphore[2]>();
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; s++) {
            init_semaphore(full[s], 1);
            init_semaphore(empty[s], 4);  // one arrival per consumer warp
        }
        fence_semaphore_init();
    }
    __syncthreads();
    if (warp_id() >= 4) {
        decrease_registers<40>();
        if (threadIdx.x == 128) {
            for (int t = 0; t < tiles; t++) {
                const int s = t % 2;
                if (t >= 2) wait(empty[s], (t / 2 - 1) % 2);  // consumers released use t-2
                expect_bytes(full[s], tma::tile_bytes<ST>());
                tma::load_async(stages[s], &in_map, coord{0, 0, t, 0}, full[s]);
            }
        }
    } else {
        increase_registers<232>();
        rt_fl<16, 64> sum, x;
        zero(sum);
        for (int t = 0; t < tiles; t++) {
            const int s = t % 2;
            wait(full[s], (t / 2) % 2);
            load(x, subtile<16, 64>(stages[s], warp_id(), 0));
            add(sum, sum, x);
            __syncwarp();
            if (lane_id() == 0) arrive(empty[s]);
        }
        store(out, sum, coord{0, 0, warp_id(), 0});
    }
}

void semaphore_pipeline(const gl_args& in, int tiles, const gl_args& out, int64_t stream) {
    using ST = st<float, 64, 64>;
    const int smem = shared_bytes_for<ST[2], semaphore[2], semaphore[2]>();
    auto kernel = pipeline_kernel;
    allow_shared(kernel, smem);
    kernel<<<1, 256, smem, as_stream(stream)>>>(tensor_map<ST>(make_gl<float>(in)), tiles, make_gl<float>(out));
    check_launch("semaphore_pipeline");
}

// The same ring shared by the blocks of a cluster of `size`: panel p of each tile is copied by
// block p % size into every block at once (tma::load_panel_multicast), and each consumer warp
// frees a stage with an arrival on that stage's empty semaphore in every block
// (cluster::arrive_at), so no block's copy overwrites a stage that another still reads. Every
// block sums all the tiles into its own 64 x 128 slice of out: a panel that missed a block, or
// landed in a stage still being read, shows there.
using multicast_tile = st<float, 64, 128>;  // four 128-byte panels

__global__ void __launch_bounds__(256, 1) multicast_pipeline_kernel(const __grid_constant__ CUtensorMap in_map,
                                                                    int tiles, gl<float> out) {
    using ST = multicast_tile;
    constexpr int PANELS = ST::cols / ST::panel_cols;
    extern __shared__ char smem[];
    shared_allocator alloc(smem);
    auto& stages = alloc.allocate<ST[2]>();
    auto& full = alloc.allocate<semaphore[2]>();
    auto& empty = alloc.allocate<semaphore[2]>();
    const int rank = cluster::rank(), size = cluster::size();
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; s++) {
            init_semaphore(full[s], 1);
            init_semaphore(empty[s], 4 * size);  // one arrival per consumer warp of every block
        }
        fence_semaphore_init();
    }
    cluster::sync();  // every block's semaphores exist before any copy or arrival reaches them
    if (warp_id() >= 4) {
        if (threadIdx.x == 128) {
            for (int t = 0; t < tiles; t++) {
                const int s = t % 2;
                if (t >= 2) wait(empty[s], (t / 2 - 1) % 2);  // every block released use t-2
                expect_bytes(full[s], tma::tile_bytes<ST>());  // the whole tile, whoever copies it
                for (int p = rank; p < PANELS; p += size)
                    tma::load_panel_multicast(stages[s], &in_map, coord{0, 0, t, 0}, p, full[s],
                                              uint16_t((1 << size) - 1));
            }
        }
    } else {
        rt_fl<16, 128> sum, x;
        zero(sum);
        for (int t = 0; t < tiles; t++) {
            const int s = t % 2;
            wait(full[s], (t / 2) % 2);
            load(x, subtile<16, 128>(stages[s], warp_id(), 0));
            add(sum, sum, x);
            __syncwarp();
            if (lane_id() < size) cluster::arrive_at(empty[s], lane_id());
        }
        store(out, sum, coord{0, 0, int(blockIdx.x) * 4 + warp_id(), 0});
    }
    cluster::sync();  // the other blocks' copies and arrivals reach this block until they are done
}

void multicast_pipeline(const gl_args& in, int tiles, int blocks, int size, const gl_args& out, int64_t stream) {
    if (size < 1 || size > 4 || blocks <= 0 || blocks % size != 0 || tiles <= 0)
        throw std::runtime_error("multicast_pipeline: size in [1, 4], blocks a positive multiple of it, tiles > 0");
    using ST = multicast_tile;
    const int smem = shared_bytes_for<ST[2], semaphore[2], semaphore[2]>();
    auto kernel = multicast_pipeline_kernel;
    allow_shared(kernel, smem);
    const cluster::launch_config launch(blocks, size, 256, smem, as_stream(stream));
    const cudaError_t e = cudaLaunchKernelEx(&launch.config, kernel, tensor_map<ST>(make_gl<float>(in)), tiles,
                                             make_gl<float>(out));
    if (e != cudaSuccess) throw std::runtime_error(std::string("multicast_pipeline: ") + cudaGetErrorString(e));
    check_launch("multicast_pipeline");
}

// out[0, count) = in[offset, offset + count) (floats) through a 1-D bulk copy into shared
// memory (tma::load_bytes_async), read back by the block with plain loads. The shared buffer
// starts poisoned with NaN so that bytes the copy misses show in out.
struct bulk_buffer {
    static constexpr int capacity = 1024;
    alignas(16) float data[capacity];
};

__global__ void __launch_bounds__(128) bulk_copy_kernel(const float* in, int64_t offset, int count, float* out) {
    extern __shared__ char smem[];
    shared_allocator alloc(smem);
    auto& buffer = alloc.allocate<bulk_buffer>();
    auto& sem = alloc.allocate<semaphore>();
    for (int i = threadIdx.x; i < bulk_buffer::capacity; i += blockDim.x) buffer.data[i] = __int_as_float(0x7fc00000);
    fence_async_proxy();  // the poison is written before the copy engine writes over it
    if (threadIdx.x == 0) {
        init_semaphore(sem, 1);
        fence_semaphore_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        expect_bytes(sem, uint32_t(count) * sizeof(float));
        tma::load_bytes_async(buffer.data, in + offset, uint32_t(count) * sizeof(float), sem);
    }
    wait(sem, 0);
    for (int i = threadIdx.x; i < bulk_buffer::capacity; i += blockDim.x) out[i] = buffer.data[i];
}

void bulk_copy(int64_t in, int64_t offset, int count, int64_t out, int64_t stream) {
    if (count <= 0 || count > bulk_buffer::capacity || count % 4 != 0 || offset % 4 != 0)
        throw std::runtime_error("bulk_copy: count in (0, 1024] and count, offset multiples of 4 floats");
    const int smem = shared_bytes_for<bulk_buffer, semaphore>();
    auto kernel = bulk_copy_kernel;
    allow_shared(kernel, smem);
    kernel<<<1, 128, smem, as_stream(stream)>>>(reinterpret_cast<const float*>(in), offset, count,
                                                reinterpret_cast<float*>(out));
    check_launch("bulk_copy");
}

// Clusters: each block of a cluster of `size` writes 1024 floats (its slice of in) into its
// shared memory; after the cluster barrier, block r reads block (r + shift) % size's buffer
// through distributed shared memory into out's slice r, along with its rank and the cluster
// size. A block leaving early would free shared memory that another still reads: the second
// barrier keeps them all until the reads are done, and half the threads of the block exit
// before it, which the barrier must not wait for.
struct cluster_buffer {
    static constexpr int floats = 1024;
    alignas(16) float data[floats];
};

__global__ void __launch_bounds__(256) cluster_exchange_kernel(const float* in, int shift, float* out, int* ranks) {
    extern __shared__ char smem[];
    shared_allocator alloc(smem);
    auto& buffer = alloc.allocate<cluster_buffer>();
    const int rank = cluster::rank(), size = cluster::size();
    const float* mine = in + size_t(blockIdx.x) * cluster_buffer::floats;
    for (int i = threadIdx.x; i < cluster_buffer::floats; i += blockDim.x) buffer.data[i] = mine[i];
    cluster::sync();
    if (threadIdx.x >= 128) return;  // these threads take no part in what follows
    const int from = (rank + shift) % size;
    const uint32_t theirs = cluster::map_shared(buffer.data, from);
    float4* slice = reinterpret_cast<float4*>(out + size_t(blockIdx.x) * cluster_buffer::floats);
    for (int i = threadIdx.x; i < cluster_buffer::floats / 4; i += 128) slice[i] = cluster::load_shared(theirs + i * 16);
    if (threadIdx.x == 0) ranks[2 * blockIdx.x] = rank, ranks[2 * blockIdx.x + 1] = size;
    cluster::sync();
}

void cluster_exchange(int64_t in, int blocks, int size, int shift, int64_t out, int64_t ranks, int64_t stream) {
    if (blocks <= 0 || size <= 0 || size > 8 || blocks % size != 0 || shift < 0)
        throw std::runtime_error("cluster_exchange: blocks a positive multiple of size, size in [1, 8], shift >= 0");
    const int smem = shared_bytes_for<cluster_buffer>();
    auto kernel = cluster_exchange_kernel;
    allow_shared(kernel, smem);
    const cluster::launch_config launch(blocks, size, 256, smem, as_stream(stream));
    const cudaError_t e = cudaLaunchKernelEx(&launch.config, kernel, reinterpret_cast<const float*>(in), shift,
                                             reinterpret_cast<float*>(out), reinterpret_cast<int*>(ranks));
    if (e != cudaSuccess) throw std::runtime_error(std::string("cluster_exchange: ") + cudaGetErrorString(e));
    check_launch("cluster_exchange");
}

}  // namespace tk_test
