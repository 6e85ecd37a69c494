"""Rebuild a run directory's summary.csv, plots and report.md from its CSVs and env.json alone.

Usage: python -m bench report RESULTS_DIR [--percentile-method linear|nearest-rank]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure  # the OO API renders with Agg; no pyplot global state

from bench.cliutil import CliParser, UsageError
from bench.dataplane import data_plane_lines
from bench.io import (
    ResultFileError,
    atomic_open,
    read_csv_checked,
    write_csv_atomic,
    write_text_atomic,
)
from bench.schema import REQUEST_COLUMNS, STEP_COLUMNS, SUMMARY_COLUMNS
from bench.stats import PERCENTILE_METHODS
from bench.summarize import (
    GROUP_KEYS,
    REFERENCE_PROTOCOL,
    as_bool,
    clean_key,
    config_groups,
    summarize,
    table_headers,
    table_rows,
)
from hicache.cost_model import POLICIES, PROTOCOLS

SITES = {"decision_collectives": "decision", "completion_collectives": "completion",
         "pp_hops": "PP hops", "hit_query_collectives": "hit query", "ack_collectives": "acks"}
PHASES = {"queue_ms": "queue", "prefetch_io_ms": "prefetch IO", "sched_lag_ms": "scheduler lag",
          "sync_ms": "sync", "load_back_ms": "load-back", "prefill_ms": "prefill"}
PERCENTILE_TEXT = {"linear": "linear interpolation between closest ranks (numpy's default)",
                   "nearest-rank": "nearest rank (the value of rank ceil(q/100 * n))"}
FAILURE_COLUMNS = ["protocol", "policy", "repeat", "error"]


def _ordered(values: Sequence, reference: Sequence) -> list:
    """Distinct values in `reference` order, unknown ones after (sorted by text)."""
    distinct = list(dict.fromkeys(values))
    known = [v for v in reference if v in distinct]
    return known + sorted((v for v in distinct if v not in reference), key=str)


def _color(protocol: str) -> str:
    """A fixed colour per protocol, the same in every plot."""
    i = PROTOCOLS.index(protocol) if protocol in PROTOCOLS else len(PROTOCOLS)
    return f"C{i % 10}"


def _save(fig: Figure, path: Path) -> None:
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
    order = [(pol, pro) for pol in _ordered(requests["policy"], POLICIES)
             for pro in _ordered(requests["protocol"], PROTOCOLS) if (pol, pro) in means.index]
    return means.loc[order]


def plot_collectives(requests: pd.DataFrame, path: Path) -> None:
    """Collectives rank 0 issues per request, stacked by call site."""
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    _stacked_bars(ax, _means(requests, list(SITES)), SITES)
    ax.set_ylabel("collectives per request (rank 0)")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_breakdown(requests: pd.DataFrame, path: Path) -> None:
    """Mean TTFT split into its phases; black ticks mark the mean TTFT itself."""
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    means = _means(requests, [*PHASES, "ttft_ms"])
    _stacked_bars(ax, means, PHASES)
    ax.scatter([p.get_x() + p.get_width() / 2 for p in ax.patches[:len(means)]],
               means["ttft_ms"], marker="_", s=300, color="k", label="TTFT", zorder=3)
    ax.set_ylabel("mean time per request (ms)")
    ax.legend(fontsize=8)
    _save(fig, path)


def _policy_axes(fig: Figure, policies: list, **kw: object) -> list[Axes]:
    """One subplot per policy, side by side."""
    axes = fig.subplots(1, len(policies), squeeze=False, **kw)[0]
    for ax, policy in zip(axes, policies, strict=True):
        ax.set_title(str(policy))
    return list(axes)


def plot_ttft_cdf(requests: pd.DataFrame, path: Path) -> None:
    """Empirical TTFT CDF per policy, one line per protocol."""
    policies = _ordered(requests["policy"], POLICIES)
    fig = Figure(figsize=(4 * len(policies) + 1, 4))
    for ax, policy in zip(_policy_axes(fig, policies, sharey=True), policies, strict=True):
        sub = requests[requests["policy"] == policy]
        for protocol in _ordered(sub["protocol"], PROTOCOLS):
            ttft = np.sort(sub.loc[sub["protocol"] == protocol, "ttft_ms"].dropna())
            ax.step(ttft, np.arange(1, ttft.size + 1) / max(ttft.size, 1), where="post",
                    label=protocol, color=_color(protocol))
        if sub["ttft_ms"].min() > 0:
            ax.set_xscale("log")
        ax.set_xlabel("TTFT (ms)")
    fig.axes[0].set_ylabel("fraction of requests")
    fig.axes[0].legend(fontsize=8)
    _save(fig, path)


def plot_ttft_vs_rate(summary: pd.DataFrame, path: Path) -> None:
    """p50 (solid) and p99 (dashed) TTFT against arrival rate, per policy."""
    policies = _ordered(summary["policy"], POLICIES)
    fig = Figure(figsize=(4 * len(policies) + 1, 4))
    for ax, policy in zip(_policy_axes(fig, policies, sharey=True), policies, strict=True):
        sub = summary[summary["policy"] == policy]
        for protocol in _ordered(sub["protocol"], PROTOCOLS):
            by_rate = (sub[sub["protocol"] == protocol].groupby("rate_rps")
                       [["ttft_p50_ms", "ttft_p99_ms"]].median().sort_index())
            ax.plot(by_rate.index, by_rate["ttft_p50_ms"], "o-", color=_color(protocol),
                    label=f"{protocol} p50")
            ax.plot(by_rate.index, by_rate["ttft_p99_ms"], "s--", color=_color(protocol),
                    label=f"{protocol} p99")
        ax.set_xlabel("arrival rate (requests/s)")
    fig.axes[0].set_ylabel("TTFT (ms)")
    fig.axes[0].legend(fontsize=7)
    _save(fig, path)


def write_plots(run_dir: Path, requests: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """All plots this run supports; returns their file names."""
    if requests.empty:
        return []
    plot_collectives(requests, run_dir / "collectives_per_request.png")
    plot_ttft_cdf(requests, run_dir / "ttft_cdf.png")
    plot_breakdown(requests, run_dir / "ttft_breakdown.png")
    names = ["collectives_per_request.png", "ttft_cdf.png", "ttft_breakdown.png"]
    if summary["rate_rps"].nunique() > 1:
        plot_ttft_vs_rate(summary, run_dir / "ttft_vs_rate.png")
        names.append("ttft_vs_rate.png")
    return names


def _yes_no(value: object) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _git_line(git: dict) -> str:
    """'<sha> (dirty)' or 'unknown: <reason>'."""
    if not git.get("commit"):
        return f"unknown ({git.get('reason') or git.get('error') or 'no reason recorded'})"
    return f"`{git['commit']}`" + (" (dirty working tree)" if git.get("dirty") else " (clean)")


def _gpu_lines(gpu: dict) -> list[str]:
    """The GPUs NVML saw, their links and topology, or the reason there are none."""
    if not gpu.get("available"):
        return [f"- GPUs: none ({gpu.get('reason') or gpu.get('error') or 'no reason recorded'})"]
    lines = [f"- GPU driver: {gpu.get('driver_version')}"]
    for g in gpu.get("gpus", []):
        lines.append(f"- GPU {g.get('index')}: {g.get('name')}, {g.get('memory_total_mib')} MiB, "
                     f"PCI {g.get('pci_bus_id')}, NVLinks active {g.get('nvlink_active')}")
    for pair in gpu.get("topology", []):
        lines.append(f"- GPUs {pair['gpus'][0]}-{pair['gpus'][1]}: PCIe {pair.get('pcie')}, "
                     f"NVLink P2P {_yes_no(pair.get('nvlink_p2p'))}")
    return lines


def provenance_lines(env: dict | None) -> list[str]:
    """Markdown bullet lines describing where the run came from (env.json)."""
    if env is None:
        return ["env.json is missing: the provenance of this run is unknown."]
    v = env.get("versions", {})
    world = ", ".join(f"{k}={val}" for k, val in (env.get("world") or {}).items())
    return [
        f"- git commit: {_git_line(env.get('git', {}))}",
        f"- time (UTC): {env.get('utc_time')}",
        f"- host: {env.get('host')} ({env.get('platform')}); CPU: {env.get('cpu_model')}, "
        f"{env.get('cpu_count')} cores",
        f"- versions: Python {v.get('python')}, torch {v.get('torch')}, numpy {v.get('numpy')}, "
        f"gloo available {_yes_no(v.get('gloo_available'))}, NCCL {v.get('nccl') or 'none'}, "
        f"CUDA available {_yes_no(v.get('cuda_available'))}",
        f"- backend: {env.get('backend')}; world layout: {world or 'unknown'}",
        *data_plane_lines(env),
        *_gpu_lines(env.get("gpu") or {}),
    ]


def _md_escape(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(map(_md_escape, headers)) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(map(_md_escape, r)) + " |" for r in rows]
    return "\n".join(lines)


def _n_text(summary: pd.DataFrame) -> str:
    """The sample count behind each row's percentiles."""
    n = (summary["requests"] * summary["repeats"]).astype(int)
    if n.empty:
        return "no rows"
    return f"n = {n.min()}" if n.min() == n.max() else f"n = {n.min()} to {n.max()}"


