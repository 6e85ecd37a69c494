"""The model beside SGLang (`bench run --model-beside`, preset seed-pr): the project's model of
each side's release served in the same turns and seeds as the sides (bench.run.sglang_worlds), its
headline (every other model protocol over the first's: for the seed PR pr36425 / pre27010),
and a fidelity line per metric and policy: does the model's ratio lie inside SGLang's 95%
interval (0.5.19 / 0.5.18)? `bench fidelity`'s rule (bench.verdict.fidelity).

Both ratios are paired within the run (the model's pairs its own serves of one repeat, as
SGLang's pairs its sides'), so one is held against the other's interval. A miss is reported,
never a failure: the run's OK / FAILED is its checks' (docs/sglang.md, "The seed PR as
released", says why). All text and fidelity.csv's rows are built from request and step
rows, so they can be rebuilt from the CSVs.
"""

from __future__ import annotations

import math

import pandas as pd

from bench.analysis.lead import COST_RATIOS, HEADLINE_HEADERS, LABELS, RATIO_COLUMNS, _f, _table
from bench.analysis.summarize import summarize
from bench.report.printer import interval_text
from bench.verdict.fidelity import METRICS, Row, interval
from hicache.spec.cost_model import POLICIES

FIDELITY_COLUMNS = ["model", "model_reference", "sglang", "sglang_reference", "policy",
                    "metric", "model_ratio", "model_ci_low", "model_ci_high", "sglang_ratio",
                    "sglang_ci_low", "sglang_ci_high", "judged", "inside"]


def pairs(plan: dict) -> list[tuple[str, str]]:
    """(side, its model) per side of the plan's sides, the reference first; [] for a run
    without the model beside."""
    sides, models = plan.get("sides") or [], plan.get("beside") or []
    return [(s["name"], m) for s, m in zip(sides, models, strict=False)] if models else []


def model_summary(requests: pd.DataFrame, steps: pd.DataFrame, plan: dict,
                  method: str = "linear", calibration: dict | None = None,
                  ranks: pd.DataFrame | None = None) -> pd.DataFrame:
    """The model's rows alone, every ratio over the first model protocol's (pre27010 for
    the seed PR), as summary.csv has the sides' over the first side's."""
    models = list(plan["beside"])
    return summarize(requests[requests["protocol"].isin(models)],
                     steps[steps["protocol"].isin(models)], method, calibration, ranks,
                     models[0])


def fidelity_rows(summary: pd.DataFrame, model: pd.DataFrame, plan: dict,
                  metrics: tuple[str, ...] = METRICS) -> list[Row]:
    """Per non-reference side, policy and metric: the model's ratio (candidate) beside
    SGLang's (the reference interval). Row.protocol is the side's name."""
    sides = {(r["protocol"], r["policy"]): r for r in summary.to_dict("records")}
    models = {(r["protocol"], r["policy"]): r for r in model.to_dict("records")}
    out = []
    for side, proto in pairs(plan)[1:]:
        for policy in sorted({k[1] for k in sides if k[0] == side}, key=_order):
            s, m = sides[(side, policy)], models.get((proto, policy), {})
            out += [Row(side, policy, n, interval(m, n), interval(s, n)) for n in metrics]
    return out


def _order(policy: str) -> int:
    return POLICIES.index(policy) if policy in POLICIES else len(POLICIES)


def metrics_for(summary: pd.DataFrame) -> tuple[str, ...]:
    """bench fidelity's metrics on the free schedule; on a pinned one step time alone (its
    TTFT and ITL ratios are not a server's: docs/metrics.md)."""
    free = all(str(s) in ("free", "None", "nan") for s in summary.get("schedule", []))
    return METRICS if free else tuple(COST_RATIOS)


def fidelity_line(row: Row) -> str:
    """`fidelity: <policy> <metric> model <ratio> SGLang <point> [lo, hi]: inside|outside`."""
    verdict = ("inside" if row.inside else "outside") if row.judged else \
        "not judged (no ratio or no interval)"
    model = "-" if math.isnan(row.candidate[0]) else f"{row.candidate[0]:.2f}"
    return (f"fidelity: {row.policy} {LABELS[row.metric]} model {model} SGLang "
            f"{interval_text(*row.free)}: {verdict}")


