// CPU unit tests of csrc/attention/task_order.h (plain C++20, no nvcc): the causal attention
// kernels take their tasks in this order, so a task it skips or repeats is a block of output
// never written or written twice.
//
// Build: g++ -std=c++20 -I<repo> -I<repo>/csrc tests/cpp/test_task_order.cpp  (tests/test_core_host.py)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "attention/task_order.h"
#include "tests/cpp/check.h"

using namespace tk::attention;

// For heads_total heads of `blocks` blocks and groups of at most max_heads heads: every
// (head, rank) comes exactly once; the groups are contiguous runs of heads, as few as groups of
// max_heads allow, at most max_heads each and differing by one head at most; within a group the
// ranks come in order (all of the group's rank 0, then rank 1, ...). With one block per head a
// group boundary cannot be seen in the order, so only the first property is checked then.
static void check_order(int heads_total, int max_heads, int blocks) {
    const HeadGroups groups = split_heads(heads_total, max_heads, blocks);
    std::vector<int> seen(size_t(heads_total) * blocks, 0);
    std::vector<int> group_sizes;
    int index = 0;
    while (index < heads_total * blocks) {
        // A group starts at rank 0 of its first head and holds `size` heads x `blocks` tasks.
        const HeadAndRank first = heaviest_first(index, groups);
        int size = 0;
        while (index + size < heads_total * blocks && size < heads_total &&
               heaviest_first(index + size, groups).rank == 0)
            size++;
        if (blocks == 1) size = heads_total;  // one "group": rank 0 of every head
        CHECK(size >= 1, "H%d M%d B%d index %d: no group", heads_total, max_heads, blocks, index);
        if (size < 1) return;
        for (int t = 0; t < size * blocks; t++) {
            const HeadAndRank at = heaviest_first(index + t, groups);
            const bool in_range = at.head >= 0 && at.head < heads_total && at.rank >= 0 && at.rank < blocks;
            CHECK(in_range, "H%d M%d B%d task %d -> head %d rank %d", heads_total, max_heads, blocks, index + t,
                  at.head, at.rank);
            if (!in_range) return;
            CHECK(at.head == first.head + t % size && at.rank == t / size, "H%d M%d B%d task %d -> head %d rank %d",
                  heads_total, max_heads, blocks, index + t, at.head, at.rank);
            seen[size_t(at.head) * blocks + at.rank]++;
        }
        group_sizes.push_back(size);
        index += size * blocks;
    }
    for (size_t i = 0; i < seen.size(); i++)
        CHECK(seen[i] == 1, "H%d M%d B%d head %zu rank %zu taken %d times", heads_total, max_heads, blocks, i / blocks,
              i % blocks, seen[i]);
    if (blocks == 1) return;
    const int expected_groups = (heads_total + max_heads - 1) / max_heads;
    CHECK(int(group_sizes.size()) == expected_groups, "H%d M%d: %zu groups", heads_total, max_heads, group_sizes.size());
    int smallest = heads_total, largest = 0;
    for (int size : group_sizes) smallest = size < smallest ? size : smallest, largest = size > largest ? size : largest;
    CHECK(largest <= max_heads && largest - smallest <= 1, "H%d M%d: groups of %d..%d heads", heads_total, max_heads,
          smallest, largest);
}

// The forward's split last round for `tasks` equal tasks of `tiles` key tiles on a grid of
// `grid` blocks: the whole tasks are full rounds and the pieces one more (at most), at least
// MIN_TILES_PER_PIECE tiles per piece, a power of two pieces; and a split task's pieces cover
// its tiles exactly once, in order, in shares differing by one tile at most.
static void check_split(int64_t tasks, int grid, int tiles) {
    const TailSplit split = split_last_round(tasks, grid, tiles);
    const int pieces = 1 << split.piece_shift;
    CHECK(split.whole_tasks + split.split_tasks == tasks, "T%lld G%d: %d whole + %d split", (long long)tasks, grid,
          split.whole_tasks, split.split_tasks);
    CHECK(split.piece_shift >= 0 && split.piece_shift <= MAX_PIECE_SHIFT, "T%lld G%d: shift %d", (long long)tasks,
          grid, split.piece_shift);
    if (split.piece_shift == 0) {
        CHECK(split.split_tasks == 0, "T%lld G%d: %d tasks split in one piece", (long long)tasks, grid,
              split.split_tasks);
        // Nothing split only when nothing is left over, or a split would not fit in the round,
        // would make pieces of fewer than MIN_TILES_PER_PIECE tiles or would save fewer than
        // MIN_TILES_SAVED tiles even in as many pieces as fit.
        const int64_t left = tasks % grid;
        int64_t most = left > 0 ? std::min<int64_t>(grid / left, tiles / MIN_TILES_PER_PIECE) : 0;
        int64_t fit = 1;
        while (fit * 2 <= most && fit < (1 << MAX_PIECE_SHIFT)) fit *= 2;
        CHECK(left == 0 || fit < 2 || tiles - (tiles + fit - 1) / fit < MIN_TILES_SAVED, "T%lld G%d K%d: not split",
              (long long)tasks, grid, tiles);
        return;
    }
    CHECK(split.whole_tasks % grid == 0, "T%lld G%d: %d whole tasks", (long long)tasks, grid, split.whole_tasks);
    CHECK(int64_t(split.split_tasks) * pieces <= grid, "T%lld G%d: %d x %d pieces", (long long)tasks, grid,
          split.split_tasks, pieces);
    CHECK(2 * int64_t(split.split_tasks) * pieces > grid || 2 * pieces * MIN_TILES_PER_PIECE > tiles ||
              split.piece_shift == MAX_PIECE_SHIFT,
          "T%lld G%d K%d: %d pieces, twice as many would fit", (long long)tasks, grid, tiles, pieces);
    int next = 0, smallest = tiles, largest = 0;
    for (int piece = 0; piece < pieces; piece++) {
        const TileRange r = piece_tiles(piece, split.piece_shift, tiles);
        CHECK(r.first == next && r.end > r.first, "K%d piece %d of %d: [%d, %d)", tiles, piece, pieces, r.first, r.end);
        next = r.end;
        smallest = std::min(smallest, r.end - r.first), largest = std::max(largest, r.end - r.first);
    }
    CHECK(next == tiles, "K%d, %d pieces end at %d", tiles, pieces, next);
    CHECK(smallest >= MIN_TILES_PER_PIECE && largest - smallest <= 1, "K%d, %d pieces: %d..%d tiles", tiles, pieces,
          smallest, largest);
    CHECK(tiles - largest >= MIN_TILES_SAVED, "K%d, %d pieces: the longest has %d tiles", tiles, pieces, largest);
}

