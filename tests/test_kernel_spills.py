"""The built kernels keep local memory (spills) out of their tensor-core loops.

Reads the SASS of the installed extension (cuobjdump, from the CUDA toolkit) and checks, with
tools/sass_loops.py, that no local load or store sits in an innermost loop that issues HGMMA
or HMMA. Spills elsewhere (the 24-register producer warpgroup, per-task setup) are allowed:
ptxas counts them, but they do not run per step. Needs no GPU; skips without cuobjdump (the CPU
CI machine has nvcc only).

One known exception: the mma.sync forward compiled for sm_90a (Hopper runs it only when forced
with use_kernel("sm80")) has one or two local loads in its non-causal loop; the same kernel
compiled for its own targets (sm_80, sm_86, sm_89) is checked.
"""

import os
import shutil
import subprocess

import pytest

from test_sass_loops import sass_loops  # noqa: F401  (the fixture: tools/sass_loops.py, imported)


def find_cuobjdump():
    if found := shutil.which("cuobjdump"):
        return found
    from torch.utils.cpp_extension import CUDA_HOME

    candidate = os.path.join(CUDA_HOME or "/usr/local/cuda", "bin", "cuobjdump")
    return candidate if os.access(candidate, os.X_OK) else None


def is_forced_only(traffic) -> bool:
    """The mma.sync forward (mangled `14forward_kernelI`, not `19forward_kernel_sm90I`) on sm_90a."""
    return traffic.arch.startswith("sm_90") and "14forward_kernelI" in traffic.name


@pytest.fixture(scope="module")
def sass():
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump (CUDA toolkit) not found")
    try:
        from thunderkittens import _C
    except ImportError as error:
        pytest.skip(f"thunderkittens._C not built: {error}")
    return subprocess.run([cuobjdump, "--dump-sass", _C.__file__], capture_output=True, text=True,
                          check=True).stdout


def test_the_extension_has_tensor_core_kernels(sass, sass_loops):
    # Guards the check below against reading nothing (an empty or unparsed listing).
    kernels = sass_loops.parse(sass)
    assert any(ins.base in sass_loops.TENSOR_CORE for kernel in kernels for ins in kernel.instructions)


def test_no_local_memory_in_tensor_core_loops(sass, sass_loops):
    offenders = [f"{traffic.arch} {traffic.name}: {traffic.hot} of {traffic.total} local loads/stores"
                 for traffic in sass_loops.report(sass) if traffic.hot and not is_forced_only(traffic)]
    assert not offenders, "local memory in tensor-core loops:\n" + "\n".join(offenders)
