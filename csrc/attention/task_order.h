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

// Task `index` of heads_total heads with `blocks` blocks each: within each group of
// heads_per_group heads, all the groups' heaviest blocks come first, then the next heaviest...
__host__ __device__ inline HeadAndRank heaviest_first(int index, int heads_total, int heads_per_group, int blocks) {
    const int per_group = heads_per_group * blocks;
    const int group = index / per_group, first_head = group * heads_per_group, r = index % per_group;
    const int heads_here = heads_per_group < heads_total - first_head ? heads_per_group : heads_total - first_head;
    return {first_head + r % heads_here, r / heads_here};
}

// How many heads, each streaming bytes_per_head, fit in half of the L2 cache together (at least
// one, at most heads_total).
inline int heads_sharing_l2(int64_t bytes_per_head, int64_t l2_bytes, int64_t heads_total) {
    const int64_t fit = (l2_bytes / 2) / (bytes_per_head > 0 ? bytes_per_head : 1);
    return int(fit < 1 ? 1 : fit > heads_total ? heads_total : fit);
}

}  // namespace tk::attention
