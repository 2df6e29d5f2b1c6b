"""The tolerance rule of the differential suite, in one place (DESIGN.md section 6).

For an output (or a gradient) ``out`` of one of our ops, ``ref`` the float64 answer on the same
inputs, and ``theirs`` PyTorch's own answer in the inputs' dtype (SDPA or torch.matmul on
contiguous copies of the same values: the yardstick; for an attention gradient the less precise
of SDPA's default backend and its fused backward, attention.yardstick says why):

  * ``out`` has the shape and dtype asked for, and is non-finite exactly where ``ref`` is
    (NaN where ``ref`` is NaN, the same infinities): memory the op forgot to write shows here;
  * where the answer is 0 by construction (rows that see no key, gradient memory outside
    the views of a base tensor: the caller's ``exact_zero``) ``out`` is exactly 0;
  * max |out - ref| <= ERROR_FACTOR * max |theirs - ref| + slack, with
    slack = max(ABS_FLOOR, eps(dtype) / 2 * max |ref|): one rounding to the output dtype at the
    largest value (for an attention gradient, whose elements sum over many rows, the floor
    grows as the square root of their number: gradient_floor);
  * ||out - ref|| / ||ref|| <= ERROR_FACTOR * ||theirs - ref|| / ||ref|| + rel_slack, with
    rel_slack = max(REL_SLACK, eps(dtype) / 2 * max |ref| * sqrt(ROUNDED_ELEMENTS) / ||ref||):
    one rounding at the largest value on ROUNDED_ELEMENTS elements.

Why the slack: a result rounded to the output dtype is up to eps/2 * |value| off whatever the
algorithm, and on a small output PyTorch's own error can happen to lie well below that (a
handful of elements, most rounded luckily): twice it would then ask for better than correct
rounding. The slack admits exactly that: results off by one more rounding than twice PyTorch's
error, at the largest value (max-abs) or on up to ROUNDED_ELEMENTS elements (relative L2). On
outputs of thousands of elements and more, PyTorch's error is well above one rounding on a few
elements, and the rule is 2x PyTorch's within a few percent (e.g. 10^5 random elements:
rel_slack is about a tenth of PyTorch's bf16 relative error).

The yardstick must itself be sane (relative L2 error below YARDSTICK_LIMIT), or the rule would
be no rule: an insane one is reported as such, unless ``out`` is at least as close to ``ref`` as
it (an ill-conditioned case, e.g. a very peaked softmax's tiny gradients, where PyTorch's own
low-precision answer is poor and ours is no worse), or ``ref`` lies within the absolute floor of
0 everywhere (an answer 0 up to cancellation, e.g. the gradient of q with one token and
normalize=True in Based): then the relative error of either is noise over noise, and only the
max-abs bound, which the floor keeps meaningful, is applied.

TK_TOLERANCE_LOG=PATH appends one JSON line per comparison to PATH (the test, what was compared,
our error, the bound, and the same for the relative L2 error): what the margins really are.
"""

from __future__ import annotations

import json
import math
import os

import torch

ERROR_FACTOR = 2.0
ABS_FLOOR = 3e-5  # float32 noise on O(1) inputs: a gradient 0 by cancellation (one key) comes out near 1e-5
FLOOR_TERMS = 128  # ABS_FLOOR covers sums of up to this many float32 terms (gradient_floor)
REL_SLACK = 1e-6
ROUNDED_ELEMENTS = 32
YARDSTICK_LIMIT = 0.1


class YardstickError(AssertionError):
    """PyTorch's own answer is not usable as a yardstick (not finite where the reference is,
    or far from it)."""


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def _rounding(dtype: torch.dtype) -> float:
    """One rounding to ``dtype``, relative: eps / 2."""
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point or dtype.is_complex else 0.0


def gradient_floor(terms: int) -> float:
    """The absolute floor for a gradient each of whose elements sums ``terms`` float32 products
    (an attention key's gradient: every query row that sees it): float32 noise grows as the
    square root of the number of terms (one key and 472 query rows: 3.1e-5 where the exact
    gradient is 0)."""
    return ABS_FLOOR * math.sqrt(max(1.0, terms / FLOOR_TERMS))


def _slack(ref_finite: torch.Tensor, dtype: torch.dtype, floor: float = ABS_FLOOR) -> float:
    largest = ref_finite.abs().max().item() if ref_finite.numel() else 0.0
    return max(floor, _rounding(dtype) * largest)


def _rel_slack(ref_finite: torch.Tensor, dtype: torch.dtype, ref_norm: float) -> float:
    if ref_norm <= 0:
        return REL_SLACK
    largest = ref_finite.abs().max().item()
    return max(REL_SLACK, _rounding(dtype) * largest * ROUNDED_ELEMENTS ** 0.5 / ref_norm)


