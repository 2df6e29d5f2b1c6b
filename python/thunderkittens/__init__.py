"""thunderkittens: fast tile kernels for PyTorch, behind torch custom ops (torch.ops.tk.*).

    import thunderkittens as tk
    out = tk.attention(q, k, v, is_causal=True)   # contract of F.scaled_dot_product_attention
    print(tk.explain(q, k, v, is_causal=True))    # which path that call takes, and why
    c = tk.matmul(a, b)                           # contract of torch.matmul (sm_90 kernel)
    print(tk.explain_matmul(a, b))                # which path that call takes, and why
    with tk.strict():        ...                  # a fallback to PyTorch raises FallbackError
    with tk.use_kernel("sm80"): ...               # force a kernel family (or TK_ATTENTION_KERNEL)
"""

import torch  # noqa: F401  (must be loaded before the extension: _C links against libtorch)

from ._version import __version__
from ._extension import BUILT_ARCHS, BUILT_OPS, build_summary  # loads _C, registers the ops
from ._attention import fake as _attention_fake  # noqa: F401  (registers the fake impls)
from ._attention import autograd as _attention_autograd  # noqa: F401  (registers the backward)
from ._attention.api import attention, explain_attention
from ._attention.explanation import AttentionPlan
from ._matmul import autograd as _matmul_autograd  # noqa: F401  (registers the autograd formula)
from ._matmul import fake as _matmul_fake  # noqa: F401  (registers the fake impl)
from ._matmul.api import explain_matmul, matmul
from ._matmul.explanation import MatmulPlan
from ._config import kernel_choice, strict, strict_enabled, use_kernel
from .errors import FallbackError

#: ``explain(q, k, v, **kwargs)`` describes the path of ``attention(q, k, v, **kwargs)``.
explain = explain_attention

__all__ = [
    "__version__", "attention", "explain", "explain_attention", "AttentionPlan",
    "matmul", "explain_matmul", "MatmulPlan",
    "strict", "strict_enabled", "use_kernel", "kernel_choice", "FallbackError",
    "BUILT_ARCHS", "BUILT_OPS", "build_summary",
]
