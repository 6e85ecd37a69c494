"""`bench compare`'s rows of one matched configuration: a count row and a timing row per
metric, each with its verdict (better / worse / same, or info / not comparable) by the rules
of bench.verdict (exact.py: counts; thresholds.py: timings).

Counts (rank 0, exact fractions) are judged exactly. Timings: per repeat the metric's
statistic of A and of B, paired by repeat (the same seed), the ratio B/A as
exp(mean of ln(b_r / a_r)) with its 95% t interval over the repeats (bench.stats); not
comparable when there is no interval (fewer than 3 paired repeats, or no scipy). A served
A/B passes its own interval (TimingOptions.interval: bench.analysis.estimate.served, which
also reads each serve's cpu_lost from ranks.csv) and its level; each row names its method
(`interval`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from bench.analysis.estimate import PerRepeat, lost_by_repeat
from bench.compare.metrics import Counts, TimingMetric
from bench.stats import Interval, Sample, ratio_interval, stat_value
from bench.verdict.exact import direction, judge_critical, judge_decision, judge_steps
from bench.verdict.thresholds import timing_verdict
from bench.verdict.words import NOT_COMPARABLE

NAIVE = "t-mean"  # compare's interval: the t interval over the pairs' log ratios


@dataclass(frozen=True)
class TimingOptions:
    """The threshold, and the interval of B over A: `interval(b, a, lost_b, lost_a)` from
    per-repeat statistics and per-repeat cpu_lost (None: compare's t interval), named
    `method` in each row."""

    threshold: float
    interval: Callable[[PerRepeat, PerRepeat, PerRepeat, PerRepeat], Interval] | None = None
    method: str = NAIVE


def _count_row(metric: str, a: Fraction | None, b: Fraction | None, n: tuple[int, int],
               judged: tuple[str, str]) -> dict:
    diff = None if a is None or b is None else float(b - a)
    return {"metric": metric, "kind": "count", "a": None if a is None else float(a),
            "b": None if b is None else float(b), "b_minus_a": diff, "n_a": n[0],
            "n_b": n[1], "verdict": judged[0], "note": judged[1]}


def count_rows(a: Counts, b: Counts, steps: tuple[int, int]) -> list[dict]:
    """The count rows of one matched configuration."""
    reqs = (a.requests, b.requests)
    return [
        _count_row("polls_per_req", a.polls_per_req, b.polls_per_req, reqs,
                   ("info", "follows timing; not judged")),
        _count_row("decision_collectives_per_req", a.decision_per_req, b.decision_per_req,
                   reqs, judge_decision(a, b)),
        _count_row("critical_collectives_per_req", a.critical_per_req, b.critical_per_req,
                   reqs, judge_critical(a, b)),
        _count_row("background_collectives_per_req", a.background_per_req,
                   b.background_per_req, reqs,
                   (direction(a.background_per_req, b.background_per_req), "")),
        _count_row("step_collectives_per_step", a.step_per_step, b.step_per_step, steps,
                   judge_steps(a, b)),
    ]


def _timing_row(metric: TimingMetric, sa: Sample | None, sb: Sample | None,
                opts: TimingOptions, lost: tuple[PerRepeat, PerRepeat] = ({}, {})) -> dict:
    row = {"metric": metric.name, "kind": "timing", "n_a": _size(sa), "n_b": _size(sb),
           "verdict": NOT_COMPARABLE, "interval": opts.method}
    if sa is None or sb is None:
        return row | {"note": f"only {'B' if sa is None else 'A'} carries {metric.needs}"}
    if not sa.values or not sb.values:
        return row | {"note": f"no samples in {'A' if not sa.values else 'B'}"}
    a, b = (pooled_stat(s, metric.stat) for s in (sa, sb))
    pb, pa = sb.per_repeat(metric.stat), sa.per_repeat(metric.stat)
    iv = ratio_interval(pb, pa) if opts.interval is None else opts.interval(pb, pa, *lost)
    row |= {"a": a, "b": b, "b_minus_a": b - a, "ratio_b_over_a": iv.point,
            "ratio_ci_low": iv.low, "ratio_ci_high": iv.high, "ratio_mdd": iv.half_width,
            "repeats": iv.n} | ({"interval": iv.method} if iv.method else {})
    if iv.point is None:
        return row | {"note": "ratio undefined (no repeat of both with a value > 0)"}
    if not iv.has_interval:
        return row | {"note": iv.note}
    return row | {"verdict": timing_verdict(iv.low, iv.high, opts.threshold), "note": ""}


def _size(sample: Sample | None) -> int | None:
    return None if sample is None else sum(v.size for v in sample.values.values())


def pooled_stat(sample: Sample, stat: str) -> float:
    """The statistic over every repeat's values together (the A and B columns)."""
    return float(stat_value(np.concatenate(list(sample.values.values())), stat))


def _side_sample(metric: TimingMetric, frame: pd.DataFrame | None, present: bool) -> Sample | None:
    """None when the run lacks the metric's columns; empty when this configuration has no rows."""
    if not present:
        return None
    return Sample.flat({}) if frame is None else metric.sample(frame)


def timing_rows(metrics: list[TimingMetric], frames: dict, present: dict,
                opts: TimingOptions) -> list[dict]:
    """The timing rows of one matched configuration (frames keyed (side, table), present
    keyed (side, metric))."""
    rows = []
    lost = tuple(lost_by_repeat(frames.get((s, "ranks"))) for s in "ba")
    for m in metrics:
        sa, sb = (_side_sample(m, frames[(s, m.table)], present[(s, m)]) for s in "ab")
        if sa is not None and sb is not None and not sa.values and not sb.values:
            continue  # e.g. bystander TTFT in runs without bystanders: nothing to compare
        rows.append(_timing_row(m, sa, sb, opts, lost))
    return rows
