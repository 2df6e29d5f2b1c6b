"""Loads the compiled extension and answers what it was built with.

Importing ``thunderkittens._C`` loads the shared library whose static initialisers register the
``torch.ops.tk.*`` ops. If that fails (not built, built against another torch, CUDA runtime
missing), the ImportError says what was built, for which torch, and how to rebuild.
"""

from __future__ import annotations

import re
import warnings

import torch

REBUILD_HINT = ("rebuild against the installed torch with: pip install --no-build-isolation . "
                "(or: pip install --no-build-isolation -e . in a development checkout)")


def describe_build_record() -> str:
    """One line from _build_info.py (written by setup.py), or why there is none."""
    try:
        from . import _build_info as info
    except ImportError:
        return ("there is no build record (python/thunderkittens/_build_info.py, written by "
                "setup.py): this looks like a source tree that was never built")
    return (f"built {info.BUILT_AT} for CUDA targets {','.join(info.CUDA_ARCHS)} with op "
            f"families {','.join(info.OPS) or '(none)'}, against torch {info.TORCH_VERSION} "
            f"(CUDA {info.TORCH_CUDA_VERSION}) using nvcc {info.NVCC_VERSION}")


def _load_extension():
    try:
        from . import _C
    except (ImportError, OSError) as error:
        raise ImportError(
            f"thunderkittens: cannot load the compiled extension thunderkittens._C: {error}\n"
            f"  this install: {describe_build_record()}\n"
            f"  running: torch {torch.__version__} (CUDA {torch.version.cuda})\n"
            f"  fix: {REBUILD_HINT}") from error
    if _C.torch_version and _C.torch_version != torch.__version__:
        # It loaded, so the symbols resolved; but the C++ ABI of another torch release may still
        # differ in ways the loader cannot see.
        warnings.warn(
            f"thunderkittens._C was built against torch {_C.torch_version} but torch "
            f"{torch.__version__} is running; {REBUILD_HINT}", RuntimeWarning, stacklevel=3)
    return _C


_C = _load_extension()

#: Op families compiled into this build (folders of csrc/, chosen by TK_OPS at build time).
BUILT_OPS: frozenset[str] = frozenset(name for name in _C.ops.split(",") if name)

#: CUDA targets compiled into this build, as written at build time: "80", "90a", "80+PTX".
BUILT_ARCHS: tuple[str, ...] = tuple(name for name in _C.cuda_archs.split(",") if name)


def _parse_target(name: str) -> tuple[int, int, str, bool]:
    ptx = name.endswith("+PTX")
    match = re.fullmatch(r"(\d+)(\d)([af]?)", name.removesuffix("+PTX"))
    if match is None:
        raise RuntimeError(f"thunderkittens._C reports an unreadable CUDA target {name!r}")
    return int(match.group(1)), int(match.group(2)), match.group(3), ptx


# Parsed once here, so the per-call check below is plain tuple arithmetic (cheap, and traceable
# by torch.compile).
_TARGETS = tuple(_parse_target(name) for name in BUILT_ARCHS)


def has_kernel_image_for(capability: tuple[int, int]) -> bool:
    """Whether the compiled code can run on a GPU of this compute capability.

    Real machine code (sm_XY) runs on the same major version with an equal or higher minor;
    arch-specific code (sm_90a) only on exactly that GPU; PTX (+PTX) is JIT-compiled for any
    newer GPU.
    """
    for major, minor, suffix, ptx in _TARGETS:
        if suffix == "a":
            if (major, minor) == capability:
                return True
        elif major == capability[0] and minor <= capability[1]:
            return True
        elif ptx and (major, minor) <= capability:
            return True
    return False


def has_arch_specific_code_for(capability: tuple[int, int]) -> bool:
    """Whether the build holds arch-specific machine code (sm_XYa) for exactly this GPU.

    Kernels that use wgmma, TMA multicast or setmaxnreg (the Hopper kernels) exist only in such
    code: a plain sm_90 target or PTX cannot express those instructions, so
    has_kernel_image_for() is not enough for them.
    """
    # A plain loop, like has_kernel_image_for: torch 2.11's dynamo failed to trace any() over
    # a generator here (NotImplementedError guarding a constant source under torch.compile).
    for major, minor, suffix, _ptx in _TARGETS:
        if suffix == "a" and (major, minor) == capability:
            return True
    return False


#: The head dims (E == Ev) each attention kernel family is built for ({family name: head dims}),
#: as the C++ side instantiates its kernels: the one place that lists them.
ATTENTION_HEAD_DIMS: dict[str, tuple[int, ...]] = {
    family: tuple(int(dim) for dim in dims) for family, dims in _C.attention_head_dims.items()}


#: {fft_size: (bytes, bytes with a pregate, bytes of the filter gradient, the sm90 forward's bytes,
#: its bytes with a pregate)}: the shared memory each FFT-conv kernel needs per block, as the C++
#: side sizes it (empty when the fftconv family was not built).
FFTCONV_SHARED_BYTES: dict[int, tuple[int, int, int, int, int]] = {
    int(size): tuple(int(b) for b in sizes) for size, sizes in _C.fftconv_shared_bytes.items()}


def build_summary() -> str:
    """One line saying what this build of the extension holds: its CUDA targets, the op
    families compiled in, and the torch (and CUDA) it was built against."""
    return (f"thunderkittens._C: CUDA targets {','.join(BUILT_ARCHS)}; op families "
            f"{','.join(sorted(BUILT_OPS)) or '(none)'}; built against torch {_C.torch_version} "
            f"(CUDA {_C.torch_cuda_version})")
