"""The history's figures (matplotlib, Agg): per series, the ratio B/A per commit with its
interval coloured by verdict, the gate's threshold, re-recorded baselines and the steps
found; below it, each commit's drift against the oldest kept commits with its interval and
the creep threshold."""

from __future__ import annotations

from pathlib import Path

from bench.history.rules import Finding, Rules, drift, epochs
from bench.history.series import Series

COLOURS = {"PASS": "tab:green", "FAIL": "tab:red", "INCONCLUSIVE": "tab:orange"}
OTHER = "tab:gray"


def draw(series: Series, labels: list[str], findings: list[Finding], rules: Rules,
         out: Path) -> Path:
    """Write `out` (a PNG) for one series; `labels` names each commit position."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.6))
    top, low = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    fig.subplots_adjust(left=0.08, right=0.98, top=0.93, bottom=0.17, hspace=0.06)
    _ratios(top, series, findings)
    _drift(low, series, rules)
    ticks = _ticks(len(labels))
    low.set_xticks(ticks, [labels[i] for i in ticks], rotation=60, fontsize=7,
                   fontfamily="monospace")
    low.set_xlabel("commit (oldest left)")
    fig.suptitle(f"{series.machine}: {series.name}", fontsize=11)
    fig.savefig(out, dpi=90)
    return out


def _ratios(ax, series: Series, findings: list[Finding]) -> None:
    for verdict in dict.fromkeys(p.verdict for p in series.points):
        pts = [p for p in series.points if p.verdict == verdict]
        colour = COLOURS.get(verdict, OTHER)
        x = [p.index for p in pts]
        ax.vlines(x, [p.low or p.ratio for p in pts], [p.high or p.ratio for p in pts],
                  color=colour, lw=1.2)  # one collection a verdict: cheap at 100s of commits
        ax.plot(x, [p.ratio for p in pts], "o", ms=3.5, color=colour, label=verdict)
    ax.axhline(1 + series.threshold, color="tab:red", ls="--", lw=1,
               label=f"threshold 1 + {series.threshold:g}")
    ax.axhline(1, color="black", lw=0.6)
    for a, b in zip(series.points, series.points[1:], strict=False):
        if a.a_commit != b.a_commit:
            ax.axvline(b.index - 0.5, color="tab:blue", ls=":", lw=1)
    for f in findings:
        if f.kind == "step" and f.series is series:
            at = next(p.index for p in series.points if p.commit == f.commit)
            ax.axvline(at - 0.5, color="tab:purple", lw=1.5, alpha=0.7)
            ax.annotate(f"step {f.change:+.1%}", (at - 0.5, 1 + series.threshold),
                        fontsize=8, color="tab:purple", xytext=(3, 3),
                        textcoords="offset points")
    ax.set_ylabel("B/A (baseline revision)")
    ax.legend(fontsize=7, loc="upper left", ncols=5)
    ax.grid(alpha=0.3)


def _drift(ax, series: Series, rules: Rules) -> None:
    for pts in epochs(series):
        rows = drift(pts, rules)
        if not rows:
            continue
        x = [r[0] for r in rows]
        ax.fill_between(x, [r[2] for r in rows], [r[3] for r in rows], color="tab:blue",
                        alpha=0.2, lw=0)
        ax.plot(x, [r[1] for r in rows], color="tab:blue", lw=1.2, marker=".", ms=3)
    ax.axhline(rules.creep_threshold, color="tab:purple", ls="--", lw=1,
               label=f"creep threshold {rules.creep_threshold:+.0%}")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_ylabel("drift vs oldest kept")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:+.0%}")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)


def _ticks(n: int, most: int = 25) -> list[int]:
    step = max(1, -(-n // most))
    return list(range(0, n, step))
