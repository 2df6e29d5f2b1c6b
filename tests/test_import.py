"""The package imports without a GPU, knows what it was built with, and explains a broken
extension instead of failing obscurely."""

import importlib.metadata
import sys
import types

import pytest
import torch

import thunderkittens as tk
from thunderkittens import _extension


def test_version_matches_metadata():
    try:
        installed = importlib.metadata.version("thunderkittens")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("thunderkittens is imported from a source tree, not installed: no metadata")
    assert tk.__version__ == installed


def test_ops_are_registered():
    schema = str(torch.ops.tk.attention_fwd_sm80.default._schema)
    assert schema == ("tk::attention_fwd_sm80(Tensor q, Tensor k, Tensor v, bool is_causal, "
                      "float scale, bool lower_right=False) -> (Tensor out, Tensor lse)")
    assert str(torch.ops.tk.matmul.default._schema) == "tk::matmul(Tensor a, Tensor b) -> Tensor"


def test_public_functions():
    assert tk.matmul.__module__ == "thunderkittens._matmul.api"
    assert {"matmul", "explain_matmul", "MatmulPlan"} <= set(tk.__all__)


def test_namespace_is_the_public_api():
    # dir(tk) holds the API and modules only (no `torch`), and __all__ names all of the API.
    api = {name for name in dir(tk)
           if not name.startswith("_") and not isinstance(getattr(tk, name), types.ModuleType)}
    assert api == set(tk.__all__) - {"__version__"}
    assert "torch" not in dir(tk)
    for name in tk.__all__:
        assert getattr(tk, name).__doc__ or name.isupper() or name == "__version__", name


def test_attention_head_dims_come_from_the_extension():
    from thunderkittens._attention import plan
    head_dims = _extension._C.attention_head_dims
    assert set(head_dims) == set(plan.BY_NAME)
    for family in plan.FAMILIES:
        assert family.head_dims == tuple(head_dims[family.name]) and family.head_dims, family.name


def test_build_facts():
    assert tk.BUILT_ARCHS, "the extension reports no CUDA targets"
    assert tk.BUILT_OPS <= {"attention", "based", "fftconv", "matmul"}
    summary = tk.build_summary()
    assert ",".join(tk.BUILT_ARCHS) in summary and torch.__version__ in summary


def test_build_record_matches_extension():
    from thunderkittens import _build_info
    assert list(_build_info.CUDA_ARCHS) == list(tk.BUILT_ARCHS)
    assert sorted(_build_info.OPS) == sorted(tk.BUILT_OPS)
    assert _build_info.TORCH_VERSION == torch.__version__
    assert _extension._C.torch_version == torch.__version__


def test_import_error_says_what_was_built_and_how_to_rebuild(monkeypatch):
    import thunderkittens
    monkeypatch.delattr(thunderkittens, "_C")
    monkeypatch.setitem(sys.modules, "thunderkittens._C", None)  # makes the import fail
    with pytest.raises(ImportError) as info:
        _extension._load_extension()
    message = str(info.value)
    assert "cannot load the compiled extension thunderkittens._C" in message
    assert "CUDA targets" in message and f"running: torch {torch.__version__}" in message
    assert "pip install --no-build-isolation ." in message


def test_import_error_without_build_record(monkeypatch):
    import thunderkittens
    monkeypatch.delattr(thunderkittens, "_build_info", raising=False)
    monkeypatch.setitem(sys.modules, "thunderkittens._build_info", None)
    assert "no build record" in _extension.describe_build_record()


@pytest.mark.parametrize("targets, capability, expected", [
    ((("80", "89", "90a")), (8, 0), True),
    ((("80", "89", "90a")), (8, 6), True),    # sm_80 code runs on sm_86
    ((("80", "89", "90a")), (9, 0), True),    # via 90a
    ((("80", "89", "90a")), (10, 0), False),  # no PTX, no sm_100 code
    ((("90a",)), (8, 0), False),
    ((("90a",)), (9, 0), True),
    ((("80",)), (9, 0), False),               # machine code does not cross major versions
    ((("80+PTX",)), (12, 0), True),           # PTX is JIT-compiled for newer GPUs
    ((("86",)), (8, 0), False),               # nor run on an older minor
    ((("100a",)), (10, 0), True),
])
def test_has_kernel_image_for(monkeypatch, targets, capability, expected):
    monkeypatch.setattr(_extension, "_TARGETS", tuple(_extension._parse_target(t) for t in targets))
    assert _extension.has_kernel_image_for(capability) is expected
