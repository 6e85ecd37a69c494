"""`bench compare`'s and `bench ab`'s outputs: the terminal table, compare.csv (ab.csv),
compare.md (ab.md) and compare_ratios.png (ab_ratios.png), all built from the same row
dicts (bench.compare.comparison.Comparison.rows)."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure  # the OO API renders with Agg; no pyplot global state
from matplotlib.ticker import FuncFormatter, NullFormatter

from bench.analysis.plot_switch import NO_PLOTS, plots_wanted
from bench.analysis.plots import save_figure
from bench.compare.comparison import Comparison, Run
from bench.report.printer import (
    WIDTH,
    fit,
    fixed_width,
    interval_text,
    markdown_table,
    say,
    wrapped,
)
from bench.rundir.env import REPO_DIR
from bench.rundir.files import write_csv_atomic, write_text_atomic

ROW_COLUMNS = ["metric", "kind", "a", "b", "b_minus_a", "ratio_b_over_a", "ratio_ci_low",
               "ratio_ci_high", "ratio_mdd", "repeats", "interval", "n_a", "n_b", "verdict", "note"]
HEADERS = ["configuration", "metric", "A", "B", "B - A", "B/A [95% CI]", "verdict", "note"]
FIXED_LABEL_KEYS = ("protocol", "policy")
COLORS = {"worse": "C3", "better": "C2", "same": "0.4"}


def default_out(comp: Comparison) -> Path:
    return REPO_DIR / "results" / f"compare_{comp.a.name}_vs_{comp.b.name}"


def _num(v: object, fmt: str) -> str:
    """A number cell; unknown (None/NaN) is '-'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, fmt)


def varying_keys(comp: Comparison) -> list[str]:
    """Configuration keys beyond protocol/policy whose values differ between rows."""
    return [k for k in comp.keys if k not in FIXED_LABEL_KEYS
            and len({str(r[k]) for r in comp.rows}) > 1]


def label(row: dict, varying: list[str]) -> str:
    extra = " ".join(f"{k}={row[k]}" for k in varying)
    return f"{row['protocol']}/{row['policy']}" + (f" {extra}" if extra else "")


def _change(row: dict) -> tuple[str, str]:
    """The 'B - A' and 'B/A [95% CI]' cells."""
    if row["kind"] == "count":
        return _num(row.get("b_minus_a"), "+.4g"), "-"
    ratio = interval_text(row.get("ratio_b_over_a"), row.get("ratio_ci_low"),
                          row.get("ratio_ci_high"), ".3f")
    return _num(row.get("b_minus_a"), "+.2f"), ratio


def table_rows(comp: Comparison) -> list[list[str]]:
    """Cells (HEADERS) of every matched row; the configuration is named on its first row."""
    varying, out, last = varying_keys(comp), [], None
    fmt = {"count": ".4g", "timing": ".2f"}
    for r in (r for r in comp.rows if r["kind"] != "configuration"):
        name = label(r, varying)
        diff, ratio = _change(r)
        out.append([name if name != last else "", r["metric"], _num(r.get("a"), fmt[r["kind"]]),
                    _num(r.get("b"), fmt[r["kind"]]), diff, ratio, r["verdict"],
                    r.get("note") or ""])
        last = name
    return out


def one_sided_lines(comp: Comparison) -> list[str]:
    varying = varying_keys(comp)
    return [f"{r['verdict']}: {label(r, varying)} ({', '.join(f'{k}={r[k]}' for k in comp.keys)})"
            for r in comp.rows if r["kind"] == "configuration"]


def format_table(rows: list[list[str]]) -> str:
    """The rows for a terminal, no line over WIDTH: each configuration on a line of its
    own and its metrics below it; a note that does not fit beside its row goes below it."""
    table = fixed_width(HEADERS[1:-1], [r[1:-1] for r in rows], right=frozenset({1, 2, 3, 4}))
    edge = max(map(len, table))  # where a note beside its row starts
    lines = [f"{HEADERS[0]}", f"  {table[0]:<{edge}}  {HEADERS[-1]}"]
    for r, line in zip(rows, table[1:], strict=True):
        if r[0]:
            lines.append(r[0])
        line = f"  {line:<{edge}}" if r[-1] else f"  {line}"
        if r[-1] and len(f"{line}  {r[-1]}") <= WIDTH:
            line = f"{line}  {r[-1]}"
        elif r[-1]:
            lines += [line, *wrapped([f"      {HEADERS[-1]}: {r[-1]}"])]
            continue
        lines.append(line)
    return "\n".join(lines)


def _run_line(side: str, run: Run) -> str:
    git = run.fact("git") or {}
    commit = (git.get("commit") or "unknown")[:10] + (" dirty" if git.get("dirty") else "")
    return f"{side} = {run.path} (commit {commit}, {run.fact('utc_time') or 'time unknown'})"


def context_lines(comp: Comparison) -> list[str]:
    a = comp.a
    return [*(comp.run_lines or [_run_line("A", a), _run_line("B", comp.b)]),
            f"schema version {a.schema_version}, preset {a.setting('preset')}, "
            f"TP{a.setting('tp')} x PP{a.setting('pp')}; ratios B/A paired by repeat, 95% t "
            f"intervals over the repeats; threshold {comp.threshold:g}",
            f"note: {comp.drift_note}" if comp.drift_note else ""]


