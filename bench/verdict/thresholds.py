"""Figures against thresholds: where an interval of a ratio B/A lies against 1 + threshold
(the gate, the served A/B's sequential rule, the review's timing verdicts), against
1 +- threshold (bench compare's worse / better / same), and a count against a ceiling
with a tolerance (the gate's host work). Intervals: bench.stats; the rule for CI:
docs/gate-ci.md."""

from __future__ import annotations

import math

from bench.verdict.words import BETTER, FAIL, PASS, SAME, UNRESOLVED, WORSE

DEFAULT_THRESHOLD = 0.05  # a timing metric's threshold where none is given (gate.json, flags)


def decide(low: float | None, high: float | None, threshold: float) -> str:
    """PASS when the whole interval lies below 1 + threshold, FAIL when it lies above,
    UNRESOLVED while it holds it (or there is no interval)."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return UNRESOLVED
    if high < 1 + threshold:
        return PASS
    if low > 1 + threshold:
        return FAIL
    return UNRESOLVED


def timing_verdict(low: float, high: float, threshold: float) -> str:
    """worse / better only when the whole CI lies beyond 1 +- threshold."""
    if low > 1 + threshold:
        return WORSE
    if high < 1 - threshold:
        return BETTER
    return SAME


def within_ceiling(value: float, ceiling: float, tolerance: float) -> bool:
    """A count at most its ceiling x (1 + tolerance)."""
    return value <= ceiling * (1 + tolerance)
