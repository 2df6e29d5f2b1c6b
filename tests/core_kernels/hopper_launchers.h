// Launchers of the Hopper (sm_90a) core test kernels; same conventions as launchers.h.
#pragma once
#include "launchers.h"

namespace tk_test {

// dump = TMA-loaded tile `at` of in (64 rows x 256 bytes); tile `at` of out = it (TMA
// store); tile `at` of acc += it (TMA reduce-add). `hinted`: the load and the store carry an L2
// evict_first cache policy.
void tma_round_trip(int dtype, const gl_args& in, const gl_args& out, const gl_args& acc, const gl_args& dump,
                    const coord_args& at, bool hinted, int64_t stream);

// d (64 x n, float) = a (64 x k) * op(b) [+ c] on wgmma. variant bit 0: b is k x n
// (mma_AB) instead of n x k (mma_ABt); bit 1: a from registers.
void wgmma(int dtype, int n, int k, bool accumulate, int variant, const gl_args& a, const gl_args& b,
           const gl_args& c, const gl_args& d, int64_t stream);

// out (64 x 64 float) = sum over the 64-row tiles of in, through a 2-stage TMA ring.
void semaphore_pipeline(const gl_args& in, int tiles, const gl_args& out, int64_t stream);

// Clusters of `size` blocks (blocks in all) each run that ring over 64 x 128 tiles of in, every
// tile's panels copied once into all blocks of the cluster (multicast); block b's 64 rows of
// out (blocks * 64 x 128) = the sum of the tiles.
void multicast_pipeline(const gl_args& in, int tiles, int blocks, int size, const gl_args& out, int64_t stream);

// out[0, 1024) = in[offset, offset + count) (raw float pointers) through a 1-D bulk copy into
// shared memory; the rest of out is the shared buffer's NaN poison.
void bulk_copy(int64_t in, int64_t offset, int count, int64_t out, int64_t stream);

// Clusters of `size` blocks (blocks in all, each with 1024 floats of in): block b's 1024
// floats of out are those of block (rank + shift) % size of its cluster, read from that
// block's shared memory; ranks[2b], ranks[2b + 1] = its cluster rank and the cluster size.
void cluster_exchange(int64_t in, int blocks, int size, int shift, int64_t out, int64_t ranks, int64_t stream);

}  // namespace tk_test
