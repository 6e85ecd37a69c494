"""Timing verdicts between sides of one run (`bench review`): each side against the first,
per policy, on the gate's timing metrics at the gate's thresholds and under its rule
(bench.ab.sequential.decide): PASS when the whole 95% interval of the ratio lies below
1 + threshold, FAIL when it lies above, UNRESOLVED while it holds it, NOT JUDGED without an
interval (too few repeats)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from bench.rundir.schema import GATED_METRICS
from bench.stats import decide

NOT_JUDGED = "NOT JUDGED"


@dataclass(frozen=True)
class Verdict:
    side: str
    policy: str
    metric: str
    state: str
    point: float | None
    low: float | None
    high: float | None
    threshold: float

    def text(self) -> str:
        if self.point is None:
            return f"{self.side} {self.policy} {self.metric}: {self.state}"
        iv = ("" if self.low is None else f" [{self.low:.3f}, {self.high:.3f}]")
        return (f"{self.side} {self.policy} {self.metric}: {self.state} "
                f"({self.point:.3f}{iv}, threshold {1 + self.threshold:g})")


def _num(row: dict, column: str) -> float | None:
    value = row.get(column)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def verdicts(summary: pd.DataFrame, sides: list[str], thresholds: dict[str, float]
             ) -> list[Verdict]:
    """Every side after the first, per policy and gated metric (summary.csv's ratios to the
    first side, bench.analysis.sides)."""
    out = []
    for row in summary.to_dict("records"):
        if row["protocol"] not in sides[1:]:
            continue
        for m in GATED_METRICS:
            point = _num(row, f"{m}_ratio")
            if point is None:
                continue
            low, high = _num(row, f"{m}_ratio_ci_low"), _num(row, f"{m}_ratio_ci_high")
            t = thresholds.get(m, 0.05)
            state = NOT_JUDGED if low is None or high is None else decide(low, high, t)
            out.append(Verdict(row["protocol"], row["policy"], m, state, point, low, high, t))
    return out


def failing(found: list[Verdict]) -> list[str]:
    """The verdicts that fail a review, as the gate fails them: FAIL and UNRESOLVED."""
    return [v.text() for v in found if v.state in ("FAIL", "UNRESOLVED")]


def lines(found: list[Verdict]) -> list[str]:
    """The page's timing section: one line per verdict, or why there are none."""
    if not found:
        return ["No timing verdicts: the run has no ratios between sides."]
    return [f"- {v.text()}" for v in found]
