"""`bench compare`'s decision rules, in one place: how a count row and a timing row of one
matched configuration get their verdict (better / worse / same, or info / not comparable).

Counts (rank 0, exact fractions): any change is flagged whatever the threshold, worse when B
issues more collectives, better when fewer. Polls follow timing, so when polls/req differ the
collectives issued inside polls are judged per poll; step collectives per step kind when the
steps carry `kind`. Timings: per repeat the metric's statistic of A and of B, paired by
repeat (the same seed), the ratio B/A as exp(mean of ln(b_r / a_r)) with its 95% t interval
over the repeats (bench.stats); worse when the whole interval lies above 1 + threshold, better
when below 1 - threshold, else same; not comparable when there is no interval (fewer than 3
paired repeats, or no scipy). A served A/B passes its own interval (TimingOptions.interval:
bench.ab.estimate.served, which also reads each serve's cpu_lost from ranks.csv) and its
level; each row names its method (`interval`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from bench.compare.metrics import Counts, TimingMetric
from bench.stats import Interval, Sample, ratio_interval, stat_value

PerRepeat = Mapping[int, float]
NAIVE = "t-mean"  # compare's interval: the t interval over the pairs' log ratios


@dataclass(frozen=True)
class TimingOptions:
    """The threshold, and the interval of B over A: `interval(b, a, lost_b, lost_a)` from
    per-repeat statistics and per-repeat cpu_lost (None: compare's t interval), named
    `method` in each row."""

    threshold: float
    interval: Callable[[PerRepeat, PerRepeat, PerRepeat, PerRepeat], Interval] | None = None
    method: str = NAIVE


def _direction(a: Fraction | None, b: Fraction | None) -> str:
    if a is None or b is None:
        return "same" if a == b else "not comparable"
    return "worse" if b > a else "better" if b < a else "same"


def _worst(verdicts: list[str]) -> str:
    for v in ("not comparable", "worse", "better"):
        if v in verdicts:
            return v
    return "same"


def _q(x: Fraction | None) -> str:
    return "-" if x is None else f"{float(x):.4g}"


def _judge_decision(a: Counts, b: Counts) -> tuple[str, str]:
    """Decision collectives per request, or per poll when the number of polls differs."""
    if (a.decision_per_req == b.decision_per_req or a.polls_per_req == b.polls_per_req
            or None in (a.decision_per_poll, b.decision_per_poll)):
        return _direction(a.decision_per_req, b.decision_per_req), ""
    return (_direction(a.decision_per_poll, b.decision_per_poll), "polls/req differ: judged "
            f"per poll, {_q(a.decision_per_poll)} -> {_q(b.decision_per_poll)}")


def _judge_critical(a: Counts, b: Counts) -> tuple[str, str]:
    """Critical collectives per request, or split into in-poll (per poll) and completion."""
    if (a.critical_per_req == b.critical_per_req or a.polls_per_req == b.polls_per_req
            or None in (a.poll_sites_per_poll, b.poll_sites_per_poll)):
        return _direction(a.critical_per_req, b.critical_per_req), ""
    verdict = _worst([_direction(a.poll_sites_per_poll, b.poll_sites_per_poll),
                      _direction(a.completion_per_req, b.completion_per_req)])
    return verdict, (f"polls/req differ: judged as in-poll per poll {_q(a.poll_sites_per_poll)}"
                     f" -> {_q(b.poll_sites_per_poll)} and completion per request "
                     f"{_q(a.completion_per_req)} -> {_q(b.completion_per_req)}")


def _judge_steps(a: Counts, b: Counts) -> tuple[str, str]:
    """Step collectives per step; per step kind when both runs' steps carry `kind`."""
    if a.step_per_step is None or b.step_per_step is None:
        side = "A" if a.step_per_step is None else "B"
        return "not comparable", f"no steps.csv rows in {side}"
    ka, kb = a.step_per_step_by_kind, b.step_per_step_by_kind
    kinds = sorted(set(ka) & set(kb))
    if not kinds:
        return _direction(a.step_per_step, b.step_per_step), ""
    verdict = _worst([_direction(ka[k], kb[k]) for k in kinds])
    if verdict == "same" and a.step_per_step == b.step_per_step:
        return verdict, ""
    return verdict, "judged per step kind: " + ", ".join(f"{k} {_q(ka[k])} -> {_q(kb[k])}"
                                                         for k in kinds)


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
                   reqs, _judge_decision(a, b)),
        _count_row("critical_collectives_per_req", a.critical_per_req, b.critical_per_req,
                   reqs, _judge_critical(a, b)),
        _count_row("background_collectives_per_req", a.background_per_req,
                   b.background_per_req, reqs,
                   (_direction(a.background_per_req, b.background_per_req), "")),
        _count_row("step_collectives_per_step", a.step_per_step, b.step_per_step, steps,
                   _judge_steps(a, b)),
    ]


def timing_verdict(low: float, high: float, threshold: float) -> str:
    """worse / better only when the whole CI lies beyond 1 +- threshold."""
    if low > 1 + threshold:
        return "worse"
    if high < 1 - threshold:
        return "better"
    return "same"


def _timing_row(metric: TimingMetric, sa: Sample | None, sb: Sample | None,
                opts: TimingOptions, lost: tuple[PerRepeat, PerRepeat] = ({}, {})) -> dict:
    row = {"metric": metric.name, "kind": "timing", "n_a": _size(sa), "n_b": _size(sb),
           "verdict": "not comparable", "interval": opts.method}
    if sa is None or sb is None:
        return row | {"note": f"only {'B' if sa is None else 'A'} carries {metric.needs}"}
    if not sa.values or not sb.values:
        return row | {"note": f"no samples in {'A' if not sa.values else 'B'}"}
    a, b = (pooled_stat(s, metric.stat) for s in (sa, sb))
    pb, pa = sb.per_repeat(metric.stat), sa.per_repeat(metric.stat)
    iv = ratio_interval(pb, pa) if opts.interval is None else opts.interval(pb, pa, *lost)
    row |= {"a": a, "b": b, "b_minus_a": b - a, "ratio_b_over_a": iv.point,
            "ratio_ci_low": iv.low, "ratio_ci_high": iv.high, "ratio_mdd": iv.half_width,
            "repeats": iv.n}
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


def lost_by_repeat(ranks: pd.DataFrame | None) -> dict[int, float]:
    """Repeat -> the serve's cpu_lost (ranks.csv, rank 0's row; one machine figure)."""
    if ranks is None or "cpu_lost" not in ranks or ranks.empty:
        return {}
    first = ranks.sort_values("rank").groupby("repeat")["cpu_lost"].first()
    values = pd.to_numeric(first, errors="coerce").dropna()
    return {int(r): float(v) for r, v in values.items()}