def print_comparison(comp: Comparison, written: list[Path]) -> None:
    """Warnings first, then context, one-sided rows, the table, the files, the final line."""
    lines = [*comp.header, *filter(None, context_lines(comp)), *one_sided_lines(comp),
             format_table(table_rows(comp)), f"wrote {', '.join(str(p) for p in written)}",
             comp.final_line()]
    say(fit(*lines))


def write_csv(comp: Comparison, path: Path) -> None:
    write_csv_atomic(path, comp.rows + comp.extra_rows,
                     comp.keys + ROW_COLUMNS + comp.extra_columns)


RULES = [
    "- Counts are rank 0's collectives, exact. Any change is flagged whatever the threshold: "
    "worse when B issues more, better when fewer. Polls follow timing, so when polls/req "
    "differ the collectives inside polls are judged per poll (decision/poll; critical = "
    "in-poll per poll and completions per request); with step kinds, step collectives are "
    "judged per kind. polls/req is shown, never judged.",
    "- Timings: per repeat (one whole serve) the metric's statistic of A and of B, paired "
    "by repeat (the same seed); the ratio B/A is exp(mean of ln(b_r / a_r)) with a 95% t "
    "interval over the paired repeats (docs/metrics.md, \"Intervals\"). worse: interval "
    "entirely above 1 + threshold; better: entirely below 1 - threshold; else same; not "
    "comparable without an interval (fewer than 3 paired repeats, or no scipy). `a` and `b` "
    "pool every repeat; `ratio_mdd` is the interval's half-width as a fraction, the "
    "smallest difference the runs could resolve.",
    "- `a`, `b` and `b_minus_a` in the CSV are in the unit the metric's name ends with "
    "(`_ms`; collectives for counts).",
]


def render_markdown(comp: Comparison, plot: str | None) -> str:
    one_sided = one_sided_lines(comp)
    return "\n".join([
        f"# bench {comp.verb}: {comp.a.name} vs {comp.b.name}", "",
        *(f"- {line}" for line in comp.header + context_lines(comp) if line), "",
        f"**{comp.final_line()}** (exit status {1 if comp.tally()['worse'] else 0})", "",
        "## Rules", "", f"Threshold {comp.threshold:g}.", *RULES, "",
        "## Rows", "", markdown_table(HEADERS, table_rows(comp)), "",
        *comp.sections,
        "## Configurations on one side only", "",
        *([f"- {line}" for line in one_sided] or ["None."]), "",
        "## Timing ratios", "",
        _plot_line(plot), "",
    ])


def _ratio_rows(comp: Comparison) -> list[dict]:
    return [r for r in comp.rows if r["kind"] == "timing" and r.get("ratio_ci_low") is not None]


def _ratio_ticks(rows: list[dict], metric: str) -> list[float]:
    """Round ratio ticks spanning the metric's intervals (and 1): fine for a narrow span."""
    ends = [v for r in rows if r["metric"] == metric for v in (r["ratio_ci_low"],
                                                             r["ratio_ci_high"])]
    low, high = min(ends + [1.0]), max(ends + [1.0])
    fine = high / low < 3
    candidates = ((0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0) if fine
                  else (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100))
    ticks = [t for t in candidates if low / 1.3 <= t <= high * 1.3]
    return ticks if len(ticks) > 1 else [1.0]


def _plot_line(plot: str | None) -> str:
    if plot:
        return f"![timing ratios B/A]({plot})"
    return f"Not drawn: {NO_PLOTS}=1." if not plots_wanted() else "No timing ratio to plot."


def plot_ratios(comp: Comparison, path: Path) -> bool:
    """Ratio B/A with its CI per configuration, one panel per timing metric; False when
    there is nothing to plot."""
    rows = _ratio_rows(comp)
    if not rows:
        return False
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    varying = varying_keys(comp)
    names = list(dict.fromkeys(label(r, varying) for r in rows))
    fig = Figure(figsize=(3.2 * len(metrics) + 2.5, 0.35 * len(names) + 1.6))
    axes = fig.subplots(1, len(metrics), sharey=True, squeeze=False)[0]
    for ax, metric in zip(axes, metrics, strict=True):
        ax.axvspan(1 - comp.threshold, 1 + comp.threshold, color="0.9")
        ax.axvline(1.0, color="k", lw=0.8)
        for r in (r for r in rows if r["metric"] == metric):
            y, p = names.index(label(r, varying)), r["ratio_b_over_a"]
            ax.errorbar([p], [y], xerr=[[p - r["ratio_ci_low"]], [r["ratio_ci_high"] - p]],
                        fmt="o", color=COLORS[r["verdict"]], capsize=3)
        ax.set_xscale("log")  # 2x and 0.5x equally far from 1
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(_ratio_ticks(rows, metric))
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("B / A (log scale)")
    axes[0].set_yticks(range(len(names)), names, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(f"B/A with 95% CI; shaded: 1 +- {comp.threshold:g}; red worse, green better, "
                 "grey same", fontsize=9)
    save_figure(fig, path)
    return True


def write_outputs(comp: Comparison, out: Path) -> list[Path]:
    """<verb>.csv, <verb>_ratios.png (when there is a ratio) and <verb>.md into `out`
    (verb: compare or ab)."""
    out.mkdir(parents=True, exist_ok=True)
    v = comp.verb
    write_csv(comp, out / f"{v}.csv")
    drawn = plots_wanted() and plot_ratios(comp, out / f"{v}_ratios.png")
    plot = f"{v}_ratios.png" if drawn else None
    write_text_atomic(out / f"{v}.md", render_markdown(comp, plot))
    return [out / n for n in (f"{v}.md", f"{v}.csv", plot) if n]
