"""The run's plots, drawn from its CSVs: collectives per request, TTFT breakdown and CDF,
TTFT vs rate, and the serving regime over time (waiting-queue depth and step time).

Every figure uses matplotlib's object API (rendered with Agg, no pyplot global state) and is
written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from bench.rundir.files import atomic_open
from bench.rundir.rundir import PLOTS, RunDir
from hicache.spec.cost_model import POLICIES, PROTOCOLS

SITES = {"decision_collectives": "decision", "completion_collectives": "completion",
         "pp_hops": "PP hops", "hit_query_collectives": "hit query", "ack_collectives": "acks"}
# The TTFT phases add up to TTFT (queue is the remainder); `sync`, the scheduler thread's time
# in collectives for the request, lies inside lag and queue and is drawn beside them.
PHASES = {"queue_ms": "queue", "prefetch_io_ms": "prefetch IO", "sched_lag_ms": "scheduler lag",
          "load_back_ms": "load-back", "prefill_ms": "prefill"}

def ordered(values: Sequence, reference: Sequence) -> list:
    """Distinct values in `reference` order, unknown ones after (sorted by text)."""
    distinct = list(dict.fromkeys(values))
    known = [v for v in reference if v in distinct]
    return known + sorted((v for v in distinct if v not in reference), key=str)


def protocol_color(protocol: str) -> str:
    """A fixed colour per protocol, the same in every plot."""
    i = PROTOCOLS.index(protocol) if protocol in PROTOCOLS else len(PROTOCOLS)
    return f"C{i % 10}"


def save_figure(fig: Figure, path: Path) -> None:
    """Write a figure as PNG atomically."""
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)


def _stacked_bars(ax: Axes, means: pd.DataFrame, columns: dict[str, str]) -> None:
    """Stacked bars (one stack per (policy, protocol) row of `means`), clustered by policy."""
    policies = list(dict.fromkeys(means.index.get_level_values(0)))
    x, ticks, bottom = [], [], np.zeros(len(means))
    for i, (policy, protocol) in enumerate(means.index):
        x.append(i + policies.index(policy))  # one empty slot between policies
        ticks.append(protocol)
    for col, label in columns.items():
        values = means[col].fillna(0).to_numpy(float)
        ax.bar(x, values, bottom=bottom, label=label, width=0.8)
        bottom = bottom + values
    ax.set_xticks(x, ticks, rotation=40, ha="right", fontsize=8)
    for policy in policies:
        xs = [xi for xi, (p, _) in zip(x, means.index, strict=True) if p == policy]
        ax.text(float(np.mean(xs)), 1.01, policy, ha="center", transform=ax.get_xaxis_transform())


def _means(requests: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Per (policy, protocol) means of `columns`, in cost_model order."""
    means = requests.groupby(["policy", "protocol"])[columns].mean()
    order = [(pol, pro) for pol in ordered(requests["policy"], POLICIES)
             for pro in ordered(requests["protocol"], PROTOCOLS) if (pol, pro) in means.index]
    return means.loc[order]


