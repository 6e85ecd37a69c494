"""A run directory's summary.csv, plots and report.md, built from its CSVs and env.json alone
(`python -m bench report` and the end of `bench run`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.analysis import beside, consensus_serves, lead
from bench.analysis import trace_tiers as trace_report
from bench.analysis.conditions import condition_lines, stage_line
from bench.analysis.plot_switch import NO_PLOTS
from bench.analysis.provenance import provenance_lines
from bench.analysis.side_lead import lead_text as side_lead
from bench.analysis.side_lead import side_names, site_lines
from bench.analysis.summarize import config_groups, summarize, table_headers, table_rows
from bench.report.printer import markdown_table, wrapped
from bench.rundir.files import (
    clean_key,
    write_csv_atomic,
    write_text_atomic,
)
from bench.rundir.rundir import PLOTS, RunDir
from bench.rundir.schema import (
    FAILURE_COLUMNS,
    GROUP_KEYS,
    REFERENCE_PROTOCOL,
    STEP_COLUMNS,
    SUMMARY_COLUMNS,
)
from bench.verdict.run_rules import (
    KNOWN_HAZARD,
    Verdict,
    data_errors,
    host_slot_leaks,
    judge,
    row_disagrees,
    unexplained_disagreements,
)

PERCENTILE_TEXT = {"linear": "linear interpolation between closest ranks (numpy's default)",
                   "nearest-rank": "nearest rank (the value of rank ceil(q/100 * n))"}


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
    bad = g[unexplained_disagreements(g) | data_errors(g)]
    lines = [f"  - request {r['rid']} (repeat {r['repeat']}): ranks_agree {r['ranks_agree']}, "
             f"data_ok {r['data_ok']}" for r in bad.head(limit).to_dict("records")]
    if len(bad) > limit:
        lines.append(f"  - and {len(bad) - limit} more")
    return lines


def divergence_lines(summary: pd.DataFrame, requests: pd.DataFrame,
                     failures: pd.DataFrame | None, ranks: pd.DataFrame | None,
                     details: pd.DataFrame | None) -> list[str]:
    """Rows whose ranks disagreed or whose data was wrong (with the sink's description of
    each disagreement), rank self-check misses, known hazards, failed cells."""
    lines, groups = [], config_groups(requests)
    for row in summary.to_dict("records"):
        if row_disagrees(row) or row["data_errors"] > 0:
            lines.append(f"- {_label(row)}: ranks_agree {row['ranks_agree']}, "
                         f"data_errors {row['data_errors']}")
            lines += _bad_request_lines(groups[clean_key(tuple(row[k] for k in GROUP_KEYS))])
    if details is not None:
        lines += [f"- {r['protocol']} / {r['policy']}, repeat {r['repeat']}: {r['what']}"
                  for r in details.head(20).to_dict("records")]
    for row in host_slot_leaks(ranks).head(20).to_dict("records"):
        lines.append(f"- rank {row.get('rank')} ({row.get('protocol')} / {row.get('policy')}, "
                     f"repeat {row.get('repeat')}): {row['host_slots_unaccounted']} host "
                     "slot(s) neither in the tree nor free at the end")
    known = summary[summary["known_disagreements"] > 0] if "known_disagreements" in summary \
        else summary.iloc[:0]
    for row in known.to_dict("records"):
        lines.append(f"- known hazard, not a failure: {_label(row)}: "
                     f"{row['known_disagreements']} request(s) ended differently on different "
                     f"PP stages; {KNOWN_HAZARD}")
    if not lines:
        lines = ["None: every row has ranks_agree True and data_errors 0."]
    if failures is not None and not failures.empty:
        lines += ["", "Failed cells (failures.csv):", "",
                  markdown_table(FAILURE_COLUMNS,
                                 failures[FAILURE_COLUMNS].astype(str).values.tolist())]
    return lines


PLOT_TITLES = {"collectives": "Collectives per request by call site (rank 0)",
               "ttft_cdf": "TTFT CDF per policy",
               "breakdown": "TTFT breakdown (means)",
               "vs_rate": "TTFT vs arrival rate (p50 solid, p99 dashed)",
               "over_time": "Waiting requests and step time over time (repeat 0)",
               "load_sweep": "TTFT per class, ITL p99 and step time against offered load"}


def _plot_lines(plots: list[str] | None) -> list[str]:
    titles = {PLOTS[role]: title for role, title in PLOT_TITLES.items()}
    if plots is None:
        return [f"Not drawn: {NO_PLOTS}=1 (as in bench ab's block runs); "
                "`python -m bench report DIR` draws them."]
    if not plots:
        return ["No request rows: nothing to plot."]
    return [line for p in plots for line in (f"### {titles[p]}", "", f"![{titles[p]}]({p})", "")]


def cpu_lines(env: dict | None, summary: pd.DataFrame) -> list[str]:
    """Says so when the run's threads outnumber the cores: timings are then CPU-bound."""
    cores = (env or {}).get("cpu_count")
    world = ((env or {}).get("world") or {}).get("world_size")
    per_rank = (env or {}).get("threads_per_rank")  # recorded by the run (schema 3 and later)
    busy = summary["cores_busy"].max() if "cores_busy" in summary else math.nan
    if not cores or not world or not per_rank:
        return []
    threads = world * per_rank
    busy_text = "" if pd.isna(busy) else f"; the ranks kept up to {busy:.1f} cores busy"
    if threads <= cores:
        return [f"CPU: {world} ranks x {per_rank} threads fit in {cores} cores"
                f"{busy_text}.", ""]
    return [f"**Warning: CPU-bound.** {world} ranks x {per_rank} threads (scheduler, "
            f"prefetch, IO, ack sync) exceed this machine's {cores} cores{busy_text}: "
            "timings here are partly CPU-bound, not only collective-bound; compare ratios "
            "within the run, not absolute times across machines.", ""]


