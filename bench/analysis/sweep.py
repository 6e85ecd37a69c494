"""A cost sweep's report: what removing a poll's all-reduce buys as a function of what that
all-reduce costs (`bench run --preset delay-sweep`; a measured sweep:
docs/results/2026-12-04_delay_sweep_dbbaed9.md).

Each added cost's rows are a run directory of their own (bench.run.plan.delay_dir). Per cost
and policy the report puts pr36425's ratios over pr27010 beside the c measured beside the
cells (bench.run.calibrate) and the overhead model's step ratio rescaled to that c, and
states the checks: under wait_complete the step ratio falls as c grows (or stays inside the
previous cost's interval); under timeout every step interval holds 1; the model's ratio
lies inside the measured interval, or the row shows the per-poll cost the run measured.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.report.printer import interval_text
from bench.rundir.files import write_csv_atomic, write_json_atomic, write_text_atomic
from bench.rundir.rundir import SWEEP_FILES, RunDir
from bench.rundir.schema import REFERENCE_PROTOCOL

PROTOCOL = "pr36425"  # held against REFERENCE_PROTOCOL at every cost
POLICIES = ("wait_complete", "timeout")
METRICS = {"step_mean": "step", "prefetch_ttft_p50": "TTFT p50 prefetch",
           "bystander_ttft_p50": "TTFT p50 bystander", "itl_p50": "ITL p50",
           "e2e_p50": "e2e p50"}
# Hosts whose control-plane all-reduce cost a public report gives: (name, c ms, source).
NAMED_HOSTS = (
    ("small-model TP host, per control all-reduce", 0.15,
     "SGLang PR #30511 (~150 us each; docs/design.md section 8)"),
    ("2 servers over TCP, 1 KB gloo allreduce_ring", 0.354, "pytorch/gloo issue #158"),
    ("4x GB300 (Grace), 4-rank gloo all_reduce", 0.5, "SGLang PR #39903"),
    ("4x B200 (Xeon 6960P, 2 sockets), 4-rank gloo all_reduce", 3.2, "SGLang PR #39903"),
)
COLUMNS = ["delay_ms", "policy", "c_upfront_ms", "c_ms", "c_beside_ms", "c_beside_ci_low_ms",
           "c_beside_ci_high_ms", "per_poll_ms", "polls_per_step", "repeats",
           *[f"{m}_ratio{s}" for m in METRICS for s in ("", "_ci_low", "_ci_high")],
           "model_step_ratio", "model_step_low", "model_step_high", "model_inside"]


@dataclass
class SweepReport:
    rows: list[dict]
    lines: list[str]  # the terminal's and sweep.md's text
    ok: bool  # every cost's own run passed its verdict


def write_manifest(run_dir: Path, delays: tuple[float, ...], dirs: list[str]) -> None:
    """sweep.json: what `bench report` needs to rebuild the sweep's report."""
    write_json_atomic(RunDir(run_dir).sweep_file("manifest"),
                      {"delays_ms": list(delays), "dirs": dirs})


def is_sweep(run_dir: Path) -> bool:
    return RunDir(run_dir).sweep_file("manifest").exists()


def model_step_ratio(this: dict, ref: dict, scale: float = 1.0) -> tuple[float, float, float]:
    """The overhead model's step ratio of pr36425 over pr27010, from pr27010's measured step:
    take away its predicted decision-collective time (polls/step x c) and add pr36425's,
    1 - (E_ref - E_this) / step_ref; the band from c's interval (low: the most saved).
    `scale`: c's ratio to the c the predictions were made with."""
    step = ref.get("step_mean_ms", math.nan)
    if not step > 0:  # NaN too
        return (math.nan,) * 3

    def ratio(e_ref: str, e_this: str) -> float:
        return 1 - scale * (ref.get(e_ref, math.nan) - this.get(e_this, math.nan)) / step
    return (ratio("predicted_extra_step_ms", "predicted_extra_step_ms"),
            ratio("predicted_extra_step_high_ms", "predicted_extra_step_low_ms"),
            ratio("predicted_extra_step_low_ms", "predicted_extra_step_high_ms"))


def cost_row(delay: float, policy: str, summary: pd.DataFrame, calib: dict | None) -> dict:
    """One COLUMNS row: pr36425 over pr27010 under `policy` at one added cost."""
    rows = {r["protocol"]: r for r in summary[summary["policy"] == policy].to_dict("records")}
    this, ref = rows.get(PROTOCOL, {}), rows.get(REFERENCE_PROTOCOL, {})
    beside = (calib or {}).get("beside") or {}
    upfront = ((calib or {}).get("allreduce") or {}).get("mean_ms", math.nan)
    c = beside.get("c_ms", math.nan)
    scale = c / upfront if c > 0 and upfront > 0 else 1.0  # NaN: not > 0
    model = model_step_ratio(this, ref, scale)
    out = {"delay_ms": delay, "policy": policy, "c_upfront_ms": upfront,
           "c_ms": c if c > 0 else upfront,
           "c_beside_ms": beside.get("c_ms", math.nan),
           "c_beside_ci_low_ms": beside.get("c_ci_low_ms", math.nan),
           "c_beside_ci_high_ms": beside.get("c_ci_high_ms", math.nan),
           # what one decision collective cost the reference's scheduler in the run
           "per_poll_ms": ref.get("c_insitu_ms", math.nan),
           "polls_per_step": ref.get("polls_per_step", math.nan),
           "repeats": this.get("step_mean_ratio_repeats", math.nan),
           "model_step_ratio": model[0], "model_step_low": model[1],
           "model_step_high": model[2]}
    for m in METRICS:
        for s in ("", "_ci_low", "_ci_high"):
            out[f"{m}_ratio{s}"] = this.get(f"{m}_ratio{s}", math.nan)
    low, high = out["step_mean_ratio_ci_low"], out["step_mean_ratio_ci_high"]
    known = not any(math.isnan(v) for v in (model[0], low, high))
    out["model_inside"] = bool(low <= model[0] <= high) if known else None
    return out


