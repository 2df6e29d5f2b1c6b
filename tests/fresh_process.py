"""Run a script as the first work of a new Python process (shared by the GPU tests).

For what must hold on a process's very first call, before anything is cached: the script
imports the same thunderkittens package as the test process, whether that is installed or on
PYTHONPATH, and can import the test helpers (e.g. differential.tolerance).
"""

import os
import subprocess
import sys
import textwrap

import thunderkittens as tk


def run_in_fresh_process(script: str) -> subprocess.CompletedProcess:
    """Runs the (dedented) script with `python -c`; returns its result, output captured as text."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(tk.__file__)))
    tests_dir = os.path.dirname(os.path.abspath(__file__))  # the script may import the test helpers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [package_root, tests_dir, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=300)
