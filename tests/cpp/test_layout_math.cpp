// CPU unit tests of kittens/common/layout_math.cuh (plain C++20, no nvcc).
//
// The index math of the tile core decides where every element of every tile lives;
// a mistake there gives silently wrong results on the GPU. Each check below compares
// the core's functions with an independent encoding of the hardware facts they must
// match (PTX ISA fragment tables, ldmatrix/movmatrix semantics, the TMA/CUTLASS
// swizzle definition) or with a structural property (bijection, bank-conflict freedom).
//
// Build: g++ -std=c++20 -I<repo> tests/cpp/test_layout_math.cpp  (tests/test_core_host.py)
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "kittens/common/layout_math.cuh"
#include "tests/cpp/check.h"

using namespace kittens::layout_math;

constexpr frag_layout kLayouts[] = {frag_layout::row, frag_layout::col};
constexpr const char* name(frag_layout l) { return l == frag_layout::row ? "row" : "col"; }

// PTX thread coordinates inside a warp for mma.sync / ldmatrix fragments.
constexpr int group_id(int lane) { return lane >> 2; }      // "groupID"
constexpr int tid_in_group(int lane) { return lane % 4; }   // "threadID_in_group"

// ---------------------------------------------------------------------------
// Compile-time facts (fail the build, not the run).
// ---------------------------------------------------------------------------
static_assert(TILE_DIM == 16);
static_assert(ceil_div(0, 16) == 0 && ceil_div(1, 16) == 1 && ceil_div(16, 16) == 1 && ceil_div(17, 16) == 2);
static_assert(ceil_div(int64_t(1) << 40, int64_t(3)) == ((int64_t(1) << 40) + 2) / 3);
static_assert(swizzle_bytes_for_width(32) == 32 && swizzle_bytes_for_width(64) == 64 &&
              swizzle_bytes_for_width(96) == 32 && swizzle_bytes_for_width(128) == 128 &&
              swizzle_bytes_for_width(192) == 64 && swizzle_bytes_for_width(512) == 128);
static_assert(swizzle(0x80, 128) == 0x90 && swizzle(0x3f0, 128) == 0x380);  // row 1 chunk 0 -> 1; row 7 chunk 7 -> 0
static_assert(fragment_row(frag_layout::row, 5, 1, 0) == 9 && fragment_col(frag_layout::row, 5, 2, 1) == 11);
static_assert(vec_slots(vec_layout::pairs) == 2 && vec_slots(vec_layout::quads) == 4);
static_assert(ldmatrix_row(31) == 15 && ldmatrix_col(31) == 8 && ldmatrix_row(8) == 8 && ldmatrix_col(8) == 0);

// ---------------------------------------------------------------------------
// ceil_div: the smallest q with q * b >= a.
// ---------------------------------------------------------------------------
static void test_ceil_div() {
    for (int a = 0; a <= 600; a++)
        for (int b = 1; b <= 70; b++) {
            const int q = ceil_div(a, b);
            CHECK(q * b >= a && (q == 0 || (q - 1) * b < a), "a=%d b=%d q=%d", a, b, q);
            const int64_t big = (int64_t(1) << 33) + a;
            const int64_t q64 = ceil_div(big, int64_t(b));
            CHECK(q64 * b >= big && (q64 - 1) * b < big, "a=%lld b=%d", (long long)big, b);
        }
}

