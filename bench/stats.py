"""Metric math for the summary, the gate and compare: percentiles and ratios with CIs.

Pure functions over plain sequences; no pandas, no I/O. Ratios are always "x over y": in a
run's summary y is the reference protocol (pr27010) of the same configuration in the same
run; in `bench compare` x is run B and y run A.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

PERCENTILE_METHODS = ("linear", "nearest-rank")

RatioCI = tuple[float | None, float | None, float | None]


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


def _nonempty(by_repeat: Mapping[int, Sequence[float]]) -> dict[int, np.ndarray]:
    """Repeat -> float array, dropping repeats without values."""
    arrays = {r: np.asarray(v, dtype=float) for r, v in by_repeat.items()}
    return {r: a for r, a in sorted(arrays.items()) if a.size}


def _ratio(num: float, den: float) -> float | None:
    """num / den, or None when the ratio is undefined (den zero or NaN)."""
    if den == 0 or math.isnan(den) or math.isnan(num):
        return None
    return float(num / den)


Stat = str  # "mean" or a percentile "p50", "p99", ...


def stat_value(values: np.ndarray, stat: Stat, axis: int | None = None) -> np.ndarray | float:
    """The statistic of `values` ("mean" or "pNN", linear percentiles) along `axis`."""
    if stat == "mean":
        return np.mean(values, axis=axis)
    if stat.startswith("p") and stat[1:].replace(".", "", 1).isdigit():
        return np.percentile(values, float(stat[1:]), axis=axis)
    raise ValueError(f"unknown statistic {stat!r}; use 'mean' or 'pNN'")


def _bootstrap_stat(strata: dict[int, np.ndarray], stat: Stat, n_boot: int,
                    rng: np.random.Generator) -> np.ndarray:
    """The statistic of n_boot stratified resamples (each repeat resampled in place)."""
    parts = [a[rng.integers(0, a.size, size=(n_boot, a.size))] for a in strata.values()]
    return stat_value(np.concatenate(parts, axis=1), stat, axis=1)


def ratio_of_stat_ci(
    x_by_repeat: Mapping[int, Sequence[float]],
    y_by_repeat: Mapping[int, Sequence[float]],
    stat: Stat = "p50",
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> RatioCI:
    """(point, low, high): stat(all x) / stat(all y) with a percentile-bootstrap CI.

    The bootstrap is stratified by repeat: within each repeat, requests are resampled with
    replacement, for x and y independently, so every resample keeps the interleaved design.
    Deterministic for a given seed. All None when either side has no values.
    """
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"need n_boot >= 1 and 0 < level < 1, got {n_boot}, {level}")
    xs, ys = _nonempty(x_by_repeat), _nonempty(y_by_repeat)
    if not xs or not ys:
        return None, None, None
    point = _ratio(float(stat_value(np.concatenate(list(xs.values())), stat)),
                   float(stat_value(np.concatenate(list(ys.values())), stat)))
    if point is None:
        return None, None, None
    rng = np.random.default_rng(seed)
    bx, by = _bootstrap_stat(xs, stat, n_boot, rng), _bootstrap_stat(ys, stat, n_boot, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = bx / by
    alpha = (1 - level) / 2
    low, high = np.nanquantile(ratios, [alpha, 1 - alpha])
    return point, float(low), float(high)


def ratio_of_medians_ci(
    x_by_repeat: Mapping[int, Sequence[float]],
    y_by_repeat: Mapping[int, Sequence[float]],
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> RatioCI:
    """median(all x) / median(all y) with its stratified bootstrap CI (ratio_of_stat_ci)."""
    return ratio_of_stat_ci(x_by_repeat, y_by_repeat, "p50", n_boot, seed, level)


def per_repeat_ratios(
    x_by_repeat: Mapping[int, Sequence[float]], y_by_repeat: Mapping[int, Sequence[float]]
) -> dict[int, float]:
    """Repeat -> median(x) / median(y) of that repeat, for repeats where both have values."""
    return per_repeat_stat_ratios(x_by_repeat, y_by_repeat, "p50")


def diff_of_means_ci(
    x_by_repeat: Mapping[int, Sequence[float]],
    y_by_repeat: Mapping[int, Sequence[float]],
    n_boot: int = 2000,
    seed: int = 0,
) -> RatioCI:
    """(point, low, high): mean(all x) - mean(all y) with a stratified 95% bootstrap CI."""
    xs, ys = _nonempty(x_by_repeat), _nonempty(y_by_repeat)
    if not xs or not ys:
        return None, None, None
    point = float(np.mean(np.concatenate(list(xs.values())))
                  - np.mean(np.concatenate(list(ys.values()))))
    rng = np.random.default_rng(seed)
    diffs = _bootstrap_stat(xs, "mean", n_boot, rng) - _bootstrap_stat(ys, "mean", n_boot, rng)
    low, high = np.quantile(diffs, [0.025, 0.975])
    return point, float(low), float(high)


def per_repeat_stat_ratios(
    x_by_repeat: Mapping[int, Sequence[float]], y_by_repeat: Mapping[int, Sequence[float]],
    stat: Stat = "p50",
) -> dict[int, float]:
    """Repeat -> stat(x) / stat(y) of that repeat, for repeats where both have values."""
    xs, ys = _nonempty(x_by_repeat), _nonempty(y_by_repeat)
    out = {}
    for r in sorted(set(xs) & set(ys)):
        ratio = _ratio(float(stat_value(xs[r], stat)), float(stat_value(ys[r], stat)))
        if ratio is not None:
            out[r] = ratio
    return out
MAX_CELLS = 2_000_000  # bootstrap weights held at once (resamples x values), ~16 MB


@dataclass(frozen=True)
class Sample:
    """Values in strata (repeats) and resampling units within them.

    `units[r][i]` is the unit (0..k-1) that value i of repeat r belongs to: a bootstrap
    resample draws whole units with replacement, within each repeat. Unit = the value itself
    for TTFT or step times; unit = the request for pooled ITL gaps, which are correlated
    within a request. Empty units and repeats are dropped.
    """

    values: dict[int, np.ndarray]
    units: dict[int, np.ndarray]

    @classmethod
    def flat(cls, by_repeat: Mapping[int, Sequence[float]]) -> Sample:
        """Every value its own unit."""
        values = _nonempty(by_repeat)
        return cls(values, {r: np.arange(a.size) for r, a in values.items()})

    @classmethod
    def clustered(cls, by_repeat: Mapping[int, Sequence[Sequence[float]]]) -> Sample:
        """Repeat -> units (e.g. one list of ITL gaps per request)."""
        values, units = {}, {}
        for r in sorted(by_repeat):
            parts = [np.asarray(u, dtype=float) for u in by_repeat[r]]
            parts = [p for p in parts if p.size]
            if parts:
                values[r] = np.concatenate(parts)
                units[r] = np.repeat(np.arange(len(parts)), [p.size for p in parts])
        return cls(values, units)

    def pooled(self) -> np.ndarray:
        return np.concatenate(list(self.values.values())) if self.values else np.array([])

    @property
    def size(self) -> int:
        return sum(a.size for a in self.values.values())


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


def _bootstrap_percentiles(sample: Sample, q: float, n_boot: int,
                           rng: np.random.Generator) -> np.ndarray:
    """q-th percentiles of n_boot resamples; each repeat's units drawn with replacement."""
    draws = []  # per repeat: how often each unit is drawn, (n_boot, units); small
    for units in sample.units.values():
        k = int(units.max()) + 1
        draws.append(rng.multinomial(k, np.full(k, 1 / k), size=n_boot))
    pooled = sample.pooled()
    order = np.argsort(pooled, kind="stable")
    chunk = max(1, MAX_CELLS // pooled.size)  # bounds the (resamples x values) weights
    out = []
    for start in range(0, n_boot, chunk):
        weights = np.hstack([d[start:start + chunk][:, units]
                             for d, units in zip(draws, sample.units.values(), strict=True)])
        out.append(weighted_percentile(pooled[order], weights[:, order], q))
    return np.concatenate(out)


def ratio_of_percentiles_ci(
    x: Sample, y: Sample, q: float, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> RatioCI:
    """(point, low, high): q-th percentile of all x over that of all y (linear
    interpolation), with a percentile-bootstrap CI from resampling x and y independently,
    stratified by repeat (see Sample). Deterministic for a given seed. All None when either
    side is empty or the point ratio is undefined; low/high None when no resample defines it.
    """
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"need n_boot >= 1 and 0 < level < 1, got {n_boot}, {level}")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within [0, 100], got {q!r}")
    if not x.size or not y.size:
        return None, None, None
    point = _ratio(float(np.percentile(x.pooled(), q)), float(np.percentile(y.pooled(), q)))
    if point is None:
        return None, None, None
    rng = np.random.default_rng(seed)
    bx = _bootstrap_percentiles(x, q, n_boot, rng)
    by = _bootstrap_percentiles(y, q, n_boot, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = bx / by
    ratios = ratios[np.isfinite(ratios)]
    if not ratios.size:
        return point, None, None
    alpha = (1 - level) / 2
    low, high = np.quantile(ratios, [alpha, 1 - alpha])
    return point, float(low), float(high)
