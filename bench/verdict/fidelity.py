"""The fidelity rule (docs/metrics.md, "The fidelity check"), shared by `bench fidelity`
(a schedule mode's ratios against a free run's intervals: bench.compare.fidelity) and the
model beside SGLang (the model's ratios against SGLang's intervals: bench.analysis.beside).

A ratio passes a metric when its point lies inside the reference's 95% interval; a metric
the reference has no interval for (too few repeats, or no scipy: docs/metrics.md, "Without
scipy"), or the candidate no ratio, is not judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

METRICS = ("prefetch_ttft_p50", "bystander_ttft_p50", "itl_p50", "step_mean")


@dataclass(frozen=True)
class Row:
    protocol: str
    policy: str
    metric: str
    candidate: tuple[float, float, float]  # point, low, high
    free: tuple[float, float, float]  # the reference's: the free run's, or SGLang's

    @property
    def judged(self) -> bool:
        return not any(math.isnan(v) for v in (self.candidate[0], *self.free[1:]))

    @property
    def inside(self) -> bool:
        return self.judged and self.free[1] <= self.candidate[0] <= self.free[2]


def interval(row: dict, metric: str) -> tuple[float, float, float]:
    """A summary row's ratio of `metric` as (point, low, high); NaN where unknown."""
    return tuple(_num(row.get(f"{metric}_ratio{s}", math.nan))
                 for s in ("", "_ci_low", "_ci_high"))


def _num(v: object) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