// divisor: the multiply-and-shift quotient equals n / d over the whole stated range,
// 0 <= n < 2^31 and d >= 1: every small pair, the numerators next to multiples of d and next
// to 2^31 (where the rounding excess is largest), and divisors next to powers of two.
static void test_divisor() {
    std::vector<int> divisors;
    for (int d = 1; d <= 2000; d++) divisors.push_back(d);
    for (int k = 11; k <= 31; k++)
        for (int64_t d : {(int64_t(1) << k) - 1, int64_t(1) << k, (int64_t(1) << k) + 1, (int64_t(3) << (k - 2)) + 1})
            if (d <= 0x7fffffff) divisors.push_back(int(d));
    uint64_t state = 12345;  // numerators drawn by a fixed LCG, the same every run
    for (const int d : divisors) {
        const divisor div(d);
        auto check = [&](int64_t n) {
            if (n < 0 || n > 0x7fffffff) return;
            CHECK(div.divide(int(n)) == int(n / d), "n=%lld d=%d -> %d", (long long)n, d, div.divide(int(n)));
        };
        for (int n = 0; n <= 3000; n++) check(n);
        for (int64_t n = 0x7fffffff; n > 0x7fffffff - 3000; n--) check(n);
        for (int64_t q : {int64_t(1), int64_t(2), int64_t(7), int64_t(1000), 0x7fffffff / int64_t(d) - 1, 0x7fffffff / int64_t(d)})
            for (int64_t e = -1; e <= 1; e++) check(q * d + e);
        for (int i = 0; i < 2000; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            check(int64_t(state >> 33));  // 31 random bits
        }
    }
}

// ---------------------------------------------------------------------------
// swizzle_bytes_for_width: the largest of 128/64/32 that divides the row width.
// ---------------------------------------------------------------------------
static void test_swizzle_width() {
    for (int w = 32; w <= 2048; w += 32) {
        const int expect = w % 128 == 0 ? 128 : w % 64 == 0 ? 64 : 32;
        CHECK(swizzle_bytes_for_width(w) == expect, "w=%d got=%d", w, swizzle_bytes_for_width(w));
        CHECK(w % swizzle_bytes_for_width(w) == 0, "w=%d", w);
    }
}

// Independent model of the Hopper TMA / wgmma swizzle modes (CUTLASS Swizzle<B,4,3>):
// a panel of `swz`-byte rows; in row r the 16-byte chunk index is XORed with
// (r / (128 / swz)) % (swz / 16), i.e. the bits above the 128-byte line.
static uint32_t tma_model_offset(int row, int col, int rows, int cols, int elem) {
    const int row_bytes = cols * elem;
    const int swz = row_bytes % 128 == 0 ? 128 : row_bytes % 64 == 0 ? 64 : 32;
    const int panel_cols = swz / elem;
    const int panel = col / panel_cols, byte_in_row = (col % panel_cols) * elem;
    const int chunk = byte_in_row / 16, in_chunk = byte_in_row % 16;
    const int phase = (row / (128 / swz)) % (swz / 16);
    return uint32_t(panel * rows * swz + row * swz + (chunk ^ phase) * 16 + in_chunk);
}

// Bank group (16-byte unit within a 128-byte line) of a shared byte offset: eight
// 16-byte accesses are conflict-free iff their bank groups are distinct.
static int bank_group(uint32_t off) { return int((off / 16) % 8); }

static bool distinct(const std::vector<int>& v) { return std::set<int>(v.begin(), v.end()).size() == v.size(); }

