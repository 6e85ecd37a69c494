"""Measures c, the latency of one small all-reduce on the run's own control-plane group,
before the cells run: the input of the overhead model (bench.analysis.overhead).

Every rank runs the same loop on its PP stage's TP CPU group (`tp_cpu`), through `Comm`
with call site `calibration`, on a counter of its own (the system's counts stay exact).
The tensor is the decision vote's shape: two int32. Rank 0's samples are the measurement;
every rank's median is kept to show the spread. With TP = 1 there is no control-plane
all-reduce (SGLang skips it) and c is 0 by definition.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from bench.stats import percentile
from hicache.comm import CALIBRATION, CollectiveCounter, Comm, Groups, Layout

METHOD = ("back-to-back MAX all-reduces of 2 int32 on the TP CPU gloo group, timed around "
          "each call on every rank (rank 0's samples reported), after a warm-up; mean CI: "
          "percentile bootstrap over the samples")


def measure(layout: Layout, groups: Groups, n: int = 300, warmup: int = 30) -> list[float]:
    """This rank's n all-reduce latencies in ms ([] when TP = 1)."""
    if groups.size("tp_cpu") == 1:
        return []
    comm = Comm(layout, groups, CollectiveCounter())
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


def summarize(per_rank: list[list[float]], tp: int, pp: int) -> dict:
    """calibration.json's content from every rank's samples (rank 0's are the figure)."""
    samples = per_rank[0]
    out = {"tp": tp, "pp": pp, "group": "tp_cpu", "method": METHOD, "n": len(samples),
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
