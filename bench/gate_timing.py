"""The gate's timing checks: ratios to pr27010 measured inside one run, against the committed
baseline's ratio x (1 + tolerance).

TTFT p50 (per request class where the run has bystanders) is noisy here; mean step time and
ITL p50 in the queue scenario are quiet and get their own, smaller `quiet_tolerance` in
gate.json (scripts/measure_noise.py derives both from run-to-run noise), so a change that
slows every poll without adding a collective shows there first. A check fails only when the
pooled ratio and every repeat's ratio exceed the bound, so noise alone does not fail CI.
"""

from __future__ import annotations

import math

import pandas as pd

from bench.gate_checks import Check, baseline_value, make_check
from bench.result_files import parse_list_cell
from bench.schema import CLASS_TTFT_METRICS, QUIET_METRICS, REFERENCE_PROTOCOL

DEFAULT_QUIET_TOLERANCE = 0.10  # used when the baseline's gate.json has none
LABELS = {"ttft": "TTFT p50", "prefetch_ttft_p50": "prefetching requests' TTFT p50",
          "bystander_ttft_p50": "bystanders' TTFT p50", "step_mean": "mean step time",
          "itl_p50": "ITL p50"}


def _repeat_ratios(cell: object, point: float, column: str) -> list[float]:
    """Parse 'r0;r1;...'; without per-repeat ratios the pooled point stands for them."""
    return parse_list_cell(cell, "summary.csv", column) or [point]


def _one(row: dict, baseline: pd.DataFrame, metric: str, point_col: str, repeat_col: str,
         tolerance: float) -> Check | None:
    point = row.get(point_col)
    base = baseline_value(baseline, row, point_col)
    if row["protocol"] == REFERENCE_PROTOCOL or point is None or pd.isna(point) \
            or math.isnan(base):
        return None
    bound = base * (1 + tolerance)
    repeats = _repeat_ratios(row.get(repeat_col), float(point), repeat_col)
    failed = point > bound and all(r > bound for r in repeats)
    noise = point > bound and not failed
    return make_check(
        row, f"{metric}_ratio_vs_baseline", not failed,
        expected=f"<= {bound:.3f} (baseline {base:.3f} x {1 + tolerance:g})",
        observed=f"{point:.3f} (repeats {';'.join(f'{r:.3f}' for r in repeats)})",
        meaning=f"{row['protocol']}'s {LABELS[metric]} relative to {REFERENCE_PROTOCOL} grew "
                "beyond the baseline's tolerance in every repeat: it got slower"
        if failed else "",
        note="above the bound pooled, but not in every repeat: treated as noise"
        if noise else "")


def ratio_checks(summary: pd.DataFrame, baseline: pd.DataFrame, tolerance: float,
                 per_metric: dict | None = None) -> list[Check]:
    """TTFT p50 ratios vs pr27010 within baseline x (1 + tolerance) unless a repeat is not:
    per request class where the run has bystanders (the pooled median of a prefetching and a
    bystander mode jumps between them), else pooled."""
    checks = []
    for r in summary.to_dict("records"):
        both = all(not pd.isna(r.get(f"{m}_ratio")) for m in CLASS_TTFT_METRICS)
        classes = CLASS_TTFT_METRICS if both else []
        if not classes:
            checks.append(_one(r, baseline, "ttft", "ttft_p50_ratio_vs_pr27010",
                               "ttft_p50_ratio_per_repeat", tolerance))
        checks += [_one(r, baseline, m, f"{m}_ratio", f"{m}_ratio_per_repeat",
                        (per_metric or {}).get(m, tolerance)) for m in classes]
    return [c for c in checks if c is not None]


def quiet_checks(summary: pd.DataFrame, baseline: pd.DataFrame, tolerance: float,
                 per_metric: dict | None = None) -> list[Check]:
    """Step time and ITL p50 ratios vs pr27010 within baseline x (1 + its tolerance): the
    metric's own from gate.json `tolerances` when measured, else the quiet tolerance."""
    checks = [_one(r, baseline, m, f"{m}_ratio", f"{m}_ratio_per_repeat",
                   (per_metric or {}).get(m, tolerance))
              for r in summary.to_dict("records") for m in QUIET_METRICS]
    return [c for c in checks if c is not None]
