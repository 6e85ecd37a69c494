"""RunDir: the one owner of a run directory. Every file name of a run, the folders results
are written into (one UTC stamp), the `results/latest` link, and every reader of a run's
files, checked against ONE table of the columns each reader needs and the cells that must
be numbers. Upgrades of files written by older versions happen here and nowhere else.

Nothing outside bench/rundir/ opens a run directory's files by name: writers ask for
`RunDir.file(NAME)` (`.plot(ROLE)`, `.sweep_file(ROLE)`, `.console_log()`,
`write_serve_record`), readers for `RunDir.requests()`, `.steps()`, `.env()` and the rest
(tests/test_layout.py holds it).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd  # annotations only: the ranks import this module, never pandas

from bench.rundir.env import REPO_DIR
from bench.rundir.files import (
    ResultFileError,
    numeric_columns,
    read_csv_checked,
    read_json_object,
    write_json_atomic,
)
from bench.rundir.schema import (
    COUNT_COLUMNS as COUNTS,
)
from bench.rundir.schema import (
    DIVERGENCE_COLUMNS,
    FAILURE_COLUMNS,
    GROUP_KEYS,
    OPTIONAL_COLUMNS,
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    STEP_SITES,
)

RESULTS_DIR = REPO_DIR / "results"
LATEST = "latest"
LEGACY_SCHEMA_VERSION = 2  # runs written before env.json recorded a schema_version

# Every file a run directory may hold, by role.
FILES = {
    "requests": "requests.csv", "steps": "steps.csv", "ranks": "ranks.csv",
    "summary": "summary.csv", "failures": "failures.csv", "divergence": "divergence.csv",
    "env": "env.json", "calibration": "calibration.json", "progress": "progress.json",
    "verdict": "verdict.json", "report": "report.md", "microbench": "microbench.json",
    "gate": "gate.json", "consensus": "consensus.csv",
    # --sglang-consensus: SGLang's checker's journals, a folder per side and serve
    "consensus_dir": "consensus", "hazards": "hazards.csv", "review": "review.md",
    "decision": "decision.json",  # a review's or a gate's verdict for scripts
    "fidelity": "fidelity.csv",
    # several SGLangs: every call-site chain in full (bench.analysis.side_lead.site_file_lines)
    "call_sites": "call_sites.txt",
}

# Folders a run may hold besides FILES' (bench.run.sglang_worlds, bench.rundir.timeline; plots are
# files of their own names).
RUN_FOLDERS = ("sides", "timeline")
# A run's plots, by role (bench.analysis.plots and trace_tiers draw them, report.md shows them).
PLOTS = {"collectives": "collectives_per_request.png", "ttft_cdf": "ttft_cdf.png",
         "breakdown": "ttft_breakdown.png", "over_time": "queue_over_time.png",
         "vs_rate": "ttft_vs_rate.png", "load_sweep": "load_sweep.png"}
# A cost sweep's own files beside its costs' run directories (bench.analysis.sweep).
SWEEP_FILES = {"manifest": "sweep.json", "table": "sweep.csv", "report": "sweep.md",
               "plot": "sweep.png"}
# In each serve's folder under consensus/ (--sglang-consensus): which cell, which serve.
SERVE_RECORD = "serve.json"
# The console of a `bench run` an A/B started, written beside its results before it runs:
# the A/B's file, not the run's (leftovers passes it).
CONSOLE_LOG = "console.log"


# ---- the one column table --------------------------------------------------------------------
SUMMARY_COUNTS = ["decision_collectives_per_req", "expected_decision_collectives_per_req",
                  "background_collectives_per_req", "expected_background_collectives_per_req",
                  "decision_collectives_per_poll"]


@dataclass(frozen=True)
class Columns:
    """What a reader of one file needs: `required` columns; `numeric` cells must be numbers
    where present; `not_empty` numeric cells must hold one."""

    required: tuple[str, ...]
    numeric: tuple[str, ...] = ()
    not_empty: tuple[str, ...] = ()


def _all(columns: list[str]) -> tuple[str, ...]:
    """Every column but those older runs lack (their files stay readable)."""
    return tuple(c for c in columns if c not in OPTIONAL_COLUMNS)


# (file, reader) -> Columns. The readers: "report" rebuilds a run's summary (every column),
# "compare" pairs two runs, "gate" judges counts, "any" needs the keys alone.
COLUMNS: dict[tuple[str, str], Columns] = {
    ("requests", "report"): Columns(_all(REQUEST_COLUMNS)),
    ("requests", "compare"): Columns(
        (*GROUP_KEYS, "repeat", "ttft_ms", *COUNTS), ("tp", "pp", "repeat", "ttft_ms", *COUNTS),
        ("tp", "pp", "repeat", *COUNTS)),
    ("requests", "gate"): Columns(
        (*GROUP_KEYS, "repeat", "rid", "page_size", "polls", "decision_collectives",
         "hit_query_collectives", "ack_collectives", "hit_tokens", "op_issued", "io_issued",
         "ranks_agree", "data_ok"),
        ("tp", "pp", "page_size", "polls", "decision_collectives", "hit_query_collectives",
         "ack_collectives", "hit_tokens"),
        ("tp", "pp", "page_size", "polls", "decision_collectives", "hit_query_collectives",
         "ack_collectives")),
    ("requests", "any"): Columns(("protocol", "policy", "repeat")),
    ("steps", "report"): Columns(_all(STEP_COLUMNS)),
    ("steps", "compare"): Columns((*GROUP_KEYS, "repeat", *STEP_SITES),
                                  ("tp", "pp", "repeat", "step_ms", *STEP_SITES),
                                  ("tp", "pp", "repeat", *STEP_SITES)),
    ("steps", "any"): Columns(_all(STEP_COLUMNS)),  # older runs lack the optional ones
    ("summary", "gate"): Columns(
        (*GROUP_KEYS, *SUMMARY_COUNTS, "ttft_p50_ratio_vs_pr27010", "ttft_p50_ratio_per_repeat",
         "ranks_agree", "data_errors"),
        ("tp", "pp", *SUMMARY_COUNTS, "ttft_p50_ratio_vs_pr27010", "data_errors"),
        ("tp", "pp", "data_errors")),
    ("summary", "any"): Columns(("protocol", "policy")),
    ("summary", "layout"): Columns(("protocol", "policy", "tp", "pp")),
    ("ranks", "any"): Columns(()),
    ("failures", "any"): Columns(tuple(FAILURE_COLUMNS)),
    ("divergence", "any"): Columns(tuple(DIVERGENCE_COLUMNS)),
    ("hazards", "any"): Columns(("scenario", "protocol", "outcome")),
}


def write_serve_record(folder: Path | str, record: dict) -> None:
    """serve.json in one serve's folder under consensus/: which cell, which serve."""
    (Path(folder) / SERVE_RECORD).write_text(json.dumps(record))


