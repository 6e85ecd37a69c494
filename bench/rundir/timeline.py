"""The timeline's files in a run directory: each rank's recorded events per cell (written by
the sink when the run recorded a timeline: `bench run --timeline`), and what `bench
timeline` draws from them.

One gzipped JSON object per cell and rank, `timeline/cell007.rank1.json.gz`: the cell
(protocol, policy, repeat, rate, index), the rank's place in the grid, its process groups'
member ranks, every thread's events (hicache.memory.events), and its steps and requests with
their unrounded stamps (this rank's time.monotonic() seconds; `arrival` is rank 0's).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from bench.rundir.files import ResultFileError, atomic_open

TIMELINE_DIR = "timeline"  # the events, per cell and rank
TRACE_FILE = "timeline.pftrace"  # what `bench timeline` writes (Perfetto protobuf)
FIGURE_FILE = "timeline.png"  # a few steps on every rank, two protocols side by side


def events_path(run_dir: Path, cell_index: int, rank: int) -> Path:
    return Path(run_dir) / TIMELINE_DIR / f"cell{cell_index:03d}.rank{rank}.json.gz"


def write_events(run_dir: Path, cell: dict, rank_record: dict) -> Path:
    """One rank's timeline of one cell, atomically (a reader never sees half a file)."""
    path = events_path(run_dir, cell["index"], rank_record["rank"])
    path.parent.mkdir(exist_ok=True)
    data = json.dumps({"cell": cell, **rank_record}, separators=(",", ":")).encode()
    with atomic_open(path, "wb") as f:
        f.write(gzip.compress(data, compresslevel=6))
    return path


def has_timeline(run_dir: Path) -> bool:
    d = Path(run_dir) / TIMELINE_DIR
    return d.is_dir() and any(d.glob("cell*.rank*.json.gz"))


def recorded_cells(run_dir: Path) -> dict[int, list[Path]]:
    """cell index -> its ranks' files, rank order."""
    out: dict[int, list[Path]] = {}
    for p in sorted((Path(run_dir) / TIMELINE_DIR).glob("cell*.rank*.json.gz")):
        index = int(p.name[4:7])
        out.setdefault(index, []).append(p)
    for paths in out.values():
        paths.sort(key=lambda p: int(p.name.split(".rank")[1].split(".")[0]))
    return out


def read_events(path: Path) -> dict:
    """One rank's record of one cell; ResultFileError (one line) if it is unreadable."""
    try:
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
    except (OSError, ValueError, EOFError) as e:
        raise ResultFileError(f"{path}: unreadable timeline file ({e})") from e
    missing = [k for k in ("cell", "rank", "groups", "threads", "steps", "requests")
               if k not in data]
    if missing:
        raise ResultFileError(f"{path}: missing keys {', '.join(missing)}")
    return data