// ---------------------------------------------------------------------------
// Shared tile offsets for every shape rows 16..128 x cols 16..256 (step 16), 2 and 4 bytes.
// ---------------------------------------------------------------------------
static void test_shared_tile(int rows, int cols, int elem, std::vector<std::string>& conflicted_cp_async) {
    const int bytes = rows * cols * elem;
    const int per_chunk = 16 / elem;
    const int swz = swizzle_bytes_for_width(cols * elem);
    std::vector<int> hits(bytes / elem, 0);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const uint32_t off = shared_tile_offset(r, c, rows, cols, elem);
            // In range and element-aligned, and one element per address (bijection).
            CHECK(off < uint32_t(bytes) && off % elem == 0, "%dx%d e%d (%d,%d) off=%u", rows, cols, elem, r, c, off);
            if (off < uint32_t(bytes)) hits[off / elem]++;
            // Same as the TMA / wgmma swizzle definition.
            CHECK(off == tma_model_offset(r, c, rows, cols, elem), "%dx%d e%d (%d,%d) off=%u model=%u", rows, cols,
                  elem, r, c, off, tma_model_offset(r, c, rows, cols, elem));
            // swizzle() of the unswizzled panel offset gives the same address (the
            // documented equivalence for row counts that are multiples of 8).
            const int panel_cols = swz / elem;
            const uint32_t linear = uint32_t((c / panel_cols) * rows * swz + r * swz + (c % panel_cols) * elem);
            CHECK(off == swizzle(linear, swz), "%dx%d e%d (%d,%d) off=%u swizzle=%u", rows, cols, elem, r, c, off,
                  swizzle(linear, swz));
            // 16-byte chunks stay whole and in order (what ldmatrix, cp.async and
            // float4 copies rely on).
            const uint32_t base = shared_tile_offset(r, c - c % per_chunk, rows, cols, elem);
            CHECK(base % 16 == 0 && off == base + uint32_t((c % per_chunk) * elem), "%dx%d e%d (%d,%d)", rows, cols,
                  elem, r, c);
            // bank_of agrees with the 4-byte bank definition.
            CHECK(bank_of(off) == int(off / 4) % 32, "off=%u", off);
        }
    for (int i = 0; i < bytes / elem; i++) CHECK(hits[i] == 1, "%dx%d e%d slot %d hit %d times", rows, cols, elem, i, hits[i]);

    // ldmatrix phase: eight consecutive rows (from any multiple of 8, i.e. also any
    // 16-aligned sub-tile) at one 16-byte aligned column hit eight bank groups.
    for (int r0 = 0; r0 < rows; r0 += 8)
        for (int c = 0; c < cols; c += per_chunk) {
            std::vector<int> g;
            for (int q = 0; q < 8; q++) g.push_back(bank_group(shared_tile_offset(r0 + q, c, rows, cols, elem)));
            CHECK(distinct(g), "ldmatrix conflict %dx%d e%d swz%d rows %d..%d col %d", rows, cols, elem, swz, r0,
                  r0 + 7, c);
        }

    // cp.async / float4 copies (group::for_each_chunk): thread i moves chunk i in
    // row-major chunk order; a warp's 16-byte accesses are served 8 threads per
    // phase. Conflict-free whenever each 8-chunk phase stays inside one swizzle
    // panel: row widths that are a multiple of 128 bytes, or a single panel.
    const int chunks_per_row = cols / per_chunk, chunks = rows * chunks_per_row;
    const bool expect_free = (cols * elem) % 128 == 0 || cols * elem == swz;
    bool any_conflict = false;
    for (int p = 0; p * 8 < chunks; p++) {
        std::vector<int> g;
        for (int i = 8 * p; i < 8 * p + 8 && i < chunks; i++)
            g.push_back(bank_group(
                shared_tile_offset(i / chunks_per_row, (i % chunks_per_row) * per_chunk, rows, cols, elem)));
        if (!distinct(g)) any_conflict = true;
    }
    if (expect_free) CHECK(!any_conflict, "cp.async conflict %dx%d e%d", rows, cols, elem);
    // Wider odd-panel rows (e.g. 48 or 96 bf16 columns) do conflict: reported, not failed.
    if (any_conflict && rows == 16)
        conflicted_cp_async.push_back(std::to_string(cols) + "x" + std::to_string(elem) + "B");
}

static void test_shared_tiles() {
    std::vector<std::string> conflicted;
    for (int elem : {2, 4})
        for (int rows = 16; rows <= 128; rows += 16)
            for (int cols = 16; cols <= 256; cols += 16) test_shared_tile(rows, cols, elem, conflicted);
    if (!conflicted.empty()) {
        std::printf("note: row-major chunk copies have bank conflicts for widths (cols x elem):");
        for (auto& s : conflicted) std::printf(" %s", s.c_str());
        std::printf("\n");
    }
}