def tally_line(rows: list[Row]) -> str:
    """How many of the judged ratios lie inside, and the misses by name."""
    judged = [r for r in rows if r.judged]
    misses = [f"{r.policy} {LABELS[r.metric]}" for r in judged if not r.inside]
    if not judged:
        return ("fidelity: nothing judged (no interval: too few repeats, or no scipy); "
                "reported, not a failure")
    text = (f"fidelity: {len(judged) - len(misses)} of {len(judged)} model ratios inside "
            "SGLang's intervals")
    return text + (f"; outside: {', '.join(misses)} (reported, not a failure)" if misses
                   else "")


def model_table(model: pd.DataFrame, plan: dict, end_to_end: bool) -> list[str]:
    """The model's headline, as the sides' (bench.analysis.side_lead): ratios to its first."""
    ref = plan["beside"][0]
    names = RATIO_COLUMNS if end_to_end else COST_RATIOS
    headers = HEADLINE_HEADERS if end_to_end else HEADLINE_HEADERS[:5]
    rows = sorted(model.to_dict("records"), key=lambda r: (_order(r["policy"]),
                                                           plan["beside"].index(r["protocol"])))
    return _table(["model", *headers[1:]], [
        [r["protocol"], r["policy"], _f(r["polls_per_step"], ".1f"), _f(r["step_mean_ms"], ".1f"),
         *["1 (ref)" if r["protocol"] == ref else interval_text(
             r.get(f"{n}_ratio"), r.get(f"{n}_ratio_ci_low"), r.get(f"{n}_ratio_ci_high"))
           for n in names]] for r in rows])


def step_mins_line(steps: pd.DataFrame | None, plan: dict) -> list[str]:
    """The per-step MINs a step (steps.csv) of the sides and of the model, which pads each
    step with the MIN SGLang's own check_hicache_events adds beside the harness's agreement
    (HiCacheConfig.step_pad_min): equal, the two worlds pay the same collectives a step;
    a difference is named, as a cost one ratio holds and the other does not."""
    if steps is None or steps.empty or "per_step_min" not in steps:
        return []
    sides, models = [s for s, _ in pairs(plan)], list(plan["beside"])
    of_sides = steps.loc[steps["protocol"].isin(sides), "per_step_min"].mean()
    of_model = steps.loc[steps["protocol"].isin(models), "per_step_min"].mean()
    if math.isnan(of_sides) or math.isnan(of_model):
        return []
    said = (f"per-step MINs a step: SGLang's sides {of_sides:.2f}, the model {of_model:.2f} "
            "(one a pad for the MIN SGLang's own step adds beside the harness's)")
    if round(of_sides, 2) == round(of_model, 2):
        return [said + ": the same collectives a step"]
    return [said + ": they differ, so a step's cost differs between the two worlds by more "
            "than the releases' polls"]


def lead_and_rows(summary: pd.DataFrame, model: pd.DataFrame, plan: dict,
                  steps: pd.DataFrame | None = None) -> tuple[list[str], list[dict]]:
    """The model's headline and the fidelity lines (after the sides' lead), and
    fidelity.csv's rows (FIDELITY_COLUMNS), from the same Rows."""
    metrics = metrics_for(summary)
    rows = fidelity_rows(summary, model, plan, metrics)
    (side0, model0), *rest = pairs(plan)
    held = "; ".join(f"{m} / {model0} against {s} / {side0}" for s, m in rest)
    lines = ["", f"The model beside, ratios to {model0} [95% CI over repeats] (the "
             "project's cache, the same turns and seeds as the sides):",
             *model_table(model, plan, metrics == METRICS), *step_mins_line(steps, plan), "",
             f"Fidelity ({held}; inside: the model's ratio lies in SGLang's 95% interval, "
             "bench fidelity's rule):", *map(fidelity_line, rows), tally_line(rows)]
    return lines, csv_rows(rows, plan)


def csv_rows(rows: list[Row], plan: dict) -> list[dict]:
    """fidelity.csv: one row per side, policy and metric; unknown is empty."""
    (side0, model0), *rest = pairs(plan)
    model_of = dict(rest)
    return [{"model": model_of[r.protocol], "model_reference": model0, "sglang": r.protocol,
             "sglang_reference": side0, "policy": r.policy, "metric": r.metric,
             **{f"model_{k}": _known(v) for k, v in zip(BOUNDS, r.candidate, strict=True)},
             **{f"sglang_{k}": _known(v) for k, v in zip(BOUNDS, r.free, strict=True)},
             "judged": r.judged, "inside": r.inside if r.judged else None} for r in rows]


BOUNDS = ("ratio", "ci_low", "ci_high")


def _known(v: float) -> float | None:
    return None if math.isnan(v) else v