RATIO_TEXT = ("Ratios are over pr27010 in the same configuration of the same run. Per repeat "
              "(one whole serve) each side's statistic is taken, paired with pr27010's repeat "
              "of the same seed, and the point is the geometric mean of the per-repeat ratios "
              "with a 95% interval over them: the t interval, cpu-adjusted where more than a "
              "tenth of the serves were disturbed (summary.csv `interval_method`; "
              "docs/metrics.md, \"Intervals\").")


def lead_lines(summary: pd.DataFrame, calib: dict | None) -> list[str]:
    """Expectation; the end-to-end headline (free schedule) and the cost decomposition, or
    for a pinned run the cost decomposition alone; then the model against measurement."""
    head, cost = lead.headline_rows(summary), lead.cost_rows(summary)
    out = ["## What the overhead model expects", "",
           *lead.expectation_lines(summary, calib), ""]
    if head:
        out += ["## Headline, end to end: each protocol against pr27010", "",
                f"On the {lead.schedule_label(summary)}.", "",
                markdown_table(lead.HEADLINE_HEADERS, head), "",
                RATIO_TEXT + " `step x` is the mean step time, ITL pools every inter-token "
                "gap of a repeat, TTFT is split by request class (prefetch: prefix in "
                "storage; bystander: nothing to fetch), e2e is arrival to last token.", "",
                *lead.resolution_lines(summary), ""]
    if cost:
        out += ["## Cost decomposition: host time in decision collectives", "",
                f"On the {lead.schedule_label(summary)}.", "",
                markdown_table(lead.COST_HEADERS, cost), "",
                "`decision ms/step`: the scheduler thread's measured time in decision "
                "collectives per step; `ms/poll`: that over the polls per step; `model "
                "ms/step`: polls per step x c. " + ("" if head else RATIO_TEXT + " On a "
                "pinned schedule TTFT and ITL are not what a server sees, so none is shown "
                "here."), "",
                *([] if head else lead.resolution_lines(summary)), "",
                *lead.band_lines(summary), ""]
    model = lead.model_rows(summary)
    if model:
        out += ["## The overhead model: predicted vs measured extra step time", "",
                markdown_table(lead.MODEL_HEADERS, model), "",
                "Predicted: polls per step x decision collectives per poll x c (calibrated "
                "before the cells). Measured: scheduler host time per step (step minus "
                "forward) over the reference protocol's, whose polls issue no collective "
                "(`overhead_reference` in summary.csv). " + lead.agreement_sentence(summary),
                ""]
    return out


