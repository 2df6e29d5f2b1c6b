"""torch.export of models that call tk.attention and tk.matmul (docs/api.md: the ops have fake
implementations, so torch.export works): the exported program holds our ops (or the fallback's
PyTorch ops), runs, and gives eager's answer bit for bit; a saved and loaded program too.

On the CPU through the stand-in kernels (conftest's cpu_kernel and cpu_matmul fixtures: the real
path choice, fake implementations and schemas), and on a GPU with the real kernels.
"""

import io

import pytest
import torch
import torch.nn as nn

import thunderkittens as tk
from kernel_required import require_kernel, skip_unless_gpu_for
from reference import lower_right_bias


class Attention(nn.Module):
    """Self-attention over a fused QKV projection, (B, L, 3 * H * D) viewed as q, k, v."""

    def __init__(self, heads, head_dim, attn_mask=None, is_causal=False):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.attn_mask, self.is_causal = attn_mask, is_causal

    def forward(self, qkv):
        b, l, _ = qkv.shape
        q, k, v = qkv.view(b, l, 3, self.heads, self.head_dim).transpose(1, 3).unbind(2)
        return tk.attention(q, k, v, attn_mask=self.attn_mask, is_causal=self.is_causal)


class CrossAttention(nn.Module):
    def __init__(self, attn_mask=None):
        super().__init__()
        self.attn_mask = attn_mask

    def forward(self, q, k, v):
        return tk.attention(q, k, v, attn_mask=self.attn_mask, enable_gqa=True)


class Projection(nn.Module):
    def forward(self, x, w):
        return tk.matmul(x, w.mT)


def ops_in(program):
    return {str(node.target) for node in program.graph.nodes if node.op == "call_function"}


def export_and_check(module, args, expected_op):
    """Exports ``module``, checks the graph calls ``expected_op`` (a substring), and that the
    exported program and its save/load round trip give eager's answer bit for bit."""
    eager = module(*args)
    program = torch.export.export(module, args)
    assert any(expected_op in op for op in ops_in(program)), ops_in(program)
    assert torch.equal(program.module()(*args), eager)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    assert torch.equal(torch.export.load(buffer).module()(*args), eager)
    return eager


def attention_cases(device):
    qkv = torch.randn(2, 33, 3 * 4 * 64, device=device, dtype=torch.bfloat16)
    q = torch.randn(2, 8, 40, 128, device=device, dtype=torch.float16)
    k, v = (torch.randn(2, 2, 17, 128, device=device, dtype=torch.float16) for _ in range(2))
    return {
        "fused qkv causal": (Attention(4, 64, is_causal=True), (qkv,)),
        "lower-right Lq > Lk gqa": (CrossAttention(lower_right_bias(40, 17)), (q, k, v)),
    }


# ---- CPU, through the stand-ins ------------------------------------------------------------------

@pytest.mark.parametrize("case", ["fused qkv causal", "lower-right Lq > Lk gqa"])
def test_export_attention_stand_in(cpu_kernel, case):
    module, args = attention_cases("cpu")[case]
    out = export_and_check(module, args, "tk.attention_fwd_sm90")
    if case.startswith("lower-right"):
        assert torch.all(out[:, :, :23] == 0)


def test_export_attention_fallback_on_cpu():
    module, args = attention_cases("cpu")["lower-right Lq > Lk gqa"]
    args = tuple(t.float() for t in args)
    out = export_and_check(module, args, "scaled_dot_product_attention")
    assert torch.all(out[:, :, :23] == 0)


def test_export_matmul_stand_in(cpu_matmul):
    x, w = torch.randn(4, 64, 128, dtype=torch.bfloat16), torch.randn(96, 128, dtype=torch.bfloat16)
    export_and_check(Projection(), (x, w), "tk.matmul")


# ---- GPU, the real kernels ---------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("family", ["sm90", "sm80"])
@pytest.mark.parametrize("case", ["fused qkv causal", "lower-right Lq > Lk gqa"])
def test_export_attention_gpu(family, case):
    skip_unless_gpu_for("attention", family)
    module, args = attention_cases("cuda")[case]
    with tk.use_kernel(family), torch.no_grad():
        require_kernel(tk.explain(*(args if len(args) == 3 else module_qkv(module, args)),
                                  attn_mask=module.attn_mask, is_causal=getattr(module, "is_causal", False),
                                  enable_gqa=len(args) == 3),
                       "attention", family)
        out = export_and_check(module, args, f"tk.attention_fwd_{family}")
    if case.startswith("lower-right"):
        assert torch.all(out[:, :, :23] == 0)


def module_qkv(module, args):
    (qkv,) = args
    b, l, _ = qkv.shape
    return qkv.view(b, l, 3, module.heads, module.head_dim).transpose(1, 3).unbind(2)


@pytest.mark.gpu
def test_export_matmul_gpu():
    skip_unless_gpu_for("matmul", "sm90")
    x = torch.randn(4, 64, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(96, 128, device="cuda", dtype=torch.bfloat16)
    require_kernel(tk.explain_matmul(x, w.mT), "matmul", "sm90")
    export_and_check(Projection(), (x, w), "tk.matmul")
