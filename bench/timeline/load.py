"""Choosing what a timeline shows: one recorded cell of a run (`protocol/policy/repeat`) and
a window of its steps (`A:B`, half-open, the scheduler's step numbers, the same on every
rank), read from the files of bench.rundir.timeline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.rundir.files import ResultFileError
from bench.rundir.timeline import has_timeline, read_events, recorded_cells


class TimelineInputError(ValueError):
    """A cell or window the run did not record; the message is one line."""


@dataclass(frozen=True)
class CellRecord:
    """Every rank's record of one cell (bench.rundir.timeline's files, rank order)."""

    cell: dict
    ranks: list[dict]

    @property
    def label(self) -> str:
        return cell_label(self.cell)

    @property
    def steps(self) -> int:
        return len(self.ranks[0]["steps"])


def cell_label(cell: dict) -> str:
    return f"{cell['protocol']}/{cell['policy']}/{cell['repeat']}"


def cell_index(run_dir: Path) -> dict[int, dict]:
    """cell index -> its cell (protocol, policy, repeat, rate) for every recorded cell."""
    if not has_timeline(run_dir):
        raise TimelineInputError(f"{run_dir} recorded no timeline (record one with "
                                 f"`python -m bench run --timeline`)")
    return {i: read_events(paths[0])["cell"] for i, paths in recorded_cells(run_dir).items()}


def find_cell(run_dir: Path, spec: str | None) -> int:
    """The index of the cell `spec` names (protocol/policy/repeat); None: the first."""
    cells = cell_index(run_dir)
    if spec is None:
        return min(cells)
    parts = spec.split("/")
    if len(parts) != 3:
        raise TimelineInputError(f"--cell {spec!r}: expected protocol/policy/repeat, "
                                 f"e.g. {cell_label(cells[min(cells)])}")
    hits = [i for i, c in cells.items() if cell_label(c) == spec]
    if not hits:
        known = ", ".join(sorted({cell_label(c) for c in cells.values()}))
        raise TimelineInputError(f"unknown cell {spec!r}; recorded: {known}")
    if len(hits) > 1:
        rates = ", ".join(f"{cells[i]['rate_rps']:g}" for i in hits)
        raise TimelineInputError(f"cell {spec!r} is ambiguous: it ran at rates {rates}")
    return hits[0]


def load_cell(run_dir: Path, index: int) -> CellRecord:
    paths = recorded_cells(run_dir).get(index)
    if not paths:
        raise TimelineInputError(f"{run_dir}: no timeline for cell {index}")
    ranks = [read_events(p) for p in paths]
    if [r["rank"] for r in ranks] != list(range(len(ranks))):
        raise ResultFileError(f"{run_dir}: cell {index}'s timeline lacks a rank's file")
    return CellRecord(ranks[0]["cell"], ranks)


def find_pair_cell(run_dir: Path, record: CellRecord, protocols: tuple[str, str]) -> int | None:
    """The cell of the other protocol of `protocols` with the same policy and repeat (the
    figure's second panel), or None if the run did not record it."""
    if record.cell["protocol"] not in protocols:
        return None
    other = protocols[1 - protocols.index(record.cell["protocol"])]
    for i, c in cell_index(run_dir).items():
        if (c["protocol"], c["policy"], c["repeat"]) == \
                (other, record.cell["policy"], record.cell["repeat"]):
            return i
    return None


def parse_window(spec: str | None, steps: int, label: str) -> tuple[int, int]:
    """Steps A:B (half-open) within the cell's `steps`; None: every step."""
    if spec is None:
        return 0, steps
    try:
        a_text, b_text = spec.split(":")
        a = int(a_text) if a_text else 0
        b = int(b_text) if b_text else steps
    except ValueError:
        raise TimelineInputError(f"--steps {spec!r}: expected A:B, e.g. 10:20") from None
    if not 0 <= a < b <= steps:
        raise TimelineInputError(f"--steps {spec}: outside the run: cell {label} has steps "
                                 f"0:{steps}")
    return a, b
