"""Metric math for the summary, compare, ab and the gate: percentiles, per-repeat statistics
and their between-repeat intervals (docs/metrics.md, "Intervals").

The unit that replicates is a repeat (one whole serve: one burst, one queue drain, one set of
decode batches). Requests, steps and ITL gaps inside one repeat share that schedule, so they
are never independent samples for an interval. Every interval here is over repeats: per
repeat one statistic per side, paired by repeat (the same seed, run next to each other in
time), and a t interval over the paired log ratios (or differences). Pure functions over plain
mappings; no pandas, no I/O. Ratios are always "x over y".
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

PERCENTILE_METHODS = ("linear", "nearest-rank")
LEVEL = 0.95
MIN_REPEATS = 3  # paired repeats an interval needs: with 2, sd has 1 degree of freedom
NO_SCIPY = "scipy is not installed"


def percentile(values: Sequence[float], q: float, method: str = "linear") -> float | None:
    """The q-th percentile (0 <= q <= 100) of `values`; None when there are none.

    linear: numpy's default interpolation between closest ranks.
    nearest-rank: the smallest value with at least q% of the values at or below it,
    i.e. the value of 1-based rank ceil(q/100 * n) (rank 1 for q = 0).
    """
    if method not in PERCENTILE_METHODS:
        raise ValueError(f"unknown percentile method {method!r}; use one of {PERCENTILE_METHODS}")
    if not isinstance(q, numbers.Real) or math.isnan(q) or not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within [0, 100], got {q!r}")
    arr = np.sort(np.asarray(values, dtype=float))
    if arr.size == 0:
        return None
    if method == "linear":
        return float(np.percentile(arr, q))
    # round() guards ceil against float noise such as 0.07 * 100 = 7.000000000000001
    rank = max(1, math.ceil(round(q / 100 * arr.size, 9)))
    return float(arr[rank - 1])


Stat = str  # "mean" or a percentile "p50", "p99", ...


def stat_value(values: np.ndarray, stat: Stat, axis: int | None = None) -> np.ndarray | float:
    """The statistic of `values` ("mean" or "pNN", linear percentiles) along `axis`."""
    if stat == "mean":
        return np.mean(values, axis=axis)
    if stat.startswith("p") and stat[1:].replace(".", "", 1).isdigit():
        return np.percentile(values, float(stat[1:]), axis=axis)
    raise ValueError(f"unknown statistic {stat!r}; use 'mean' or 'pNN'")


def per_repeat_stat(by_repeat: Mapping[int, Sequence[float]], stat: Stat) -> dict[int, float]:
    """Repeat -> the statistic of that repeat's values, for repeats that have values."""
    out = {}
    for r in sorted(by_repeat):
        values = np.asarray(by_repeat[r], dtype=float)
        if values.size:
            out[int(r)] = float(stat_value(values, stat))
    return out


@dataclass(frozen=True)
class Interval:
    """A point and its 95% between-repeat interval.

    `n` is the number of paired repeats behind it; `half_width` the interval's half-width
    (for a ratio, as a fraction: the interval is point x [1/(1+h), 1+h]; for a difference, in
    the values' unit): the smallest difference this run could tell from none, its minimum
    detectable difference. `note` says why low/high are None when there is a point;
    `method` names how it was made where the caller chose among several
    (bench.analysis.estimate).
    """

    point: float | None
    low: float | None
    high: float | None
    n: int
    half_width: float | None = None
    note: str = ""
    method: str = ""

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None


def paired(x: Mapping[int, float], y: Mapping[int, float], log: bool) -> np.ndarray:
    """Per repeat present on both sides with finite values: ln(x/y) (log) or x - y. A ratio
    needs both values > 0."""
    out = []
    for r in sorted(set(x) & set(y)):
        a, b = float(x[r]), float(y[r])
        if not (math.isfinite(a) and math.isfinite(b)):
            continue
        if log and (a <= 0 or b <= 0):
            continue
        out.append(math.log(a / b) if log else a - b)
    return np.asarray(out, dtype=float)


def binomial_half_cdf(n: int) -> np.ndarray:
    """P(Binomial(n, 1/2) <= k) for k = 0..n, exact (integer sums over 2**n, one rounding).
    Not from scipy: the c-beside interval (bench.run.calibrate) and the A/B's sign test need
    it in every run, and a node without scipy (a GPU node as shipped) must still finish its
    runs (docs/metrics.md, "Without scipy")."""
    if n < 0:
        raise ValueError(f"need n >= 0, got {n}")
    cum, out = 0, []
    for k in range(n + 1):
        cum += math.comb(n, k)
        out.append(cum / 2 ** n)  # int / int: correctly rounded, however large n
    return np.asarray(out)


