"""What a trace replay adds to a run's report: per-tier hit ratios beside the trace's own
reuse bound, the load-sweep plot (TTFT per request class, ITL p99 and step time against
offered load, per protocol x policy), and the bench_serving-compatible JSON lines."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bench.analysis import serving_json
from bench.report.printer import markdown_table
from bench.rundir.rundir import RunDir
from hicache.spec.cost_model import POLICIES, PROTOCOLS

SWEEP_PANELS = [("prefetch_ttft", "TTFT, prefetch class (ms)"),
                ("bystander_ttft", "TTFT, bystander class (ms)"),
                ("itl_p99_ms", "ITL p99 (ms)"), ("step_mean_ms", "mean step time (ms)")]
TIER_HEADERS = ["protocol", "policy", "offered req/s", "x", "device", "host", "storage",
                "computed", "reuse bound", "rejected"]


def _pct(v: object) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def _count(v: object) -> str:
    return "-" if v is None or pd.isna(v) else str(int(v))  # runs before the column: "-"


def tier_lines(summary: pd.DataFrame, requests: pd.DataFrame, files: list[str]) -> list[str]:
    """report.md's "Cache tiers" section (runs with the token columns filled), naming the
    bench_serving JSON files."""
    if "prompt_tokens" not in requests or not requests["prompt_tokens"].sum() > 0:
        return []
    scale = requests.groupby("rate_rps")["time_scale"].first() if "time_scale" in requests \
        else pd.Series(dtype=float)
    rows = [[r["protocol"], r["policy"], f"{r['rate_rps']:.2f}",
             "-" if pd.isna(scale.get(r["rate_rps"])) else f"{scale[r['rate_rps']]:g}",
             *(_pct(r[f"{k}_ratio"]) for k in ("device_hit", "host_hit", "storage_hit",
                                               "computed", "reuse_bound")),
             _count(r.get("rejected_requests"))]
            for r in summary.to_dict("records")]
    return ["## Cache tiers", "",
            "Where the prompt tokens came from at scheduling, as shares of all prompt tokens "
            "(requests.csv: device_hit_tokens, host_hit_tokens, storage_hit_tokens fetched "
            "by the request's own prefetch, computed_tokens); the reuse bound is the trace's "
            "own (leading blocks seen in an earlier request, skipped ones included, capped at "
            "input_length - 1, whole pages): device + host + storage reach it with unbounded "
            "pools. Rejected: requests refused as longer than the device pool holds (all "
            "repeats; their tokens are not in the shares).", "",
            markdown_table(TIER_HEADERS, rows), "",
            *([f"bench_serving's result fields per repeat: {', '.join(files)} (docs/usage.md "
               "says which compare with a real engine's)", ""] if files else [])]


def plot_load_sweep(summary: pd.DataFrame, path: Path) -> None:
    """p50 (solid) and p99 (dashed) of each panel's metric against offered load; one row of
    panels per policy, one colour per protocol."""
    import matplotlib.pyplot as plt

    from bench.analysis.plots import ordered, protocol_color, save_figure

    policies = ordered(summary["policy"].unique(), POLICIES)
    fig, axes = plt.subplots(len(policies), len(SWEEP_PANELS), squeeze=False,
                             figsize=(4.2 * len(SWEEP_PANELS), 3.4 * len(policies)))
    for row, policy in zip(axes, policies, strict=True):
        sub = summary[summary["policy"] == policy]
        for ax, (metric, title) in zip(row, SWEEP_PANELS, strict=True):
            for proto in ordered(sub["protocol"].unique(), PROTOCOLS):
                g = sub[sub["protocol"] == proto].sort_values("rate_rps")
                for q, style in (("p50", "o-"), ("p99", "s--")):
                    col = f"{metric}_{q}_ms" if metric.endswith("ttft") else metric
                    if metric.endswith("ttft") or q == "p50":
                        ax.plot(g["rate_rps"], g[col], style, color=protocol_color(proto),
                                label=f"{proto} {q}" if metric.endswith("ttft") else proto)
            ax.set_title(f"{policy}: {title}", fontsize=9)
            ax.set_xlabel("offered load (requests/s)")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, path)


def write_outputs(run_dir: Path, requests: pd.DataFrame, summary: pd.DataFrame,
                  plots: bool = True) -> tuple[list[str], list[str]]:
    """The trace replay's extra files (none for other workloads): (plots, the
    bench_serving JSON lines); the load-sweep plot when the run has more than one load."""
    files = serving_json.write(run_dir, requests)
    if plots and files and summary["rate_rps"].nunique() > 1:
        path = RunDir(run_dir).plot("load_sweep")
        plot_load_sweep(summary, path)
        return [path.name], files
    return [], files
