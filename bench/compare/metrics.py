"""What `bench compare` reads from one configuration's rows: exact collective counts and
timing samples.

A timing metric is one line of TIMING_METRICS: its name (with its unit), the frame it reads
(requests.csv or steps.csv rows of one configuration), the statistic ("mean" or "pNN") taken
per repeat, the columns it needs, and a function from the frame to a stats.Sample (values by
repeat, in resampling units for the bootstrap cross-check).
Counts are exact fractions (sums over requests or steps), so differences are exact too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from bench.rundir.files import cells_by_repeat, column_by_repeat, parse_gaps
from bench.rundir.schema import COUNT_COLUMNS, STEP_SITES
from bench.stats import Sample

CLASS_COLUMN = "request_class"  # absent in runs before the serving regime: all "prefetch"
DEFAULT_CLASS = "prefetch"


@dataclass(frozen=True)
class TimingMetric:
    """One timing statistic of a configuration, compared as the ratio B/A."""

    name: str
    table: str  # "requests" or "steps"
    stat: str  # the statistic of each repeat: "mean" or a percentile "pNN"
    needs: tuple[str, ...]  # columns a run must carry for the metric to exist there
    sample: Callable[[pd.DataFrame], Sample]
    shown_if: str = ""  # report only when at least one run carries this column

    def present(self, columns: pd.Index | None) -> bool:
        return columns is not None and all(c in columns for c in self.needs)


def _by_repeat(frame: pd.DataFrame, column: str) -> dict[int, np.ndarray]:
    return column_by_repeat(frame, column)


def ttft(request_class: str | None = None) -> Callable[[pd.DataFrame], Sample]:
    """TTFT of every request, or of one class (a run without classes is all prefetch)."""
    def sample(frame: pd.DataFrame) -> Sample:
        if request_class is not None:
            classes = frame.get(CLASS_COLUMN, pd.Series(DEFAULT_CLASS, index=frame.index))
            frame = frame[classes.fillna(DEFAULT_CLASS) == request_class]
        return Sample.flat(_by_repeat(frame, "ttft_ms"))
    return sample


def itl_gaps(frame: pd.DataFrame) -> Sample:
    """Pooled inter-token gaps of all requests; a request's gaps are one resampling unit."""
    return Sample.clustered({r: [parse_gaps(c) for c in cells]
                             for r, cells in cells_by_repeat(frame, "itl_ms").items()})


def all_steps(frame: pd.DataFrame) -> Sample:
    """Wall time of every scheduler step (the mean step time of steps.csv)."""
    return Sample.flat(_by_repeat(frame, "step_ms"))


def decode_steps(frame: pd.DataFrame) -> Sample:
    """Wall time of decode steps (kind == decode), or of every timed step without `kind`."""
    if "kind" in frame:
        frame = frame[frame["kind"] == "decode"]
    return Sample.flat(_by_repeat(frame, "step_ms"))


TIMING_METRICS = (
    TimingMetric("ttft_p50_ms", "requests", "p50", ("ttft_ms",), ttft()),
    TimingMetric("ttft_p99_ms", "requests", "p99", ("ttft_ms",), ttft()),
    TimingMetric("prefetch_ttft_p50_ms", "requests", "p50", ("ttft_ms",), ttft("prefetch"),
                 shown_if=CLASS_COLUMN),
    TimingMetric("prefetch_ttft_p99_ms", "requests", "p99", ("ttft_ms",), ttft("prefetch"),
                 shown_if=CLASS_COLUMN),
    TimingMetric("bystander_ttft_p50_ms", "requests", "p50", ("ttft_ms", CLASS_COLUMN),
                 ttft("bystander")),
    TimingMetric("bystander_ttft_p99_ms", "requests", "p99", ("ttft_ms", CLASS_COLUMN),
                 ttft("bystander")),
    TimingMetric("itl_p50_ms", "requests", "p50", ("itl_ms",), itl_gaps),
    TimingMetric("itl_p99_ms", "requests", "p99", ("itl_ms",), itl_gaps),
    TimingMetric("step_mean_ms", "steps", "mean", ("step_ms",), all_steps),
    TimingMetric("decode_step_p50_ms", "steps", "p50", ("step_ms",), decode_steps),
    TimingMetric("decode_step_p99_ms", "steps", "p99", ("step_ms",), decode_steps),
)
METRIC_NAMES = tuple(m.name for m in TIMING_METRICS)


def metric_list(values: list[str] | None) -> list[str] | None:
    """Timing metric names (each value may be comma-separated), checked against the registry
    (ValueError names the unknown ones); None for none asked."""
    if not values:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in METRIC_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown --metric {', '.join(unknown) or '(empty)'}; choose from "
                         f"{', '.join(METRIC_NAMES)}")
    return names


@dataclass(frozen=True)
class Counts:
    """One configuration's collectives (rank 0), as exact fractions; None = unknown."""

    requests: int
    polls_per_req: Fraction
    decision_per_req: Fraction
    critical_per_req: Fraction
    background_per_req: Fraction
    decision_per_poll: Fraction | None  # None: no polls
    poll_sites_per_poll: Fraction | None  # decision + PP hops, the collectives inside polls
    completion_per_req: Fraction
    step_per_step: Fraction | None  # None: no steps.csv rows
    step_per_step_by_kind: dict[str, Fraction]


def _frac(total: float, n: int) -> Fraction | None:
    return Fraction(int(total), n) if n else None


def _step_counts(steps: pd.DataFrame | None) -> tuple[Fraction | None, dict[str, Fraction]]:
    """Step collectives per step, overall and per step kind (when steps carry `kind`)."""
    if steps is None or steps.empty:
        return None, {}
    per_step = steps[STEP_SITES].sum(axis=1)
    by_kind = {}
    if "kind" in steps:
        by_kind = {str(k): _frac(s.sum(), len(s)) for k, s in per_step.groupby(steps["kind"])}
    return _frac(per_step.sum(), len(per_step)), by_kind


def _ticket_total(requests: pd.DataFrame) -> int:
    """PP-ticket broadcasts (sglang-0.5.23, buffer_only, PP > 1); runs before it carry none."""
    if "ticket_collectives" not in requests:
        return 0
    return int(requests["ticket_collectives"].fillna(0).sum())


def counts(requests: pd.DataFrame, steps: pd.DataFrame | None) -> Counts:
    """Per-request and per-step collective counts of one configuration (all repeats)."""
    n = len(requests)
    total = {c: requests[c].sum() for c in COUNT_COLUMNS}
    polls = int(total["polls"])
    step, by_kind = _step_counts(steps)
    return Counts(
        requests=n, polls_per_req=_frac(polls, n),
        decision_per_req=_frac(total["decision_collectives"], n),
        critical_per_req=_frac(total["decision_collectives"] + total["completion_collectives"]
                               + total["pp_hops"], n),
        background_per_req=_frac(total["hit_query_collectives"] + total["ack_collectives"]
                                 + _ticket_total(requests), n),
        decision_per_poll=_frac(total["decision_collectives"], polls),
        poll_sites_per_poll=_frac(total["decision_collectives"] + total["pp_hops"], polls),
        completion_per_req=_frac(total["completion_collectives"], n),
        step_per_step=step, step_per_step_by_kind=by_kind)