def sign_test_p(above: int, n: int) -> float:
    """The two-sided exact sign test's p of `above` of n nonzero pairs above 0: twice the
    smaller tail of Binomial(n, 1/2), at most 1 (scipy.stats.binomtest's for p = 1/2)."""
    if not 0 <= above <= n or n < 1:
        raise ValueError(f"need 0 <= above <= n and n >= 1, got {above}, {n}")
    return min(1.0, 2 * float(binomial_half_cdf(n)[min(above, n - above)]))


def _scipy_stats():
    """scipy.stats, or None where it is missing (a GPU node as shipped, no package index)."""
    try:
        from scipy import stats
    except ImportError:
        return None
    return stats


def scipy_available() -> bool:
    return _scipy_stats() is not None


def wilcoxon_p(d: np.ndarray) -> float | None:
    """The two-sided Wilcoxon signed-rank p of d against 0 (scipy.stats'); None without
    scipy."""
    stats = _scipy_stats()
    return None if stats is None else float(stats.wilcoxon(d).pvalue)


def too_few(n: int) -> str:
    return f"too few repeats for an interval ({n} paired, needs {MIN_REPEATS})"


def t_half_width(d: np.ndarray, level: float = LEVEL) -> float:
    """t_{n-1, (1+level)/2} x sd(d) / sqrt(n), from scipy.stats (needs len(d) >= 2)."""
    stats = _scipy_stats()
    assert stats is not None and d.size >= 2
    sd = float(np.std(d, ddof=1))
    return float(stats.t.ppf((1 + level) / 2, d.size - 1)) * sd / math.sqrt(d.size)


def t_interval(d: np.ndarray, log: bool, level: float = LEVEL) -> Interval:
    """The interval of mean(d): exp(mean(d) +- h) for log ratios, mean(d) +- h for
    differences, h = t_half_width(d). Refuses (point only, with a note) below MIN_REPEATS
    paired repeats or without scipy."""
    if not 0 < level < 1:
        raise ValueError(f"need 0 < level < 1, got {level}")
    n = int(d.size)
    if n == 0:
        return Interval(None, None, None, 0, None, "no paired repeats")
    mean = float(np.mean(d))
    point = math.exp(mean) if log else mean
    if n < MIN_REPEATS:
        return Interval(point, None, None, n, None, too_few(n))
    if _scipy_stats() is None:
        return Interval(point, None, None, n, None, NO_SCIPY)
    h = t_half_width(d, level)
    if log:
        return Interval(point, math.exp(mean - h), math.exp(mean + h), n, math.expm1(h))
    return Interval(point, mean - h, mean + h, n, h)


def ratio_interval(x: Mapping[int, float], y: Mapping[int, float],
                   level: float = LEVEL) -> Interval:
    """x over y from per-repeat statistics paired by repeat: exp(mean of ln(x_r / y_r)) with
    its t interval (docs/metrics.md, "Intervals")."""
    return t_interval(paired(x, y, log=True), log=True, level=level)


def diff_interval(x: Mapping[int, float], y: Mapping[int, float],
                  level: float = LEVEL) -> Interval:
    """x minus y from per-repeat statistics paired by repeat: mean of (x_r - y_r) with its t
    interval."""
    return t_interval(paired(x, y, log=False), log=False, level=level)


def per_repeat_ratios(x: Mapping[int, float], y: Mapping[int, float]) -> dict[int, float]:
    """Repeat -> x_r / y_r for the repeats both have (values > 0)."""
    return {r: float(x[r]) / float(y[r]) for r in sorted(set(x) & set(y))
            if float(y[r]) > 0 and float(x[r]) > 0}


# ---- the two-stage bootstrap: a cross-check of the t interval (bench noise) --------------

MAX_CELLS = 2_000_000  # bootstrap weights held at once (resamples x values), ~16 MB


