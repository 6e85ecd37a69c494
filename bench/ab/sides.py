"""Timing verdicts between the sides of one run (`bench review`: several SGLangs served in
turns) over its stages: each side against the first, per policy, on the gate's timing metrics
at the gate's thresholds and under its rule (bench.verdict.thresholds.decide).

The sides are read as two runs the served A/B's way: each side's rows of every stage
stacked into one run whose repeats continue from stage to stage
(bench.compare.comparison.stacked), the side renamed to the first side's name so that rows
pair by configuration and repeat, then compared with the served A/B's own interval
(bench.ab.served.timing: bench.analysis.estimate.served, chosen by the serves' cpu_lost) and
judged from the gated rows the gate reads (bench.ab.served.gated_rows). So the gate's
revisions and the review's sides share one merge, one interval and one rule.

PASS when the interval lies below 1 + threshold, FAIL when above, UNRESOLVED while it holds
it (the review may add a stage: bench.ab.sequential.more); at the budget an UNRESOLVED check
is INCONCLUSIVE when the machine was disturbed (its serves' cpu_lost p50 above
bench.rundir.schema's DISTURBED_LIMIT) and FAIL when it was quiet; NOT JUDGED without an
interval (too few repeats). docs/sglang-ci.md, "Timings"."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from bench.ab.served import gated_rows, timing
from bench.analysis import estimate
from bench.compare.comparison import Run, compare, stacked
from bench.rundir.decision import Disturbance
from bench.stats import LEVEL, Interval
from bench.verdict.thresholds import DEFAULT_THRESHOLD, decide
from bench.verdict.words import FAIL, INCONCLUSIVE, NOT_JUDGED, UNRESOLVED, undecided_verdict

ESTIMATOR = estimate.ESTIMATOR  # what decision.json records: the served A/B's rule


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
    method: str = ""  # how the interval was made (bench.analysis.estimate: `t-mean 0.95`)

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
        how = f", {self.method}" if self.method and self.low is not None else ""
        why = f"; {self.note}" if self.note else ""
        return (f"{self.side} {self.policy} {self.metric}: {self.state} "
                f"({self.point:.3f}{iv}, threshold {1 + self.threshold:g}, "
                f"{self.pairs} pairs{how}{why})")


def _side(run: Run, name: str, as_name: str) -> Run:
    """The run's rows of side `name` in every table, renamed `as_name` (the first side's)."""
    def pick(frame: pd.DataFrame | None) -> pd.DataFrame | None:
        if frame is None or "protocol" not in frame:
            return frame
        return frame[frame["protocol"].astype(str) == name].assign(protocol=as_name)
    return replace(run, requests=pick(run.requests), steps=pick(run.steps),
                   ranks=pick(run.ranks))


def verdicts(stages: Sequence[tuple[Path | str, int]], sides: list[str],
             thresholds: dict[str, float], level: float = LEVEL) -> list[Verdict]:
    """Every side after the first against the first, over the stages (each a run folder and
    its repeats), per policy and gated metric; `level`: the interval's (a sequential look's
    spent level, bench.ab.sequential.look_level)."""
    whole = stacked([(Path(folder), repeats) for folder, repeats in stages])
    first = _side(whole, sides[0], sides[0])
    out = []
    for side in sides[1:]:
        comp = compare(first, _side(whole, side, sides[0]),
                       timing=timing(DEFAULT_THRESHOLD, level))
        out += from_rows(side, list(gated_rows(comp)), thresholds)
    return out


def from_rows(side: str, rows: list[tuple[dict, str, Interval]],
              thresholds: dict[str, float]) -> list[Verdict]:
    """One side's verdicts from its gated rows (row, metric, Interval of side / first)."""
    out = []
    for row, m, iv in rows:
        t = thresholds.get(m, DEFAULT_THRESHOLD)
        state = (NOT_JUDGED if iv.low is None or iv.high is None
                 else decide(iv.low, iv.high, t))
        out.append(Verdict(side, row["policy"], m, state, iv.point, iv.low, iv.high, t, iv.n,
                           iv.note if state == NOT_JUDGED else "", iv.method or ""))
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


__all__ = ["ESTIMATOR", "LEVEL", "Verdict", "at_budget", "failing", "from_rows",
           "inconclusive", "lines", "states", "verdicts"]
