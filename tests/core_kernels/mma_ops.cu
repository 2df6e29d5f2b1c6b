// mma_AB / mma_ABt / mma_AtB / mma_AtBt through the path kernels use: operands go
// global -> shared (group copy) -> registers (ldmatrix, .trans for col layouts),
// the accumulator global -> registers. Each warp computes 16 rows of D, reading its
// slab of A through a sub-tile view, so M = 64 runs on a full warpgroup.
#include "common.cuh"

namespace tk_test {

template <bool AT, bool BT, typename T, int M, int N, int K>
__device__ void mma_case(char* smem, const gl<T>& a_gl, const gl<T>& b_gl, const gl<float>& c_gl,
                         const gl<float>& d_gl, bool alias) {
    constexpr int warps = M / 16;
    using SA = st<T, AT ? K : M, AT ? M : K>;  // A stored as given: K x M when transposed
    using SB = st<T, BT ? N : K, BT ? K : N>;
    shared_allocator alloc(smem);
    auto& sa = alloc.allocate<SA>();
    auto& sb = alloc.allocate<SB>();
    group<warps>::load(sa, a_gl, coord{});
    group<warps>::load(sb, b_gl, coord{});
    __syncthreads();

    const int w = warp_id();
    // This warp's 16 rows of op(A): rows of A, or columns of the stored A^T.
    std::conditional_t<AT, rt<T, K, 16, col_l>, rt<T, 16, K, row_l>> a;
    // Operands are loaded in their mma's register grouping (load<mma_operand::...>), which
    // covers the swapped-quadrant ldmatrix orders (a col tile as A, a row tile as B); the
    // round-trip tests cover the natural order.
    if constexpr (AT) load<mma_operand::a>(a, subtile<K, 16>(sa, 0, w));
    else load<mma_operand::a>(a, subtile<16, K>(sa, w, 0));
    std::conditional_t<BT, rt<T, N, K, row_l>, rt<T, K, N, col_l>> b;
    load<mma_operand::b>(b, sb);
    rt_fl<16, N> c, d;
    load(c, c_gl, coord{0, 0, w, 0});

    auto run = [&](auto& dst) {
        if constexpr (!AT && !BT) mma_AB(dst, a, b, c);
        else if constexpr (!AT && BT) mma_ABt(dst, a, b, c);
        else if constexpr (AT && !BT) mma_AtB(dst, a, b, c);
        else mma_AtBt(dst, a, b, c);
    };
    if (alias) {
        run(c);  // d aliases c: accumulate in place
        store(d_gl, c, coord{0, 0, w, 0});
    } else {
        run(d);
        store(d_gl, d, coord{0, 0, w, 0});
    }
}

template <typename T, int M, int N, int K>
__global__ void __launch_bounds__(M / 16 * 32)
    mma_kernel(gl<T> a, gl<T> b, gl<float> c, gl<float> d, int variant, bool alias) {
    extern __shared__ char smem[];
    switch (variant) {
        case 0: mma_case<false, false, T, M, N, K>(smem, a, b, c, d, alias); break;
        case 1: mma_case<false, true, T, M, N, K>(smem, a, b, c, d, alias); break;
        case 2: mma_case<true, false, T, M, N, K>(smem, a, b, c, d, alias); break;
        case 3: mma_case<true, true, T, M, N, K>(smem, a, b, c, d, alias); break;
    }
}

template <typename T, int M, int N, int K>
bool try_mma(int m, int n, int k, int variant, bool alias, const gl_args& a, const gl_args& b, const gl_args& c,
             const gl_args& d, int64_t stream) {
    if (m != M || n != N || k != K) return false;
    // Stored shapes differ per variant but not their sizes.
    const int smem = shared_bytes_for<st<T, M, K>, st<T, K, N>>();
    auto kernel = mma_kernel<T, M, N, K>;
    allow_shared(kernel, smem);
    kernel<<<1, M / 16 * 32, smem, as_stream(stream)>>>(make_gl<T>(a), make_gl<T>(b), make_gl<float>(c),
                                                         make_gl<float>(d), variant, alias);
    check_launch("mma");
    return true;
}

void mma(int dtype, int m, int n, int k, int variant, bool alias, const gl_args& a, const gl_args& b,
         const gl_args& c, const gl_args& d, int64_t stream) {
    auto go = [&]<typename T>(std::type_identity<T>) {
        const bool done = try_mma<T, 16, 16, 16>(m, n, k, variant, alias, a, b, c, d, stream) ||
                          try_mma<T, 32, 64, 48>(m, n, k, variant, alias, a, b, c, d, stream) ||
                          try_mma<T, 64, 64, 128>(m, n, k, variant, alias, a, b, c, d, stream);
        if (!done) throw std::runtime_error("mma: no instance for this shape");
    };
    if (dtype == BF16) go(std::type_identity<bf16>{});
    else if (dtype == F16) go(std::type_identity<half>{});
    else throw std::runtime_error("mma: operands must be bf16 or fp16");
}

}  // namespace tk_test
