"""The case server of the GPU tests (tests/differential/worker.py), on the CPU: one process
serves many jobs; a failing job keeps it; a job that loses the CUDA context, kills the process
or hangs costs that job only, with the server's output in the message, and the next job gets a
new server."""

import re

import pytest

from differential.settings import shard_seed
from differential.worker import Worker

MODULE = "differential.worker_check_cases"


def run(worker, case, timeout=60):
    return worker.run({"kind": "case", "module": MODULE, "case": case}, timeout=timeout)


def pid_of(answer):
    return int(re.search(r"pid (\d+)", answer["output"]).group(1))


@pytest.fixture
def worker():
    worker = Worker()
    yield worker
    worker.close()


def test_one_server_many_jobs_and_a_new_one_after_each_fatal_end(worker):
    first = run(worker, "ok")
    assert first["status"] == "ok", first
    assert pid_of(run(worker, "ok")) == pid_of(first)

    failed = run(worker, "fail")
    assert failed["status"] == "fail" and "the expected failure" in failed["message"]
    assert "about to fail" in failed["output"] and not failed["fatal"]
    assert pid_of(run(worker, "ok")) == pid_of(first), "an ordinary failure keeps the server"

    fault = run(worker, "fault")
    assert fault["status"] == "fail" and fault["fatal"], fault
    after_fault = run(worker, "ok")
    assert after_fault["status"] == "ok" and pid_of(after_fault) != pid_of(first)

    died = run(worker, "die")
    assert died["status"] == "fail" and "ended (killed by signal" in died["message"], died
    assert "about to die" in died["output"]
    after_death = run(worker, "ok")
    assert after_death["status"] == "ok" and pid_of(after_death) != pid_of(after_fault)

    hung = run(worker, "hang", timeout=3)
    assert hung["status"] == "fail" and "no answer within 3 s" in hung["message"], hung
    assert run(worker, "ok")["status"] == "ok"


def test_a_property_shard_reports_its_cases_and_seed(worker):
    answer = worker.run({"kind": "property", "property": "matmul", "profile": "cpu", "shard": 0,
                         "device": "cpu"}, timeout=300)
    assert answer["status"] == "ok", answer
    assert sum(answer["counts"].values()) == 150 + 2, answer["counts"]  # random + coverage cases
    assert answer["seed"] == shard_seed(0)
