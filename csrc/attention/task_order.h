// The order in which the persistent sm90 attention kernels take causal tasks. Causal tasks
// differ in size (a query block near the end of the sequence sees more keys; a key block near
// the start is seen by more queries), and blocks take them one at a time from a global
// counter: handing out the heaviest first lets the light ones fill in at the end, so the
// blocks finish together. Heads go in groups whose streamed data fits in L2 together, so the
// tasks running at one time share their heads' data there.
#pragma once
#include <cstdint>

namespace tk::attention {

struct HeadAndRank {
    int head;  // over batch x heads
    int rank;  // 0: the head's heaviest block, 1: the next heaviest, ...
};

// How the heads split into groups: as few groups of at most max_heads_per_group heads as they
// can, the groups differing by one head at most: heaviest-first evens out the blocks' ends only
// within a group, and a last group of one head would end on that head's heaviest tasks alone
// (session 13: b4 h16 n4097 d128 causal, 64 heads in groups of 7 and a last one of 1, lost 7%
// forward). Made on the host, so that a task's head and rank take two divisions, as before.
struct HeadGroups {
    int small;       // heads in each of the last groups
    int big_groups;  // the first groups, of small + 1 heads each
};

inline HeadGroups split_heads(int heads_total, int max_heads_per_group) {
    const int groups = (heads_total + max_heads_per_group - 1) / max_heads_per_group;
    return {heads_total / groups, heads_total % groups};
}

// Task `index` of the heads with `blocks` blocks each: within each group of heads, all the
// group's heaviest blocks come first, then the next heaviest...
__host__ __device__ inline HeadAndRank heaviest_first(int index, HeadGroups groups, int blocks) {
    const int big_heads = groups.big_groups * (groups.small + 1);
    const bool big = index < big_heads * blocks;
    const int heads_here = big ? groups.small + 1 : groups.small, tasks_here = heads_here * blocks;
    const int i = big ? index : index - big_heads * blocks;
    const int group = i / tasks_here, r = i - group * tasks_here;
    return {(big ? 0 : big_heads) + group * heads_here + r % heads_here, r / heads_here};
}

// How many heads, each touching bytes_per_head, fit in half of the L2 cache together (at least
// one, at most heads_total).
inline int heads_sharing_l2(int64_t bytes_per_head, int64_t l2_bytes, int64_t heads_total) {
    const int64_t fit = (l2_bytes / 2) / (bytes_per_head > 0 ? bytes_per_head : 1);
    return int(fit < 1 ? 1 : fit > heads_total ? heads_total : fit);
}

}  // namespace tk::attention