def table_lines(rows: list[dict]) -> list[str]:
    """A markdown table: per cost and policy, c, the ratios with intervals, the model."""
    head = ["added ms", "policy", "c ms [CI]", "c before ms", "ms/poll in run", "polls/step",
            *METRICS.values(), "model step", "model inside"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['delay_ms']:g}", r["policy"],
                 interval_text(r["c_ms"], r["c_beside_ci_low_ms"], r["c_beside_ci_high_ms"]),
                 _f(r["c_upfront_ms"], ".2f"),
                 _f(r["per_poll_ms"], ".2f"), _f(r["polls_per_step"], ".1f"),
                 *[interval_text(r[f"{m}_ratio"], r[f"{m}_ratio_ci_low"],
                                 r[f"{m}_ratio_ci_high"]) for m in METRICS],
                 _f(r["model_step_ratio"], ".2f"),
                 "-" if r["model_inside"] is None else ("yes" if r["model_inside"] else "NO")]
        out.append("| " + " | ".join(cells) + " |")
    return out


def check_lines(rows: list[dict]) -> list[str]:
    """The sweep's three statements (module docstring), each with what it rests on."""
    return [trend_line(rows), timeout_line(rows), *model_lines(rows)]


def trend_line(rows: list[dict]) -> str:
    """wait_complete: each cost's step ratio at or below the previous cost's interval."""
    wc = [r for r in rows if r["policy"] == "wait_complete"]
    if any(math.isnan(r["step_mean_ratio_ci_high"]) for r in wc):
        return "wait_complete: no interval at some cost, so no trend is stated."
    bad = [f"+{b['delay_ms']:g} ms {b['step_mean_ratio']:.2f} above +{a['delay_ms']:g} ms's "
           f"[{a['step_mean_ratio_ci_low']:.2f}, {a['step_mean_ratio_ci_high']:.2f}]"
           for a, b in zip(wc, wc[1:], strict=False)
           if b["step_mean_ratio"] > a["step_mean_ratio"]
           and b["step_mean_ratio"] > a["step_mean_ratio_ci_high"]]
    steps = ", ".join(_f(r["step_mean_ratio"], ".2f") for r in wc)
    if bad:
        return f"wait_complete step ratio by cost ({steps}): it RISES past the interval: " \
               + "; ".join(bad) + "."
    first, last = wc[0], wc[-1]
    grows = last["step_mean_ratio_ci_high"] < first["step_mean_ratio_ci_low"]
    return (f"wait_complete step ratio by cost ({steps}): each falls, or stays inside the "
            f"previous cost's interval; " + (
                "the effect grows with what an all-reduce costs (the last cost's interval "
                "lies below the first's)." if grows else
                "the last cost's interval overlaps the first's: over this range the step "
                "effect does not grow beyond the intervals."))


def timeout_line(rows: list[dict]) -> str:
    """timeout: both protocols pay one all-reduce a poll, so every interval should hold 1."""
    to = [r for r in rows if r["policy"] == "timeout"
          and not math.isnan(r["step_mean_ratio_ci_low"])]
    out = [f"+{r['delay_ms']:g} ms" for r in to
           if not r["step_mean_ratio_ci_low"] <= 1 <= r["step_mean_ratio_ci_high"]]
    if not to:
        return "No timeout row with an interval."
    if out:
        return (f"timeout (both pay the all-reduce): the step interval excludes 1 at "
                f"{', '.join(out)} of {len(to)} costs.")
    return f"timeout (both pay the all-reduce): the step interval holds 1 at all {len(to)} costs."


def model_lines(rows: list[dict]) -> list[str]:
    """Where the model's predicted step ratio misses the measured interval, the measured
    per-poll cost beside the modelled c."""
    miss = [r for r in rows if r["model_inside"] is False]
    known = [r for r in rows if r["model_inside"] is not None]
    head = (f"Model's predicted step ratio inside the measured interval at "
            f"{len(known) - len(miss)} of {len(known)} cost x policy rows.")
    return [head, *(f"- +{r['delay_ms']:g} ms {r['policy']}: model {r['model_step_ratio']:.2f} "
                    f"against {r['step_mean_ratio']:.2f} [{r['step_mean_ratio_ci_low']:.2f}, "
                    f"{r['step_mean_ratio_ci_high']:.2f}]; a decision collective took "
                    f"{r['per_poll_ms']:.2f} ms in the run against c = {r['c_ms']:.2f} ms "
                    f"modelled, at {r['polls_per_step']:.1f} polls a step"
                    for r in miss)]


