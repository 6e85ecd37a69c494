"""One evaluated gate check, its state (PASS, FAIL, INCONCLUSIVE or NOT JUDGED) and the
gate's verdict over all of them (bench.verdict.words.overall). The checks themselves:
bench.gate.evaluate (exact), bench.gate.timing (timings), bench.gate.host_ceiling."""

from __future__ import annotations

from dataclasses import dataclass

from bench.stats import Interval
from bench.verdict.words import FAIL, INCONCLUSIVE, NOT_JUDGED, PASS, overall


@dataclass(frozen=True)
class Check:
    """One evaluated check of one summary row."""

    check: str
    protocol: str
    policy: str
    layout: str
    passed: bool
    expected: str = ""
    observed: str = ""
    meaning: str = ""
    note: str = ""
    # False: nothing to judge it on (a timing without an interval). It fails nothing, and it
    # is no PASS either: the table and the last line say NOT JUDGED, and why (the note).
    judged: bool = True
    # Timing checks with an interval: the difference the interval resolves (its half-width,
    # a fraction) beside the threshold asked. An interval that holds 1 + threshold is
    # undecided (`unresolved`): a change of the threshold's size could not be told from
    # none, so it has not passed. Left so at the budget it is INCONCLUSIVE on a disturbed
    # machine (`inconclusive`), FAIL on a quiet one (bench.gate.timing.settle); `needed` is
    # the half-width that would have decided it (the point's distance from 1 + threshold).
    resolves: float | None = None
    threshold: float | None = None
    unresolved: bool = False
    inconclusive: bool = False
    needed: float | None = None
    interval: Interval | None = None  # the ratio B/A and its interval (decision.json)


def layout(row: dict) -> str:
    """The row's configuration beyond protocol and policy, short: `tp2 pp1 sim 8/s`."""
    extra = " extra_pool" if row["extra_pool"] in (True, "True") else ""
    try:
        rate = f"{float(row['rate_rps']):g}/s"
    except (TypeError, ValueError):  # "-": a check of the whole run
        rate = str(row["rate_rps"])
    return f"tp{row['tp']} pp{row['pp']} {row['storage']} {rate}{extra}"


def make_check(row: dict, name: str, passed: bool, **kw) -> Check:
    return Check(name, str(row["protocol"]), str(row["policy"]), layout(row), passed, **kw)


def state(c: Check) -> str:
    """PASS, FAIL, INCONCLUSIVE or NOT JUDGED (an undecided check is never PASS)."""
    if not c.judged:
        return NOT_JUDGED
    if c.inconclusive:
        return INCONCLUSIVE
    return PASS if c.passed and not c.unresolved else FAIL


def is_timing(c: Check) -> bool:
    """A timing check (bench.gate.timing.judge): it carries its interval."""
    return c.interval is not None


def verdict_of(checks: list[Check]) -> str:
    """PASS, FAIL or INCONCLUSIVE over every check: any exact check failed fails it, the
    timing checks by their states (bench.verdict.words.overall)."""
    exact_failed = sum(not c.passed for c in checks if not is_timing(c))
    return overall([state(c) for c in checks if is_timing(c)], exact_failed)
