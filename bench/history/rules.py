"""The history's two rules, over one machine's series (bench.history.series), and the
check that names a commit to re-record the baseline at. docs/history.md states them with
their measured false-alarm rates (bench.history.simulate).

Every commit's log ratio y counts with its own weight 1/var (var from its interval), and
each series' spread between neighbouring commits beyond their intervals (phi, at least 1:
the median over neighbours of (y[i+1] - y[i])^2 / (var[i] + var[i+1]), over the median of
chi-square with one degree of freedom) widens every interval, so a machine whose commits
scatter more than their gates said does not read as steps.

Step: at each point k of a series (epoch), the weighted mean of the `window` commits after
it (k included) minus that of the `window` before (at least `min_side` each side), its
interval z * se with z for alpha / M two-sided (Bonferroni over the M points of every
series of the machine looked at). A step is a point whose whole interval lies beyond
+-min_step; of neighbouring flagged points (within a window) the one with the largest
|change| / se is named: the first commit after the step.

Creep: the drift of the `recent` newest commits up to k against the `window` oldest kept
commits of the epoch (weighted means, as above; Bonferroni over every k of every series),
resolved above creep_threshold (its whole interval) while every gate of that series from
the oldest kept commit to k PASSed: the change slipped by one gate at a time."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from bench.history.series import Point, Series, z_of

CHI2_1_MEDIAN = 0.454936  # scipy.stats.chi2(1).median()


@dataclass(frozen=True)
class Rules:
    window: int = 5
    recent: int = 3
    min_side: int = 2
    min_step: float = 0.005
    creep_threshold: float = 0.02
    alpha: float = 0.05  # family-wise, per rule, per machine


@dataclass
class Finding:
    """A step (`kind` "step") or a creep, on the ratio scale: change with its corrected
    interval; `commit` the first commit after a step or the commit a creep resolved at;
    `before` the last commit before the step or the oldest kept commit of a creep."""

    kind: str
    series: Series
    commit: str
    before: str
    change: float
    low: float
    high: float
    last: str  # a step: the newest commit of its after-window (bisect's BAD)
    commits: int  # commits in the span a creep covers / in a step's two windows


def epochs(series: Series) -> list[list[Point]]:
    """The series' points with an interval, one list per epoch."""
    out: dict[int, list[Point]] = {}
    for p in series.points:
        if p.var is not None and p.var > 0:
            out.setdefault(p.epoch, []).append(p)
    return list(out.values())


def phi(points: list[Point]) -> float:
    """The spread beyond the intervals between neighbouring commits (module doc), >= 1."""
    terms = [(b.y - a.y) ** 2 / (a.var + b.var) for a, b in zip(points, points[1:], strict=False)]
    if len(terms) < 3:
        return 1.0
    return max(1.0, statistics.median(terms) / CHI2_1_MEDIAN)


def wmean(points: list[Point]) -> tuple[float, float]:
    """Inverse-variance weighted mean of y and its variance."""
    w = [1 / p.var for p in points]
    return sum(wi * p.y for wi, p in zip(w, points, strict=True)) / sum(w), 1 / sum(w)


def _splits(pts: list[Point], rules: Rules):
    for k in range(rules.min_side, len(pts) - rules.min_side + 1):
        yield k, pts[max(0, k - rules.window):k], pts[k:k + rules.window]


def _creep_points(pts: list[Point], rules: Rules):
    for k in range(rules.window + rules.recent - 1, len(pts)):
        yield k, pts[:rules.window], pts[k - rules.recent + 1:k + 1]


def _diff(before: list[Point], after: list[Point], f: float) -> tuple[float, float]:
    (mb, vb), (ma, va) = wmean(before), wmean(after)
    return ma - mb, math.sqrt((vb + va) * f)


