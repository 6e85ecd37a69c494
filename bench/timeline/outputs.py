"""What `bench timeline` and the report write from a run's recorded timeline: the Perfetto
trace of a window of one cell, and the figure of a few steps of that cell beside the same
steps under the other protocol of the pair (pr27010, pr36425)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.rundir.timeline import FIGURE_FILE, TRACE_FILE
from bench.timeline import figure, load, slices
from bench.timeline.load import CellRecord, TimelineInputError

PAIR = ("pr27010", "pr36425")  # the figure's two panels
FIGURE_POLICY = "wait_complete"  # the report's figure: where pr27010 polls most


@dataclass(frozen=True)
class Written:
    timeline: slices.Timeline
    trace: Path | None  # None: the perfetto package is missing (`missing` says so)
    figure: Path
    missing: str | None = None


def write_outputs(run_dir: Path, cell: str | None, steps: str | None,
                  out: Path | None = None) -> Written:
    """The trace of `steps` (A:B, default every step) of `cell` (default the first
    recorded), and the figure; TimelineInputError for a cell or window not recorded."""
    from bench.timeline import perfetto_trace

    record = load.load_cell(run_dir, load.find_cell(run_dir, cell))
    window = load.parse_window(steps, record.steps, record.label)
    tl = slices.build(record, window)
    fig_window = window if steps is not None and window[1] - window[0] <= 8 else None
    fig = write_pair_figure(run_dir, record, run_dir / FIGURE_FILE, fig_window)
    try:
        perfetto_trace.require_perfetto()
    except ImportError as e:
        return Written(tl, None, fig, str(e))
    path = out or run_dir / TRACE_FILE
    from bench.rundir.files import atomic_open

    with atomic_open(path, "wb") as f:
        f.write(perfetto_trace.trace_bytes(tl))
    return Written(tl, path, fig)


def write_pair_figure(run_dir: Path, record: CellRecord, path: Path,
                      window: tuple[int, int] | None = None) -> Path:
    """The figure of `record`'s cell, beside its pair's cell when the run recorded it."""
    return figure.write_figure(path, pair_panels(run_dir, record, window))


def pair_panels(run_dir: Path, record: CellRecord,
                window: tuple[int, int] | None = None) -> list[slices.Timeline]:
    """The figure's panels: `record`'s cell and its pair's (PAIR order), each cut to
    `window` or, by default, to a few steps from the first that polled."""
    records = [record]
    other = load.find_pair_cell(run_dir, record, PAIR)
    if other is not None:
        records.append(load.load_cell(run_dir, other))
        records.sort(key=lambda r: PAIR.index(r.cell["protocol"]))
    panels = []
    for r in records:
        w = window if window is not None and window[1] <= r.steps else \
            figure.figure_window(r.ranks[0]["steps"])
        panels.append(slices.build(r, w))
    return panels


def report_figure(run_dir: Path) -> str | None:
    """The report's figure (pr27010 beside pr36425, wait_complete, the first repeat
    recorded), written into the run directory; None when the run recorded no such cell."""
    try:
        cells = load.cell_index(run_dir)
    except TimelineInputError:
        return None
    wanted = [i for i, c in sorted(cells.items())
              if c["protocol"] in PAIR and c["policy"] == FIGURE_POLICY]
    if not wanted:
        wanted = sorted(cells)
    record = load.load_cell(run_dir, wanted[0])
    write_pair_figure(run_dir, record, run_dir / FIGURE_FILE)
    return FIGURE_FILE


def report_lines(run_dir: Path) -> list[str]:
    """report.md's "Where a step's time goes" section: the figure, when the run recorded a
    timeline; no lines otherwise."""
    name = report_figure(run_dir)
    if name is None:
        return []
    return ["## Where a step's time goes", "",
            "A few steps on every rank and thread, pr27010 beside pr36425 (the run's timeline; "
            "each collective coloured by call site, its wait for a peer hatched). The whole "
            f"timeline: `python -m bench timeline {run_dir.name}` writes {TRACE_FILE} for "
            "ui.perfetto.dev (docs/timeline.md).", "", f"![timeline]({name})", ""]
