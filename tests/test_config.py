"""Kernel-family forcing (TK_ATTENTION_KERNEL / tk.use_kernel) parses and validates."""

import pytest
import torch

import thunderkittens as tk


def test_default_is_auto():
    assert tk.kernel_choice("attention") == "auto"


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("sm80", "sm80"), (" SM80 ", "sm80"),
                                             ("", "auto")])
def test_env_var(monkeypatch, value, expected):
    monkeypatch.setenv("TK_ATTENTION_KERNEL", value)
    assert tk.kernel_choice("attention") == expected


@pytest.mark.parametrize("value", ["sm100", "fast", "sm_80", "1"])
def test_env_var_bad_value(monkeypatch, value):
    monkeypatch.setenv("TK_ATTENTION_KERNEL", value)
    with pytest.raises(ValueError, match=r"TK_ATTENTION_KERNEL: kernel must be one of \['auto', 'sm90', 'sm80', 'decode'\]"):
        tk.kernel_choice("attention")


def test_env_var_bad_value_reaches_the_caller(monkeypatch, cpu_kernel):
    monkeypatch.setenv("TK_ATTENTION_KERNEL", "sm100")
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="TK_ATTENTION_KERNEL"):
        tk.attention(q, q, q)


def test_context_manager_nests_and_restores(monkeypatch):
    monkeypatch.setenv("TK_ATTENTION_KERNEL", "sm80")
    with tk.use_kernel("auto"):
        assert tk.kernel_choice("attention") == "auto"  # the context manager wins over the env
        with tk.use_kernel("SM80"):
            assert tk.kernel_choice("attention") == "sm80"
        assert tk.kernel_choice("attention") == "auto"
    assert tk.kernel_choice("attention") == "sm80"


def test_context_manager_restores_after_exception():
    with pytest.raises(RuntimeError):
        with tk.use_kernel("sm80"):
            raise RuntimeError("boom")
    assert tk.kernel_choice("attention") == "auto"


@pytest.mark.parametrize("value", ["sm100", "", None, 80])
def test_context_manager_bad_value(value):
    with pytest.raises(ValueError, match=r"use_kernel: kernel must be one of \['auto', 'sm90', 'sm80', 'decode'\]"):
        with tk.use_kernel(value):
            pass


def test_context_manager_unknown_op():
    with pytest.raises(ValueError, match="unknown op 'matmul'"):
        with tk.use_kernel("sm80", op="matmul"):
            pass


def test_forced_kernel_shows_in_explain(cpu_kernel):
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    with tk.use_kernel("sm80"):
        assert tk.explain(q, q, q).kernel == "sm80"
