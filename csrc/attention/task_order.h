// The order in which the persistent sm90 attention kernels take causal tasks. Causal tasks
// differ in size (a query block near the end of the sequence sees more keys; a key block near
// the start is seen by more queries), and blocks take them one at a time from a global
// counter: handing out the heaviest first lets the light ones fill in at the end, so the
// blocks finish together. Heads go in groups whose streamed data fits in L2 together, so the
// tasks running at one time share their heads' data there.
#pragma once
#include <cstdint>

#include "kittens/common/layout_math.cuh"

namespace tk::attention {

using kittens::layout_math::divisor;

struct HeadAndRank {
    int head;  // over batch x heads
    int rank;  // 0: the head's heaviest block, 1: the next heaviest, ...
};

// How the heads split into groups: as few groups of at most max_heads_per_group heads as they
// can, the groups differing by one head at most: heaviest-first evens out the blocks' ends only
// within a group, and a last group of one head would end on that head's heaviest tasks alone.
// Made on the host, with the divisors a task's head and rank need.
struct HeadGroups {
    int big_heads;                          // the first groups' heads (one more per group)
    int big_tasks;                          // and their tasks
    divisor big_heads_each, small_heads_each;  // heads in a first group, in a later one
    divisor big_tasks_each, small_tasks_each;  // tasks in a first group, in a later one
};

inline HeadGroups split_heads(int heads_total, int max_heads_per_group, int blocks) {
    const int groups = (heads_total + max_heads_per_group - 1) / max_heads_per_group;
    const int small = heads_total / groups, big_heads = heads_total % groups * (small + 1);
    return {big_heads, big_heads * blocks, divisor(small + 1), divisor(small),
            divisor((small + 1) * blocks), divisor(small * blocks)};
}

// Task `index` of the heads with `blocks` blocks each (as given to split_heads): within each
// group of heads, all the group's heaviest blocks come first, then the next heaviest...
KITTENS_HOST_DEVICE HeadAndRank heaviest_first(int index, const HeadGroups& groups) {
    const bool big = index < groups.big_tasks;
    const divisor& heads_here = big ? groups.big_heads_each : groups.small_heads_each;
    const divisor& tasks_here = big ? groups.big_tasks_each : groups.small_tasks_each;
    const int i = big ? index : index - groups.big_tasks;
    const int group = tasks_here.divide(i), r = i - group * tasks_here.value;
    const int rank = heads_here.divide(r);
    return {(big ? 0 : groups.big_heads) + group * heads_here.value + (r - rank * heads_here.value), rank};
}

// How many heads, each touching bytes_per_head, fit in half of the L2 cache together (at least
// one, at most heads_total).
inline int heads_sharing_l2(int64_t bytes_per_head, int64_t l2_bytes, int64_t heads_total) {
    const int64_t fit = (l2_bytes / 2) / (bytes_per_head > 0 ? bytes_per_head : 1);
    return int(fit < 1 ? 1 : fit > heads_total ? heads_total : fit);
}

// The non-causal forward's last round. Its tasks are all the same size and go round robin, so
// when they are not a whole number of rounds of the grid the last round runs only the few
// left over, on as few SMs, for a whole task's time (b8 hq32 n2048 d128: 4096 tasks are 31
// rounds of 132 and 4 more, as long as 4224 tasks would take). Those left-over
// tasks run instead as 2^piece_shift pieces each, over equal shares of the key tiles, on that
// many blocks; the last piece of a task to finish merges them (forward_sm90.cu). A power of two,
// so that a piece's task and tiles come from shifts, which the kernel keeps in uniform
// registers (an integer division would put its loop counts in vector registers, and every
// wgmma descriptor derived from them).
struct TailSplit {
    int whole_tasks;  // the tasks run whole: full rounds of the grid, first
    int split_tasks;  // the ones after them, each run as 2^piece_shift pieces
    int piece_shift;  // 0: nothing split
};

// At least this many key tiles per piece, and a split only where it takes at least
// MIN_TILES_SAVED tiles off the last round's longest task: splitting has a fixed cost (the
// partial results written, fenced, counted, read back and merged, the merged rows stored from
// registers), about what 4-6 d64 tiles take.
constexpr int MIN_TILES_PER_PIECE = 4;
constexpr int MIN_TILES_SAVED = 12;
constexpr int MAX_PIECE_SHIFT = 6;  // 64 pieces; with < 2^24 tiles, piece * tiles fits an int

inline TailSplit split_last_round(int64_t tasks, int grid, int tiles_per_task) {
    const int64_t left = grid > 0 ? tasks % grid : 0;
    if (left == 0) return {int(tasks), 0, 0};
    const int64_t by_grid = grid / left;  // all pieces in the same (last) round
    const int64_t by_tiles = tiles_per_task / MIN_TILES_PER_PIECE;
    const int64_t most = by_grid < by_tiles ? by_grid : by_tiles;
    int shift = 0;
    while (shift < MAX_PIECE_SHIFT && (int64_t(2) << shift) <= most) shift++;
    const int64_t longest_piece = (tiles_per_task + (int64_t(1) << shift) - 1) >> shift;
    if (shift == 0 || tiles_per_task - longest_piece < MIN_TILES_SAVED) return {int(tasks), 0, 0};
    return {int(tasks - left), int(left), shift};
}

// The forward in clusters of two (forward_sm90.cu: PAIRED) runs pieces 2i and 2i + 1 on the two
// blocks of a cluster, which share their K/V tiles: those two must be the same share of two
// neighbouring split tasks. Returns the piece, in the order above (task-major: task k's shares
// are k * 2^shift + 0 .. 2^shift - 1), that the `index`-th piece in cluster order is:
// neighbouring tasks 2m and 2m + 1 go share by share, interleaved. (A bijection on
// [0, split_tasks * 2^shift) when split_tasks is even.)
KITTENS_HOST_DEVICE int paired_piece(int index, int shift) {
    const int pair = index >> 1, share = pair & ((1 << shift) - 1);
    const int task = ((pair >> shift) << 1) | (index & 1);
    return (task << shift) | share;
}

// The key tiles [first, end) of piece `piece` (0 .. 2^shift - 1) of a task with `tiles` tiles:
// equal shares, differing by one tile at most.
struct TileRange {
    int first, end;
};
KITTENS_HOST_DEVICE TileRange piece_tiles(int piece, int shift, int tiles) {
    return {(piece * tiles) >> shift, ((piece + 1) * tiles) >> shift};
}

}  // namespace tk::attention
