"""Several run folders merged into one run directory, whose report is then built from it as
from any run's: a duet's lanes (bench.run.duet) or several SGLangs' worlds, each of whose
rank 0 wrote its own folder under `lanes/` (`merge_lanes`), and the stages of a run staged
to resolve (`bench run --resolve`: `merge_stages`), whose repeat numbers continue from
stage to stage. The run directory gets every part's rows, the first part's env.json (with
the parts named) and a calibration.json holding every part's c."""

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
    _merge(run, lanes, [0] * len(lanes), {"duet_lanes": [str(p) for p in lanes]})


def merge_stages(run: RunDir, stages: list[tuple[Path, int]], record: list[dict],
                 planned: dict) -> None:
    """Writes run's files from its stages, each (folder, its repeats): stage k's repeat r
    becomes repeat (the repeats of the stages before it) + r. env.json names the stages
    (`record`: what each ran), and its plan counts every stage's repeats and holds the
    run's own settings where a stage's differ (`planned`: its seed, its target)."""
    offsets = [sum(n for _, n in stages[:k]) for k in range(len(stages))]
    _merge(run, [p for p, _ in stages], offsets, {"stages": record},
           planned | {"repeats": sum(n for _, n in stages)})


def _merge(run: RunDir, folders: list[Path], offsets: list[int], named: dict,
           planned: dict | None = None) -> None:
    parts = [RunDir(p) for p in folders]
    for role in CSV_ROLES:
        _concat(run.file(role), [(p.file(role), k) for p, k in zip(parts, offsets, strict=True)
                                 if p.has(role)])
    env = parts[0].env(optional=True)
    if env is not None:
        env |= named
        env.setdefault("plan", {}).update(planned or {}, out_dir=str(run.path))
        write_json_atomic(run.file("env"), env)
    calib = [p.calibration() for p in parts]
    if calib and calib[0] is not None:
        write_json_atomic(run.file("calibration"),
                          {**calib[0], "lanes": [c and c.get("allreduce") for c in calib]})


def _concat(dst: Path, sources: list[tuple[Path, int]]) -> None:
    """One CSV from several with the same header (rows in the sources' order), each
    source's `repeat` column raised by its offset."""
    if not sources:
        return
    out, header = io.StringIO(), None
    writer = csv.writer(out, lineterminator="\n")
    for src, offset in sources:
        with open(src, newline="") as f:
            reader = csv.reader(f)
            head = next(reader, None)
            assert header is None or head == header, f"{src}: another header"
            if header is None:
                writer.writerow(head)
            header = head
            at = head.index("repeat") if offset and head and "repeat" in head else None
            for row in reader:
                if at is not None and row[at] != "":
                    row[at] = str(int(float(row[at])) + offset)
                writer.writerow(row)
    write_text_atomic(dst, out.getvalue())
