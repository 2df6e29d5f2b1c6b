"""The properties of the differential suite, each a hypothesis test over one strategy.

    python -m differential PROPERTY [--profile gpu] [--shard I/N] [--max-examples N] [--device cuda|cpu]

(from the tests/ folder) runs one property (or shard I of its N, 0-based) in this process and
prints one line ``TK_FUZZ_RESULT {json}``: whether it passed, how many cases went to each path,
the seed and the profile; the way to run a sample under compute-sanitizer. The GPU tests run
shards in their test worker's case server (differential.worker), which a kernel fault (an
illegal or misaligned address poisons the process's CUDA context: every later CUDA call fails)
ends, so the fault costs one shard. After a fault every later case of the shard fails at once,
with the case that faulted first in the message (hypothesis then reports a "minimal" example
that only shows the context was lost: read the message).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from hypothesis import example, given, seed

from . import attention, based, fftconv, invalid, matmul
from .environment import Environment, PathCounts
from .settings import PROFILES, SHRINK_BUDGET_S, Profile, hypothesis_settings, shard_seed

RESULT_TAG = "TK_FUZZ_RESULT "

# Properties and what each needs: "any" device, or "cpu" only (fake tensors, torch.compile with
# the CPU stand-ins, argument validation: none of them needs a GPU to say anything).
PROPERTIES = {
    "attention": "any",
    "attention_misaligned": "any",
    "attention_no_key_rows": "any",
    "attention_dropout": "any",
    "attention_fake": "cpu",
    "attention_compile": "cpu",
    "attention_validation": "cpu",
    "matmul": "any",
    "matmul_fake": "cpu",
    "matmul_compile": "cpu",
    "matmul_validation": "cpu",
    "based": "any",
    "based_step": "any",
    "fftconv": "any",
}

GPU_PROPERTIES = tuple(name for name, where in PROPERTIES.items() if where == "any")

_FAULTS = ("misaligned address", "illegal memory access", "illegal instruction",
           "unspecified launch failure", "device-side assert", "CUDA error")


class CudaContextLost(AssertionError):
    pass


_context_lost: str | None = None


def _guarded(check, case) -> None:
    """check(case), turning a CUDA fault into CudaContextLost that names the first faulting
    case (later cases cannot run in this process)."""
    global _context_lost
    if _context_lost is not None:
        raise CudaContextLost(f"the CUDA context was lost earlier, by {_context_lost}")
    try:
        check(case)
    except Exception as error:
        if any(text in str(error) for text in _FAULTS):
            _context_lost = f"{case!r}: {type(error).__name__}: {error}"
            raise CudaContextLost(f"CUDA fault (the context is lost) in {_context_lost}") from error
        raise


def _strategy_and_check(name: str, profile: Profile, env: Environment, stand_in, matmul_stand_in,
                        counts: PathCounts, op_stand_in=None):
    if name == "based":
        return (based.based_cases(profile, env),
                lambda case: based.check_case(case, env, counts, stand_in=op_stand_in),
                based.coverage_cases())
    if name == "based_step":
        return (based.step_cases(profile, env),
                lambda case: based.check_step(case, env, counts, stand_in=op_stand_in),
                based.step_coverage_cases())
    if name == "fftconv":
        return (fftconv.fftconv_cases(profile, env),
                lambda case: fftconv.check_case(case, env, counts, stand_in=op_stand_in),
                fftconv.coverage_cases())
    if name in ("attention", "attention_misaligned", "attention_no_key_rows", "attention_dropout"):
        kinds = dict(misaligned=name == "attention_misaligned",
                     no_key_rows=name == "attention_no_key_rows", dropout=name == "attention_dropout")
        strategy = attention.attention_cases(profile, env, **kinds)
        return (strategy, lambda case: attention.check_case(case, env, counts, stand_in=stand_in),
                attention.coverage_cases(**kinds))
    if name == "attention_fake":
        return (attention.attention_cases(profile, env),
                lambda case: attention.check_fake(case, env, counts), attention.coverage_cases())
    if name == "attention_compile":
        def check(case):
            attention.check_case(case, env, counts, call_factory=attention.compiled_attention)
        return attention.attention_cases(profile, env), check, ()
    if name == "matmul":
        return (matmul.matmul_cases(profile, env),
                lambda case: matmul.check_case(case, env, counts, stand_in=matmul_stand_in),
                matmul.coverage_cases())
    if name == "matmul_fake":
        return (matmul.matmul_cases(profile, env),
                lambda case: matmul.check_fake(case, env, counts), matmul.coverage_cases())
    if name == "matmul_compile":
        def check(case):
            matmul.check_case(case, env, counts, call=matmul.compiled_matmul())
        return matmul.matmul_cases(profile, env), check, ()
    raise ValueError(f"unknown property {name!r}; known: {sorted(PROPERTIES)}")


def run_property(name: str, profile: Profile, env: Environment, counts: PathCounts | None = None,
                 *, stand_in=None, matmul_stand_in=None, op_stand_in=None,
                 max_examples: int | None = None, shard: int | None = None) -> PathCounts:
    """Runs property ``name`` (raises on the minimal failing example); returns the path counts.
    shard: run only that shard of the profile's (its cases, from its seed); default all of
    them in one run from the seed of shard 0. stand_in / matmul_stand_in: the cpu_kernel /
    cpu_matmul fixtures' stand-ins (their calls are checked against tk.explain); op_stand_in:
    differential.standins' for the based, based_step and fftconv properties."""
    counts = counts if counts is not None else PathCounts(name)
    if shard is None:
        examples, case_seed = max_examples or profile.examples_for(name), shard_seed(0)
    else:
        examples, case_seed = max_examples or profile.shard_examples(name, shard), shard_seed(shard)
    if name.endswith("_validation"):
        op = name.split("_")[0]
        mutations = invalid.mutations_of(op)
        for mutation in mutations:
            strategy = invalid.invalid_calls(op, mutation)
            _run_hypothesis(f"{name}_{mutation}", strategy,
                            lambda call: invalid.check_invalid(call, counts),
                            max(2, examples // len(mutations)), case_seed)
        return counts
    strategy, check, explicit = _strategy_and_check(name, profile, env, stand_in, matmul_stand_in,
                                                    counts, op_stand_in)
    _run_hypothesis(name, strategy, check, examples, case_seed, explicit)
    return counts


def _run_hypothesis(name: str, strategy, check, examples: int, case_seed: int,
                    explicit=()) -> None:
    # Shrinking runs as long as it finds smaller failing cases; SHRINK_BUDGET_S seconds after the
    # first failure every case not seen failing passes, so shrinking stops and hypothesis
    # reports the smallest failing case found so far (replaying it fails again).
    failing: set = set()
    first_failure: list[float] = []

    @hypothesis_settings(examples)
    @seed(case_seed)
    @given(strategy)
    def prop(case):
        if first_failure and time.monotonic() - first_failure[0] > SHRINK_BUDGET_S \
                and repr(case) not in failing:
            return
        try:
            _guarded(check, case)
        except BaseException:
            failing.add(repr(case))
            if not first_failure:
                first_failure.append(time.monotonic())
            raise

    for case in explicit:  # run first, besides the random ones
        prop = example(case)(prop)
    prop.__name__ = prop.__qualname__ = f"differential_{name}"
    prop()


def result_line(prop: str, profile: str, counts: PathCounts, ok: bool, error: str = "",
                shard: int | None = None, shards: int | None = None) -> dict:
    """What a run of one property (or shard) reports."""
    return {"property": prop, "ok": ok, "counts": dict(counts.counts), "profile": profile,
            "seed": shard_seed(shard or 0), "shard": shard, "shards": shards, "error": error[-6000:]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m differential")
    parser.add_argument("property", choices=sorted(PROPERTIES))
    parser.add_argument("--profile", default="gpu", choices=sorted(PROFILES))
    parser.add_argument("--shard", default=None, help="I/N: shard I (0-based) of N")
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args(argv)
    env = Environment.cuda() if args.device == "cuda" else Environment.cpu()
    profile = PROFILES[args.profile]
    shard = shards = None
    if args.shard:
        shard, shards = (int(x) for x in args.shard.split("/"))
        if shards != profile.shards_for(args.property):
            parser.error(f"profile {profile.name} has {profile.shards_for(args.property)} shards "
                         f"of {args.property}")
    counts = PathCounts(args.property)
    ok, error = True, ""
    started = time.monotonic()
    try:
        run_property(args.property, profile, env, counts, max_examples=args.max_examples,
                     shard=shard)
    except BaseException as exc:  # noqa: BLE001  (reported, with the traceback)
        ok, error = False, "".join(traceback.format_exception(exc))
        print(error, file=sys.stderr)
    result = result_line(args.property, profile.name, counts, ok, error, shard, shards)
    result["seconds"] = round(time.monotonic() - started, 2)
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0 if ok else 1
