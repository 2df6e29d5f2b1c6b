"""A case server: GPU jobs run in a separate, long-lived Python process, so that a CUDA fault
or a hang costs one job, not the whole pytest run, while the process start (torch import, CUDA
context) is paid once per test worker, not once per case.

A kernel fault (``misaligned address``, ``illegal memory access``) poisons the process's CUDA
context: every later CUDA call in it fails. The server therefore ends itself after a job that
faulted, and a job that kills it (an abort, SIGFPE) or does not answer in time (a hang; it is
then killed) fails with the server's last output; the next job starts a new server.

Jobs (one JSON object a line on the server's stdin):
  {"kind": "case", "module": "differential.fallback_layouts", "case": ID}
      runs ``module.CASES[ID]()`` (a fixed case: raises on failure);
  {"kind": "property", "property": NAME, "profile": PROFILE, "shard": I}
      runs shard I of a differential property on the GPU (runner.run_property; with
      "device": "cpu" on the CPU); the answer carries the per-path case counts and the seed.
Answers are lines ``TK_JOB {json}``: {"status": "start"}, then {"status": "ok" | "fail",
"message": ..., "fatal": bool, ...}. Everything else the job prints is its output.

By hand, from the tests/ folder (also the way to run cases under compute-sanitizer):

    python -m differential.worker MODULE ID...
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG = "TK_JOB "
FAULTS = ("misaligned address", "illegal memory access", "illegal instruction",
          "unspecified launch failure", "device-side assert", "CUDA error", "CUDA context was lost")


def _emit(message: dict) -> None:
    sys.stdout.write(TAG + json.dumps(message) + "\n")
    sys.stdout.flush()


def _run_job(job: dict) -> dict:
    """Runs one job; returns the extra fields of its answer (raises on failure, with
    ``extra`` attached to the exception when there is something to report anyway)."""
    if job["kind"] == "case":
        importlib.import_module(job["module"]).CASES[job["case"]]()
        return {}
    if job["kind"] == "property":
        from .environment import Environment, PathCounts
        from .runner import run_property
        from .settings import PROFILES, shard_seed
        counts = PathCounts(job["property"])
        extra = {"counts": counts.counts, "seed": shard_seed(job["shard"])}
        env = Environment.cpu() if job.get("device") == "cpu" else Environment.cuda()
        try:
            run_property(job["property"], PROFILES[job["profile"]], env, counts,
                         shard=job["shard"])
        except BaseException as error:
            error.extra = extra  # type: ignore[attr-defined]
            raise
        return extra
    raise ValueError(f"unknown job kind {job['kind']!r}")


def serve() -> int:
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        _emit({"status": "start"})
        started = time.monotonic()
        try:
            extra = _run_job(job)
        except BaseException as error:  # noqa: BLE001  (reported to the parent)
            message = "".join(traceback.format_exception(error))[-8000:]
            fatal = any(text in message for text in FAULTS)
            _emit({"status": "fail", "message": message, "fatal": fatal,
                   "seconds": round(time.monotonic() - started, 2),
                   **getattr(error, "extra", {})})
            if fatal:
                return 3  # the CUDA context may be lost: a new server runs the next job
        else:
            _emit({"status": "ok", "seconds": round(time.monotonic() - started, 2), **extra})
        _release_memory()
    return 0


def _release_memory() -> None:
    """Gives the GPU memory the job's tensors held back to the device: a server per test worker
    next to the test workers themselves would otherwise keep the largest job's memory cached
    each (eight of each filled an 80 GB H100)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        import gc
        gc.collect()
        torch.cuda.empty_cache()


class Worker:
    """The test side: starts the server on the first job, hands it jobs one at a time, and
    starts a new one after a job that ended it (or hung)."""

    def __init__(self, output_lines: int = 300):
        self._process: subprocess.Popen | None = None
        self._lines: queue.Queue | None = None
        self._output_lines = output_lines

    def _start(self) -> None:
        import thunderkittens
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(thunderkittens.__file__)))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
            filter(None, [TESTS_DIR, package_root, os.environ.get("PYTHONPATH")]))}
        env.pop("PYTEST_CURRENT_TEST", None)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "differential.worker"], cwd=TESTS_DIR, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            bufsize=1, errors="replace")
        lines: queue.Queue = queue.Queue()
        stream = self._process.stdout

        def read():
            for text in stream:
                lines.put(text.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        self._lines = lines

    def _stop(self) -> str:
        """Ends the server (if still running); returns how it ended."""
        process, self._process = self._process, None
        if process is None:
            return "not running"
        if process.poll() is None:
            process.kill()
        status = process.wait()
        return f"exit status {status}" if status >= 0 else f"killed by signal {-status}"

    def run(self, job: dict, timeout: float) -> dict:
        """The job's answer: {"status": "ok" | "fail", "message", "output", ...}."""
        if self._process is None or self._process.poll() is not None:
            self._stop()
            self._start()
        try:
            self._process.stdin.write(json.dumps(job) + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            ending = self._stop()
            return {"status": "fail", "message": f"the case server ended ({ending}) before the job",
                    "output": ""}
        output: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ending = self._stop()
                return {"status": "fail", "output": self._tail(output),
                        "message": f"no answer within {timeout:.0f} s (a hang?); the case server "
                                   f"was killed ({ending})"}
            try:
                line = self._lines.get(timeout=min(remaining, 5.0))
            except queue.Empty:
                continue
            if line is None:
                ending = self._stop()
                return {"status": "fail", "output": self._tail(output),
                        "message": f"the case server ended ({ending}) in this job"}
            if not line.startswith(TAG):
                output.append(line)
                continue
            answer = json.loads(line[len(TAG):])
            if answer["status"] == "start":
                continue
            answer["output"] = self._tail(output)
            if answer.get("fatal"):
                self._stop()
            return answer

    def _tail(self, output: list[str]) -> str:
        return "\n".join(output[-self._output_lines:])

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            try:
                self._process.stdin.close()
                self._process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._stop()


def _by_hand(module: str, ids: list[str]) -> int:
    failed = 0
    for case_id in ids:
        try:
            importlib.import_module(module).CASES[case_id]()
        except BaseException:  # noqa: BLE001
            failed += 1
            print(f"FAIL {case_id}\n{traceback.format_exc()}", flush=True)
        else:
            print(f"ok   {case_id}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_by_hand(sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else serve())
