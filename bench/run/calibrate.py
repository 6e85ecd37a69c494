"""Measures c, the latency of one small all-reduce on the run's own control-plane group,
before the cells run: the input of the overhead model (bench.analysis.overhead).

Every rank runs the same loop on its PP stage's TP CPU group (`tp_cpu`), through `Comm`
with call site `calibration`, on a counter of its own (the system's counts stay exact).
The tensor is the decision vote's shape: two int32. Rank 0's samples are the measurement;
every rank's median is kept to show the spread. With an added cost (--collective-delay-ms)
the probe pays it as the system's collectives do, so c includes it. With TP = 1 there is no
control-plane all-reduce (SGLang skips it) and c is 0 by definition.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from bench.stats import binomial_half_cdf, percentile
from hicache.comm.comm import CALIBRATION, CollectiveCounter, Comm
from hicache.comm.groups import Groups, Layout

METHOD = ("back-to-back MAX all-reduces of 2 int32 on the TP CPU gloo group, timed around "
          "each call on every rank (rank 0's samples reported), after a warm-up; mean CI: "
          "percentile bootstrap over the samples")


def measure(layout: Layout, groups: Groups, n: int = 300, warmup: int = 30,
            delay_ms: float = 0.0) -> list[float]:
    """This rank's n all-reduce latencies in ms ([] when TP = 1), each with the added cost
    `delay_ms` the system's collectives pay."""
    if groups.size("tp_cpu") == 1:
        return []
    comm = Comm(layout, groups, CollectiveCounter(), delay_ms)
    t = torch.zeros(2, dtype=torch.int32)
    out = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        # Blocks until every TP rank of the stage joined: the latency a poll waits for.
        comm.all_reduce(t, dist.ReduceOp.MAX, "tp_cpu", CALIBRATION)
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def mean_ci(samples: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean."""
    a = np.asarray(samples, dtype=float)
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def summarize(per_rank: list[list[float]], tp: int, pp: int, delay_ms: float = 0.0) -> dict:
    """calibration.json's content from every rank's samples (rank 0's are the figure)."""
    samples = per_rank[0]
    out = {"tp": tp, "pp": pp, "group": "tp_cpu", "method": METHOD, "n": len(samples),
           "collective_delay_ms": delay_ms,
           "allreduce_ms": [round(s, 4) for s in samples], "pp_hop_ms": None,
           "pp_hop_note": "not measured: taken as half a 2-rank all-reduce (analysis.overhead)",
           "per_rank_p50_ms": [percentile(s, 50) if s else None for s in per_rank]}
    if not samples:
        out["allreduce"] = {"p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "mean_ms": 0.0,
                            "mean_ci_low_ms": 0.0, "mean_ci_high_ms": 0.0}
        out["note"] = "TP = 1: no control-plane all-reduce, c = 0"
        return out
    low, high = mean_ci(samples)
    out["allreduce"] = {"p50_ms": percentile(samples, 50), "p90_ms": percentile(samples, 90),
                        "p99_ms": percentile(samples, 99),
                        "mean_ms": float(np.mean(samples)), "mean_ci_low_ms": low,
                        "mean_ci_high_ms": high}
    return out


# ---- c beside the cells ------------------------------------------------------------------
#
# The c above is one stretch of 300 all-reduces before the cells: a burst of load during it
# moves the whole figure (0.56-1.05 ms in three runs of one commit). Beside the cells, after
# every serve (outside its timed region), every rank times BESIDE_N more; a burst moves a few
# cells' samples, not the median over cells of the per-cell mean.
BESIDE_N = 40
BESIDE_WARMUP = 5
BESIDE_METHOD = (f"{BESIDE_N} MAX all-reduces of 2 int32 on the TP CPU gloo group after every "
                 f"serve (after {BESIDE_WARMUP} warm-up), rank 0's samples; c_ms: the median "
                 f"over cells of each cell's mean, its 95% interval from order statistics "
                 f"(binomial); spread: the per-cell means' p10-p90")


def beside(per_cell: list[list[float]], upfront: dict | None) -> dict:
    """calibration.json's `beside`: c from the samples timed after every cell, its spread,
    and whether the c measured before the cells (`upfront`, its `allreduce`) differs."""
    cells = [s for s in per_cell if s]
    if not cells:
        return {"method": BESIDE_METHOD, "cells": 0, "c_ms": None}
    means = np.sort([float(np.mean(s)) for s in cells])
    pooled = np.concatenate([np.asarray(s, dtype=float) for s in cells])
    low, high = median_interval(list(means))
    out = {"method": BESIDE_METHOD, "cells": len(cells), "n": int(pooled.size),
           "c_ms": float(np.median(means)), "c_ci_low_ms": low, "c_ci_high_ms": high,
           "cell_mean_p10_ms": float(np.quantile(means, 0.1)),
           "cell_mean_p90_ms": float(np.quantile(means, 0.9)),
           "cell_mean_min_ms": float(means[0]), "cell_mean_max_ms": float(means[-1]),
           "p25_ms": float(np.quantile(pooled, 0.25)), "p50_ms": float(np.median(pooled)),
           "per_cell_mean_ms": [round(float(np.mean(s)), 4) for s in per_cell if s]}
    if upfront and upfront.get("mean_ms"):
        up_lo, up_hi = upfront["mean_ci_low_ms"], upfront["mean_ci_high_ms"]
        out["upfront_mean_ms"] = upfront["mean_ms"]
        # Differs: the upfront mean's interval and the beside median's do not overlap.
        out["upfront_differs"] = bool(up_hi < low or up_lo > high)
    return out


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval of the median: the order statistics x_(j) and
    x_(n-j+1) (1-based), j the smallest rank with P(Binomial(n, 1/2) <= j - 1) < (1 -
    level) / 2, so the interval covers the median with at least `level` (the whole range
    when n is too small for it)."""
    a = np.sort(np.asarray(values, dtype=float))
    cdf = binomial_half_cdf(a.size)
    # the first rank whose CDF reaches alpha; alpha a hair lower so that a CDF equal to it
    # up to rounding counts as reaching it, as scipy.stats' binom.ppf's own tolerance does
    j = max(1, int(np.searchsorted(cdf, (1 - level) / 2 * (1 - 1e-12))))
    return float(a[j - 1]), float(a[a.size - j])

