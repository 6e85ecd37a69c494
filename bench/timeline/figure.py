"""The timeline's static figure: a few steps on every rank, one panel per protocol side by
side (pr27010 against pr36425 under one policy and repeat), drawn from the same slices as
the trace (bench.timeline.slices). A row per rank and thread; collectives coloured by call
site, the wait inside each one hatched: pr27010's polls each carry a decision all-reduce,
pr36425's polls none."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from bench.rundir.files import atomic_open
from bench.timeline.slices import THREAD_ORDER, Timeline
from hicache.memory.events import SCHEDULER_THREAD

FIGURE_STEPS = 4  # steps per panel
SITE_COLORS = {"decision": "#d62728", "completion": "#ff7f0e", "request_broadcast": "#7f7f7f",
               "per_step_min": "#1f77b4", "model_allreduce": "#9467bd", "hit_query": "#2ca02c",
               "ack": "#17becf", "pp_hop": "#8c564b", "harness_stop": "#bcbd22",
               "consensus": "#e377c2", "ticket": "#8c564b"}
KIND_COLORS = {"forward": "#c6dbef", "poll": "#fdd0a2", "read": "#a1d99b", "exists": "#c7e9c0",
               "write": "#dadaeb", "load_back": "#fdae6b", "host_copy": "#bcbddc"}
ROWS = tuple(t for t in THREAD_ORDER if t != "requests")


def figure_window(steps: list[dict], n: int = FIGURE_STEPS) -> tuple[int, int]:
    """The first `n` steps from the first one after step 0 that polled a request (the
    regime the protocols differ in), or the first `n` steps if none polled."""
    polled = [s["step"] for s in steps if s["polled"] > 0 and s["step"] > 0]
    a = polled[0] if polled else 0
    a = max(0, min(a, len(steps) - n))
    return a, min(len(steps), a + n)


def write_figure(path: Path, panels: list[Timeline]) -> Path:
    fig = Figure(figsize=(7.5 * len(panels), 1.2 + 0.42 * _rows(panels[0])),
                 layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    span = max(_span(tl) for tl in panels)
    for ax, tl in zip(axes, panels, strict=True):
        _panel(ax, tl, span)
    handles = [Patch(color=c, label=s) for s, c in SITE_COLORS.items()
               if any(x.name == s for tl in panels for x in tl.slices)]
    handles += [Patch(color=c, label=k) for k, c in KIND_COLORS.items()
                if any(x.kind == k for tl in panels for x in tl.slices)]
    handles.append(Patch(facecolor="none", hatch="////", edgecolor="black",
                         label="wait for a peer"))
    fig.legend(handles=handles, loc="outside lower center",
               ncol=min(4 * len(panels), len(handles)),
               fontsize=7, frameon=False)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    return path


def _rows(tl: Timeline) -> int:
    return len(_row_keys(tl))


def _row_keys(tl: Timeline) -> list[tuple[int, str]]:
    present = {(s.rank, s.thread) for s in tl.slices}
    ranks = sorted({r for r, _ in present})
    return [(r, t) for r in ranks for t in ROWS if (r, t) in present]


def _span(tl: Timeline) -> float:
    steps = tl.of_kind("step")
    return (max(s.end for s in steps) - tl.t0) * 1e3 if steps else 1.0


def _panel(ax, tl: Timeline, span_ms: float) -> None:
    keys = _row_keys(tl)
    y = {k: len(keys) - 1 - i for i, k in enumerate(keys)}
    for s in tl.slices:
        row = y.get((s.rank, s.thread))
        if row is None or s.end <= s.start:
            continue
        x, w = (s.start - tl.t0) * 1e3, (s.end - s.start) * 1e3
        _bar(ax, s, row, x, w)
    ax.set_yticks(list(y.values()), [f"rank {r} {t}" for r, t in y], fontsize=7)
    ax.set_xlim(0, span_ms)
    ax.set_xlabel("ms from the window's first step (rank 0's clock)", fontsize=8)
    decisions = sum(1 for s in tl.of_kind("collective", 0) if s.name == "decision")
    polls = len(tl.of_kind("poll", 0))
    ax.set_title(f"{tl.label}, steps {tl.window[0]}-{tl.window[1] - 1}: rank 0 polled "
                 f"{polls}x, {decisions} decision all-reduces", fontsize=9)


def _bar(ax, s, row: int, x: float, w: float) -> None:
    if s.kind == "step":
        ax.broken_barh([(x, w)], (row - 0.5, 1.0), facecolor="none", edgecolor="#444444",
                       linewidth=0.6, zorder=1)
        ax.text(x + w / 2, row + 0.38, s.name.split(" ", 1)[1], fontsize=6, ha="center",
                va="center", clip_on=True)
    elif s.kind == "collective":
        height = 0.5 if s.thread == SCHEDULER_THREAD else 0.7
        ax.broken_barh([(x, w)], (row - height / 2, height),
                       facecolor=SITE_COLORS.get(s.name, "black"), linewidth=0, zorder=3)
    elif s.kind == "wait":
        ax.broken_barh([(x, w)], (row - 0.25, 0.5), facecolor="none", hatch="////",
                       edgecolor="black", linewidth=0, zorder=4)
    elif s.kind in KIND_COLORS:
        height = 0.85 if s.kind in ("forward", "poll") else 0.7
        ax.broken_barh([(x, w)], (row - height / 2, height), facecolor=KIND_COLORS[s.kind],
                       linewidth=0, zorder=2)
