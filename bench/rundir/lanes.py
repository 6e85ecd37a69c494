"""A duet's lanes (bench.run.duet) merged into one run directory: each lane's rank 0 wrote
its own folder under `lanes/`; the run directory gets every lane's rows, lane 0's env.json
(with each lane's folder named) and a calibration.json holding every lane's c, so the
report is built from it as from any run."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from bench.rundir.files import write_json_atomic, write_text_atomic
from bench.rundir.rundir import RunDir

CSV_ROLES = ("requests", "steps", "ranks", "divergence", "failures")


def merge_lanes(run: RunDir, lanes: list[Path]) -> None:
    """Writes run's CSVs, env.json and calibration.json from the lanes' (a lane that wrote
    nothing, e.g. it died before its first cell, adds nothing)."""
    parts = [RunDir(p) for p in lanes]
    for role in CSV_ROLES:
        _concat(run.file(role), [p.file(role) for p in parts if p.has(role)])
    env = parts[0].env(optional=True)
    if env is not None:
        env["duet_lanes"] = [str(p) for p in lanes]
        env.setdefault("plan", {})["out_dir"] = str(run.path)
        write_json_atomic(run.file("env"), env)
    calib = [p.calibration() for p in parts]
    if calib and calib[0] is not None:
        write_json_atomic(run.file("calibration"),
                          {**calib[0], "lanes": [c and c.get("allreduce") for c in calib]})


def _concat(dst: Path, sources: list[Path]) -> None:
    """One CSV from several with the same header (rows in the sources' order)."""
    if not sources:
        return
    out, header = io.StringIO(), None
    writer = csv.writer(out, lineterminator="\n")
    for src in sources:
        with open(src, newline="") as f:
            reader = csv.reader(f)
            head = next(reader, None)
            assert header is None or head == header, f"{src}: another header"
            if header is None:
                writer.writerow(head)
            header = head
            writer.writerows(reader)
    write_text_atomic(dst, out.getvalue())
