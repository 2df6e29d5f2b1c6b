"""Every bad-argument rule of tk.attention raises a clear ValueError/TypeError that names the
argument, from both attention() and explain(). CPU only: the checks never look at data."""

import math

import numpy as np
import pytest
import torch

import thunderkittens as tk


def qkv(q_shape=(2, 4, 8, 64), k_shape=None, v_shape=None, dtype=torch.float32, device="cpu"):
    k_shape = k_shape or q_shape
    v_shape = v_shape or k_shape
    return tuple(torch.randn(shape, dtype=dtype, device=device)
                 for shape in (q_shape, k_shape, v_shape))


def with_args(**overrides):
    """(args, kwargs) for a call on valid inputs with some arguments replaced."""
    q, k, v = qkv()
    args = {"query": q, "key": k, "value": v}
    kwargs = {}
    for name, value in overrides.items():
        (args if name in args else kwargs)[name] = value
    return (args["query"], args["key"], args["value"]), kwargs


def shaped(q_shape, k_shape=None, v_shape=None, dtypes=None, devices=None, **kwargs):
    q, k, v = qkv(q_shape, k_shape, v_shape)
    if dtypes:
        q, k, v = (t.to(d) for t, d in zip((q, k, v), dtypes))
    if devices:
        q, k, v = (t.to(d) for t, d in zip((q, k, v), devices))
    return (q, k, v), kwargs


