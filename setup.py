"""Build script for the one extension, ``thunderkittens._C``.

Install with ``pip install --no-build-isolation .`` (or ``-e .``) so the extension is compiled
against the torch that is already installed; a build-isolated install compiles against whatever
torch pip downloads into the isolated environment, which is how undefined-symbol import errors
happen.

A full build compiles every kernel for three GPU targets and takes a few minutes on a
two-core machine; TK_CUDA_ARCHS (one target, e.g. "90a") and TK_OPS (one op family) shorten it.

Environment knobs (all optional):

  TK_CUDA_ARCHS      GPU targets, e.g. "80;89;90a" (the default) or "90a". Entries: 80, 8.0,
                     sm_80, 90a, 9.0a; "+PTX" also embeds PTX for newer GPUs. When unset,
                     TORCH_CUDA_ARCH_LIST (numeric entries only) is honoured instead.
  TK_OPS             comma list of op families (folders under csrc/) to compile, default all
                     ("none": only the op schemas, every op reports it was not compiled).
  TK_PTXAS_VERBOSE   1 adds "-Xptxas -v" (registers, spills, shared memory per kernel).
  MAX_JOBS           parallel compile jobs (read by torch's ninja build).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from setuptools import setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
PACKAGE_DIR = ROOT / "python" / "thunderkittens"
DEFAULT_ARCHS = "80;89;90a"
MIN_ARCH = 80  # every kernel family needs at least mma.sync bf16 + cp.async (sm_80)


# ---------------------------------------------------------------------------------------------
# GPU targets
# ---------------------------------------------------------------------------------------------

def _parse_arch(entry: str, source: str) -> tuple[str, bool]:
    """'8.0', '80', 'sm_80', '90a', '9.0a+PTX' -> ('80', False), ('90a', True) ..."""
    text = entry.strip()
    ptx = False
    if text.upper().endswith("+PTX"):
        ptx, text = True, text[:-4]
    text = text.lower().removeprefix("sm_").removeprefix("compute_")
    match = re.fullmatch(r"(\d+)\.?(\d)([af]?)", text)
    if not match:
        raise SystemExit(
            f"{source}: cannot read GPU target {entry!r}; use numbers like 80, 8.0, 90a or 9.0a "
            "(named targets such as 'Ampere' are not accepted here)")
    major, minor, suffix = match.groups()
    arch = f"{major}{minor}{suffix}"
    if int(major + minor) < MIN_ARCH:
        raise SystemExit(f"{source}: {entry!r} is older than sm_80; the kernels need sm_80 or newer")
    if ptx and suffix:
        # Arch-specific targets (90a) cannot be carried forward as PTX: the JIT refuses them.
        raise SystemExit(f"{source}: {entry!r}: +PTX is not allowed on an arch-specific target")
    return arch, ptx


def cuda_targets() -> tuple[list[str], list[str]]:
    """Return (names, nvcc gencode flags). Names look like '80', '90a', '80+PTX'."""
    if os.environ.get("TK_CUDA_ARCHS", "").strip():
        raw, source = os.environ["TK_CUDA_ARCHS"], "TK_CUDA_ARCHS"
    elif os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip():
        raw, source = os.environ["TORCH_CUDA_ARCH_LIST"], "TORCH_CUDA_ARCH_LIST"
    else:
        raw, source = DEFAULT_ARCHS, "default"
    names, flags = [], []
    for entry in re.split(r"[;,\s]+", raw.strip()):
        if not entry:
            continue
        arch, ptx = _parse_arch(entry, source)
        name = arch + ("+PTX" if ptx else "")
        if name in names:
            continue
        names.append(name)
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    if not names:
        raise SystemExit(f"{source} is empty")
    return names, flags


# ---------------------------------------------------------------------------------------------
# Op families (one folder per family under csrc/)
# ---------------------------------------------------------------------------------------------

def available_families() -> list[str]:
    return sorted(p.name for p in CSRC.iterdir()
                  if p.is_dir() and (any(p.rglob("*.cu")) or any(p.rglob("*.cpp"))))


def selected_families() -> list[str]:
    available = available_families()
    raw = os.environ.get("TK_OPS", "").strip()
    if not raw or raw.lower() == "all":
        return available
    if raw.lower() == "none":  # registration only: every op raises "not compiled into this build"
        return []
    wanted = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        raise SystemExit(f"TK_OPS: unknown op families {unknown}; available: {available}")
    return [name for name in available if name in wanted]


def sources(families: list[str]) -> list[str]:
    # Files directly in csrc/ (registration, Python module) are always built; family folders
    # only when selected.
    found = sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.cu"))
    for family in families:
        found += sorted((CSRC / family).rglob("*.cpp")) + sorted((CSRC / family).rglob("*.cu"))
    return [str(path.relative_to(ROOT)) for path in found]


# ---------------------------------------------------------------------------------------------
# Build record
# ---------------------------------------------------------------------------------------------

def nvcc_version() -> str:
    if not CUDA_HOME:
        return "not found"
    try:
        out = subprocess.check_output([os.path.join(CUDA_HOME, "bin", "nvcc"), "--version"],
                                      text=True)
    except (OSError, subprocess.CalledProcessError):
        return "not found"
    match = re.search(r"release ([\d.]+), (V[\d.]+)", out)
    return f"{match.group(1)} ({match.group(2)})" if match else out.strip().splitlines()[-1]


def write_build_info(archs: list[str], families: list[str], targets: list[Path]) -> None:
    # Read by thunderkittens/_extension.py so that a failed import of _C can say what was built.
    # Written only when the extension is really compiled (not by `setup.py --version` & co).
    record = {
        "CUDA_ARCHS": archs,
        "OPS": families,
        "TORCH_VERSION": torch.__version__,
        "TORCH_CUDA_VERSION": torch.version.cuda,
        "NVCC_VERSION": nvcc_version(),
        "CUDA_HOME": CUDA_HOME,
        "BUILT_AT": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    lines = ['"""Written by setup.py at build time; do not edit, not tracked by git."""', ""]
    lines += [f"{key} = {value!r}" for key, value in record.items()]
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------
# Extension
# ---------------------------------------------------------------------------------------------

ARCHS, GENCODE_FLAGS = cuda_targets()
FAMILIES = selected_families()


def extension(archs: list[str], gencode_flags: list[str], families: list[str]) -> CUDAExtension:
    # Compiled into registration.cpp / python_module.cpp only (host flags), so changing them
    # does not recompile the kernels.
    build_defines = [f'-DTK_BUILD_ARCHS="{",".join(archs)}"',
                     f'-DTK_BUILD_OPS="{",".join(families)}"',
                     f'-DTK_BUILD_TORCH="{torch.__version__}"',
                     f'-DTK_BUILD_TORCH_CUDA="{torch.version.cuda}"']
    build_defines += [f"-DTK_HAS_{family.upper()}=1" for family in families]

    # C++20 for host files too: newer torch headers (ATen) require it.
    cxx_flags = ["-O3", "-std=c++20", "-DNDEBUG"] + build_defines
    nvcc_flags = [
        "-O3", "-std=c++20", "-DNDEBUG",
        "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math", "-lineinfo",
        # torch's defaults hide the __half/__nv_bfloat16 operators and conversions; our kernel
        # files never include torch headers, so they can have them back.
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
    ]
    # Our -gencode flags contain "arch", which makes torch's _get_cuda_arch_flags() add nothing
    # of its own (it returns [] as soon as a user flag mentions "arch").
    nvcc_flags += gencode_flags
    if os.environ.get("TK_PTXAS_VERBOSE", "0").strip().lower() in ("1", "true", "yes", "on"):
        nvcc_flags += ["-Xptxas", "-v"]

    print(f"thunderkittens: CUDA targets {archs}, op families {families}, "
          f"torch {torch.__version__} (CUDA {torch.version.cuda}), nvcc {nvcc_version()}")
    return CUDAExtension(
        name="thunderkittens._C",
        sources=sources(families),
        include_dirs=[str(ROOT), str(CSRC)],
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
    )


class BuildExtensionInTree(BuildExtension):
    """torch's BuildExtension with a persistent object directory.

    pip's editable installs compile in a fresh temporary directory each time, which throws away
    ninja's incremental state; keeping objects under build/ means a rebuild after editing one
    kernel recompiles only that file (ninja also rebuilds anything whose command line changed).
    """

    def finalize_options(self) -> None:
        super().finalize_options()
        tag = f"py{sys.version_info.major}{sys.version_info.minor}"
        self.build_temp = str(ROOT / "build" / f"temp.{tag}")

    def run(self) -> None:
        # The source tree copy serves editable/in-place builds; the build_lib copy goes into
        # wheels (build_py has already copied the package there by now).
        targets = [PACKAGE_DIR / "_build_info.py"]
        if not self.inplace:
            targets.append(Path(self.build_lib) / "thunderkittens" / "_build_info.py")
        write_build_info(ARCHS, FAMILIES, targets)
        super().run()


setup(
    ext_modules=[extension(ARCHS, GENCODE_FLAGS, FAMILIES)],
    cmdclass={"build_ext": BuildExtensionInTree.with_options(use_ninja=True)},
)