def _label(row: dict) -> str:
    return (f"{row['protocol']} / {row['policy']} (tp={row['tp']}, pp={row['pp']}, "
            f"rate={row['rate_rps']}, storage={row['storage']})")


def _bad_request_lines(g: pd.DataFrame, limit: int = 5) -> list[str]:
    """The first requests of a group whose ranks disagreed or whose data was wrong."""
    bad = g[(as_bool(g["ranks_agree"]) != True)  # noqa: E712 - unknown is not agreement
            | (as_bool(g["data_ok"]) == False)]  # noqa: E712
    lines = [f"  - request {r['rid']} (repeat {r['repeat']}): ranks_agree {r['ranks_agree']}, "
             f"data_ok {r['data_ok']}" for r in bad.head(limit).to_dict("records")]
    if len(bad) > limit:
        lines.append(f"  - and {len(bad) - limit} more")
    return lines


def divergence_lines(summary: pd.DataFrame, requests: pd.DataFrame,
                     failures: pd.DataFrame | None, ranks: pd.DataFrame | None) -> list[str]:
    """Rows whose ranks disagreed or whose data was wrong, rank cross-check misses, failures."""
    lines, groups = [], config_groups(requests)
    for row in summary.to_dict("records"):
        if not row["ranks_agree"] or row["data_errors"] > 0:
            lines.append(f"- {_label(row)}: ranks_agree {row['ranks_agree']}, "
                         f"data_errors {row['data_errors']}")
            lines += _bad_request_lines(groups[clean_key(tuple(row[k] for k in GROUP_KEYS))])
    if ranks is not None and "crosscheck_ok" in ranks:
        miss = ranks[as_bool(ranks["crosscheck_ok"]) == False]  # noqa: E712
        for row in miss.head(20).to_dict("records"):
            lines.append(f"- rank {row.get('rank')} ({row.get('protocol')} / "
                         f"{row.get('policy')}, repeat {row.get('repeat')}): its collective "
                         "counter disagrees with the independent cross-check")
    if not lines:
        lines = ["None: every row has ranks_agree True and data_errors 0."]
    if failures is not None and not failures.empty:
        lines += ["", "Failed cells (failures.csv):", "",
                  markdown_table(FAILURE_COLUMNS,
                                 failures[FAILURE_COLUMNS].astype(str).values.tolist())]
    return lines