def verdict_lines(verdict: Verdict) -> list[str]:
    """report.md's verdict: the run's one OK/FAILED line (bench.verdict.run_rules) and its notes."""
    head = ("OK: every rank agreed, no data errors, every counter matched torch's and every "
            "host slot was accounted for." if verdict.ok
            else f"{verdict.line} (see Divergence / failures below).")
    return [head, *(f"Note: {n}" for n in verdict.notes), ""]


@dataclass(frozen=True)
class ReportParts:
    """What report.md is written from (render_report)."""

    run_dir: Path
    summary: pd.DataFrame
    method: str  # the percentile method (PERCENTILE_TEXT)
    plots: list[str] | None  # None: not drawn
    divergence: list[str]
    env: dict | None
    calib: dict | None
    verdict: Verdict
    tiers: list[str] = ()
    sides: list[str] = ()  # the lead of a run of several SGLangs (bench.analysis.side_lead)


def render_report(p: ReportParts) -> str:
    """report.md's text; `p.sides`: the lead of a run of several SGLangs (its own headline,
    bench.analysis.side_lead), shown as the terminal shows it."""
    side_md = ["## SGLang sides", "", "```", *p.sides, "```", ""] if p.sides else []
    summary, staged = p.summary, stage_line(p.env)
    return "\n".join([
        f"# hicache-bench report: {p.run_dir.name}", "", "## Provenance", "",
        *provenance_lines(p.env), "", *([staged, ""] if staged else []),
        *cpu_lines(p.env, summary), *verdict_lines(p.verdict),
        *side_md, *lead_lines(summary, p.calib), "## All configurations", "",
        markdown_table(table_headers(summary), table_rows(summary)), "",
        f"TTFT percentiles pool all repeats; method: {PERCENTILE_TEXT[p.method]}; "
        f"{_n_text(summary)} requests per row. The ratio is median TTFT over "
        f"{REFERENCE_PROTOCOL}'s in the same configuration of the same run, per repeat, "
        "with a 95% interval over the paired repeats; per-repeat ratios, each interval's "
        "half-width (`_mdd`) and its repeat count are in summary.csv.", "",
        "Collective counts are those issued by global rank 0 (PP stage 0, TP rank 0); "
        "`ranks.csv` has every rank's counts by call site.", "", *p.tiers,
        "## Plots", "", *_plot_lines(p.plots), "## Divergence / failures", "", *p.divergence,
        "",
    ])


def load_back_line(requests: pd.DataFrame, env: dict | None) -> str | None:
    """Achieved load-back GB/s against the host->device peak (GPU runs; None elsewhere)."""
    peak = (env or {}).get("h2d_peak_gbps")
    if not peak:
        return None
    gbps = sorted(v for v in requests.get("load_back_gbps", pd.Series(dtype=float)).dropna() if v)
    if not gbps:
        return f"load-back: none with bytes; host->device peak {peak} GB/s"
    p50 = statistics.median(gbps)
    return (f"load-back: p50 {p50:.1f} GB/s over {len(gbps)} load-backs "
            f"({100 * p50 / peak:.0f}% of the host->device peak {peak} GB/s)")


