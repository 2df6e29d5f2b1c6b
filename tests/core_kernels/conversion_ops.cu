// Register tile conversions on a 32 x 64 tile: precision (copy), layout
// (swap_layout) and transposes. Tiles are loaded and stored with the bounded
// register <-> global ops, which place every element by its fragment coordinates,
// so a wrong register permutation shows up as misplaced values.
// Op ids (mirrored in tests/test_core_gpu.py, CONVERSIONS):
//   0 copy row, 1 copy col                         (any in -> out type)
//   2 swap_layout row->col, 3 col->row             (16-bit, same type)
//   4 transpose_sep row->col, 5 col->row           (same type)
//   6 transpose row, 7 transpose col               (16-bit, same type)
#include "common.cuh"

namespace tk_test {

constexpr int kRows = 32, kCols = 64;

template <typename TI, typename TO>
__global__ void __launch_bounds__(32) convert_kernel(gl<TI> in, gl<TO> out, int op) {
    if (op == 0 || op == 1) {
        auto run = [&]<typename L>(L) {
            rt<TI, kRows, kCols, L> x;
            rt<TO, kRows, kCols, L> y;
            load(x, in, coord{});
            copy(y, x);
            store(out, y, coord{});
        };
        if (op == 0) run(row_l{});
        else run(col_l{});
        return;
    }
    if constexpr (std::same_as<TI, TO>) {
        // from layout LS to LD, dst shape DR x DC
        auto run = [&]<typename LS, typename LD, int DR, int DC>(LS, LD, std::integral_constant<int, DR>,
                                                                  std::integral_constant<int, DC>, auto f) {
            rt<TI, kRows, kCols, LS> x;
            rt<TI, DR, DC, LD> y;
            load(x, in, coord{});
            f(y, x);
            store(out, y, coord{});
        };
        using same = std::integral_constant<int, kRows>;
        using wide = std::integral_constant<int, kCols>;
        auto sep = [](auto& y, const auto& x) { transpose_sep(y, x); };
        if constexpr (half_precision<TI>) {
            auto swap = [](auto& y, const auto& x) { swap_layout(y, x); };
            auto tr = [](auto& y, const auto& x) { transpose(y, x); };
            switch (op) {
                case 2: run(row_l{}, col_l{}, same{}, wide{}, swap); return;
                case 3: run(col_l{}, row_l{}, same{}, wide{}, swap); return;
                case 6: run(row_l{}, row_l{}, wide{}, same{}, tr); return;
                case 7: run(col_l{}, col_l{}, wide{}, same{}, tr); return;
            }
        }
        switch (op) {
            case 4: run(row_l{}, col_l{}, wide{}, same{}, sep); return;
            case 5: run(col_l{}, row_l{}, wide{}, same{}, sep); return;
        }
    }
    __trap();  // op not instantiated for these types (the launcher rejects it first)
}

static bool supported(int in_dtype, int out_dtype, int op) {
    if (op == 0 || op == 1) return true;
    if (in_dtype != out_dtype) return false;
    if (op == 4 || op == 5) return true;
    return in_dtype != F32 && op >= 2 && op <= 7;
}

void convert(int in_dtype, int out_dtype, int op, const gl_args& in, const gl_args& out, int64_t stream) {
    if (!supported(in_dtype, out_dtype, op)) throw std::runtime_error("convert: op not defined for these types");
    with_dtype(in_dtype, [&]<typename TI>(std::type_identity<TI>) {
        with_dtype(out_dtype, [&]<typename TO>(std::type_identity<TO>) {
            convert_kernel<TI, TO><<<1, 32, 0, as_stream(stream)>>>(make_gl<TI>(in), make_gl<TO>(out), op);
            check_launch("convert");
        });
    });
}

}  // namespace tk_test
