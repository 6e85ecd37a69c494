"""`bench noise`'s engine: does the next run of the same commit land inside this run's
intervals? The project checking its own calibration.

For K runs of one preset on one commit, per headline metric (the ratios to pr27010 of
summary.csv, non-reference rows): every run's point and 95% interval per configuration, and
the coverage: over every ordered pair of runs (i, j), i != j, and every configuration, how
often run i's interval holds run j's point. Two independent estimates with honest 95%
intervals of equal width give about 83% (P(|Z| < 1.96 / sqrt 2)); with t intervals from n
repeats a little more (about 87% for n = 6). Far less means the intervals leave out noise
that the next run sees. Optionally the two-stage bootstrap's intervals are checked the same
way (bench.stats.bootstrap_ratio_interval, recomputed from requests.csv / steps.csv).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.analysis.serving_metrics import RATIO_SOURCES, metric_sample
from bench.analysis.summarize import config_groups
from bench.rundir.rundir import RunDir
from bench.rundir.schema import GATED_METRICS, RATIO_METRICS, REFERENCE_PROTOCOL
from bench.stats import bootstrap_ratio_interval

METRICS = [*RATIO_METRICS, "ttft_p50"]
EXPECTED = 0.83  # two honest 95% intervals' estimates
TARGET = 0.80  # the bar for every headline metric
THRESHOLD_STEP = 0.01
THRESHOLD_FLOOR = 0.02


def columns(metric: str) -> tuple[str, str, str, str]:
    """summary.csv's point, low, high and half-width columns of a metric."""
    if metric == "ttft_p50":
        return ("ttft_p50_ratio_vs_pr27010", "ttft_p50_ratio_ci_low", "ttft_p50_ratio_ci_high",
                "ttft_p50_ratio_mdd")
    return (f"{metric}_ratio", f"{metric}_ratio_ci_low", f"{metric}_ratio_ci_high",
            f"{metric}_ratio_mdd")


@dataclass(frozen=True)
class Estimate:
    point: float
    low: float | None
    high: float | None
    half_width: float | None
    repeats: int


Estimates = dict[tuple[str, str], Estimate]  # (configuration, metric) -> estimate


def _num(v: object) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _config(row: dict) -> str:
    return f"{row['protocol']}/{row['policy']}"


def from_summary(run_dir: Path) -> Estimates:
    """Every non-reference row's estimates of every metric, from summary.csv."""
    summary = RunDir(run_dir).summary()
    out = {}
    for row in summary.to_dict("records"):
        if row["protocol"] == REFERENCE_PROTOCOL:
            continue
        for m in METRICS:
            point, low, high, mdd = (_num(row.get(c)) for c in columns(m))
            if point is not None:
                n = row.get(f"{columns(m)[0].removesuffix('_vs_pr27010')}_repeats", 0)
                out[(_config(row), m)] = Estimate(point, low, high, mdd,
                                                  int(0 if pd.isna(n) else n))
    return out


def from_bootstrap(run_dir: Path, n_boot: int = 1000) -> Estimates:
    """The two-stage bootstrap's estimates of the RATIO_METRICS, from the run's rows."""
    requests = RunDir(run_dir).requests()
    steps = RunDir(run_dir).steps()
    groups, step_groups = config_groups(requests), config_groups(steps)
    out = {}
    for key, g in groups.items():
        ref = (REFERENCE_PROTOCOL, *key[1:])
        if key[0] == REFERENCE_PROTOCOL or ref not in groups:
            continue
        for m in RATIO_METRICS:
            x = metric_sample(g, step_groups.get(key), m)
            y = metric_sample(groups[ref], step_groups.get(ref), m)
            iv = bootstrap_ratio_interval(x, y, RATIO_SOURCES[m][2], n_boot)
            if iv.point is not None:
                out[(f"{key[0]}/{key[1]}", m)] = Estimate(iv.point, iv.low, iv.high,
                                                          iv.half_width, iv.n)
    return out


def coverage(runs: list[Estimates], metric: str) -> tuple[int, int]:
    """(hits, trials): run i's interval holding run j's point, i != j, per configuration."""
    hits = trials = 0
    for i, ei in enumerate(runs):
        for j, ej in enumerate(runs):
            if i == j:
                continue
            for (config, m), e in ei.items():
                other = ej.get((config, m))
                if m != metric or other is None or e.low is None or e.high is None:
                    continue
                trials += 1
                hits += e.low <= other.point <= e.high
    return hits, trials


def metric_figures(runs: list[Estimates], metric: str) -> dict:
    """Coverage, half-widths and the spread of the points between runs, for one metric."""
    hits, trials = coverage(runs, metric)
    widths = [e.half_width for r in runs for (c, m), e in r.items()
              if m == metric and e.half_width is not None]
    configs = sorted({c for r in runs for (c, m) in r if m == metric})
    spread = []
    for c in configs:
        points = [r[(c, metric)].point for r in runs if (c, metric) in r]
        if len(points) > 1 and all(p > 0 for p in points):
            mid = statistics.median(points)
            spread.append(max(abs(math.log(p / mid)) for p in points))
    repeats = [e.repeats for r in runs for (c, m), e in r.items() if m == metric]
    return {"coverage": hits / trials if trials else None, "hits": hits, "trials": trials,
            "half_width_median": statistics.median(widths) if widths else None,
            "half_width_max": max(widths) if widths else None,
            "run_to_run_max": math.expm1(max(spread)) if spread else None,
            "repeats": min(repeats) if repeats else 0, "configs": len(configs)}


def figures(runs: list[Estimates]) -> dict[str, dict]:
    return {m: metric_figures(runs, m) for m in METRICS
            if any(k[1] == m for r in runs for k in r)}


def thresholds(per_metric: dict[str, dict]) -> dict[str, float]:
    """The gate's threshold per gated metric: the largest half-width the noise runs had
    (the biggest difference a run of this preset could fail to resolve), rounded up to
    THRESHOLD_STEP and at least THRESHOLD_FLOOR."""
    out = {}
    for m in GATED_METRICS:
        widest = (per_metric.get(m) or {}).get("half_width_max")
        if widest is not None:
            steps = math.ceil(round(widest / THRESHOLD_STEP, 9))
            out[m] = round(max(THRESHOLD_FLOOR, steps * THRESHOLD_STEP), 2)
    return out


def per_config_table(runs: list[Estimates], names: list[str]) -> list[dict]:
    """One row per (configuration, metric, run): the point and its interval."""
    rows = []
    for i, r in enumerate(runs):
        for (config, metric), e in sorted(r.items()):
            rows.append({"run": names[i], "configuration": config, "metric": metric,
                         "point": e.point, "low": e.low, "high": e.high,
                         "half_width": e.half_width, "repeats": e.repeats})
    return rows