@dataclass(frozen=True)
class Sample:
    """Values in repeats and resampling units within them.

    `units[r][i]` is the unit (0..k-1) that value i of repeat r belongs to: the bootstrap's
    second stage draws whole units with replacement, within each repeat. Unit = the value
    itself for TTFT or step times; unit = the request for pooled ITL gaps, which are
    correlated within a request. Empty units and repeats are dropped.
    """

    values: dict[int, np.ndarray]
    units: dict[int, np.ndarray]

    @classmethod
    def flat(cls, by_repeat: Mapping[int, Sequence[float]]) -> Sample:
        """Every value its own unit."""
        arrays = {int(r): np.asarray(v, dtype=float) for r, v in sorted(by_repeat.items())}
        values = {r: a for r, a in arrays.items() if a.size}
        return cls(values, {r: np.arange(a.size) for r, a in values.items()})

    @classmethod
    def clustered(cls, by_repeat: Mapping[int, Sequence[Sequence[float]]]) -> Sample:
        """Repeat -> units (e.g. one list of ITL gaps per request)."""
        values, units = {}, {}
        for r in sorted(by_repeat):
            parts = [np.asarray(u, dtype=float) for u in by_repeat[r]]
            parts = [p for p in parts if p.size]
            if parts:
                values[int(r)] = np.concatenate(parts)
                units[int(r)] = np.repeat(np.arange(len(parts)), [p.size for p in parts])
        return cls(values, units)

    def per_repeat(self, stat: Stat) -> dict[int, float]:
        return per_repeat_stat(self.values, stat)


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of `weights` (counts per value of the sorted `values`): the q-th percentile,
    by linear interpolation, of the sample holding value i weights[row, i] times. Equals
    np.percentile(np.repeat(values, weights[row]), q)."""
    cum = np.cumsum(weights, axis=1)
    h = q / 100 * (cum[:, -1] - 1)
    lo = np.floor(h)
    hi = np.minimum(lo + 1, cum[:, -1] - 1)

    def at(k: np.ndarray) -> np.ndarray:  # the k-th (0-based) value of the expanded sample
        return values[(cum <= k[:, None]).sum(axis=1)]
    v_lo = at(lo)
    return v_lo + (h - lo) * (at(hi) - v_lo)


def _resampled_stat(values: np.ndarray, units: np.ndarray, stat: Stat, n_boot: int,
                    rng: np.random.Generator) -> np.ndarray:
    """The statistic of n_boot resamples of one repeat, its units drawn with replacement."""
    k = int(units.max()) + 1
    draws = rng.multinomial(k, np.full(k, 1 / k), size=n_boot)  # (n_boot, units)
    order = np.argsort(values, kind="stable")
    chunk = max(1, MAX_CELLS // values.size)  # bounds the (resamples x values) weights
    out = []
    for start in range(0, n_boot, chunk):
        weights = draws[start:start + chunk][:, units][:, order]
        if stat == "mean":
            out.append(weights @ values[order] / weights.sum(axis=1))
        else:
            out.append(weighted_percentile(values[order], weights, float(stat[1:])))
    return np.concatenate(out)


def bootstrap_ratio_interval(x: Sample, y: Sample, stat: Stat, n_boot: int = 2000,
                             seed: int = 0, level: float = LEVEL) -> Interval:
    """x over y by a two-stage bootstrap: draw the paired repeats with replacement, then
    within each drawn repeat its units (x and y independently), and take exp(mean over the
    drawn repeats of ln(stat x / stat y)); a percentile interval of n_boot such draws. The
    point is the t interval's, exp(mean of the per-repeat log ratios). Both stages resample
    the within-repeat noise, which the between-repeat spread already holds, so this interval
    is, if anything, wider than the t interval. Deterministic for a given seed."""
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"need n_boot >= 1 and 0 < level < 1, got {n_boot}, {level}")
    stat_value(np.array([1.0]), stat)  # a bad statistic fails here, not deep inside
    sx, sy = x.per_repeat(stat), y.per_repeat(stat)
    reps = [r for r in sorted(set(sx) & set(sy)) if sx[r] > 0 and sy[r] > 0]
    base = t_interval(paired(sx, sy, log=True), log=True, level=level)
    if len(reps) < MIN_REPEATS:
        return base
    rng = np.random.default_rng(seed)
    logs = np.vstack([np.log(_resampled_stat(x.values[r], x.units[r], stat, n_boot, rng))
                      - np.log(_resampled_stat(y.values[r], y.units[r], stat, n_boot, rng))
                      for r in reps])  # (repeats, n_boot)
    picks = rng.integers(0, len(reps), size=(n_boot, len(reps)))
    means = logs[picks, np.arange(n_boot)[:, None]].mean(axis=1)
    means = means[np.isfinite(means)]
    alpha = (1 - level) / 2
    low, high = np.exp(np.quantile(means, [alpha, 1 - alpha]))
    h = max(math.log(base.point / low), math.log(high / base.point))
    return Interval(base.point, float(low), float(high), len(reps), math.expm1(h))

