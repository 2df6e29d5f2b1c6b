// The load/compute/finish template (kittens/hopper/pipeline.cuh) exercised by a GEMM:
// C (M x N) = A (M x K) * B (K x N), all row-major, bf16/fp16 in, fp32 accumulation.
// 128 x 256 output tiles, two consumer warpgroups of 64 rows, 64-deep K stages through a
// 4-stage TMA ring, wgmma with B MN-major, a persistent grid in L2-friendly task order.
#include "hopper_common.cuh"

namespace tk_test {

template <typename T>
struct gemm_layout {
    static constexpr int consumer_warpgroups = 2, stages = 4;
    static constexpr int BM = 128, BN = 256, BK = 64;
    using a_tile = st<T, BM, BK>;
    using b_tile = st<T, BK, BN>;
    struct inputs {
        a_tile a;
        b_tile b;
    };
    static constexpr uint32_t input_bytes = tma::tile_bytes<a_tile>() + tma::tile_bytes<b_tile>();
    struct globals {
        CUtensorMap a_map, b_map;
        gl<T> c;
        int m, n, k;
    };
    struct task {
        int m_tile, n_tile;
    };
    struct registers {
        rt_fl<16, BN> acc;  // this warp's 16 rows of its warpgroup's 64
    };

    // Groups of 8 tile-rows sweep the columns: tasks running together share B columns
    // and A rows in L2.
    __device__ static bool get_task(task& t, int index, const globals& g) {
        constexpr int GROUP = 8;
        const int m_tiles = ceil_div(g.m, BM), n_tiles = ceil_div(g.n, BN);
        if (index >= m_tiles * n_tiles) return false;
        const int first_m = index / (GROUP * n_tiles) * GROUP;
        const int rows = min(GROUP, m_tiles - first_m), in_group = index % (GROUP * n_tiles);
        t.m_tile = first_m + in_group % rows;
        t.n_tile = in_group / rows;
        return true;
    }
    __device__ static int iterations(const task&, const globals& g) { return ceil_div(g.k, BK); }
    __device__ static void load(inputs& in, const task& t, int it, const globals& g, semaphore& sem) {
        tma::load_async(in.a, &g.a_map, coord{0, 0, t.m_tile, it}, sem);
        tma::load_async(in.b, &g.b_map, coord{0, 0, it, t.n_tile}, sem);
    }
    __device__ static void setup(registers& r, const task&) { zero(r.acc); }
    __device__ static void compute(registers& r, inputs& in, const task&, int, int consumer) {
        wgmma::fence();
        wgmma::mma_AB(r.acc, subtile<64, BK>(in.a, consumer, 0), in.b, true);
        wgmma::commit();
        wgmma::wait<0>();
    }
    __device__ static void finish(registers& r, const task& t, const globals& g, int consumer) {
        store(g.c, r.acc, coord{0, 0, (t.m_tile * BM + consumer * 64) / 16 + warp_id() % 4, t.n_tile});
    }
};

void gemm(int dtype, const gl_args& a, const gl_args& b, const gl_args& c, int64_t stream) {
    auto go = [&]<typename T>(std::type_identity<T>) {
        using L = gemm_layout<T>;
        const gl<T> ga = make_gl<T>(a), gb = make_gl<T>(b), gc = make_gl<T>(c);
        const typename L::globals g{tensor_map<typename L::a_tile>(ga), tensor_map<typename L::b_tile>(gb),
                                    gc, ga.rows(), gb.cols(), ga.cols()};
        int sms = 0;
        check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "multiprocessors");
        const int tasks = ceil_div(g.m, L::BM) * ceil_div(g.n, L::BN);
        auto kernel = pipeline::kernel<L>;
        allow_shared(kernel, pipeline::shared_bytes<L>());
        kernel<<<std::min(tasks, sms), pipeline::threads<L>(), pipeline::shared_bytes<L>(), as_stream(stream)>>>(g);
        check_launch("gemm");
    };
    if (dtype == BF16) go(std::type_identity<bf16>{});
    else if (dtype == F16) go(std::type_identity<half>{});
    else throw std::runtime_error("gemm: operands must be bf16 or fp16");
}

}  // namespace tk_test