CASES = {
    # types
    "query not a tensor": (with_args(query=[[1.0]]), TypeError, "query must be a torch.Tensor"),
    "key not a tensor": (with_args(key=None), TypeError, "key must be a torch.Tensor"),
    "value is numpy": (with_args(value=np.zeros((2, 4, 8, 64))), TypeError,
                       "value must be a torch.Tensor"),
    "attn_mask not a tensor": (with_args(attn_mask=[[True]]), TypeError,
                               "attn_mask must be a torch.Tensor or None"),
    "is_causal not bool": (with_args(is_causal=1), TypeError, "is_causal must be a bool"),
    "enable_gqa not bool": (with_args(enable_gqa="yes"), TypeError, "enable_gqa must be a bool"),
    "dropout_p not a number": (with_args(dropout_p="0.1"), TypeError, "dropout_p must be a float"),
    "dropout_p bool": (with_args(dropout_p=True), TypeError, "dropout_p must be a float"),
    "scale string": (with_args(scale="0.1"), TypeError, "scale must be a float or None"),
    "scale tensor": (with_args(scale=torch.tensor(0.1)), TypeError, "scale must be a float or None"),
    # values of the scalar arguments
    "dropout_p negative": (with_args(dropout_p=-0.1), ValueError, r"dropout_p must be in \[0, 1\]"),
    "dropout_p above 1": (with_args(dropout_p=1.5), ValueError, r"dropout_p must be in \[0, 1\]"),
    "dropout_p nan": (with_args(dropout_p=math.nan), ValueError, r"dropout_p must be in \[0, 1\]"),
    "scale nan": (with_args(scale=math.nan), ValueError, "scale must be a finite number"),
    "scale inf": (with_args(scale=math.inf), ValueError, "scale must be a finite number"),
    "scale -inf": (with_args(scale=-math.inf), ValueError, "scale must be a finite number"),
    "attn_mask with is_causal": (with_args(attn_mask=torch.ones(8, 8, dtype=torch.bool),
                                           is_causal=True),
                                 ValueError, "attn_mask must be None when is_causal=True"),
    # dtypes and devices
    "query integer": (shaped((2, 4, 8, 64), dtypes=(torch.int64,) * 3), TypeError,
                      "query must have a floating-point dtype"),
    "key complex": (shaped((2, 4, 8, 64), dtypes=(torch.float32, torch.complex64, torch.float32)),
                    TypeError, "key must have a floating-point dtype"),
    "value bool": (shaped((2, 4, 8, 64), dtypes=(torch.float32, torch.float32, torch.bool)),
                   TypeError, "value must have a floating-point dtype"),
    "mixed dtypes key": (shaped((2, 4, 8, 64), dtypes=(torch.float32, torch.float64, torch.float32)),
                         TypeError, "key dtype torch.float64 differs from query dtype torch.float32"),
    "mixed dtypes value": (shaped((2, 4, 8, 64), dtypes=(torch.bfloat16, torch.bfloat16,
                                                          torch.float16)),
                           TypeError, "value dtype torch.float16 differs from query dtype"),
    "mixed devices": (shaped((2, 4, 8, 64), devices=("cpu", "meta", "cpu")), ValueError,
                      "key is on meta but query is on cpu"),
    # shapes
    "query rank 2": (shaped((8, 64)), ValueError, "query must have at least 3 dims"),
    "key rank differs": (shaped((2, 4, 8, 64), (4, 8, 64)), ValueError,
                         "key has 3 dims but query has 4"),
    "value rank differs": (shaped((2, 4, 8, 64), (2, 4, 8, 64), (1, 2, 4, 8, 64)), ValueError,
                           "value has 5 dims but query has 4"),
    "query empty": (shaped((2, 4, 0, 64), (2, 4, 8, 64)), ValueError, "query is empty"),
    "key empty": (shaped((2, 4, 8, 64), (2, 4, 0, 64), (2, 4, 8, 64)), ValueError, "key is empty"),
    "value empty batch": (shaped((2, 4, 8, 64), (2, 4, 8, 64), (0, 4, 8, 64)), ValueError,
                          "value is empty"),
    "key batch differs": (shaped((2, 4, 8, 64), (3, 4, 8, 64)), ValueError,
                          r"key batch dims \(3,\) differ from query batch dims \(2,\)"),
    "value batch differs (rank 5)": (shaped((2, 3, 4, 8, 64), (2, 3, 4, 8, 64), (2, 1, 4, 8, 64)),
                                     ValueError, "value batch dims"),
    "key vs value heads": (shaped((2, 4, 8, 64), (2, 2, 8, 64), (2, 4, 8, 64), enable_gqa=True),
                           ValueError, "key has 2 heads but value has 4"),
    "heads differ without gqa": (shaped((2, 8, 8, 64), (2, 2, 8, 64)), ValueError,
                                 "query has 8 heads but key has 2; pass enable_gqa=True"),
    "gqa not divisible": (shaped((2, 6, 8, 64), (2, 4, 8, 64), enable_gqa=True), ValueError,
                          r"query heads \(6\) must be a multiple of key heads \(4\)"),
    "head dim q vs k": (shaped((2, 4, 8, 64), (2, 4, 8, 32), (2, 4, 8, 64)), ValueError,
                        "key head dim 32 differs from query head dim 64"),
    "key vs value length": (shaped((2, 4, 8, 64), (2, 4, 8, 64), (2, 4, 9, 64)), ValueError,
                            "value length 9 differs from key length 8"),
}


@pytest.mark.parametrize("function", [tk.attention, tk.explain], ids=["attention", "explain"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_argument_raises(function, case):
    (args, kwargs), error, message = CASES[case]
    with pytest.raises(error, match=message):
        function(*args, **kwargs)


def test_errors_mention_the_function():
    with pytest.raises(ValueError, match=r"^tk\.attention: "):
        tk.attention(*qkv((2, 4, 0, 64), (2, 4, 8, 64)))


@pytest.mark.parametrize("scale", [0.0, -0.5, 3, 1e-3])
def test_any_finite_scale_is_accepted(scale):
    q, k, v = qkv()
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
    torch.testing.assert_close(tk.attention(q, k, v, scale=scale), expected)


def test_valid_edge_cases_are_accepted():
    # dropout_p at both ends of its range, attn_mask without is_causal, GQA with equal heads.
    q, k, v = qkv()
    for kwargs in ({"dropout_p": 0.0}, {"dropout_p": 1.0}, {"attn_mask": torch.ones(8, 8).bool()},
                   {"enable_gqa": True}, {"is_causal": True}):
        assert tk.attention(q, k, v, **kwargs).shape == q.shape
