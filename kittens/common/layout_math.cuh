// Pure index arithmetic of the tile core: shared-memory swizzles and register
// fragment coordinates. Everything here is constexpr and callable from host code,
// so it is unit-tested on the CPU (tests/cpp/test_layout_math.cpp) without a GPU.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define KITTENS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KITTENS_HOST_DEVICE inline
#endif

namespace kittens::layout_math {

// Edge of the smallest tile the core works with (one tensor-core fragment).
inline constexpr int TILE_DIM = 16;

KITTENS_HOST_DEVICE constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
KITTENS_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Division by a number fixed before a kernel starts (a head count, blocks per head), as one
// 32x32 -> 64-bit multiply and a shift instead of the dozen-odd dependent instructions of a
// general integer division: kernels that map a task index to its coordinates at every task
// pay that latency before the task's first product. For 0 <= n < 2^31 and value >= 1: with
// l = ceil(log2 value), shift = 31 + l and multiplier = ceil(2^shift / value) (< 2^32), the
// excess multiplier * value - 2^shift is below value <= 2^l, so n times it stays below
// 2^shift and (n * multiplier) >> shift is exactly floor(n / value).
struct divisor {
    int value;
    uint32_t multiplier;
    int shift;

    constexpr divisor() : divisor(1) {}
    constexpr explicit divisor(int v) : value(v), multiplier(0), shift(31) {
        int l = 0;
        while ((int64_t(1) << l) < v) l++;
        shift = 31 + l;
        multiplier = uint32_t(((uint64_t(1) << shift) + uint64_t(v) - 1) / uint64_t(v));
    }
    KITTENS_HOST_DEVICE constexpr int divide(int n) const {
        return int((uint64_t(uint32_t(n)) * multiplier) >> shift);
    }
};

// ---------------------------------------------------------------------------
// Shared tiles.
//
// A shared tile of `rows x cols` elements is stored as column panels whose row is
// exactly `swizzle_bytes` wide (the largest of 128/64/32 bytes that divides the tile
// width). Each panel is `rows` contiguous panel-rows. Inside a panel the 16-byte
// chunks of a row are XOR-permuted by the row index: this is the layout the Hopper
// TMA engine and wgmma descriptors call 128B/64B/32B swizzle, and it makes the
// eight 16-byte row reads of an ldmatrix hit eight distinct bank groups.
// All three patterns repeat every 8 rows (1024, 512, 256 bytes); the tile base
// must be aligned to that period (1024 bytes covers all three modes).
// ---------------------------------------------------------------------------

KITTENS_HOST_DEVICE constexpr int swizzle_bytes_for_width(int width_bytes) {
    return width_bytes % 128 == 0 ? 128 : width_bytes % 64 == 0 ? 64 : 32;
}

// XOR permutation of 16-byte chunks inside a swizzle atom. `offset` is a byte
// offset from a 1024-byte aligned base.
KITTENS_HOST_DEVICE constexpr uint32_t swizzle(uint32_t offset, int swizzle_bytes) {
    // Bits [4, 4+log2(swizzle_bytes/16)) (the chunk in the row) are XORed with the
    // same number of bits starting at bit 7.
    const uint32_t mask = swizzle_bytes == 128 ? 7u : swizzle_bytes == 64 ? 3u : 1u;
    return offset ^ (((offset >> 7) & mask) << 4);
}

// Byte offset of element (row, col) in a shared tile, swizzle included.
// Equal to swizzle(linear offset) for tiles whose rows are a multiple of 8 (every
// panel then starts on a pattern period), but written so the XOR only involves the
// low bits of the row: when a kernel's row is `compile-time multiple of 16 + lane
// term`, the compiler folds the multiple into an immediate and keeps one address
// register per column slice instead of one per sub-tile.
KITTENS_HOST_DEVICE constexpr uint32_t shared_tile_offset(int row, int col, int rows, int cols,
                                                          int element_bytes) {
    const int swz = swizzle_bytes_for_width(cols * element_bytes);
    const int panel_cols = swz / element_bytes;
    const uint32_t panel_base = uint32_t(col / panel_cols) * uint32_t(rows) * uint32_t(swz);
    const uint32_t col_bytes = uint32_t((col % panel_cols) * element_bytes);
    // Bits 7.. of the linear offset row*swz are row >> (log2(128/swz)).
    const int shift = swz == 128 ? 0 : swz == 64 ? 1 : 2;
    const uint32_t mask = swz == 128 ? 7u : swz == 64 ? 3u : 1u;
    const uint32_t xor_chunk = ((uint32_t(row) >> shift) & mask) << 4;
    return panel_base + uint32_t(row) * uint32_t(swz) + (col_bytes ^ xor_chunk);
}

// 4-byte bank (0..31) of a shared byte offset.
KITTENS_HOST_DEVICE constexpr int bank_of(uint32_t offset) { return int((offset / 4) % 32); }

// Hopper wgmma shared-memory matrix descriptor (PTX ISA, "matrix descriptor format"): bits
// 0-13 start address, 16-29 leading-dimension byte offset, 32-45 stride-dimension byte offset,
// each in 16-byte units (of an 18-bit byte value), and bits 62-63 the swizzle mode of the
// core's shared tiles (1: 128-byte, 2: 64-byte, 3: 32-byte).
KITTENS_HOST_DEVICE constexpr uint64_t wgmma_swizzle_mode(int swizzle_bytes) {
    return swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : 3;
}
KITTENS_HOST_DEVICE constexpr uint64_t wgmma_descriptor(uint32_t address, uint32_t leading_bytes,
                                                        uint32_t stride_bytes, int swizzle_bytes) {
    auto field = [](uint32_t bytes) { return uint64_t((bytes & 0x3FFFF) >> 4); };
    return field(address) | (field(leading_bytes) << 16) | (field(stride_bytes) << 32) |
           (wgmma_swizzle_mode(swizzle_bytes) << 62);
}

// Start-address step, in the descriptor's 16-byte units, of a wgmma operand from k-step 0 to
// k-step k (16 more K elements) in a shared tile whose rows are row_bytes apart in a panel
// and whose column panels are panel_bytes apart. K-major: 16 columns further along the row,
// across whole panels. MN-major: 16 rows further down. The operand starts at a row that is a
// multiple of 8 and (K-major) at the first column of a panel, so no swizzle term enters.
KITTENS_HOST_DEVICE constexpr uint32_t wgmma_k_step(bool mn_major, int k, int row_bytes, int panel_bytes,
                                                    int element_bytes) {
    if (mn_major) return uint32_t(k * 16 * row_bytes) >> 4;
    const int panel_cols = row_bytes / element_bytes, col = k * 16;
    return uint32_t((col / panel_cols) * panel_bytes + (col % panel_cols) * element_bytes) >> 4;
}

// A descriptor moved `step` 16-byte units further: only the low word changes, since the start
// field (bits 0-13) cannot carry while the address stays below 2^18 bytes (all of shared memory).
KITTENS_HOST_DEVICE constexpr uint64_t wgmma_descriptor_advance(uint64_t descriptor, uint32_t step) {
    return (descriptor & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(descriptor) + step);
}

// ---------------------------------------------------------------------------
// Register fragments.
//
// A 16x16 base tile is spread over the 32 lanes of a warp: each lane holds four
// packed pairs (register k = 0..3, element h = 0..1 of the pair). `row` layout
// is the mma.sync A-operand / accumulator fragment: pairs run along a row.
// `col` layout is its transpose pattern (the mma.sync B-operand fragment): pairs
// run along a column. Register k covers the 8x8 quadrant (k % 2, k / 2) in
// (row-block, col-block) order for both layouts.
// ---------------------------------------------------------------------------

enum class frag_layout { row, col };

KITTENS_HOST_DEVICE constexpr int fragment_row(frag_layout l, int lane, int k, int h) {
    return l == frag_layout::row ? lane / 4 + 8 * (k % 2) : 2 * (lane % 4) + h + 8 * (k % 2);
}
KITTENS_HOST_DEVICE constexpr int fragment_col(frag_layout l, int lane, int k, int h) {
    return l == frag_layout::row ? 2 * (lane % 4) + h + 8 * (k / 2) : lane / 4 + 8 * (k / 2);
}

// Register vectors hold one value per row (or per column) of a tile. A lane holds
// either the two indices lane/4 and lane/4+8 of each 16 ("pairs": shared by the
// four lanes of a quad) or the four indices 2*(lane%4)+{0,1}, +8 ("quads": shared
// by the eight lanes with equal lane%4).
enum class vec_layout { pairs, quads };

KITTENS_HOST_DEVICE constexpr int vec_slots(vec_layout v) { return v == vec_layout::pairs ? 2 : 4; }
KITTENS_HOST_DEVICE constexpr int vec_index(vec_layout v, int lane, int slot) {
    return v == vec_layout::pairs ? lane / 4 + 8 * slot : 2 * (lane % 4) + slot % 2 + 8 * (slot / 2);
}

// Which vector layout holds one value per row (resp. column) of a tile of layout l,
// and which slot of that vector belongs to fragment element (k, h).
KITTENS_HOST_DEVICE constexpr vec_layout per_row_vec(frag_layout l) {
    return l == frag_layout::row ? vec_layout::pairs : vec_layout::quads;
}
KITTENS_HOST_DEVICE constexpr vec_layout per_col_vec(frag_layout l) {
    return l == frag_layout::row ? vec_layout::quads : vec_layout::pairs;
}
KITTENS_HOST_DEVICE constexpr int row_slot(frag_layout l, int k, int h) {
    return l == frag_layout::row ? k % 2 : 2 * (k % 2) + h;
}
KITTENS_HOST_DEVICE constexpr int col_slot(frag_layout l, int k, int h) {
    return l == frag_layout::row ? 2 * (k / 2) + h : k / 2;
}

// ldmatrix (x4, with or without .trans) loads the four 8x8 quadrants of a 16x16
// tile into registers k = 0..3; lane i supplies the address of one 8-element row of
// quadrant i / 8. Both fragment layouts use the same addresses (col uses .trans).
KITTENS_HOST_DEVICE constexpr int ldmatrix_row(int lane) { return lane % 8 + 8 * ((lane / 8) % 2); }
KITTENS_HOST_DEVICE constexpr int ldmatrix_col(int lane) { return 8 * (lane / 16); }

}  // namespace kittens::layout_math
