"""thunderkittens: fast tile kernels for PyTorch, behind torch custom ops (torch.ops.tk.*).

    import thunderkittens as tk
    out = tk.attention(q, k, v, is_causal=True)   # contract of F.scaled_dot_product_attention
    print(tk.explain(q, k, v, is_causal=True))    # which path that call takes, and why
    o = tk.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k_new, v_new)  # decoding
    c = tk.matmul(a, b)                           # contract of torch.matmul (sm_90 kernel)
    print(tk.explain_matmul(a, b))                # which path that call takes, and why
    o = tk.based(q, k, v)                         # Based linear attention (causal)
    y = tk.fftconv(u, k)                          # causal long convolution via the FFT
    with tk.strict():        ...                  # a fallback to PyTorch raises FallbackError
    with tk.use_kernel("sm80"): ...               # force a kernel family (or TK_ATTENTION_KERNEL)
"""

from ._version import __version__
from ._extension import BUILT_ARCHS, BUILT_OPS, build_summary  # loads _C: registers the ops
from ._config import kernel_choice, strict, strict_enabled, use_kernel
from .errors import FallbackError
from ._attention.api import attention, explain_attention  # also registers fake impls, autograd
from ._attention.plan import AttentionPlan
from ._attention.kvcache import KVCachePlan, attention_with_kvcache, explain_kvcache
from ._matmul.api import explain_matmul, matmul
from ._matmul.plan import MatmulPlan
from ._based.api import based, explain_based
from ._based.plan import BasedPlan
from ._based.step import BasedStepPlan, based_step, explain_based_step
from ._fftconv.api import FFTConv, explain_fftconv, fftconv
from ._fftconv.plan import FFTConvPlan

#: ``explain(q, k, v, **kwargs)`` describes the path of ``attention(q, k, v, **kwargs)``.
explain = explain_attention

__all__ = [
    "__version__", "attention", "explain", "explain_attention", "AttentionPlan",
    "attention_with_kvcache", "explain_kvcache", "KVCachePlan",
    "matmul", "explain_matmul", "MatmulPlan",
    "based", "based_step", "explain_based", "BasedPlan", "explain_based_step", "BasedStepPlan",
    "fftconv", "FFTConv", "explain_fftconv", "FFTConvPlan",
    "strict", "strict_enabled", "use_kernel", "kernel_choice", "FallbackError",
    "BUILT_ARCHS", "BUILT_OPS", "build_summary",
]