def _plot_lines(plots: list[str]) -> list[str]:
    titles = {"collectives_per_request.png": "Collectives per request by call site (rank 0)",
              "ttft_cdf.png": "TTFT CDF per policy",
              "ttft_breakdown.png": "TTFT breakdown (means)",
              "ttft_vs_rate.png": "TTFT vs arrival rate (p50 solid, p99 dashed)"}
    if not plots:
        return ["No request rows: nothing to plot."]
    return [line for p in plots for line in (f"### {titles[p]}", "", f"![{titles[p]}]({p})", "")]


def render_report(run_dir: Path, summary: pd.DataFrame, method: str, plots: list[str],
                  divergence: list[str], env: dict | None) -> str:
    """report.md's text."""
    ok = bool(summary["ranks_agree"].all()) and int(summary["data_errors"].sum()) == 0
    return "\n".join([
        f"# hicache-bench report: {run_dir.name}", "", "## Provenance", "",
        *provenance_lines(env), "", "## Summary", "",
        "OK: every rank agreed and no data errors." if ok
        else "FAILED: see Divergence / failures below.", "",
        markdown_table(table_headers(summary), table_rows(summary)), "",
        f"TTFT percentiles pool all repeats; method: {PERCENTILE_TEXT[method]}; "
        f"{_n_text(summary)} requests per row. The ratio is median TTFT over "
        f"{REFERENCE_PROTOCOL}'s in the same configuration of the same run, with a 95% "
        "percentile-bootstrap interval stratified by repeat; per-repeat ratios are in "
        "summary.csv.", "",
        "Collective counts are those issued by global rank 0 (PP stage 0, TP rank 0); "
        "`ranks.csv` has every rank's counts by call site.", "",
        "## Plots", "", *_plot_lines(plots), "## Divergence / failures", "", *divergence, "",
    ])


