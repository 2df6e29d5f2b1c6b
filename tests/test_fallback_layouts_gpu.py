"""Views SDPA mishandles, and rows that see no key, on every path (GPU).

SDPA (the fallback's peer) has returned garbage (relative error 1.4, no error raised) for views
that start 8 bytes off a 16-byte boundary, ``torch.randn(b, h, l, d + 8)[..., 4:4 + d]``, and in
other shapes faulted with ``misaligned address``, after which every CUDA call in the process
fails. A drop-in must not be less robust than what it replaces: each case here is checked
against the float64 reference within PyTorch's own error on contiguous copies of the same
values (tests/differential/fallback_layouts.py lists them). Rows that see no key
(causal_lower_right with Lq > Lk) must be 0, with 0 gradient, whichever path runs.

Each case runs in the test worker's case server (tests/differential/worker.py), so a fault
costs one case, not the rest of the pytest run.
"""

import pytest
import torch

from differential import fallback_layouts

pytestmark = pytest.mark.gpu

CASE_TIMEOUT_S = 240


def check(case_worker, case_id, record_property):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    answer = case_worker.run({"kind": "case", "module": "differential.fallback_layouts",
                              "case": case_id}, timeout=CASE_TIMEOUT_S)
    if answer["status"] != "ok":
        pytest.fail(f"{case_id}:\n{answer['message']}\n--- output ---\n{answer['output'][-6000:]}",
                    pytrace=False)


@pytest.mark.parametrize("case_id", fallback_layouts.misaligned_ids())
def test_misaligned_view(case_worker, case_id, record_property):
    check(case_worker, case_id, record_property)


@pytest.mark.parametrize("case_id", fallback_layouts.REPRO_IDS)
def test_issue_repro(case_worker, case_id, record_property):
    check(case_worker, case_id, record_property)


@pytest.mark.parametrize("case_id", fallback_layouts.no_key_rows_ids())
def test_rows_that_see_no_key(case_worker, case_id, record_property):
    check(case_worker, case_id, record_property)
