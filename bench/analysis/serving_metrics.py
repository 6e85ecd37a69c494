"""Serving-regime metrics of one configuration group (docs/design.md section 8): TTFT per request
class, inter-token latency (ITL), step time, polls and collectives per step, queue depth,
throughput; their ratios to pr27010 with 95% between-repeat intervals (bench.stats: per
repeat one statistic per side, paired with pr27010's repeat of the same seed); and the
overhead model's prediction next to what was measured.

Pooled ITL is every gap between consecutive tokens of every request (requests.csv `itl_ms`).
Step time is rank 0's wall time per scheduler step (steps.csv). The overhead model's
measured side is the scheduler's host time per step (step minus forward) over that of a
protocol whose polls issue no collective in the same configuration (the reference).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from bench.analysis import estimate
from bench.analysis.estimate import PerRepeat
from bench.analysis.overhead import extra_step_ms, hop_ms, intervals_overlap
from bench.rundir.files import cells_by_repeat, column_by_repeat, list_cell, parse_gaps
from bench.rundir.schema import RATIO_METRICS
from bench.stats import (
    Interval,
    Sample,
    diff_interval,
    per_repeat_ratios,
    per_repeat_stat,
    stat_value,
)
from hicache.spec.cost_model import Setting, decision_per_poll

CLASSES = ("prefetch", "bystander")
# Ratio metrics vs pr27010 (schema.RATIO_METRICS): name -> (source, class filter, statistic)
RATIO_SOURCES = {
    "step_mean": ("steps", None, "mean"),
    "itl_p50": ("itl", None, "p50"),
    "itl_p99": ("itl", None, "p99"),
    "prefetch_ttft_p50": ("ttft", "prefetch", "p50"),
    "prefetch_ttft_p99": ("ttft", "prefetch", "p99"),
    "bystander_ttft_p50": ("ttft", "bystander", "p50"),
    "bystander_ttft_p99": ("ttft", "bystander", "p99"),
    "e2e_p50": ("e2e", None, "p50"),  # arrival -> last token, every request
}
ZERO_COST_REFERENCES = ("step-clock", "step-batched", "pr36425")  # in order of preference
C_MISMATCH = 1.25  # in-run c this far from the calibrated c: the c assumption broke


def _nan(v: object) -> float:
    return math.nan if v is None else float(v)


def _classes(g: pd.DataFrame) -> pd.Series:
    """Each request's class; runs without the column hold prefetching requests only."""
    if "request_class" not in g:
        return pd.Series("prefetch", index=g.index)
    classes = g["request_class"].astype(object)
    return classes.where(classes.notna(), "prefetch")


def itl_gaps(cells: Iterable) -> np.ndarray:
    """All gaps (ms) of requests.csv `itl_ms` cells ('1.2;3.4', empty when < 2 tokens).
    Joined and converted at once (a summary reads every request's gaps several times); a
    cell that is not numbers is named by parsing cell by cell."""
    text = ";".join(t for t in (str(c) for c in cells if not pd.isna(c)) if t.strip())
    if not text:
        return np.array([], dtype=float)
    try:
        return np.array(text.split(";"), dtype=float)
    except ValueError:
        return np.array([g for c in cells for g in parse_gaps(c)], dtype=float)


def by_repeat(g: pd.DataFrame, s: pd.DataFrame | None, source: str,
              klass: str | None = None) -> dict[int, np.ndarray]:
    """Repeat -> the samples behind a metric: step times, ITL gaps, TTFTs (of a class) or
    end-to-end latencies."""
    if source == "steps":
        if s is None or s.empty or "step_ms" not in s:
            return {}
        return column_by_repeat(s, "step_ms")
    if source == "itl":
        if "itl_ms" not in g:
            return {}
        return {r: itl_gaps(cells) for r, cells in cells_by_repeat(g, "itl_ms").items()}
    column = "e2e_ms" if source == "e2e" else "ttft_ms"
    if column not in g:
        return {}
    sub = g if klass is None else g[_classes(g) == klass]
    return column_by_repeat(sub, column)


