"""Views SDPA mishandles, and rows that see no key, on every path (GPU).

SDPA (the fallback's peer) has returned garbage (relative error 1.4, no error raised) for views
that start 8 bytes off a 16-byte boundary, ``torch.randn(b, h, l, d + 8)[..., 4:4 + d]``, and in
other shapes faulted with ``misaligned address``, after which every CUDA call in the process
fails. A drop-in must not be less robust than what it replaces: each case here is checked
against the float64 reference within PyTorch's own error on contiguous copies of the same
values (tests/differential/fallback_layouts.py lists them). Rows that see no key
(causal_lower_right with Lq > Lk) must be 0, with 0 gradient, whichever path runs.

The cases run in fresh worker processes (tests/differential/fresh_cases.py), so a fault costs
one case, not the rest of the session.
"""

import pytest
import torch

from differential import fallback_layouts, fresh_cases

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def results():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return fresh_cases.run_cases("differential.fallback_layouts", fallback_layouts.all_ids(),
                                 timeout=600)


def check(results, case_id):
    result = results[case_id]
    if result["status"] != "ok":
        pytest.fail(f"{case_id}:\n{result['message']}", pytrace=False)


@pytest.mark.parametrize("case_id", fallback_layouts.misaligned_ids())
def test_misaligned_view(results, case_id):
    check(results, case_id)


@pytest.mark.parametrize("case_id", fallback_layouts.REPRO_IDS)
def test_issue_repro(results, case_id):
    check(results, case_id)


@pytest.mark.parametrize("case_id", fallback_layouts.no_key_rows_ids())
def test_rows_that_see_no_key(results, case_id):
    check(results, case_id)