def serve_record(folder: Path | str) -> dict | None:
    """What write_serve_record wrote in `folder`; None for a folder without one."""
    path = Path(folder) / SERVE_RECORD
    return json.loads(path.read_text()) if path.exists() else None


def utc_stamp() -> str:
    """The one stamp in results folder names: UTC, to the second."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def utc_time() -> str:
    """The one time recorded inside result files: UTC ISO 8601, to the second."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class RunDir:
    """One results directory: a run (`bench run`), or an ab / bisect / noise / compare /
    gate-power folder, or the committed baseline; each reader raises ResultFileError (one
    line) for a missing or malformed file."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @classmethod
    def new(cls, kind: str, *parts: str, root: Path = RESULTS_DIR) -> RunDir:
        """A new folder's RunDir (not yet created): `bench run`'s are STAMP_PRESET_SHA, the
        others KIND_PARTS_STAMP."""
        name = "_".join([utc_stamp(), *parts] if kind == "run" else [kind, *parts, utc_stamp()])
        return cls(root / name)

    @property
    def name(self) -> str:
        return self.path.resolve().name

    def file(self, role: str) -> Path:
        return self.path / FILES[role]

    def plot(self, role: str) -> Path:
        return self.path / PLOTS[role]

    def sweep_file(self, role: str) -> Path:
        return self.path / SWEEP_FILES[role]

    def console_log(self) -> Path:
        return self.path / CONSOLE_LOG

    def has(self, role: str) -> bool:
        return self.file(role).exists()

    def leftovers(self) -> list[str]:
        """The names in this folder that a run writes (FILES, RUN_FOLDERS, plots), sorted:
        what a new run here would mix with its own. Anything else (a console log beside
        the results) is not a run's."""
        own = set(FILES.values()) | set(RUN_FOLDERS)
        return sorted(p.name for p in self.path.iterdir()
                      if p.name in own or p.suffix == ".png")

    def check_dir(self) -> RunDir:
        if not self.path.is_dir():
            raise ResultFileError(f"{self.path}: no such directory")
        return self

    def link_latest(self, root: Path = RESULTS_DIR) -> None:
        """results/latest -> this directory, when it lies in `root` (a relative link,
        replaced atomically: results/latest always points at a whole directory)."""
        if self.path.resolve().parent != root.resolve():
            return
        latest, tmp = root / LATEST, root / f".{LATEST}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(self.path.name)
        os.replace(tmp, latest)

    # ---- readers ---------------------------------------------------------------------------

    def table(self, role: str, reader: str = "any", optional: bool = False
              ) -> pd.DataFrame | None:
        """A CSV file checked as COLUMNS[(role, reader)] says; None when `optional` and absent."""
        path = self.file(role)
        if optional and not path.exists():
            return None
        cols = COLUMNS[(role, reader)]
        frame = read_csv_checked(path, list(cols.required))
        if cols.numeric:
            frame = numeric_columns(frame, list(cols.numeric), path, list(cols.not_empty))
        return frame

    def requests(self, reader: str = "any") -> pd.DataFrame:
        return self.table("requests", reader)

    def steps(self, reader: str = "any", optional: bool = False) -> pd.DataFrame | None:
        return self.table("steps", reader, optional)

    def summary(self, reader: str = "any", optional: bool = False) -> pd.DataFrame | None:
        return self.table("summary", reader, optional)

    def ranks(self) -> pd.DataFrame | None:
        return self.table("ranks", optional=True)

    def failures(self) -> pd.DataFrame | None:
        return self.table("failures", optional=True)

    def divergence(self) -> pd.DataFrame | None:
        return self.table("divergence", optional=True)

    def hazards(self, optional: bool = False) -> list[dict] | None:
        """A `bench hazards` folder's cells as the run's rows (empty cells None, the step an
        int), as bench.hazards.report wrote them."""
        frame = self.table("hazards", optional=optional)
        if frame is None:
            return None
        rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
        return [{**r, "step": None if r.get("step") is None else int(r["step"])}
                for r in rows]

    def json(self, role: str, optional: bool = False, required: list[str] = ()) -> dict | None:
        path = self.file(role)
        if optional and not path.exists():
            return None
        return read_json_object(path, required)

    def env(self, optional: bool = False) -> dict | None:
        return self.json("env", optional)

    def calibration(self, optional: bool = True) -> dict | None:
        return self.json("calibration", optional)

    def add_to_env(self, key: str, value: object) -> None:
        """Adds one fact to env.json (written by rank 0 at the start), e.g. what the planted
        neighbour ran; nothing when env.json was never written."""
        env = self.env(optional=True)
        if env is not None:
            write_json_atomic(self.file("env"), {**env, key: value})

    def plan(self) -> dict | None:
        """The run's plan as env.json records it (None for runs before it did)."""
        return (self.env(optional=True) or {}).get("plan")

    def schema_version(self) -> object:
        """env.json's schema_version; runs written before it recorded one are version 2."""
        return (self.env(optional=True) or {}).get("schema_version", LEGACY_SCHEMA_VERSION)
