"""The verdict words and how they combine: a timing check's state, the whole decision of a
gate or a review, and its exit code (the schema of decision.json: docs/gate-ci.md); and
bench compare's words for B against A."""

from __future__ import annotations

from collections.abc import Iterable

from bench.rundir.decision import Disturbance

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
NOT_JUDGED = "NOT JUDGED"  # no interval to judge on: fails nothing, and is no PASS
REFUSED = "REFUSED"  # a review's side refused the cell before serving it
UNRESOLVED = "UNRESOLVED"  # an interval that still holds 1 + threshold (before the budget)
DECISION_VERDICTS = (PASS, FAIL, INCONCLUSIVE)
METRIC_VERDICTS = (*DECISION_VERDICTS, NOT_JUDGED, REFUSED)
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 77}  # 2 is bad input: no decision
# bench compare's, B against A: a count or a timing row's verdict ("info": not judged)
BETTER, WORSE, SAME, NOT_COMPARABLE = "better", "worse", "same", "not comparable"
COMPARE_VERDICTS = (BETTER, WORSE, SAME)


def overall(metric_verdicts: Iterable[str], exact_failed: int) -> str:
    """PASS, FAIL or INCONCLUSIVE: FAIL when an exact check or a timing check failed; else
    INCONCLUSIVE when a timing check is; else PASS (NOT JUDGED, REFUSED fail nothing)."""
    seen = set(metric_verdicts)
    if exact_failed or FAIL in seen:
        return FAIL
    return INCONCLUSIVE if INCONCLUSIVE in seen else PASS


def undecided_verdict(disturbance: Disturbance) -> str:
    """A timing check still undecided when the budget is spent: INCONCLUSIVE on a disturbed
    machine; FAIL on a quiet one (the change sits at its threshold: not shown within it)."""
    return FAIL if disturbance.quiet else INCONCLUSIVE
