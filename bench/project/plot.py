"""projection.png: predicted extra step time vs polls per step, the run's measured points marked.

Log-log axes, one panel per PP, one colour per TP; one line style per cost class of the
protocols that pay per poll (classes whose members cost the same, project.projection). Built from
the same row dicts as projection.csv.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # the OO API renders with Agg; no pyplot global state
from matplotlib.lines import Line2D

from bench.analysis.plots import save_figure
from bench.project.grid import Assumptions, CostClass, finite

STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def _lines(ax: Axes, rows: list[dict], member: tuple[str, str], pp: int, tps: list[int],
           style: str) -> None:
    """One line per TP of one protocol/policy at one PP."""
    for i, tp in enumerate(tps):
        pts = sorted((r["polls_per_step"], r["extra_step_ms"]) for r in rows
                     if r["source"] == "model" and (r["protocol"], r["policy"]) == member
                     and r["tp"] == tp and r["pp"] == pp)
        ax.plot([q for q, _ in pts], [e for _, e in pts], style, color=f"C{i}")


def _visible(r: dict, pp: int, members: list[tuple[str, str]]) -> bool:
    if r["source"] != "measured" or r["pp"] != pp or (r["protocol"], r["policy"]) not in members:
        return False
    m, q = r["measured_extra_step_ms"], r["polls_per_step"]
    return finite(m) and m > 0 and finite(q) and q > 0


def _points(ax: Axes, rows: list[dict], pp: int, members: list[tuple[str, str]],
            tps: list[int], marker: str) -> int:
    """The run's measured points of one cost class at one PP, CI as error bars; how many."""
    shown = [r for r in rows if _visible(r, pp, members)]
    for r in shown:
        m, low, high = (r[c] for c in ("measured_extra_step_ms", "measured_extra_step_ci_low_ms",
                                       "measured_extra_step_ci_high_ms"))
        yerr = [[max(m - low, 0)], [max(high - m, 0)]] if finite(low) and finite(high) \
            else None
        color = f"C{tps.index(r['tp'])}" if r["tp"] in tps else "k"
        ax.errorbar([r["polls_per_step"]], [m], yerr=yerr, fmt=marker, color=color,
                    markeredgecolor="k", capsize=3, zorder=3)
    return len(shown)


def _legend(ax: Axes, classes: list[CostClass], tps: list[int]) -> None:
    handles = [Line2D([], [], color=f"C{i}", label=f"TP{tp}") for i, tp in enumerate(tps)]
    handles += [Line2D([], [], color="k", ls=STYLES[i], marker=MARKERS[i], mfc="w",
                       label=k.label.split(":")[0]) for i, k in enumerate(classes)]
    handles.append(Line2D([], [], color="gray", ls=":", label="base decode step"))
    ax.legend(handles=handles, fontsize=7, loc="lower right")


def plot_projection(rows: list[dict], classes: list[CostClass], a: Assumptions,
                    path: Path) -> int:
    """Write the plot of `classes` (those that pay per poll); returns the measured points
    it marks."""
    model = [r for r in rows if r["source"] == "model"]
    tps, pps = sorted({r["tp"] for r in model}), sorted({r["pp"] for r in model})
    fig = Figure(figsize=(4.3 * len(pps) + 1, 4.6))
    axes = fig.subplots(1, len(pps), sharey=True, squeeze=False)[0]
    shown = 0
    for ax, pp in zip(axes, pps, strict=True):
        for i, k in enumerate(classes):
            _lines(ax, rows, k.members[0], pp, tps, STYLES[i % len(STYLES)])
            shown += _points(ax, rows, pp, k.members, tps, MARKERS[i % len(MARKERS)])
        ax.axhline(a.base_step_ms, color="gray", ls=":")
        ax.set(xscale="log", yscale="log", title=f"PP = {pp}",
               xlabel="requests polled per step (Q)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("predicted extra scheduler time per step (ms)")
    _legend(axes[-1], classes, tps)
    fig.suptitle(f"c = {a.c_ms:.3g} ms at TP{a.tp0}, {a.scaling} scaling; markers: this "
                 "run's measurements (95% CI)", fontsize=9)
    save_figure(fig, path)
    return shown
