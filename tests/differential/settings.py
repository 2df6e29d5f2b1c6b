"""Hypothesis profiles of the differential suite and its one fixed seed.

A profile fixes how many cases each property runs, in how many shards, and how large they may
be. ``cpu`` is the short profile of the CPU suite (well under a minute), ``gpu`` the long one of
the GPU check (about 4,500 cases in 42 shards, run in parallel by the test workers: most cases
small, a tenth up to the long lengths), ``smoke`` a tenth of ``gpu`` in one shard per property
for trying a change, ``sanitize`` a small sample for compute-sanitizer. TK_FUZZ_PROFILE names the GPU suite's profile (default ``gpu``),
TK_FUZZ_CPU_PROFILE the CPU suite's (default ``cpu``), TK_FUZZ_SEED the seed. Every run is
reproducible: a fixed seed (shard i of a property draws from seed SEED + i * SHARD_SEED_STEP),
no example database (nothing is written to the repository), no deadline; a failure is shrunk
to a minimal example, which hypothesis prints (within SHRINK_BUDGET_S seconds of the first
failure; then the smallest failing example found so far is reported).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from hypothesis import HealthCheck, Verbosity, settings
from hypothesis.configuration import set_hypothesis_home_dir

SEED = int(os.environ.get("TK_FUZZ_SEED", "45"))
SHARD_SEED_STEP = 1_000_003
SHRINK_BUDGET_S = float(os.environ.get("TK_FUZZ_SHRINK_S", "60"))

# Hypothesis keeps a cache (.hypothesis/) in the working directory even without an example
# database; keep it out of the repository.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "thunderkittens-hypothesis"))


@dataclass(frozen=True)
class Sizes:
    max_len: int               # longest sequence of an attention case
    attention_work: int        # bound on batch * heads * Lq * Lk * head_dim of one case
    max_matrix: int            # largest M, N or K of a matmul case
    matmul_work: int           # bound on batch * M * N * K of one case


@dataclass(frozen=True)
class Profile:
    name: str
    examples: dict[str, int]   # property -> number of cases
    small: Sizes               # most cases
    large: Sizes               # large_percent of the cases
    large_percent: int = 0
    shards: dict[str, int] | None = None  # property -> shards (default 1)

    def examples_for(self, prop: str) -> int:
        return self.examples[prop]

    def shards_for(self, prop: str) -> int:
        return (self.shards or {}).get(prop, 1)

    def shard_examples(self, prop: str, shard: int) -> int:
        """Cases of shard ``shard`` (0-based): the property's cases split as evenly as can be."""
        total, shards = self.examples_for(prop), self.shards_for(prop)
        return total // shards + (1 if shard < total % shards else 0)


def shard_seed(shard: int) -> int:
    return SEED + shard * SHARD_SEED_STEP


_CPU_SIZES = Sizes(max_len=80, attention_work=200_000, max_matrix=80, matmul_work=200_000)
_SANITIZE_SIZES = Sizes(max_len=200, attention_work=4_000_000, max_matrix=200, matmul_work=4_000_000)
_GPU_SMALL = Sizes(max_len=300, attention_work=20_000_000, max_matrix=320, matmul_work=30_000_000)
_GPU_LARGE = Sizes(max_len=2100, attention_work=300_000_000, max_matrix=2100,
                   matmul_work=2_000_000_000)

_GPU_EXAMPLES = {
    "attention": 1600,
    "attention_misaligned": 400,
    "attention_no_key_rows": 300,
    "attention_dropout": 60,
    "matmul": 1200,
    # CPU-only properties, when run with this profile by hand (python -m differential)
    "attention_validation": 100, "attention_fake": 100, "attention_compile": 10,
    "matmul_validation": 100, "matmul_fake": 100, "matmul_compile": 10,
    "based": 400,
    "based_step": 200,
    "fftconv": 400,
}
_GPU_SHARDS = {"attention": 16, "attention_misaligned": 4, "attention_no_key_rows": 3,
               "attention_dropout": 1, "matmul": 8, "based": 4, "based_step": 2, "fftconv": 4}

PROFILES = {
    "cpu": Profile(
        name="cpu",
        examples={
            "attention": 120, "attention_misaligned": 40, "attention_no_key_rows": 40,
            "attention_dropout": 15, "attention_validation": 60, "attention_fake": 40,
            "attention_compile": 5,
            "matmul": 150, "matmul_validation": 40, "matmul_fake": 40, "matmul_compile": 5,
            "based": 30, "based_step": 30, "fftconv": 30,
        },
        small=_CPU_SIZES, large=_CPU_SIZES),
    "gpu": Profile(name="gpu", examples=_GPU_EXAMPLES, small=_GPU_SMALL, large=_GPU_LARGE,
                   large_percent=10, shards=_GPU_SHARDS),
    "smoke": Profile(name="smoke", examples={k: max(5, v // 10) for k, v in _GPU_EXAMPLES.items()},
                     small=_GPU_SMALL, large=_GPU_LARGE, large_percent=10),
    # A sample small enough for compute-sanitizer (tools/sanitize_differential.py), which slows
    # kernels down by orders of magnitude.
    "sanitize": Profile(name="sanitize",
                        examples={"attention": 60, "attention_misaligned": 20,
                                  "attention_no_key_rows": 20, "matmul": 30,
                                  "based": 8, "based_step": 8, "fftconv": 8},
                        small=_SANITIZE_SIZES, large=_SANITIZE_SIZES),
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
