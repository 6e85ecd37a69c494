"""The gate's timing checks, from between-repeat intervals (bench.stats), two ways.

With `--ab` (make gate): the baseline revision (results/baseline/gate.json `ab.revision`)
and this working tree served as sides of one run on this machine (bench.gate.ab,
bench.ab.served), so the machine's speed and its drift cancel; per configuration and gated
metric the ratio B/A paired by repeat with its 95% interval. Stages are added while a check
is undecided (bench.ab.sequential, judged by `ab_states`), up to gate.json's budget.

Without `--ab`: this run's per-repeat ratios to pr27010 against the baseline's own
per-repeat ratios (summary.csv), paired by repeat (the same seed), a t interval over the
paired log ratios. The two runs were made at different times, maybe on different machines:
that drift is not in the interval, which is why make gate uses --ab.

A check PASSes when its whole interval lies below 1 + threshold and FAILs when it lies
above. One whose interval still holds 1 + threshold when the A/B ends is undecided, and
`settle` gives it its verdict from the machine's disturbance (the serves' cpu_lost p50
against bench.rundir.schema.DISTURBED_LIMIT, fixed in advance, never read from a timing):
INCONCLUSIVE when the machine was disturbed (too noisy to decide: the gate exits 77), FAIL
when it was quiet (the change sits at its threshold: not shown within it). An undecided
check never reads PASS; each carries the half-width it reached and the one it needed.

A check without an interval (fewer than 3 paired repeats, no scipy) is NOT JUDGED: it fails
nothing, and the gate's table and last line say so and why; it is never judged on a point.
The thresholds per metric come from `bench noise --update-gate`; TTFT p50 is gated per
request class where the run has bystanders. The rule for CI: docs/gate-ci.md.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from bench.ab.served import gated_rows
from bench.compare.comparison import Comparison
from bench.gate.baseline import baseline_match
from bench.rundir.decision import Disturbance
from bench.rundir.files import parse_list_cell
from bench.rundir.rundir import FILES
from bench.rundir.schema import CLASS_TTFT_METRICS, QUIET_METRICS, REFERENCE_PROTOCOL
from bench.stats import Interval, ratio_interval
from bench.verdict.checks import Check, make_check, state
from bench.verdict.thresholds import DEFAULT_THRESHOLD, decide
from bench.verdict.words import FAIL, PASS, undecided_verdict

LABELS = {"ttft": "TTFT p50", "prefetch_ttft_p50": "prefetching requests' TTFT p50",
          "bystander_ttft_p50": "bystanders' TTFT p50", "step_mean": "mean step time",
          "itl_p50": "ITL p50"}


def _observed(iv: Interval) -> str:
    return f"{iv.point:.3f} [{iv.low:.3f}, {iv.high:.3f}], {iv.n} paired repeats"


def resolvable(iv: Interval) -> float:
    """The interval's half-width as a fraction (point x [1/(1+h), 1+h]): the smallest change
    it tells from none. From low and high where the row carries no half-width."""
    if iv.half_width is not None and not math.isnan(iv.half_width):
        return float(iv.half_width)
    return max(iv.high / iv.point, iv.point / iv.low) - 1


def needed(iv: Interval, threshold: float) -> float:
    """The half-width (a fraction, as `resolvable`) that would have decided the check: its
    point's distance from 1 + threshold."""
    edge = 1 + threshold
    return max(iv.point / edge, edge / iv.point) - 1


def judge(row: dict, name: str, metric: str, iv: Interval, threshold: float,
          against: str) -> Check | None:
    """One timing check (bench.verdict.thresholds.decide): FAIL when the whole interval lies
    above 1 + threshold, PASS when it lies below, else undecided (`settle` gives it its
    verdict: never PASS)."""
    if iv.point is None:
        return None
    bound = f"x {against}: passes below {1 + threshold:g}, fails above it"
    if not iv.has_interval:
        return make_check(row, name, True, expected=bound, observed=f"{iv.point:.3f}",
                          note=f"not judged: {iv.note}", judged=False, interval=iv)
    h = resolvable(iv)
    seen = dict(expected=bound, observed=_observed(iv), resolves=h, threshold=threshold,
                interval=iv)
    decided = decide(iv.low, iv.high, threshold)
    if decided == FAIL:
        return make_check(
            row, name, False, **seen,
            meaning=f"{row['protocol']}'s {LABELS[metric]} grew beyond {1 + threshold:g}x "
                    f"{against}, its whole 95% interval above that: it got slower")
    if decided == PASS:
        return make_check(row, name, True, **seen)
    need = needed(iv, threshold)
    return make_check(
        row, name, False, **seen, unresolved=True, needed=need,
        note=f"undecided: its interval holds {1 + threshold:g} (half-width {h:.1%}, "
             f"needed {need:.1%})",
        meaning=f"{row['protocol']}'s {LABELS[metric]}: its 95% interval holds "
                f"{1 + threshold:g}, so a change of {threshold:.1%} could not be told from "
                "none: not passed")


