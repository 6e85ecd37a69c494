"""What SGLang's own rank-consensus checker said of each serve of a `--sglang-consensus`
run (sglang_adapter.judge.consensus): the journals every rank wrote under the run's `consensus/`
folder (a folder per side and serve, bench.run.worker), read back into consensus.csv, one
row per serve: `silent`, `fired: <function>` (where, and what each rank said, in the detail)
or `absent` (a release that ships no checker), and the collectives the checker issued on its
own groups, which the serve's counts leave out. What the run's verdict makes of it:
bench.verdict.run_rules.findings."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.rundir.files import write_csv_atomic
from bench.rundir.rundir import RunDir, serve_record
from sglang_adapter import consensus_collectives, consensus_verdict, ships_checker

COLUMNS = ["side", "protocol", "policy", "repeat", "serve", "sglang_consensus",
           "consensus_detail", "checker_collectives"]


def serve_rows(folder: Path) -> list[dict]:
    """A row per serve folder (those rank 0 named in serve.json), in side and cell order."""
    rows = []
    for side in sorted(p for p in folder.iterdir() if p.is_dir()):
        serves = [p for p in side.iterdir() if serve_record(p) is not None]
        # cell order (its index leads the name), its warm-up serve before its main one
        for serve in sorted(serves, key=lambda p: (p.name.split("-")[0],
                                                   not p.name.endswith("-warm"))):
            meta = serve_record(serve)
            said = consensus_verdict(serve, meta["world"], present=ships_checker(meta["root"]))
            rows.append({"side": side.name, "protocol": meta["protocol"],
                         "policy": meta["policy"], "repeat": meta["repeat"],
                         "serve": meta["serve"], **said,
                         "checker_collectives": consensus_collectives(serve, meta["world"])})
    return rows


def tabulate(run_dir: Path | str) -> pd.DataFrame | None:
    """consensus.csv written from the run's journals and returned; None for a run without
    the checker."""
    run = RunDir(run_dir)
    folder = run.file("consensus_dir")
    if not folder.is_dir():
        return None
    rows = serve_rows(folder)
    write_csv_atomic(run.file("consensus"), rows, COLUMNS)
    return pd.DataFrame(rows, columns=COLUMNS)