def assert_nonfinite_match(what: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    """``out`` is NaN / +inf / -inf exactly where ``ref`` is."""
    if bool(torch.isfinite(ref).all()) and bool(torch.isfinite(out).all()):
        return
    for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        ours, expected = test(out), test(ref)
        if not torch.equal(ours, expected):
            wrong = ours != expected
            index = _first_index(wrong)
            raise AssertionError(
                f"{what}: {int(wrong.sum())} of {out.numel()} elements differ in being {name} "
                f"from the float64 reference (first at {index}: ours {out[index].item()}, "
                f"reference {ref[index].item()})")


def assert_close(what: str, out: torch.Tensor, ref: torch.Tensor, theirs: torch.Tensor,
                 dtype: torch.dtype | None = None, exact_zero: torch.Tensor | None = None,
                 floor: float = ABS_FLOOR) -> None:
    """The rule above; ``dtype`` is the inputs' dtype (default: out's); ``exact_zero`` a bool
    mask of where ``out`` must be exactly 0; ``floor`` the absolute floor of the slack
    (ABS_FLOOR, or gradient_floor for long sums)."""
    dtype = dtype or out.dtype
    assert tuple(out.shape) == tuple(ref.shape), \
        f"{what}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}, expected {dtype}"
    out64 = out.detach().double()
    ref = ref.detach()
    assert_nonfinite_match(what, out64, ref)
    if exact_zero is not None and exact_zero.any() and not torch.all(out64[exact_zero] == 0):
        wrong = exact_zero & (out64 != 0)
        index = _first_index(wrong)
        raise AssertionError(f"{what}: {int(wrong.sum())} elements are not 0 where the answer is 0 "
                             f"by construction (first at {index}: {out64[index].item()})")
    theirs64 = theirs.detach().double()
    if bool(torch.isfinite(ref).all()):  # the common case: no masks to apply
        if not bool(torch.isfinite(theirs64).all()):
            raise YardstickError(f"{what}: PyTorch's own answer is not finite where the reference is")
        diff, diff_theirs, ref_finite = out64 - ref, theirs64 - ref, ref
    else:
        finite = torch.isfinite(ref)
        if not finite.any():
            return
        if not bool(torch.isfinite(theirs64[finite]).all()):
            raise YardstickError(f"{what}: PyTorch's own answer is not finite where the reference is")
        diff, diff_theirs, ref_finite = (out64 - ref)[finite], (theirs64 - ref)[finite], ref[finite]
    err, err_theirs = diff.abs().max().item(), diff_theirs.abs().max().item()
    bound = ERROR_FACTOR * err_theirs + _slack(ref_finite, dtype, floor)
    ref_norm = ref_finite.norm().item()
    rel = diff.norm().item() / ref_norm if ref_norm > 0 else 0.0
    rel_theirs = diff_theirs.norm().item() / ref_norm if ref_norm > 0 else 0.0
    cancelled = ref_finite.numel() == 0 or ref_finite.abs().max().item() <= floor
    if cancelled:
        record(what, err, bound, dtype=dtype)
        assert err <= bound, (f"{what} (0 up to cancellation): max abs error {err:.3e} > "
                              f"{ERROR_FACTOR:g} x PyTorch's {err_theirs:.3e} + slack (bound {bound:.3e})")
        return
    if rel_theirs > YARDSTICK_LIMIT and (err > err_theirs or rel > rel_theirs):
        raise YardstickError(f"{what}: PyTorch's own answer has relative L2 error {rel_theirs:.3e} "
                             "against the float64 reference: not a usable yardstick")
    rel_slack = _rel_slack(ref_finite, dtype, ref_norm)
    rel_bound = ERROR_FACTOR * rel_theirs + rel_slack
    record(what, err, bound, rel, rel_bound, dtype)
    assert err <= bound, (f"{what}: max abs error {err:.3e} > {ERROR_FACTOR:g} x PyTorch's "
                          f"{err_theirs:.3e} + slack (bound {bound:.3e})")
    assert rel <= rel_bound, (f"{what}: relative L2 error {rel:.3e} > {ERROR_FACTOR:g} x "
                              f"PyTorch's {rel_theirs:.3e} + {rel_slack:.3e}")


def record(what: str, err: float, bound: float, rel: float | None = None,
           rel_bound: float | None = None, dtype: torch.dtype | None = None) -> None:
    """Appends the comparison to TK_TOLERANCE_LOG, if set (see the module docstring)."""
    path = os.environ.get("TK_TOLERANCE_LOG")
    if not path:
        return
    line = {"test": os.environ.get("PYTEST_CURRENT_TEST", "").removesuffix(" (call)"),
            "what": what, "dtype": str(dtype).removeprefix("torch.") if dtype else None,
            "err": err, "bound": bound, "rel": rel, "rel_bound": rel_bound}
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")


def untouched(bases, make) -> list[torch.Tensor]:
    """For each base tensor, a bool mask of the elements no view made by ``make`` reads: their
    gradient is 0 by construction."""
    probes = [torch.zeros(b.shape, dtype=torch.float64, device=b.device, requires_grad=True)
              for b in bases]
    sum(view.sum() for view in make(probes)).backward()
    return [p.grad == 0 if p.grad is not None else torch.ones(p.shape, dtype=torch.bool, device=p.device)
            for p in probes]
