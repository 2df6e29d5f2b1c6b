"""The parameter space of the GPU attention tests (forward and gradients), shared by both."""

import torch

DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [64, 96, 128]
GQA_RATIOS = [1, 4, 8]


def attention_cases(small_lengths, long_lengths):
    """(len_q, len_kv, dtype, head_dim, causal, gqa_ratio) tuples: the full cross product for
    the small lengths; for the long ones every dtype, head dim and causal flag with the GQA
    ratios rotated (the full product would be slow)."""
    cases = []
    for len_q, len_kv in small_lengths:
        for dtype in DTYPES:
            for head_dim in HEAD_DIMS:
                for causal in (False, True):
                    for ratio in GQA_RATIOS:
                        cases.append((len_q, len_kv, dtype, head_dim, causal, ratio))
    index = 0
    for len_q, len_kv in long_lengths:
        for dtype in DTYPES:
            for head_dim in HEAD_DIMS:
                for causal in (False, True):
                    cases.append((len_q, len_kv, dtype, head_dim, causal,
                                  GQA_RATIOS[index % len(GQA_RATIOS)]))
                    index += 1
    return cases


def case_id(case):
    len_q, len_kv, dtype, head_dim, causal, ratio = case
    return (f"lq{len_q}-lk{len_kv}-{str(dtype).removeprefix('torch.')}-d{head_dim}-"
            f"{'causal' if causal else 'full'}-gqa{ratio}")
