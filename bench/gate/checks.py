"""One evaluated gate check, and the baseline look-up the gate's comparisons share."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from bench.stats import Interval

BASELINE_KEY = ["protocol", "policy", "tp", "pp"]
EPS = 1e-9  # CSV round trips of means; per-request counts are compared exactly


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


def baseline_value(baseline: pd.DataFrame, row: dict, column: str) -> float:
    """The baseline's most lenient finite `column` for the row's (protocol, policy, tp, pp);
    NaN when the baseline has no such row or column."""
    if column not in baseline:
        return math.nan
    match = baseline
    for k in BASELINE_KEY:
        match = match[match[k] == row[k]]
    values = pd.to_numeric(match[column], errors="coerce").dropna()
    return float(values.max()) if len(values) else math.nan


def baseline_match(baseline: pd.DataFrame, row: dict) -> dict | None:
    """The baseline's row for the row's (protocol, policy, tp, pp); None when it has none."""
    match = baseline
    for k in BASELINE_KEY:
        if k not in match:
            return None
        match = match[match[k].astype(str) == str(row[k])]
    return match.iloc[0].to_dict() if len(match) else None


def state(c: Check) -> str:
    """PASS, FAIL, INCONCLUSIVE or NOT JUDGED (an undecided check is never PASS)."""
    if not c.judged:
        return "NOT JUDGED"
    if c.inconclusive:
        return "INCONCLUSIVE"
    return "PASS" if c.passed and not c.unresolved else "FAIL"