def _pct(values: np.ndarray, stat: str) -> float:
    return float(stat_value(values, stat)) if values.size else math.nan


def _ttft_class_columns(g: pd.DataFrame) -> dict:
    out = {}
    for klass in CLASSES:
        ttft = g.loc[_classes(g) == klass, "ttft_ms"].dropna().to_numpy(float)
        out[f"{klass}_requests"] = int(ttft.size)
        for q in (50, 90, 99):
            out[f"{klass}_ttft_p{q}_ms"] = _pct(ttft, f"p{q}")
    return out


def _step_columns(s: pd.DataFrame | None) -> dict:
    keys = ("step_mean_ms", "step_p50_ms", "step_p99_ms", "decode_step_p50_ms",
            "decode_step_p99_ms", "host_ms_per_step", "polls_per_step",
            "critical_collectives_per_step", "decision_sync_ms_per_step", "waiting_p50",
            "waiting_max", "prefetching_p50", "prefetching_max")
    if s is None or s.empty or "step_ms" not in s:
        return dict.fromkeys(keys, math.nan)
    step = s["step_ms"].to_numpy(float)
    decode = s.loc[s["kind"] == "decode", "step_ms"].to_numpy(float)
    critical = s[["decision", "completion", "pp_hop"]].sum(axis=1)
    return {"step_mean_ms": step.mean(), "step_p50_ms": _pct(step, "p50"),
            "step_p99_ms": _pct(step, "p99"), "decode_step_p50_ms": _pct(decode, "p50"),
            "decode_step_p99_ms": _pct(decode, "p99"),
            "host_ms_per_step": (s["step_ms"] - s["forward_ms"]).mean(),
            "polls_per_step": s["polled"].mean(), "critical_collectives_per_step":
            critical.mean(), "decision_sync_ms_per_step": s["decision_sync_ms"].mean(),
            "waiting_p50": s["waiting"].median(), "waiting_max": s["waiting"].max(),
            "prefetching_p50": s["prefetching"].median(),
            "prefetching_max": s["prefetching"].max()}


def _throughput(g: pd.DataFrame, s: pd.DataFrame | None) -> float:
    """Output tokens per second of serving time (all repeats' tokens over their steps)."""
    if s is None or s.empty or "output_tokens" not in g or "step_ms" not in s:
        return math.nan
    seconds = s["step_ms"].sum() / 1e3
    return float(g["output_tokens"].sum() / seconds) if seconds > 0 else math.nan


def serving_columns(g: pd.DataFrame, s: pd.DataFrame | None, cores_busy: float) -> dict:
    """Absolute serving metrics of a group: TTFT per class, ITL, steps, queue, throughput."""
    gaps = itl_gaps(g["itl_ms"]) if "itl_ms" in g else np.array([])
    out = _ttft_class_columns(g) | _step_columns(s)
    out["output_tok_per_s"] = _throughput(g, s)
    for stat in ("p50", "p90", "p99"):
        out[f"itl_{stat}_ms"] = _pct(gaps, stat)
    out["itl_mean_ms"] = _pct(gaps, "mean")
    out["cores_busy"] = cores_busy
    return out


def interval_columns(name: str, iv: Interval) -> dict:
    """`name`, `_ci_low`, `_ci_high`, `_mdd` (the half-width: what the run can resolve) and
    `_repeats` (paired repeats behind it); unknown is NaN."""
    return {name: _nan(iv.point), f"{name}_ci_low": _nan(iv.low),
            f"{name}_ci_high": _nan(iv.high), f"{name}_mdd": _nan(iv.half_width),
            f"{name}_repeats": iv.n}


def interval_note(intervals: list[Interval]) -> str:
    """Why a row has points without intervals (too few repeats, no scipy), once per reason."""
    return "; ".join(dict.fromkeys(iv.note for iv in intervals
                                   if iv.point is not None and iv.note))


