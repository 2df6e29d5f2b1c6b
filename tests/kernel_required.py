"""Which GPUs each kernel family is for, and the GPU tests' rule: they skip only without a GPU
or on a GPU the family is not for; on a GPU it is for, ``explain`` naming no kernel is a FAILURE
(a build without code for this GPU, a family left out of the build, or a path-choice regression
would otherwise turn thousands of tests into skips and still exit 0)."""

import pytest
import torch

import thunderkittens as tk

# (op, family) -> (which GPUs, in words; the rule on the compute capability): the support tables
# of docs/api.md.
FAMILY_GPUS = {
    ("attention", "sm90"): ("an sm_90 GPU (H100 / H200)", lambda capability: capability == (9, 0)),
    ("attention", "sm80"): ("an sm_80 or newer GPU", lambda capability: capability >= (8, 0)),
    ("attention", "decode"): ("an sm_80 or newer GPU", lambda capability: capability >= (8, 0)),
    ("matmul", "sm90"): ("an sm_90 GPU (H100 / H200)", lambda capability: capability == (9, 0)),
}


def gpu_is_for(op: str, family: str) -> bool:
    """Whether there is a GPU and the family is for it."""
    if not torch.cuda.is_available():
        return False
    return FAMILY_GPUS[(op, family)][1](tuple(torch.cuda.get_device_capability()))


def skip_unless_gpu_for(op: str, family: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    what, rule = FAMILY_GPUS[(op, family)]
    capability = tuple(torch.cuda.get_device_capability())
    if not rule(capability):
        pytest.skip(f"the {op} {family} kernels run on {what}; this GPU is "
                    f"sm_{capability[0]}{capability[1]}")


def require_kernel(plan, op: str, family: str) -> None:
    """Fails the test unless ``plan`` (explain's answer on a GPU the family is for) is a kernel."""
    if not plan.uses_kernel:
        pytest.fail(f"this GPU should run the {op} {family} kernel, but explain says: {plan} "
                    f"({tk.build_summary()})", pytrace=False)