// ---------------------------------------------------------------------------
// Register fragments: (lane, k, h) -> (row, col) is a bijection onto 16x16, and
// register k covers quadrant (k % 2, k / 2) in both layouts.
// ---------------------------------------------------------------------------
static void test_fragment_bijection() {
    for (frag_layout l : kLayouts) {
        int hits[16][16] = {};
        for (int lane = 0; lane < 32; lane++)
            for (int k = 0; k < 4; k++)
                for (int h = 0; h < 2; h++) {
                    const int r = fragment_row(l, lane, k, h), c = fragment_col(l, lane, k, h);
                    CHECK(r >= 0 && r < 16 && c >= 0 && c < 16, "%s lane %d k %d h %d -> (%d,%d)", name(l), lane, k, h, r, c);
                    if (r >= 0 && r < 16 && c >= 0 && c < 16) hits[r][c]++;
                    CHECK(r / 8 == k % 2 && c / 8 == k / 2, "%s quadrant of k=%d is (%d,%d)", name(l), k, r / 8, c / 8);
                }
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++) CHECK(hits[r][c] == 1, "%s (%d,%d) held %d times", name(l), r, c, hits[r][c]);
    }
    // The two layouts are transposes of each other (col layout of X^T == row layout of X).
    for (int lane = 0; lane < 32; lane++)
        for (int k = 0; k < 4; k++)
            for (int h = 0; h < 2; h++)
                CHECK(fragment_row(frag_layout::col, lane, k, h) % 8 == fragment_col(frag_layout::row, lane, k, h) % 8 &&
                          fragment_col(frag_layout::col, lane, k, h) % 8 == fragment_row(frag_layout::row, lane, k, h) % 8,
                      "lane %d k %d h %d", lane, k, h);
}

// ---------------------------------------------------------------------------
// Register vectors: slot functions agree with the fragment coordinates, and the
// lanes sharing one index are exactly what the core's shuffles combine.
// ---------------------------------------------------------------------------
static void test_vectors() {
    for (frag_layout l : kLayouts)
        for (int lane = 0; lane < 32; lane++)
            for (int k = 0; k < 4; k++)
                for (int h = 0; h < 2; h++) {
                    const int rs = row_slot(l, k, h), cs = col_slot(l, k, h);
                    CHECK(rs >= 0 && rs < vec_slots(per_row_vec(l)) && cs >= 0 && cs < vec_slots(per_col_vec(l)),
                          "%s k %d h %d slots %d %d", name(l), k, h, rs, cs);
                    CHECK(vec_index(per_row_vec(l), lane, rs) == fragment_row(l, lane, k, h),
                          "%s row: lane %d k %d h %d", name(l), lane, k, h);
                    CHECK(vec_index(per_col_vec(l), lane, cs) == fragment_col(l, lane, k, h),
                          "%s col: lane %d k %d h %d", name(l), lane, k, h);
                }
    // per_row/per_col pick opposite vector layouts, and the two layouts swap them.
    CHECK(per_row_vec(frag_layout::row) == per_col_vec(frag_layout::col), "row/col vector layouts");
    CHECK(per_col_vec(frag_layout::row) == per_row_vec(frag_layout::col), "row/col vector layouts");

    for (vec_layout v : {vec_layout::pairs, vec_layout::quads}) {
        const bool pairs = v == vec_layout::pairs;
        // Every lane holds distinct indices, and all 16 indices are held.
        std::set<int> all;
        for (int lane = 0; lane < 32; lane++) {
            std::set<int> mine;
            for (int s = 0; s < vec_slots(v); s++) mine.insert(vec_index(v, lane, s)), all.insert(vec_index(v, lane, s));
            CHECK(int(mine.size()) == vec_slots(v), "vec lane %d holds duplicates", lane);
        }
        CHECK(all.size() == 16 && *all.begin() == 0 && *all.rbegin() == 15, "vec covers 0..15");
        // Lanes holding index n (in the same slot): exactly one orbit of the xor
        // butterfly reduce_across_lanes uses (masks 1,2 for pairs; 4,8,16 for quads).
        const std::vector<int> masks = pairs ? std::vector<int>{1, 2} : std::vector<int>{4, 8, 16};
        for (int lane = 0; lane < 32; lane++) {
            std::set<int> orbit = {lane};
            for (int m : masks) {
                std::set<int> next = orbit;
                for (int x : orbit) next.insert(x ^ m);
                orbit = next;
            }
            for (int s = 0; s < vec_slots(v); s++) {
                std::set<int> sharing;
                for (int o = 0; o < 32; o++)
                    if (vec_index(v, o, s) == vec_index(v, lane, s)) sharing.insert(o);
                CHECK(sharing == orbit, "vec %s lane %d slot %d: sharing lanes != shuffle orbit", pairs ? "pairs" : "quads",
                      lane, s);
            }
        }
        // The writer lanes of store(gl, rv) (lane % 4 == 0 for pairs, lane < 4 for
        // quads) hold every index exactly once.
        int held[16] = {};
        for (int lane = 0; lane < 32; lane++)
            if (pairs ? lane % 4 == 0 : lane < 4)
                for (int s = 0; s < vec_slots(v); s++) held[vec_index(v, lane, s)]++;
        for (int n = 0; n < 16; n++) CHECK(held[n] == 1, "vec store writers hold index %d %d times", n, held[n]);
    }
}