// The clustered forward's piece order (paired_piece) for `split_tasks` (even) tasks in
// 2^shift pieces: every piece once, and pieces 2i and 2i + 1 the same share of tasks 2m and 2m + 1.
static void check_paired_pieces(int split_tasks, int shift) {
    const int pieces = split_tasks << shift;
    std::vector<int> seen(pieces, 0);
    for (int i = 0; i < pieces; i++) {
        const int piece = paired_piece(i, shift);
        CHECK(piece >= 0 && piece < pieces, "S%d shift %d: index %d -> piece %d", split_tasks, shift, i, piece);
        if (piece < 0 || piece >= pieces) continue;
        seen[piece]++;
        if (i % 2 == 1) {
            const int other = paired_piece(i - 1, shift), mask = (1 << shift) - 1;
            CHECK((other & mask) == (piece & mask) && (other >> shift) % 2 == 0 && (piece >> shift) == (other >> shift) + 1,
                  "S%d shift %d: index %d pairs piece %d with %d", split_tasks, shift, i, other, piece);
        }
    }
    for (int piece = 0; piece < pieces; piece++)
        CHECK(seen[piece] == 1, "S%d shift %d: piece %d taken %d times", split_tasks, shift, piece, seen[piece]);
}

int main() {
    for (int split_tasks = 2; split_tasks <= 40; split_tasks += 2)
        for (int shift = 0; shift <= MAX_PIECE_SHIFT; shift++) check_paired_pieces(split_tasks, shift);
    // The clustered forward pairs tasks 2t, 2t + 1 on an even grid: with an even number of tasks,
    // the whole ones and the split ones are even in number too.
    for (int grid : {2, 132, 114})
        for (int64_t tasks = 2; tasks <= 3 * grid + 2; tasks += 2)
            for (int tiles : {24, 32, 48}) {
                const TailSplit split = split_last_round(tasks, grid, tiles);
                CHECK(split.whole_tasks % 2 == 0 && split.split_tasks % 2 == 0, "T%lld G%d K%d: %d whole, %d split",
                      (long long)tasks, grid, tiles, split.whole_tasks, split.split_tasks);
            }

    for (int grid : {1, 7, 132, 114})
        for (int64_t tasks = 1; tasks <= 3 * grid + 1; tasks++)
            for (int tiles : {1, 4, 7, 8, 9, 16, 33, 64, 257, 4096}) check_split(tasks, grid, tiles);
    check_split(4096, 132, 24);           // b16 h16 n3072 d64: 4 tasks left, 4 pieces of 6 tiles
    check_split(4, 132, 8);               // 4 tasks of 8 tiles: not split (2 pieces would save 4 tiles)
    check_split(0x7fffff00, 132, 1 << 24);  // the largest sizes: no overflow in piece_tiles
    // The measured cases (task_order.h): split where it paid, not where it cost.
    CHECK(split_last_round(4096, 132, 24).piece_shift == 2, "b16 h16 n3072 d64: 4 pieces");
    CHECK(split_last_round(4, 132, 16).piece_shift == 2, "4 tasks of 16 tiles: 4 pieces");
    CHECK(split_last_round(4, 132, 8).piece_shift == 0, "4 tasks of 8 tiles: none");
    CHECK(split_last_round(64, 132, 16).piece_shift == 0, "64 tasks of 16 tiles: none");

    for (int heads = 1; heads <= 80; heads++)
        for (int max_heads = 1; max_heads <= heads + 1; max_heads++)
            for (int blocks = 1; blocks <= 7; blocks++) check_order(heads, max_heads, blocks);
    // Sizes of the benchmarks (b x h, query or key blocks per head, the groups L2 allows).
    check_order(256, 40, 6);
    check_order(256, 20, 12);
    check_order(64, 7, 33);
    check_order(128, 14, 32);
    check_order(16 * 16, 13, 24);
    std::printf("%ld checks, %d failures\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
