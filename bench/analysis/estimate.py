"""Intervals of a paired A/B's ratio B/A from the pairs' log ratios, one function per method.

A pair is one configuration's serve by A and by B seconds apart on one seed; its log ratio
is ln(b / a) of a timing statistic. Each method returns an Estimate: its short name, the
ratio's point and interval (exp of the log-scale ones), the pairs behind it and, where pairs
were dropped, how many it kept:

- `t-mean`: exp(mean) with the t interval (bench.stats.t_interval);
- `hl-wilcoxon`: the Hodges-Lehmann estimate (median of the Walsh averages) with the
  Wilcoxon signed-rank interval (exact distribution up to EXACT_MAX pairs, normal beyond).
  A burst of outside load only adds delay to one side of a pair, so the log ratios carry
  rare long tails either way; the signed ranks bound each one's weight;
- `cpu-adjusted`: the intercept of the log ratios regressed on the pairs' difference in
  machine-lost CPU (ranks.csv cpu_lost of B minus of A), i.e. the ratio at equal
  disturbance (CUPED / ANCOVA with a covariate read from the machine, never the timings);
- `drop-disturbed`: the t-mean over the pairs neither of whose serves lost more than
  DROP_LIMIT of the machine's CPU (limit fixed in advance, applied to both sides);
- `cpu-time`: the t-mean of the ranks' own CPU seconds' log ratios, a measure beside wall
  time that outside load moves less.

Every interval needs scipy.stats (t and normal quantiles, linregress); without it each
method gives its point and no interval, as bench.stats does. docs/metrics.md, "Intervals",
says which method the served A/B uses (bench.analysis.estimate.SERVED) and why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import pandas as pd

from bench import stats as base  # its _scipy_stats read at each call (a test hides scipy)
from bench.rundir.schema import DISTURBED_LIMIT
from bench.stats import LEVEL, MIN_REPEATS, NO_SCIPY, Interval, too_few

PerRepeat = Mapping[int, float]  # repeat -> one serve's statistic (or its cpu_lost)
EXACT_MAX = 50  # pairs up to which the Wilcoxon interval uses the exact distribution
DROP_LIMIT = 0.25  # drop-disturbed: a serve that lost more of the machine's CPU is dropped


@dataclass(frozen=True)
class Estimate:
    """A ratio's point and interval by one method; `kept` the pairs used of `n` given."""

    name: str
    point: float | None
    low: float | None
    high: float | None
    n: int
    kept: int | None = None
    note: str = ""

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def half_width(self) -> float | None:
        """The interval's half-width as a fraction (the larger side, log scale)."""
        if not self.has_interval or self.point is None:
            return None
        return math.expm1(max(math.log(self.point / self.low), math.log(self.high / self.point)))

    def interval(self) -> Interval:
        """As bench.stats' Interval (what the comparison's rows carry)."""
        return Interval(self.point, self.low, self.high, self.n if self.kept is None
                        else self.kept, self.half_width, self.note)


def _refused(name: str, d: np.ndarray, center: Callable[[np.ndarray], float],
             need: int = MIN_REPEATS) -> Estimate | None:
    """The point-only Estimate when d is too short or scipy is missing, else None."""
    n = int(d.size)
    if n == 0:
        return Estimate(name, None, None, None, 0, note="no paired repeats")
    point = math.exp(center(d))
    if n < need:
        return Estimate(name, point, None, None, n, note=too_few(n))
    if base._scipy_stats() is None:
        return Estimate(name, point, None, None, n, note=NO_SCIPY)
    return None


def _check(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"need 0 < level < 1, got {level}")


def t_mean(d: np.ndarray, level: float = LEVEL, name: str = "t-mean") -> Estimate:
    """exp(mean(d)) with exp(mean +- t_{n-1} sd / sqrt(n))."""
    _check(level)
    d = np.asarray(d, dtype=float)
    refused = _refused(name, d, np.mean)
    if refused is not None:
        return refused
    stats = base._scipy_stats()
    m = float(np.mean(d))
    h = float(stats.t.ppf((1 + level) / 2, d.size - 1)) * float(np.std(d, ddof=1)) \
        / math.sqrt(d.size)
    return Estimate(name, math.exp(m), math.exp(m - h), math.exp(m + h), int(d.size))


def walsh(d: np.ndarray) -> np.ndarray:
    """The n(n+1)/2 Walsh averages (d_i + d_j) / 2, i <= j, sorted."""
    i, j = np.triu_indices(d.size)
    return np.sort((d[i] + d[j]) / 2)