// ---------------------------------------------------------------------------
// mma.sync m16n8k16 operand conventions (mma.cuh) against the PTX ISA tables.
// ---------------------------------------------------------------------------
// PTX ISA, "Matrix Fragments for mma.m16n8k16" (.bf16/.f16), encoded independently:
//   A (16x16, row):  reg i of a0..a3, half h -> row g + 8*(i%2), col 2t + h + 8*(i/2)
//   B (16x8,  col):  reg i of b0..b1, half h -> k 2t + h + 8*i,  n g
//   C/D (16x8, f32): pair i of {c0,c1},{c2,c3}, half h -> row g + 8*i, col 2t + h
struct rc { int r, c; };
static rc ptx_a(int lane, int i, int h) { return {group_id(lane) + 8 * (i % 2), 2 * tid_in_group(lane) + h + 8 * (i / 2)}; }
static rc ptx_b(int lane, int i, int h) { return {2 * tid_in_group(lane) + h + 8 * i, group_id(lane)}; }  // (k, n)
static rc ptx_c(int lane, int i, int h) { return {group_id(lane) + 8 * i, 2 * tid_in_group(lane) + h}; }

// Register permutations of mma.cuh (detail::a_fragment / detail::b_fragment) — they
// are device code, so they are mirrored here; keep in sync with mma.cuh.
static int core_a_reg(frag_layout l, int i) {  // A-fragment reg i <- tile reg
    const bool transposed = l == frag_layout::col;
    const int map[4] = {0, transposed ? 2 : 1, transposed ? 1 : 2, 3};
    return map[i];
}
static int core_b_reg(frag_layout l, int half, int i) {  // B reg i of n8 half `half` <- tile reg
    const bool col = l == frag_layout::col;
    const int map[4] = {0, col ? 1 : 2, col ? 2 : 1, 3};
    return map[2 * half + i];
}

