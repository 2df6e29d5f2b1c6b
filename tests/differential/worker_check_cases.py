"""Cases that exercise the case server itself (test_case_worker.py): one that passes, one that
fails, one that loses the CUDA context, one that kills the process, one that hangs."""

import os
import signal
import time


def _ok():
    print(f"pid {os.getpid()}")


def _fail():
    print("about to fail")
    raise AssertionError("the expected failure")


def _fault():
    raise RuntimeError("CUDA error: misaligned address")


def _die():
    print("about to die", flush=True)
    os.kill(os.getpid(), signal.SIGFPE)


def _hang():
    time.sleep(600)


CASES = {"ok": _ok, "fail": _fail, "fault": _fault, "die": _die, "hang": _hang}