def settle(checks: list[Check], disturbance: Disturbance) -> list[Check]:
    """The undecided checks' verdicts once the A/B has ended: INCONCLUSIVE on a disturbed
    machine, FAIL on a quiet one (bench.verdict.words.undecided_verdict)."""
    if undecided_verdict(disturbance) == FAIL:
        why = (f"; the machine was quiet ({disturbance.line()}): the change sits at its "
               "threshold, not shown within it")
        return [replace(c, meaning=c.meaning + why) if c.unresolved else c for c in checks]
    why = (f"; the machine was too noisy to decide ({disturbance.line()}): INCONCLUSIVE, "
           "not a failure")
    return [replace(c, inconclusive=True, meaning=c.meaning + why) if c.unresolved else c
            for c in checks]


def _gated(row: dict) -> list[str]:
    """The gated metrics of a row: per request class where it has both classes."""
    both = all(not pd.isna(row.get(f"{m}_ratio", math.nan)) for m in CLASS_TTFT_METRICS)
    return [*QUIET_METRICS, *(CLASS_TTFT_METRICS if both else ["ttft"])]


def _per_repeat(row: dict, metric: str) -> dict[int, float]:
    column = "ttft_p50_ratio_per_repeat" if metric == "ttft" else f"{metric}_ratio_per_repeat"
    return dict(enumerate(parse_list_cell(row.get(column), FILES["summary"], column)))


def baseline_checks(summary: pd.DataFrame, baseline: pd.DataFrame,
                    thresholds: dict[str, float]) -> list[Check]:
    """This run's ratios to pr27010 against the baseline's, paired by repeat."""
    checks = []
    for row in summary.to_dict("records"):
        base = baseline_match(baseline, row)
        if row["protocol"] == REFERENCE_PROTOCOL or base is None:
            continue
        for m in _gated(row):
            iv = ratio_interval(_per_repeat(row, m), _per_repeat(base, m))
            checks.append(judge(row, f"{m}_ratio_vs_baseline", m, iv,
                                thresholds.get(m, DEFAULT_THRESHOLD), "the baseline's"))
    return [c for c in checks if c is not None]


def ab_checks(comp: Comparison, thresholds: dict[str, float]) -> list[Check]:
    """Every configuration's gated timing metrics of an A/B run: B (this tree) over A (the
    baseline revision), paired by repeat."""
    checks = [judge(row, f"{m}_ab", m, iv, thresholds.get(m, DEFAULT_THRESHOLD),
                    "the baseline revision's") for row, m, iv in gated_rows(comp)]
    return [c for c in checks if c is not None]


def ab_states(comp: Comparison, thresholds: dict[str, float]
              ) -> list[tuple[str, float, float, float, float]]:
    """The sequential rule's input (bench.ab.sequential.more): per gated check its state,
    point, low, high and threshold (an interval not yet made: UNRESOLVED at its point)."""
    out = []
    for _, m, iv in gated_rows(comp):
        t = thresholds.get(m, DEFAULT_THRESHOLD)
        low, high = (iv.low, iv.high) if iv.has_interval else (None, None)
        out.append((decide(low, high, t), iv.point, low, high, t))
    return out


def resolution_lines(checks: list[Check]) -> list[str]:
    """Per timing check with an interval: the difference it resolves beside its threshold."""
    out = []
    for c in checks:
        if c.resolves is None:
            continue
        need = f", needed {c.needed:.1%}" if c.needed is not None else ""
        out.append(f"resolution: {c.check} {c.protocol}/{c.policy} ({c.layout}): resolves "
                   f"{c.resolves:.1%}{need}, threshold {c.threshold:.1%}: {state(c)}")
    return out
