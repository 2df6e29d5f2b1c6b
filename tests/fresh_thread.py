"""Run a call as the first CUDA work of a new thread (shared by the GPU tests).

Torch's autograd device threads and a user's own worker threads can reach an op before any
CUDA runtime call of theirs has made the device's context current on that thread; driver calls
the op makes (the TMA map encoder) then fail unless the op makes the context current itself.
"""

import threading


def call_in_new_thread(fn):
    """fn() in a new thread; returns its result or re-raises its exception here."""
    outcome = {}

    def work():
        try:
            outcome["result"] = fn()
        except BaseException as error:  # noqa: BLE001  (re-raised in the caller's thread)
            outcome["error"] = error

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
