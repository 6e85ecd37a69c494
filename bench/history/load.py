"""Reading one decision.json (bench.rundir.decision owns the file) as a plain dict, checked
for what a history needs: the one seam where this package reads a result file."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from bench.rundir.files import ResultFileError
from bench.verdict.words import DECISION_VERDICTS, METRIC_VERDICTS

TOP_KEYS = ("kind", "verdict", "created", "host", "commit", "a", "preset", "thresholds",
            "metrics")
METRIC_KEYS = ("metric", "protocol", "policy", "ratio", "low", "high", "threshold", "verdict")
SHA = re.compile(r"^[0-9a-f]{7,40}$")


class HistoryError(ResultFileError):
    """A history or a result file that cannot be used: one line, exit 2."""


def read_decision(path: Path) -> dict:
    """decision.json at `path` as a dict (bench.rundir.decision.read, the file's one reader),
    checked for what a history keeps; HistoryError (one line) when it is unreadable, from a
    newer schema, or lacks what a history keeps."""
    from bench.rundir import decision

    try:
        obj = dataclasses.asdict(decision.read(Path(path)))
    except ResultFileError as e:
        raise HistoryError(str(e)) from None
    check_decision(obj, str(path))
    return obj


def check_decision(obj: dict, where: str) -> dict:
    """The fields the history reads, present and of the right kind, else HistoryError."""
    missing = [k for k in TOP_KEYS if k not in obj]
    if missing:
        raise HistoryError(f"{where}: not a decision.json: no {', '.join(missing)}")
    if obj["kind"] not in ("gate", "review") or obj["verdict"] not in DECISION_VERDICTS:
        raise HistoryError(f"{where}: kind {obj['kind']!r} / verdict {obj['verdict']!r} "
                           "is not a gate's or a review's")
    if obj["commit"] is not None and not (isinstance(obj["commit"], str)
                                          and SHA.match(obj["commit"])):
        raise HistoryError(f"{where}: commit must be a git sha or null, got {obj['commit']!r}")
    if not isinstance(obj["a"], dict) or not isinstance(obj["metrics"], list):
        raise HistoryError(f"{where}: a must be an object and metrics a list")
    for i, m in enumerate(obj["metrics"]):
        if not isinstance(m, dict) or any(k not in m for k in METRIC_KEYS):
            raise HistoryError(f"{where}: metrics[{i}] lacks one of {', '.join(METRIC_KEYS)}")
        if m["verdict"] not in METRIC_VERDICTS:
            raise HistoryError(f"{where}: metrics[{i}]: unknown verdict {m['verdict']!r}")
        if m["ratio"] is not None and not _interval_ok(m):
            raise HistoryError(f"{where}: metrics[{i}]: ratio/low/high must be positive "
                               "numbers with low <= ratio <= high (or all null)")
    return obj


def _interval_ok(m: dict) -> bool:
    vals = (m["low"], m["ratio"], m["high"])
    if m["low"] is None and m["high"] is None:
        return _positive(m["ratio"])
    return all(_positive(v) for v in vals) and vals[0] <= vals[1] <= vals[2]


def _positive(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