static void test_mma_conventions() {
    for (int lane = 0; lane < 32; lane++)
        for (int h = 0; h < 2; h++) {
            for (int i = 0; i < 4; i++) {
                const rc want = ptx_a(lane, i, h);  // (m, k)
                // a row tile is M x K: element (m, k) at its own coordinates.
                const int kr = core_a_reg(frag_layout::row, i);
                CHECK(fragment_row(frag_layout::row, lane, kr, h) == want.r && fragment_col(frag_layout::row, lane, kr, h) == want.c,
                      "A from row tile: lane %d reg %d h %d", lane, i, h);
                // a col tile holds A^T (K x M): element (m, k) sits at (k, m).
                const int kc = core_a_reg(frag_layout::col, i);
                CHECK(fragment_row(frag_layout::col, lane, kc, h) == want.c && fragment_col(frag_layout::col, lane, kc, h) == want.r,
                      "A from col tile (A^T): lane %d reg %d h %d", lane, i, h);
            }
            for (int half = 0; half < 2; half++)
                for (int i = 0; i < 2; i++) {
                    rc want = ptx_b(lane, i, h);  // (k, n) within the n8 half
                    want.c += 8 * half;           // n within the 16-wide base tile
                    // a col tile is K x N.
                    const int kc = core_b_reg(frag_layout::col, half, i);
                    CHECK(fragment_row(frag_layout::col, lane, kc, h) == want.r && fragment_col(frag_layout::col, lane, kc, h) == want.c,
                          "B from col tile: lane %d half %d reg %d h %d", lane, half, i, h);
                    // a row tile holds B^T (N x K): element (k, n) sits at (n, k).
                    const int kr = core_b_reg(frag_layout::row, half, i);
                    CHECK(fragment_row(frag_layout::row, lane, kr, h) == want.c && fragment_col(frag_layout::row, lane, kr, h) == want.r,
                          "B from row tile (B^T): lane %d half %d reg %d h %d", lane, half, i, h);
                }
            // Accumulators: mma_tiles feeds tile regs {0,1} to half 0 and {2,3} to half 1
            // of a float row tile.
            for (int half = 0; half < 2; half++)
                for (int i = 0; i < 2; i++) {
                    const rc want = ptx_c(lane, i, h);
                    const int k = 2 * half + i;
                    CHECK(fragment_row(frag_layout::row, lane, k, h) == want.r &&
                              fragment_col(frag_layout::row, lane, k, h) == want.c + 8 * half,
                          "C/D: lane %d half %d pair %d h %d", lane, half, i, h);
                }
        }
}

// ---------------------------------------------------------------------------
// ldmatrix.x4 addresses and results, movmatrix (swap_layout), transpose_sep.
// ---------------------------------------------------------------------------
static void test_ldmatrix() {
    // Lanes 8q..8q+7 give the row addresses of matrix q (-> register q), row L % 8.
    // Matrix q must be quadrant (q % 2, q / 2), each of its rows given exactly once.
    for (int q = 0; q < 4; q++) {
        std::set<int> rows;
        for (int j = 0; j < 8; j++) {
            const int lane = 8 * q + j;
            CHECK(ldmatrix_row(lane) == 8 * (q % 2) + j && ldmatrix_col(lane) == 8 * (q / 2), "ldmatrix lane %d", lane);
            rows.insert(ldmatrix_row(lane));
        }
        CHECK(rows.size() == 8, "ldmatrix quadrant %d rows", q);
    }
    // What ldmatrix delivers (PTX ISA): in register q, lane L receives element
    // (L / 4, 2 * (L % 4) + h) of matrix q, or its transpose (2 * (L % 4) + h, L / 4)
    // with .trans. The delivered tile coordinate must be the fragment coordinate.
    for (int lane = 0; lane < 32; lane++)
        for (int q = 0; q < 4; q++)
            for (int h = 0; h < 2; h++) {
                {  // non-trans -> row layout
                    const int mr = group_id(lane), mc = 2 * tid_in_group(lane) + h;
                    const int src = 8 * q + mr;  // lane that supplied row mr of matrix q
                    const int r = ldmatrix_row(src), c = ldmatrix_col(src) + mc;
                    CHECK(r == fragment_row(frag_layout::row, lane, q, h) && c == fragment_col(frag_layout::row, lane, q, h),
                          "ldmatrix row: lane %d reg %d h %d", lane, q, h);
                }
                {  // .trans -> col layout
                    const int mr = 2 * tid_in_group(lane) + h, mc = group_id(lane);
                    const int src = 8 * q + mr;
                    const int r = ldmatrix_row(src), c = ldmatrix_col(src) + mc;
                    CHECK(r == fragment_row(frag_layout::col, lane, q, h) && c == fragment_col(frag_layout::col, lane, q, h),
                          "ldmatrix trans: lane %d reg %d h %d", lane, q, h);
                }
            }
}