def interval_method(intervals: list[Interval]) -> str:
    """How a row's intervals were made (`t-mean 0.95`, `cpu-adjusted 0.95`), each method
    once: one per row, as the pairs and their cpu_lost are one per row."""
    return "; ".join(dict.fromkeys(iv.method for iv in intervals if iv.has_interval))


def metric_per_repeat(g: pd.DataFrame | None, s: pd.DataFrame | None,
                      name: str) -> dict[int, float]:
    """Repeat -> a RATIO_METRICS metric's statistic of that repeat (one whole serve)."""
    if g is None:
        return {}
    source, klass, stat = RATIO_SOURCES[name]
    return per_repeat_stat(by_repeat(g, s, source, klass), stat)


def metric_sample(g: pd.DataFrame | None, s: pd.DataFrame | None, name: str) -> Sample:
    """A RATIO_METRICS metric's values by repeat in resampling units (a request's ITL gaps
    are one unit), for the two-stage bootstrap (bench.ab.noise's cross-check)."""
    if g is None:
        return Sample.flat({})
    source, klass, _ = RATIO_SOURCES[name]
    if source == "itl":
        return Sample.clustered({r: [parse_gaps(c) for c in cells] for r, cells in
                                 cells_by_repeat(g, "itl_ms").items()} if "itl_ms" in g else {})
    return Sample.flat(by_repeat(g, s, source, klass))


def ratio_columns(g: pd.DataFrame, s: pd.DataFrame | None, ref: pd.DataFrame | None,
                ref_s: pd.DataFrame | None, lost: tuple[PerRepeat, PerRepeat] = ({}, {})
                ) -> tuple[dict, list[Interval]]:
    """Each RATIO_METRICS metric over pr27010's in the same configuration: per repeat the
    metric of each side, paired by repeat, and the served A/B's interval of the log ratios
    (bench.analysis.estimate.served: the t-mean, or cpu-adjusted where `lost`, each side's
    serves' cpu_lost by repeat, says more than a tenth of them were disturbed); also the
    per-repeat ratios. Returns the cells and the intervals (for the row's note)."""
    out, intervals = {}, []
    for name in RATIO_METRICS:
        x, y = metric_per_repeat(g, s, name), metric_per_repeat(ref, ref_s, name)
        iv = estimate.served(x, y, *lost)
        intervals.append(iv)
        out |= interval_columns(f"{name}_ratio", iv)
        out[f"{name}_ratio_per_repeat"] = list_cell(per_repeat_ratios(x, y).values()) \
            or math.nan
    return out, intervals


def reference_protocol(available: set[str], policy: str) -> str | None:
    """The protocol whose polls issue no collective, to measure extra step time against."""
    for p in ZERO_COST_REFERENCES:
        if p in available and decision_per_poll(p, policy, 2, 2) == (0, 0):
            return p
    return None


def _host_by_repeat(s: pd.DataFrame | None) -> dict[int, float]:
    """Repeat -> the scheduler's mean host time per step (step minus forward) in it."""
    if s is None or s.empty or "forward_ms" not in s:
        return {}
    return {int(r): float((x["step_ms"] - x["forward_ms"]).mean())
            for r, x in s.groupby("repeat")}


OVERHEAD_KEYS = ("c_ms", "c_p50_ms", "c_insitu_ms", "predicted_extra_step_ms",
                 "predicted_extra_step_low_ms", "predicted_extra_step_high_ms",
                 "measured_extra_step_ms", "measured_extra_step_ci_low_ms",
                 "measured_extra_step_ci_high_ms", "predicted_itl_inflation",
                 "measured_itl_inflation")