def _read_optional(path: Path, required: list[str]) -> pd.DataFrame | None:
    return read_csv_checked(path, required) if path.exists() else None


def _read_env(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ResultFileError(f"{path}: unreadable JSON ({e})") from e


def write_report(run_dir: Path, percentile_method: str = "linear") -> Path:
    """Rebuild summary.csv, the plots and report.md of `run_dir`; returns report.md's path.

    Raises ResultFileError when requests.csv (or another present result file) is unusable.
    """
    run_dir = Path(run_dir)
    requests = read_csv_checked(run_dir / "requests.csv", REQUEST_COLUMNS)
    steps = _read_optional(run_dir / "steps.csv", STEP_COLUMNS)
    steps = pd.DataFrame(columns=STEP_COLUMNS) if steps is None else steps
    summary = summarize(requests, steps, percentile_method)
    write_csv_atomic(run_dir / "summary.csv", summary.to_dict("records"), SUMMARY_COLUMNS)
    plots = write_plots(run_dir, requests, summary)
    divergence = divergence_lines(summary, requests,
                                  _read_optional(run_dir / "failures.csv", FAILURE_COLUMNS),
                                  _read_optional(run_dir / "ranks.csv", []))
    text = render_report(run_dir, summary, percentile_method, plots, divergence,
                         _read_env(run_dir / "env.json"))
    write_text_atomic(run_dir / "report.md", text)
    return run_dir / "report.md"


def main_report(argv: list[str]) -> int:
    """`python -m bench report DIR`: rebuild plots and report.md; 2 on bad input."""
    parser = CliParser(prog="bench report", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a results/<run> directory")
    parser.add_argument("--percentile-method", choices=PERCENTILE_METHODS, default="linear")
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        print(f"bench report: {e}", file=sys.stderr)
        return 2
    if not args.run_dir.is_dir():
        print(f"bench report: {args.run_dir}: no such directory", file=sys.stderr)
        return 2
    try:
        path = write_report(args.run_dir, args.percentile_method)
    except ValueError as e:  # ResultFileError, or a cell the cost model cannot read
        print(f"bench report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
