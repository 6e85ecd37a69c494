"""Timing verdicts between sides of one run and its later stages (`bench review`): each side
against the first, per policy, on the gate's timing metrics at the gate's thresholds and
under its rule (bench.verdict.thresholds.decide). The interval is the 95% t interval of the
paired log ratios over every stage's repeats (one stage: the run's own summary columns).
PASS when it lies below 1 + threshold, FAIL when above, UNRESOLVED while it holds it (the
review may add a stage: bench.ab.sequential.more); at the budget an UNRESOLVED check is
INCONCLUSIVE when the machine was disturbed (its serves' cpu_lost p50 above
bench.rundir.schema's DISTURBED_LIMIT) and FAIL when it was quiet; NOT JUDGED without an
interval (too few repeats). docs/sglang-ci.md, "Timings"."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from bench.rundir.decision import Disturbance
from bench.rundir.files import parse_list_cell
from bench.rundir.rundir import FILES
from bench.rundir.schema import GATED_METRICS
from bench.stats import LEVEL, t_interval
from bench.verdict.thresholds import DEFAULT_THRESHOLD, decide
from bench.verdict.words import FAIL, INCONCLUSIVE, NOT_JUDGED, UNRESOLVED, undecided_verdict

ESTIMATOR = "t-mean-log"  # the t interval of the mean of the pairs' log ratios


@dataclass(frozen=True)
class Verdict:
    side: str
    policy: str
    metric: str
    state: str  # PASS, FAIL, UNRESOLVED (before the budget), INCONCLUSIVE, NOT JUDGED
    point: float | None
    low: float | None
    high: float | None
    threshold: float
    pairs: int = 0
    note: str = ""

    @property
    def half_width(self) -> float | None:
        """The interval's half-width as a fraction (None without one)."""
        if self.low is None or self.high is None:
            return None
        return math.expm1((math.log(self.high) - math.log(self.low)) / 2)

    @property
    def needed_half_width(self) -> float | None:
        """The half-width that would have decided an undecided check: the distance of its
        point from 1 + threshold, as a fraction (None when decided or without a point)."""
        if self.state not in (UNRESOLVED, INCONCLUSIVE) and not self.note.startswith("undecided"):
            return None
        if self.point is None:
            return None
        return math.expm1(abs(math.log(self.point) - math.log(1 + self.threshold)))

    def text(self) -> str:
        if self.point is None:
            return f"{self.side} {self.policy} {self.metric}: {self.state}"
        iv = "" if self.low is None else f" [{self.low:.3f}, {self.high:.3f}]"
        why = f"; {self.note}" if self.note else ""
        return (f"{self.side} {self.policy} {self.metric}: {self.state} "
                f"({self.point:.3f}{iv}, threshold {1 + self.threshold:g}, "
                f"{self.pairs} pairs{why})")


def _num(row: dict, column: str) -> float | None:
    value = row.get(column)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _one(row: dict, metric: str) -> tuple[float | None, float | None, float | None, int]:
    """A metric's point, interval and pairs from one summary row's own columns."""
    pairs = _num(row, f"{metric}_ratio_repeats")
    return (_num(row, f"{metric}_ratio"), _num(row, f"{metric}_ratio_ci_low"),
            _num(row, f"{metric}_ratio_ci_high"), int(pairs or 0))


def _merged(rows: list[dict], metric: str, level: float = LEVEL
            ) -> tuple[float | None, float | None, float | None, int]:
    """A metric's point, interval and pairs over several stages' rows of one side and
    policy: their per-repeat ratios pooled, the t interval of their logs at `level`."""
    column = f"{metric}_ratio_per_repeat"
    ratios = [x for r in rows for x in parse_list_cell(r.get(column), FILES["summary"], column)
              if x > 0]
    iv = t_interval(np.log(np.asarray(ratios, dtype=float)), log=True, level=level)
    return iv.point, iv.low, iv.high, iv.n


def verdicts(summaries: pd.DataFrame | list[pd.DataFrame], sides: list[str],
             thresholds: dict[str, float], level: float | None = None) -> list[Verdict]:
    """Every side after the first, per policy and gated metric (summary.csv's ratios to the
    first side, bench.analysis.side_lead), over one stage's summary or several's; `level`: the
    interval's, a sequential look's spent level (bench.ab.sequential.look_level), else the
    summary's own 95 % interval of one stage."""
    stages = [summaries] if isinstance(summaries, pd.DataFrame) else list(summaries)
    keyed = [{(r["protocol"], r["policy"]): r for r in s.to_dict("records")} for s in stages]
    out = []
    for row in stages[0].to_dict("records"):
        if row["protocol"] not in sides[1:]:
            continue
        rows = [k[(row["protocol"], row["policy"])] for k in keyed
                if (row["protocol"], row["policy"]) in k]
        for m in GATED_METRICS:
            point, low, high, pairs = (_one(row, m) if len(rows) == 1 and level is None
                                       else _merged(rows, m, level or LEVEL))
            if point is None:
                continue
            t = thresholds.get(m, DEFAULT_THRESHOLD)
            state = NOT_JUDGED if low is None or high is None else decide(low, high, t)
            out.append(Verdict(row["protocol"], row["policy"], m, state, point, low, high, t,
                               pairs))
    return out


def states(found: list[Verdict]) -> list[tuple[str, float, float, float, float]]:
    """The sequential rule's input (bench.ab.sequential.more): every check with an interval."""
    return [(v.state, v.point, v.low, v.high, v.threshold) for v in found
            if v.low is not None]


def at_budget(found: list[Verdict], shaken: Disturbance) -> list[Verdict]:
    """The verdicts once no stage is added: an UNRESOLVED check reads what the gate's rule
    says (bench.verdict.words.undecided_verdict): INCONCLUSIVE on a disturbed machine, FAIL
    on a quiet one. So a quiet machine never ends INCONCLUSIVE, and no undecided check
    reads PASS."""
    state = undecided_verdict(shaken)
    note = f"undecided at the budget on a {'quiet' if shaken.quiet else 'disturbed'} machine"
    return [replace(v, state=state, note=note) if v.state == UNRESOLVED else v for v in found]


def failing(found: list[Verdict]) -> list[str]:
    """The verdicts that fail a review: FAIL, and UNRESOLVED (a verdict not yet judged at
    the budget, as the gate fails it)."""
    return [v.text() for v in found if v.state in (FAIL, UNRESOLVED)]


def inconclusive(found: list[Verdict]) -> list[str]:
    return [v.text() for v in found if v.state == INCONCLUSIVE]


def lines(found: list[Verdict]) -> list[str]:
    """The page's timing section: one line per verdict, or why there are none."""
    if not found:
        return ["No timing verdicts: the run has no ratios between sides."]
    return [f"- {v.text()}" for v in found]


__all__ = ["ESTIMATOR", "LEVEL", "Verdict", "at_budget", "failing", "inconclusive", "lines",
           "states", "verdicts"]