def read_at(rows: list[dict], policy: str, c: float, metric: str = "step_mean"
            ) -> tuple[float, float, float] | None:
    """`metric`'s ratio and interval bounds under `policy` at all-reduce cost `c`, read off
    the measured curve: linear in c between the two costs whose measured c bracket it
    (each bound on its own); at the lowest (highest) cost's own point when `c` lies below
    (above) it but inside that point's interval of c; None outside the measured range."""
    pts = sorted((r["c_ms"], r[f"{metric}_ratio"], r[f"{metric}_ratio_ci_low"],
                  r[f"{metric}_ratio_ci_high"], r.get("c_beside_ci_low_ms", math.nan),
                  r.get("c_beside_ci_high_ms", math.nan)) for r in rows
                 if r["policy"] == policy and r["c_ms"] > 0)
    if pts and (pts[0][4] <= c <= pts[0][0] or pts[-1][0] <= c <= pts[-1][5]):
        return (pts[0] if c <= pts[0][0] else pts[-1])[1:4]
    for (c0, *v0), (c1, *v1) in zip(pts, pts[1:], strict=False):
        if c0 <= c <= c1:
            w = 0.0 if c1 == c0 else (c - c0) / (c1 - c0)
            return tuple(a + w * (b - a) for a, b in zip(v0[:3], v1[:3], strict=True))
    return None


def host_lines(rows: list[dict]) -> list[str]:
    """The curve read at NAMED_HOSTS' costs: step and TTFT p50 ratios with intervals."""
    have = [r["c_ms"] for r in rows if r["c_ms"] > 0]
    if not have:
        return []
    out = [f"Read at named hosts' c (linear between the measured costs, or at the end "
           f"point whose interval of c holds it; measured c {min(have):.2f}-{max(have):.2f} "
           f"ms here):", "",
           "| host | c ms | source | policy | step | TTFT p50 prefetch | TTFT p50 bystander |",
           "|---|---|---|---|---|---|---|"]
    for name, c, source in NAMED_HOSTS:
        for policy in POLICIES:
            cells = [read_at(rows, policy, c, m) for m in ("step_mean", "prefetch_ttft_p50",
                                                          "bystander_ttft_p50")]
            text = ["outside the measured c" if v is None else interval_text(*v)
                    for v in cells]
            out.append(f"| {name} | {c:g} | {source} | {policy} | " + " | ".join(text) + " |")
    return out


def write_sweep(run_dir: Path, plots: bool = True) -> SweepReport:
    """Each cost's report (bench.analysis.report), then sweep.csv, sweep.md and (unless
    `plots` is False) sweep.png of `run_dir`, a sweep's directory."""
    from bench.analysis.report import write_report

    run_dir = Path(run_dir)
    sweep = RunDir(run_dir)
    manifest = json.loads(sweep.sweep_file("manifest").read_text())
    rows, ok = [], True
    for delay, sub in zip(manifest["delays_ms"], manifest["dirs"], strict=True):
        if not RunDir(run_dir / sub).has("requests"):
            ok = False  # the sweep stopped before this cost served a cell
            continue
        report = write_report(run_dir / sub, plots=plots)
        ok = ok and report.verdict.ok
        calib = RunDir(run_dir / sub).calibration()
        rows += [cost_row(delay, p, report.summary, calib) for p in POLICIES
                 if p in set(report.summary["policy"])]
    rows.sort(key=lambda r: (POLICIES.index(r["policy"]), r["delay_ms"]))
    write_csv_atomic(sweep.sweep_file("table"), rows, COLUMNS)
    lines = [f"{PROTOCOL} over {REFERENCE_PROTOCOL} by added cost per control-plane "
             f"collective [95% CI over paired repeats]. c: one control-plane all-reduce, "
             f"measured beside the cells (the median of the cells' means [CI]), the model's "
             f"input; c before: the mean of the stretch before the cells; ms/poll in run: "
             f"what one of {REFERENCE_PROTOCOL}'s decision collectives took its scheduler. "
             f"Model step: 1 - (polls/step x c) / {REFERENCE_PROTOCOL}'s step under "
             f"wait_complete (pr36425's polls issue none); under timeout both sides' "
             f"polls x c.", "",
             *table_lines(rows), "", *check_lines(rows), "", *host_lines(rows)]
    if plots and rows:
        from bench.analysis.sweep_plot import draw

        draw(rows, sweep.sweep_file("plot"), METRICS, POLICIES)
        lines += ["", f"![ratio against c]({SWEEP_FILES['plot']})"]
    write_text_atomic(sweep.sweep_file("report"), "# Cost sweep\n\n" + "\n".join(lines) + "\n")
    return SweepReport(rows, lines, ok)


def _f(v: object, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)
