// The end of the forward kernels' online softmax, per query row, shared by forward_sm80.cu and
// forward_sm90.cu: row_max is the running max of raw scores, row_sum the sum of P (lanes
// combined). A row that saw no key (lower-right causal with Lq > Lk) keeps max -inf and sum 0;
// it must come out as O = 0 and lse = -inf, as SDPA's math backend and FlashAttention give.
#pragma once
#include "kittens/kittens.cuh"

namespace tk::attention {

// The divisor of O: the row sum, or 1 where it is 0 (O is 0 there too), so O / l is 0, not 0/0.
template <typename V>
__device__ __forceinline__ void guard_empty_rows(V& row_sum) {
    kittens::for_each_slot(row_sum, [&](int, int, float& l) { l = l == 0.f ? 1.f : l; });
}

// The natural-log log-sum-exp of the scaled scores, (m * c + log2 l) * ln2 with c = scale *
// log2(e); -inf for a row that saw no key.
template <typename V>
__device__ __forceinline__ void log_sum_exp(V& lse, const V& row_max, const V& row_sum, float scale_log2) {
    constexpr float LN2 = 0.6931471805599453f;
    kittens::for_each_slot(lse, [&](int t, int i, float& x) {
        const float m = row_max.data[t][i];
        x = m == kittens::neg_infinity() ? m : (m * scale_log2 + __log2f(row_sum.data[t][i])) * LN2;
    });
}

}  // namespace tk::attention