static void test_movmatrix_and_transpose() {
    // movmatrix.m8n8.trans (PTX ISA): given M in the row pattern (lane L holds
    // M[L/4][2(L%4)+h]), lane L receives M^T in the row pattern, i.e. M[2(L%4)+h][L/4].
    // swap_layout applies it per register k, so the col-layout element (lane, k, h)
    // must be the same tile coordinate as that delivered element.
    for (int lane = 0; lane < 32; lane++)
        for (int k = 0; k < 4; k++)
            for (int h = 0; h < 2; h++) {
                const int qr = 8 * (k % 2), qc = 8 * (k / 2);
                // row -> col: source quadrant holds M = X_q, delivered X_q[2t+h][g].
                CHECK(fragment_row(frag_layout::col, lane, k, h) == qr + 2 * tid_in_group(lane) + h &&
                          fragment_col(frag_layout::col, lane, k, h) == qc + group_id(lane),
                      "swap row->col lane %d k %d h %d", lane, k, h);
                // col -> row: the col quadrant in row-pattern terms is M = X_q^T, so the
                // delivered M^T[g][2t+h] = X_q[g][2t+h], the row-layout element.
                CHECK(fragment_row(frag_layout::row, lane, k, h) == qr + group_id(lane) &&
                          fragment_col(frag_layout::row, lane, k, h) == qc + 2 * tid_in_group(lane) + h,
                      "swap col->row lane %d k %d h %d", lane, k, h);
            }
    // transpose_sep: dst (X^T, opposite layout) reg k = src reg perm[k] with
    // perm = {0, 2, 1, 3} (tile_conversions.cuh). Both directions.
    const int perm[4] = {0, 2, 1, 3};
    for (frag_layout src : kLayouts) {
        const frag_layout dst = src == frag_layout::row ? frag_layout::col : frag_layout::row;
        for (int lane = 0; lane < 32; lane++)
            for (int k = 0; k < 4; k++)
                for (int h = 0; h < 2; h++)
                    CHECK(fragment_row(dst, lane, k, h) == fragment_col(src, lane, perm[k], h) &&
                              fragment_col(dst, lane, k, h) == fragment_row(src, lane, perm[k], h),
                          "transpose_sep %s->%s lane %d k %d h %d", name(src), name(dst), lane, k, h);
    }
}

// wgmma matrix descriptors: each field where the PTX ISA's descriptor format puts it (14 bits
// of 16-byte units each for start address, leading and stride byte offsets; the swizzle mode
// in bits 62-63), nothing in the reserved bits, and one descriptor worked out by hand.
static void test_wgmma_descriptor() {
    CHECK(wgmma_swizzle_mode(128) == 1 && wgmma_swizzle_mode(64) == 2 && wgmma_swizzle_mode(32) == 3,
          "swizzle modes");
    // A 128-byte-swizzled K-major tile at shared address 0x400: start 0x40, leading 16 B -> 1,
    // stride 8 rows x 128 B -> 64, mode 1.
    CHECK(wgmma_descriptor(0x400, 16, 1024, 128) == 0x4000004000010040ull, "hand example %llx",
          (unsigned long long)wgmma_descriptor(0x400, 16, 1024, 128));
    const int swizzles[] = {128, 64, 32};
    for (int swz : swizzles)
        for (uint32_t address = 0; address < (1u << 18); address += 0x1230)
            for (uint32_t leading : {16u, 1024u, 8192u, 16384u, 65536u})
                for (uint32_t stride : {256u, 512u, 1024u}) {
                    const uint64_t d = wgmma_descriptor(address & ~15u, leading, stride, swz);
                    CHECK((d & 0x3FFF) == (address & ~15u) >> 4, "start %x", address);
                    CHECK(((d >> 16) & 0x3FFF) == leading >> 4, "leading %u", leading);
                    CHECK(((d >> 32) & 0x3FFF) == stride >> 4, "stride %u", stride);
                    CHECK((d >> 62) == wgmma_swizzle_mode(swz), "mode %d", swz);
                    const uint64_t reserved = (0x3ull << 14) | (0x3ull << 30) | (0xFFFFull << 46);
                    CHECK((d & reserved) == 0, "reserved bits set: %llx", (unsigned long long)d);
                }
}