def _predicted(row: dict, s: pd.DataFrame, calib: dict) -> dict:
    """c and the extra step time its polls predict, with the band from c's interval."""
    c = calib["allreduce"]
    tp, pp = int(row["tp"]), int(row["pp"])
    hop = hop_ms(c["mean_ms"], max(2, int(calib["tp"])), calib.get("pp_hop_ms"))
    completions, polls = s["completion"].mean(), s["polled"].mean()
    host_memory = row.get("host_memory")
    host_memory = host_memory if isinstance(host_memory, str) else "cache"
    predict = [extra_step_ms(Setting(row["protocol"], row["policy"], tp, pp,
                                     host_memory=host_memory),
                             polls, c_ms, hop, completions)
               for c_ms in (c["mean_ms"], c["mean_ci_low_ms"], c["mean_ci_high_ms"])]
    critical = s[["decision", "completion", "pp_hop"]].to_numpy().sum()
    return {"c_ms": c["mean_ms"], "c_p50_ms": c["p50_ms"],
            "c_insitu_ms": s["decision_sync_ms"].sum() / critical if critical else math.nan,
            "predicted_extra_step_ms": predict[0], "predicted_extra_step_low_ms": predict[1],
            "predicted_extra_step_high_ms": predict[2]}


def overhead_columns(row: dict, s: pd.DataFrame | None, ref: dict | None,
                   ref_s: pd.DataFrame | None, calib: dict | None) -> dict:
    """Predicted extra step time (from c and the row's polls) beside the measured one, and
    the ITL inflation each implies; `ref` is the reference protocol's serving cells. The
    measured extra is per repeat, paired with the reference's repeat (bench.stats)."""
    out = dict.fromkeys(OVERHEAD_KEYS, math.nan) | {
        "measured_extra_step_repeats": 0, "overhead_model_agrees": None,
        "overhead_reference": None if ref is None else ref["protocol"],
        "overhead_model_note": ""}
    if calib is None or s is None or s.empty or "polled" not in s:
        return out
    out |= _predicted(row, s, calib)
    x, y = _host_by_repeat(s), _host_by_repeat(ref_s)
    if ref is None or not (x and y):
        return out
    iv = diff_interval(x, y)
    out |= {"measured_extra_step_ms": _nan(iv.point), "measured_extra_step_repeats": iv.n,
            "measured_extra_step_ci_low_ms": _nan(iv.low),
            "measured_extra_step_ci_high_ms": _nan(iv.high)}
    # Every step pays the extra time, and every ITL gap spans whole steps.
    if ref["step_mean_ms"] > 0 and ref["itl_mean_ms"] > 0:
        out["predicted_itl_inflation"] = 1 + out["predicted_extra_step_ms"] / ref["step_mean_ms"]
        out["measured_itl_inflation"] = row["itl_mean_ms"] / ref["itl_mean_ms"]
    if not iv.has_interval:  # no interval to hold the prediction against
        return out | {"overhead_model_note": iv.note}
    agrees = intervals_overlap((out["predicted_extra_step_low_ms"],
                                out["predicted_extra_step_high_ms"]), (iv.low, iv.high))
    return out | {"overhead_model_agrees": agrees,
                  "overhead_model_note": "" if agrees else _why(out, calib["allreduce"])}


def _why(out: dict, c: dict) -> str:
    """Which assumption of the model broke, in one sentence."""
    if out["predicted_extra_step_high_ms"] == 0:
        return (f"its polls issue no collective, yet its host time per step differs from the "
                f"reference's by {out['measured_extra_step_ms']:+.2f} ms: scheduler work other "
                "than collectives (the walk's own cost per poll, per-step flags) or drift")
    insitu, calibrated = out["c_insitu_ms"], c["mean_ms"]
    if not math.isnan(insitu) and calibrated > 0 and not (
            1 / C_MISMATCH <= insitu / calibrated <= C_MISMATCH):
        return (f"c broke: a decision collective took {insitu:.3f} ms in the run against "
                f"{calibrated:.3f} ms calibrated on quiet groups (contention with the IO/ack "
                "threads and the other ranks)")
    if out["measured_extra_step_ms"] > out["predicted_extra_step_high_ms"]:
        return ("the step grew by more than its collectives cost: other scheduler work grew "
                "with them (e.g. the walk, or threads competing for the GIL or the cores)")
    return ("the step grew by less than its collectives cost: part of their time overlapped "
            "work the reference step also waited for")
