"""The properties of the differential suite, each a hypothesis test over one strategy, and the
way a GPU test runs one in a fresh process.

    python -m differential PROPERTY [--profile gpu] [--max-examples N] [--device cuda|cpu]

(from the tests/ folder) runs one property in this process and prints one line
``TK_FUZZ_RESULT {json}``: whether it passed, how many cases went to each path, the seed and
the profile. A GPU test runs it in a fresh process because a kernel fault (an illegal or
misaligned address) poisons the process's CUDA context: every later CUDA call fails, so a fault
must cost one property, not the rest of the test session. After a fault every later case of the
property fails at once, with the case that faulted first in the message (hypothesis then
reports a "minimal" example that only shows the context was lost: read the message).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback

from hypothesis import given, seed

from . import attention, invalid, matmul
from .environment import Environment, PathCounts
from .settings import PROFILES, SEED, Profile, hypothesis_settings

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
                        counts: PathCounts):
    if name in ("attention", "attention_misaligned", "attention_no_key_rows", "attention_dropout"):
        strategy = attention.attention_cases(
            profile, env, misaligned=name == "attention_misaligned",
            no_key_rows=name == "attention_no_key_rows", dropout=name == "attention_dropout")
        return strategy, lambda case: attention.check_case(case, env, counts, stand_in=stand_in)
    if name == "attention_fake":
        return (attention.attention_cases(profile, env),
                lambda case: attention.check_fake(case, env, counts))
    if name == "attention_compile":
        def check(case):
            attention.check_case(case, env, counts, call_factory=attention.compiled_attention)
        return attention.attention_cases(profile, env), check
    if name == "matmul":
        return (matmul.matmul_cases(profile, env),
                lambda case: matmul.check_case(case, env, counts, stand_in=matmul_stand_in))
    if name == "matmul_fake":
        return matmul.matmul_cases(profile, env), lambda case: matmul.check_fake(case, env, counts)
    if name == "matmul_compile":
        def check(case):
            matmul.check_case(case, env, counts, call=matmul.compiled_matmul())
        return matmul.matmul_cases(profile, env), check
    raise ValueError(f"unknown property {name!r}; known: {sorted(PROPERTIES)}")


def run_property(name: str, profile: Profile, env: Environment, counts: PathCounts | None = None,
                 *, stand_in=None, matmul_stand_in=None, max_examples: int | None = None) -> PathCounts:
    """Runs property ``name`` (raises on the minimal failing example); returns the path counts.
    stand_in / matmul_stand_in: the cpu_kernel / cpu_matmul fixtures' stand-ins (their calls
    are checked against tk.explain)."""
    counts = counts if counts is not None else PathCounts(name)
    examples = max_examples or profile.examples_for(name)
    if name.endswith("_validation"):
        op = name.split("_")[0]
        mutations = invalid.mutations_of(op)
        for mutation in mutations:
            strategy = invalid.invalid_calls(op, mutation)
            _run_hypothesis(f"{name}_{mutation}", strategy,
                            lambda call: invalid.check_invalid(call, counts),
                            max(2, examples // len(mutations)))
        return counts
    strategy, check = _strategy_and_check(name, profile, env, stand_in, matmul_stand_in, counts)
    _run_hypothesis(name, strategy, check, examples)
    return counts


def _run_hypothesis(name: str, strategy, check, examples: int) -> None:
    @hypothesis_settings(examples)
    @seed(SEED)
    @given(strategy)
    def prop(case):
        _guarded(check, case)

    prop.__name__ = prop.__qualname__ = f"differential_{name}"
    prop()


# ---- fresh processes ---------------------------------------------------------------------------

def run_in_fresh_process(name: str, profile: str, *, timeout: float = 570.0,
                         max_examples: int | None = None, device: str = "cuda") -> dict:
    """Runs property ``name`` in a new Python process (see the module docstring); returns its
    result (dict: ok, counts, seed, profile, error) with "output": the process's output."""
    args = [sys.executable, "-m", "differential", name, "--profile", profile, "--device", device]
    if max_examples:
        args += ["--max-examples", str(max_examples)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS_DIR, _package_root(),
                                                                     os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(args, cwd=TESTS_DIR, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes) \
            else (expired.stdout or "")
        return {"ok": False, "counts": {}, "seed": SEED, "profile": profile, "output": output,
                "error": f"timed out after {timeout:.0f} s (a hang?)"}
    output = done.stdout + done.stderr
    for line in done.stdout.splitlines()[::-1]:
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
            result["output"] = output
            return result
    return {"ok": False, "counts": {}, "seed": SEED, "profile": profile, "output": output,
            "error": f"the process ended (exit status {done.returncode}) without a result"}


def _package_root() -> str:
    import thunderkittens
    return os.path.dirname(os.path.dirname(os.path.abspath(thunderkittens.__file__)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m differential")
    parser.add_argument("property", choices=sorted(PROPERTIES))
    parser.add_argument("--profile", default="gpu", choices=sorted(PROFILES))
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args(argv)
    env = Environment.cuda() if args.device == "cuda" else Environment.cpu()
    counts = PathCounts(args.property)
    ok, error = True, ""
    try:
        run_property(args.property, PROFILES[args.profile], env, counts,
                     max_examples=args.max_examples)
    except BaseException as exc:  # noqa: BLE001  (reported, with the traceback, to the parent)
        ok, error = False, "".join(traceback.format_exception(exc))
        print(error, file=sys.stderr)
    print(RESULT_TAG + json.dumps({"property": args.property, "ok": ok, "counts": dict(counts.counts),
                                   "seed": SEED, "profile": args.profile, "error": error[-4000:]}),
          flush=True)
    return 0 if ok else 1