// ---------------------------------------------------------------------------
// wgmma k-steps: the kernels build an operand's descriptor once and advance its start field by
// wgmma_k_step per 16 K elements. That must land on exactly the address the tile layout gives
// the k-th step's first element, and advancing must equal building the descriptor there.
// ---------------------------------------------------------------------------
static void test_wgmma_k_steps() {
    const int shapes[][2] = {{64, 64}, {64, 128}, {128, 64}, {128, 128}, {64, 256}, {256, 64}, {16, 32}, {32, 16}};
    for (const auto& shape : shapes)
        for (int elem : {2}) {
            const int rows = shape[0], cols = shape[1];
            const int swz = swizzle_bytes_for_width(cols * elem), panel_cols = swz / elem;
            const int row_bytes = swz, panel_bytes = rows * swz;
            auto offset = [&](int r, int c) { return shared_tile_offset(r, c, rows, cols, elem); };
            for (uint32_t base = 0; base + uint32_t(rows * cols * elem) <= 227u * 1024u; base += 7 * 1024)
                for (int r0 = 0; r0 < rows; r0 += 8) {
                    // K-major: from (r0, c0) at the start of a panel, 16 columns per step.
                    for (int c0 = 0; c0 < cols; c0 += panel_cols)
                        for (int k = 0; c0 + 16 * k < cols; k++) {
                            const uint32_t from = base + offset(r0, c0), to = base + offset(r0, c0 + 16 * k);
                            const uint32_t step = wgmma_k_step(false, k, row_bytes, panel_bytes, elem);
                            CHECK(to - from == 16 * step, "K-major %dx%d r0 %d c0 %d k %d: %u vs %u", rows, cols, r0, c0,
                                  k, to - from, 16 * step);
                            const uint64_t d = wgmma_descriptor(from, 16, 8 * row_bytes, swz);
                            CHECK(wgmma_descriptor_advance(d, step) == wgmma_descriptor(to, 16, 8 * row_bytes, swz),
                                  "K-major advance %dx%d base %u k %d", rows, cols, base, k);
                        }
                    // MN-major: from (r0, c0), 16 rows per step.
                    for (int c0 = 0; c0 < cols; c0 += 16)
                        for (int k = 0; r0 + 16 * k < rows; k++) {
                            const uint32_t from = base + offset(r0, c0), to = base + offset(r0 + 16 * k, c0);
                            const uint32_t step = wgmma_k_step(true, k, row_bytes, panel_bytes, elem);
                            CHECK(to - from == 16 * step, "MN-major %dx%d r0 %d c0 %d k %d: %u vs %u", rows, cols, r0, c0,
                                  k, to - from, 16 * step);
                            const uint64_t d = wgmma_descriptor(from, uint32_t(panel_bytes), 8 * row_bytes, swz);
                            CHECK(wgmma_descriptor_advance(d, step) ==
                                      wgmma_descriptor(to, uint32_t(panel_bytes), 8 * row_bytes, swz),
                                  "MN-major advance %dx%d base %u k %d", rows, cols, base, k);
                        }
                }
        }
}

int main() {
    test_ceil_div();
    test_divisor();
    test_swizzle_width();
    test_shared_tiles();
    test_fragment_bijection();
    test_vectors();
    test_mma_conventions();
    test_ldmatrix();
    test_movmatrix_and_transpose();
    test_wgmma_descriptor();
    test_wgmma_k_steps();
    std::printf("%ld checks, %d failures\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