def signed_rank_cdf(n: int) -> np.ndarray:
    """P(T+ <= t), t = 0..n(n+1)/2, of the signed-rank statistic of n pairs under no
    effect: exact integer counts of the subsets of {1..n} by sum, over 2**n."""
    return np.asarray(_signed_rank_cdf(n))


@cache
def _signed_rank_cdf(n: int) -> tuple[float, ...]:
    counts = [1] + [0] * (n * (n + 1) // 2)
    for k in range(1, n + 1):
        for s in range(k * (k + 1) // 2, k - 1, -1):
            counts[s] += counts[s - k]
    cum, out = 0, []
    for c in counts:
        cum += c
        out.append(cum / 2 ** n)
    return tuple(out)


def wilcoxon_rank(n: int, level: float) -> int:
    """c: the interval is the (c+1)-th to the (M-c)-th Walsh average (M = n(n+1)/2), c the
    largest with P(T+ <= c) <= (1 - level) / 2; -1 when even c = 0 is too likely (the level
    cannot be reached with n pairs)."""
    alpha2 = (1 - level) / 2
    if n <= EXACT_MAX:
        cdf = signed_rank_cdf(n)
        return int(np.searchsorted(cdf, alpha2, side="right")) - 1
    stats = base._scipy_stats()
    m = n * (n + 1) / 2
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return int(math.floor(m / 2 - 0.5 - float(stats.norm.ppf(1 - alpha2)) * sd))


def hodges_lehmann(d: np.ndarray, level: float = LEVEL) -> Estimate:
    """exp(median of the Walsh averages) with the Wilcoxon signed-rank interval."""
    _check(level)
    d = np.asarray(d, dtype=float)
    name = "hl-wilcoxon"
    refused = _refused(name, d, lambda x: float(np.median(walsh(x))))
    if refused is not None:
        return refused
    w = walsh(d)
    point = math.exp(float(np.median(w)))
    c = wilcoxon_rank(int(d.size), level)
    if c < 0:
        return Estimate(name, point, None, None, int(d.size),
                        note=f"{d.size} pairs cannot reach a {level:.4g} signed-rank interval")
    return Estimate(name, point, math.exp(float(w[c])), math.exp(float(w[w.size - 1 - c])),
                    int(d.size))


def cpu_adjusted(d: np.ndarray, lost_diff: np.ndarray, level: float = LEVEL) -> Estimate:
    """The intercept of d regressed on lost_diff (B's cpu_lost minus A's per pair): the log
    ratio at equal disturbance, with a t_{n-2} interval from linregress's stderr. Falls back
    to the t-mean (named so in the note) when the covariate does not vary or there are no
    more than MIN_REPEATS pairs."""
    _check(level)
    d, x = np.asarray(d, dtype=float), np.asarray(lost_diff, dtype=float)
    if d.shape != x.shape:
        raise ValueError(f"need one covariate per pair, got {x.size} for {d.size}")
    name = "cpu-adjusted"
    if d.size <= MIN_REPEATS or np.ptp(x) == 0:  # no degree of freedom to spare: the t-mean
        e = t_mean(d, level, name)
        why = "covariate constant" if d.size > MIN_REPEATS else f"{d.size} pairs"
        return Estimate(name, e.point, e.low, e.high, e.n, note=e.note or f"{why}: t-mean")
    refused = _refused(name, d, np.mean)
    if refused is not None:
        return refused
    stats = base._scipy_stats()
    fit = stats.linregress(x, d)
    h = float(stats.t.ppf((1 + level) / 2, d.size - 2)) * float(fit.intercept_stderr)
    b0 = float(fit.intercept)
    return Estimate(name, math.exp(b0), math.exp(b0 - h), math.exp(b0 + h), int(d.size))


def drop_disturbed(d: np.ndarray, lost_a: np.ndarray, lost_b: np.ndarray,
                   level: float = LEVEL, limit: float = DROP_LIMIT) -> Estimate:
    """The t-mean over the pairs whose two serves each lost at most `limit` (NaN: kept)."""
    d = np.asarray(d, dtype=float)
    la, lb = (np.nan_to_num(np.asarray(x, dtype=float), nan=0.0) for x in (lost_a, lost_b))
    keep = (la <= limit) & (lb <= limit)
    e = t_mean(d[keep], level, "drop-disturbed")
    return Estimate(e.name, e.point, e.low, e.high, int(d.size), int(keep.sum()), e.note)


def cpu_time(cpu_a: np.ndarray, cpu_b: np.ndarray, level: float = LEVEL) -> Estimate:
    """The ratio of the ranks' own CPU seconds B/A: the t-mean of the pairs' log ratios."""
    a, b = np.asarray(cpu_a, dtype=float), np.asarray(cpu_b, dtype=float)
    ok = (a > 0) & (b > 0)
    return t_mean(np.log(b[ok] / a[ok]), level, "cpu-time")


# ---- the served A/B's method: the one place it is chosen ----------------------------------

METHODS: dict[str, Callable[[np.ndarray, np.ndarray, float], Estimate]] = {
    "t-mean": lambda d, x, level: t_mean(d, level),
    "hl-wilcoxon": lambda d, x, level: hodges_lehmann(d, level),
    "cpu-adjusted": cpu_adjusted,
}
# The served A/B's interval method (ab.json and each row's `interval` name it): by the
# machine's disturbance over the pairs' serves, read from the machine, never a timing, at a
# limit fixed in advance (bench.rundir.schema.DISTURBED_LIMIT, the limit the gate's
# INCONCLUSIVE reads): cpu-adjusted where more than a tenth of the serves lost more than it
# (their cpu_lost p90 above it), since then some pairs carry a disturbance one side met and
# the other did not, which the lost CPU explains; the t-mean where they did not, where the
# covariate is noise and the t-mean's quiet power and false alarms are measured. Figures:
# docs/metrics.md, "Intervals".
SERVED = "by-disturbance"
QUIET_METHOD, DISTURBED_METHOD = "t-mean", "cpu-adjusted"
SHARE = 0.9  # the quantile of the serves' cpu_lost held against the limit
# what a result file (the gate's decision.json `estimator`) records of the served intervals
ESTIMATOR = (f"{QUIET_METHOD}, {DISTURBED_METHOD} when the pairs' cpu lost p{SHARE * 100:.0f} "
             f"exceeds {DISTURBED_LIMIT:.0%}, 95 % at every look")


def method_for(lost: list[float], limit: float = DISTURBED_LIMIT) -> str:
    """by-disturbance's method for pairs whose serves lost these shares of the machine's CPU
    (rank 0's cpu_lost, both sides): cpu-adjusted where their p90 exceeds `limit` (more
    than a tenth of the serves disturbed); the t-mean where it does not or nothing was
    measured (no excuse without a measure)."""
    values = [v for v in lost if math.isfinite(v)]
    return (DISTURBED_METHOD if values and float(np.quantile(values, SHARE)) > limit
            else QUIET_METHOD)


def served(b: Mapping[int, float], a: Mapping[int, float], lost_b: Mapping[int, float],
           lost_a: Mapping[int, float], level: float = LEVEL, method: str = SERVED
           ) -> Interval:
    """The served A/B's interval of B over A from per-repeat statistics paired by repeat and
    each serve's cpu_lost (ranks.csv); where a pair lacks cpu_lost the covariate is taken
    as equal on both sides (difference 0). The Interval's `method` names the method used
    and the level (`cpu-adjusted 0.95`)."""
    reps = [r for r in sorted(set(a) & set(b))
            if math.isfinite(a[r]) and math.isfinite(b[r]) and a[r] > 0 and b[r] > 0]
    d = np.asarray([math.log(b[r] / a[r]) for r in reps], dtype=float)
    x = np.asarray([_lost(lost_b, r) - _lost(lost_a, r) for r in reps], dtype=float)
    if method == SERVED:
        method = method_for([float(m[r]) for r in reps for m in (lost_a, lost_b)
                             if m.get(r) is not None])
    iv = METHODS[method](d, x, level).interval()
    return replace(iv, method=f"{method} {level:.4g}")


def _lost(lost: Mapping[int, float], r: int) -> float:
    v = lost.get(r)
    return 0.0 if v is None or not math.isfinite(v) else float(v)


def lost_by_repeat(ranks: pd.DataFrame | None) -> dict[int, float]:
    """Repeat -> the serve's cpu_lost (ranks.csv, rank 0's row; one machine figure)."""
    if ranks is None or "cpu_lost" not in ranks or ranks.empty:
        return {}
    first = ranks.sort_values("rank").groupby("repeat")["cpu_lost"].first()
    values = pd.to_numeric(first, errors="coerce").dropna()
    return {int(r): float(v) for r, v in values.items()}
