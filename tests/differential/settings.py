"""Hypothesis profiles of the differential suite and its one fixed seed.

A profile fixes how many cases each property runs and how large they may be. ``cpu`` is the
short profile of the CPU suite (well under a minute), ``gpu`` the long one of the GPU check
(thousands of cases, a few minutes on one H100), ``smoke`` a tenth of ``gpu`` for trying a
change. TK_FUZZ_PROFILE names the GPU suite's profile (default ``gpu``), TK_FUZZ_CPU_PROFILE the
CPU suite's (default ``cpu``), TK_FUZZ_SEED the seed. Every run is reproducible: a fixed seed, no example database (nothing is written to the
repository), no deadline; a failure is shrunk to a minimal example, which hypothesis prints.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from hypothesis import HealthCheck, Verbosity, settings
from hypothesis.configuration import set_hypothesis_home_dir

SEED = int(os.environ.get("TK_FUZZ_SEED", "45"))

# Hypothesis keeps a cache (.hypothesis/) in the working directory even without an example
# database; keep it out of the repository.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "thunderkittens-hypothesis"))


@dataclass(frozen=True)
class Profile:
    name: str
    examples: dict[str, int]   # property -> number of cases
    max_len: int               # longest sequence of an attention case
    attention_work: int        # bound on batch * heads * Lq * Lk * head_dim of one case
    max_matrix: int            # largest M, N or K of a matmul case
    matmul_work: int           # bound on batch * M * N * K of one case

    def examples_for(self, prop: str) -> int:
        return self.examples[prop]


_GPU_EXAMPLES = {
    "attention": 1500,
    "attention_misaligned": 400,
    "attention_no_key_rows": 300,
    "attention_dropout": 50,
    "matmul": 1200,
    # CPU-only properties, when run with this profile by hand (python -m differential)
    "attention_validation": 100, "attention_fake": 100, "attention_compile": 10,
    "matmul_validation": 100, "matmul_fake": 100, "matmul_compile": 10,
}

PROFILES = {
    "cpu": Profile(
        name="cpu",
        examples={
            "attention": 120, "attention_misaligned": 40, "attention_no_key_rows": 40,
            "attention_dropout": 15, "attention_validation": 60, "attention_fake": 40,
            "attention_compile": 5,
            "matmul": 150, "matmul_validation": 40, "matmul_fake": 40, "matmul_compile": 5,
        },
        max_len=80, attention_work=200_000, max_matrix=80, matmul_work=200_000),
    "gpu": Profile(name="gpu", examples=_GPU_EXAMPLES, max_len=2100,
                   attention_work=300_000_000, max_matrix=2100, matmul_work=2_000_000_000),
    "smoke": Profile(name="smoke", examples={k: max(5, v // 10) for k, v in _GPU_EXAMPLES.items()},
                     max_len=2100, attention_work=300_000_000, max_matrix=2100,
                     matmul_work=2_000_000_000),
}


def profile_named(variable: str, default: str) -> Profile:
    """The profile the environment variable ``variable`` names, else ``default``."""
    name = os.environ.get(variable, "") or default
    if name not in PROFILES:
        raise ValueError(f"{variable} must be one of {sorted(PROFILES)}, got {name!r}")
    return PROFILES[name]


def hypothesis_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        database=None,                 # no .hypothesis directory, nothing replayed from disk
        derandomize=False,             # the seed is SEED (runner applies @seed)
        deadline=None,                 # first calls compile and allocate: timing is no signal
        print_blob=True,               # a failure also prints @reproduce_failure(...)
        suppress_health_check=list(HealthCheck),  # sizes and budgets are chosen on purpose
        verbosity=Verbosity.normal,
        report_multiple_bugs=True,
    )