def plot_collectives(requests: pd.DataFrame, path: Path) -> None:
    """Collectives rank 0 issues per request, stacked by call site."""
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    _stacked_bars(ax, _means(requests, list(SITES)), SITES)
    ax.set_ylabel("collectives per request (rank 0)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_breakdown(requests: pd.DataFrame, path: Path) -> None:
    """Mean TTFT split into its phases (they add up to the black TTFT tick); a hatched bar
    beside each stack shows how much of it the scheduler spent in collectives."""
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    means = _means(requests, [*PHASES, "sync_ms", "ttft_ms"])
    _stacked_bars(ax, means, PHASES)
    centres = np.array([p.get_x() + p.get_width() / 2 for p in ax.patches[:len(means)]])
    ax.bar(centres + 0.3, means["sync_ms"].fillna(0).to_numpy(float), width=0.2,
           color="none", edgecolor="k", hatch="///",
           label="of which: scheduler in collectives (sync)")
    ax.scatter(centres, means["ttft_ms"], marker="_", s=300, color="k", label="TTFT",
               zorder=3)
    ax.set_ylabel("mean time per request (ms)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def _policy_axes(fig: Figure, policies: list, **kw: object) -> list[Axes]:
    """One subplot per policy, side by side."""
    axes = fig.subplots(1, len(policies), squeeze=False, **kw)[0]
    for ax, policy in zip(axes, policies, strict=True):
        ax.set_title(str(policy))
    return list(axes)


def _log_axis(ax: Axes) -> None:
    """A log x axis labelled at 1-2-5 steps only: minor labels would overlap."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)


def plot_ttft_cdf(requests: pd.DataFrame, path: Path) -> None:
    """Empirical TTFT CDF per policy, one line per protocol."""
    policies = ordered(requests["policy"], POLICIES)
    fig = Figure(figsize=(4 * len(policies) + 1, 4))
    for ax, policy in zip(_policy_axes(fig, policies, sharey=True), policies, strict=True):
        sub = requests[requests["policy"] == policy]
        for protocol in ordered(sub["protocol"], PROTOCOLS):
            ttft = np.sort(sub.loc[sub["protocol"] == protocol, "ttft_ms"].dropna())
            ax.step(ttft, np.arange(1, ttft.size + 1) / max(ttft.size, 1), where="post",
                    label=protocol, color=protocol_color(protocol))
        if sub["ttft_ms"].min() > 0:
            _log_axis(ax)
        ax.set_xlabel("TTFT (ms)")
    fig.axes[0].set_ylabel("fraction of requests")
    fig.axes[0].legend(fontsize=8)
    save_figure(fig, path)


def plot_ttft_vs_rate(summary: pd.DataFrame, path: Path) -> None:
    """p50 (solid) and p99 (dashed) TTFT against arrival rate, per policy."""
    policies = ordered(summary["policy"], POLICIES)
    fig = Figure(figsize=(4 * len(policies) + 1, 4))
    for ax, policy in zip(_policy_axes(fig, policies, sharey=True), policies, strict=True):
        sub = summary[summary["policy"] == policy]
        for protocol in ordered(sub["protocol"], PROTOCOLS):
            by_rate = (sub[sub["protocol"] == protocol].groupby("rate_rps")
                       [["ttft_p50_ms", "ttft_p99_ms"]].median().sort_index())
            ax.plot(by_rate.index, by_rate["ttft_p50_ms"], "o-", color=protocol_color(protocol),
                    label=f"{protocol} p50")
            ax.plot(by_rate.index, by_rate["ttft_p99_ms"], "s--", color=protocol_color(protocol),
                    label=f"{protocol} p99")
        ax.set_xlabel("arrival rate (requests/s)")
    fig.axes[0].set_ylabel("TTFT (ms)")
    fig.axes[0].legend(fontsize=7)
    save_figure(fig, path)


def plot_over_time(steps: pd.DataFrame, path: Path) -> None:
    """Repeat 0 of each configuration: the waiting-queue depth (top) and the step time
    (bottom, a rolling median over 9 steps) against time since the cell's first step."""
    policies = ordered(steps["policy"], POLICIES)
    fig = Figure(figsize=(4 * len(policies) + 1, 6))
    axes = fig.subplots(2, len(policies), squeeze=False, sharex="col")
    first = steps[steps["repeat"] == steps["repeat"].min()]
    for col, policy in enumerate(policies):
        sub = first[first["policy"] == policy]
        axes[0][col].set_title(str(policy))
        for protocol in ordered(sub["protocol"], PROTOCOLS):
            s = sub[sub["protocol"] == protocol].sort_values("step")
            t = s["t_s"] - s["t_s"].min()
            kw = {"color": protocol_color(protocol), "label": protocol, "linewidth": 1}
            axes[0][col].plot(t, s["waiting"], **kw)
            axes[1][col].plot(t, s["step_ms"].rolling(9, min_periods=1).median(), **kw)
        axes[1][col].set_xlabel("time since the first step (s)")
    axes[0][0].set_ylabel("waiting requests")
    axes[1][0].set_ylabel("step time (ms, rolling median)")
    axes[0][0].legend(fontsize=8)
    save_figure(fig, path)


def write_plots(run_dir: Path, requests: pd.DataFrame, summary: pd.DataFrame,
                steps: pd.DataFrame | None = None) -> list[str]:
    """All plots this run supports; returns their file names."""
    if requests.empty:
        return []
    run = RunDir(run_dir)
    plot_collectives(requests, run.plot("collectives"))
    plot_ttft_cdf(requests, run.plot("ttft_cdf"))
    plot_breakdown(requests, run.plot("breakdown"))
    drawn = ["collectives", "ttft_cdf", "breakdown"]
    if steps is not None and not steps.empty and "step_ms" in steps:
        plot_over_time(steps, run.plot("over_time"))
        drawn.append("over_time")
    if summary["rate_rps"].nunique() > 1:
        plot_ttft_vs_rate(summary, run.plot("vs_rate"))
        drawn.append("vs_rate")
    return [PLOTS[role] for role in drawn]


