"""Fixed GPU cases run in fresh processes, so that a CUDA fault or a hang costs one case, not
the test session (a fault such as ``misaligned address`` poisons the process's CUDA context:
every later CUDA call in it fails).

A case module defines ``CASES``, a dict from case id to a function that raises on failure.
``run_cases(module, ids)`` runs them in one worker process,

    python -m differential.fresh_cases MODULE ID...   (from the tests/ folder)

which reports each case as it starts and ends; when a worker dies (a fault, an abort) or hangs,
the case it was running fails with the worker's last output and a new worker takes the cases
it had not reached. A worker also ends itself after a case that lost the CUDA context.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import traceback

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE_TAG = "TK_CASE "
_FAULTS = ("misaligned address", "illegal memory access", "illegal instruction",
           "unspecified launch failure", "device-side assert", "CUDA error")


def worker(module_name: str, ids: list[str]) -> int:
    module = importlib.import_module(module_name)
    for case_id in ids:
        print(CASE_TAG + json.dumps({"id": case_id, "status": "start"}), flush=True)
        try:
            module.CASES[case_id]()
        except BaseException as error:  # noqa: BLE001  (reported to the parent)
            message = "".join(traceback.format_exception(error))[-6000:]
            print(CASE_TAG + json.dumps({"id": case_id, "status": "fail", "message": message}),
                  flush=True)
            if any(text in str(error) for text in _FAULTS):
                return 3  # the CUDA context is lost: a new worker runs the rest
        else:
            print(CASE_TAG + json.dumps({"id": case_id, "status": "ok"}), flush=True)
    return 0


def _decode(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def run_cases(module_name: str, ids: list[str], *, timeout: float = 300.0) -> dict[str, dict]:
    """{case id: {"status": "ok" | "fail", "message": ...}} for every id (see the module doc)."""
    import thunderkittens
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(thunderkittens.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [TESTS_DIR, package_root, os.environ.get("PYTHONPATH")]))}
    results: dict[str, dict] = {}
    remaining = list(ids)
    while remaining:
        args = [sys.executable, "-m", "differential.fresh_cases", module_name, *remaining]
        try:
            done = subprocess.run(args, cwd=TESTS_DIR, env=env, capture_output=True, text=True,
                                  timeout=timeout)
            stdout, stderr, ending = done.stdout, done.stderr, f"exit status {done.returncode}"
        except subprocess.TimeoutExpired as expired:
            stdout, stderr = _decode(expired.stdout), _decode(expired.stderr)
            ending = f"no answer within {timeout:.0f} s (a hang?); killed"
        running = None
        for line in stdout.splitlines():
            if not line.startswith(CASE_TAG):
                continue
            report = json.loads(line[len(CASE_TAG):])
            if report["status"] == "start":
                running = report["id"]
            else:
                results[report["id"]] = report
                running = None
        tail = "\n".join(line for line in (stdout + stderr).splitlines()
                         if not line.startswith(CASE_TAG))[-6000:]
        if running is not None:
            results[running] = {"id": running, "status": "fail",
                                "message": f"the worker process ended ({ending}) in this case:\n{tail}"}
        progressed = [i for i in remaining if i in results]
        remaining = [i for i in remaining if i not in results]
        if remaining and not progressed:
            for case_id in remaining:
                message = f"the worker process ended ({ending}) before this case:\n{tail}"
                results[case_id] = {"id": case_id, "status": "fail", "message": message}
            break
    return results


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1], sys.argv[2:]))