def steps(all_series: list[Series], rules: Rules = Rules()) -> list[Finding]:
    """The steps of every series of one machine (module doc), oldest first."""
    parts = [(s, pts) for s in all_series for pts in epochs(s)]
    looked = sum(len(list(_splits(pts, rules))) for _, pts in parts)
    if not looked:
        return []
    z = z_of(1 - rules.alpha / looked)
    edge = math.log1p(rules.min_step)
    found = []
    for s, pts in parts:
        f = phi(pts)
        flagged = []
        for k, before, after in _splits(pts, rules):
            d, se = _diff(before, after, f)
            if d - z * se > edge or d + z * se < -edge:
                flagged.append((k, d, se, after))
        for k, d, se, after in _strongest(flagged, pts, rules, f):
            found.append(Finding("step", s, pts[k].commit, pts[k - 1].commit, math.expm1(d),
                                 math.expm1(d - z * se), math.expm1(d + z * se),
                                 after[-1].commit, min(k, rules.window) + len(after)))
    return sorted(found, key=lambda x: (_index(x.series, x.commit), x.series.name))


def _strongest(flagged: list[tuple], pts: list[Point], rules: Rules, f: float) -> list[tuple]:
    """One step per cluster of flagged points (same direction, closer than a window): the
    flagged point where one mean before and one after fit the cluster's commits (its points
    and a window either side) best, by weighted squares."""
    clusters: list[list[tuple]] = []
    for item in flagged:
        last = clusters[-1][-1] if clusters else None
        if last and item[0] - last[0] < rules.window and (item[1] > 0) == (last[1] > 0):
            clusters[-1].append(item)
        else:
            clusters.append([item])
    out = []
    for c in clusters:
        span = pts[max(0, c[0][0] - rules.window):c[-1][0] + rules.window]
        out.append(min(c, key=lambda item, span=span: _misfit(span, pts[item[0]].index)))
    return out


def _misfit(span: list[Point], k: int) -> float:
    """Weighted squares of `span` about one mean before commit position k and one from it."""
    parts = [p for p in span if p.index < k], [p for p in span if p.index >= k]
    return sum(sum((p.y - wmean(side)[0]) ** 2 / p.var for p in side) for side in parts if side)


def _index(series: Series, commit: str) -> int:
    return next((p.index for p in series.points if p.commit == commit), -1)


def creeps(all_series: list[Series], rules: Rules = Rules()) -> list[Finding]:
    """Per series and epoch, the first commit where the drift resolved above the creep
    threshold while every gate of the series up to it PASSed (module doc)."""
    parts = [(s, pts) for s in all_series for pts in epochs(s)]
    looked = sum(len(list(_creep_points(pts, rules))) for _, pts in parts)
    if not looked:
        return []
    z = z_of(1 - rules.alpha / looked)
    edge = math.log1p(rules.creep_threshold)
    found = []
    for s, pts in parts:
        f = phi(pts)
        verdicts = {p.commit: p.verdict for p in s.points}
        for k, first, recent in _creep_points(pts, rules):
            d, se = _diff(first, recent, f)
            span = [p for p in s.points if pts[0].index <= p.index <= pts[k].index]
            if d - z * se > edge and all(verdicts[p.commit] == "PASS" for p in span):
                found.append(Finding("creep", s, pts[k].commit, pts[0].commit, math.expm1(d),
                                     math.expm1(d - z * se), math.expm1(d + z * se),
                                     pts[k].commit, len(span)))
                break
    return found


def drift(points: list[Point], rules: Rules = Rules(), level: float = 0.95) -> list[tuple]:
    """Per point of one epoch: (index, drift, low, high) of its own y against the weighted
    mean of the epoch's `window` oldest commits, at `level`, widened by phi (the figure's
    lower panel; the rule reads windows, not single commits)."""
    if len(points) < 2:
        return []
    f, z = phi(points), z_of(level)
    m0, v0 = wmean(points[:rules.window])
    out = []
    for p in points:
        se = math.sqrt((p.var + v0) * f)
        d = p.y - m0
        out.append((p.index, math.expm1(d), math.expm1(d - z * se), math.expm1(d + z * se)))
    return out