@dataclass(frozen=True)
class RunReport:
    """What one build of a run's report produced, for the caller to print."""

    path: Path  # report.md
    summary: pd.DataFrame
    verdict: Verdict
    lead: list[str]  # the terminal's lead after the table


def summary_of(run_dir: Path, percentile_method: str = "linear") -> pd.DataFrame:
    """The summary rows of a run directory's result files, nothing written (a run staged
    to resolve reads them after each stage: bench.ab.protocols)."""
    return _summarized(RunDir(run_dir), percentile_method)[2]


def _summarized(run: RunDir, percentile_method: str
                ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """requests.csv, steps.csv and their summary rows (ratios against the first side where
    several SGLangs ran)."""
    requests = run.requests("report")
    steps = run.steps("report", optional=True)
    steps = pd.DataFrame(columns=STEP_COLUMNS) if steps is None else steps
    sides = side_names((run.env(optional=True) or {}).get("plan"))
    return requests, steps, summarize(requests, steps, percentile_method, run.calibration(),
                                      run.ranks(), *sides[:1])


def write_report(run_dir: Path, percentile_method: str = "linear",
                 plots: bool = True) -> RunReport:
    """Build summary.csv, the plots (unless `plots` is False), verdict.json and report.md of
    `run_dir` from its result files, once; returns what was built.

    Raises ResultFileError when requests.csv (or another present result file) is unusable.
    """
    run = RunDir(run_dir)
    run_dir = run.path
    requests, steps, summary = _summarized(run, percentile_method)
    ranks, failures, details = run.ranks(), run.failures(), run.divergence()
    calibration, env = run.calibration(), run.env(optional=True)
    sides = side_names((env or {}).get("plan"))  # several SGLangs: the first the reference
    write_csv_atomic(run.file("summary"), summary.to_dict("records"), SUMMARY_COLUMNS)
    disagreements = [] if details is None else \
        details.loc[details["kind"] == "disagreement", "what"].astype(str).tolist()
    verdict = judge(requests, ranks, (env or {}).get("plan"), failures, disagreements,
                    consensus_serves.tabulate(run_dir))
    verdict.write(run_dir)
    trace_plots, trace_files = trace_report.write_outputs(run_dir, requests, summary, plots)
    drawn = None  # None: not drawn (the report says so); [] when there is nothing to plot
    if plots:
        from bench.analysis.plots import write_plots  # matplotlib: only when drawing
        drawn = write_plots(run_dir, requests, summary, steps) + trace_plots
    timeline = []  # with a recorded timeline: the figure of a few steps (bench.timeline)
    if plots:
        from bench.timeline.outputs import report_lines
        timeline = report_lines(run_dir)
    divergence = divergence_lines(summary, requests, failures, ranks, details)
    side_text = side_lead(summary, requests, env["plan"]) if sides else []
    if sides:  # the console names call sites short; the chains in full go to a file
        write_text_atomic(run.file("call_sites"),
                          "\n".join(site_lines(requests, sides)) + "\n")
    if beside.pairs((env or {}).get("plan") or {}):  # --model-beside: fidelity.csv too
        model = beside.model_summary(requests, steps, env["plan"], percentile_method,
                                     calibration, ranks)
        lines, rows = beside.lead_and_rows(summary, model, env["plan"], steps)
        write_csv_atomic(run.file("fidelity"), rows, beside.FIDELITY_COLUMNS)
        side_text += lines
    text = render_report(ReportParts(
        run_dir, summary, percentile_method, drawn, divergence, env, calibration, verdict,
        trace_report.tier_lines(summary, requests, trace_files) + timeline, side_text))
    write_text_atomic(run.file("report"), text)
    text_lead = side_text or lead.lead_text(summary, calibration)
    loaded = load_back_line(requests, env)
    return RunReport(run.file("report"), summary, verdict,
                     wrapped(text_lead + ([loaded] if loaded else [])
                             + condition_lines(env, calibration)))
