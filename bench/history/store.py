"""A history as plain files: `DIR/history.json` (what the history holds: its kind and the
settings every result in it shares) and one copy of each kept decision.json at
`DIR/<machine>/<commit>/<created>.json`.

Machines stay apart by folder (default: the result's host), so one machine's ratios are
never read beside another's. A commit gated again keeps both files; the history reads the
later one (by `created`) as that commit's result: a rerun after an INCONCLUSIVE on a busy
machine replaces it, and nothing kept is deleted. docs/history.md shows the layout."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from bench.history.load import SHA, HistoryError, read_decision
from bench.rundir.files import write_json_atomic

FORMAT = 1
MARKER = "history.json"
SETTINGS = ("preset", "schedule", "thresholds", "level", "estimator")
MACHINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass
class History:
    """A history read back: its folder, kind, shared settings, and per machine the kept
    result of each commit (the latest by created), with `_file` naming where it lies."""

    path: Path
    kind: str
    settings: dict
    machines: dict[str, list[dict]] = field(default_factory=dict)


def settings_of(decision: dict) -> dict:
    """What every result of one history must share: results measured under other settings
    are not ratios of the same thing."""
    return {k: decision.get(k) for k in SETTINGS}


def _mismatch(have: dict, got: dict) -> str:
    return "; ".join(f"{k} {got[k]!r} (the history's: {have.get(k)!r})"
                     for k in SETTINGS if have.get(k) != got.get(k))


def _stamp(created: object) -> str:
    text = re.sub(r"[^0-9TZ]", "", str(created))
    return text or "unknown"


def read_marker(path: Path) -> dict:
    """DIR/history.json, checked; HistoryError for an empty or foreign directory."""
    marker = path / MARKER
    if not path.is_dir():
        raise HistoryError(f"{path}: no such directory: not a history (start one with "
                           "bench history add)")
    if not marker.is_file():
        what = "an empty directory" if not any(path.iterdir()) else "a foreign directory"
        raise HistoryError(f"{path}: {what}, not a history (no {MARKER}; start one with "
                           "bench history add)")
    try:
        head = json.loads(marker.read_text())
    except (OSError, ValueError) as e:
        raise HistoryError(f"{marker}: unreadable ({e})") from None
    if not isinstance(head, dict) or head.get("format") is None or "settings" not in head:
        raise HistoryError(f"{marker}: not a history's {MARKER}")
    if head["format"] > FORMAT:
        raise HistoryError(f"{marker}: format {head['format']} is newer than this bench "
                           f"reads ({FORMAT}): update hicache-bench")
    return head


def add(path: Path, decision_file: Path, machine: str | None = None,
        commit: str | None = None) -> str:
    """Keep one decision.json in the history at `path` (created when absent or empty);
    returns what it did. Refused (HistoryError, nothing written): a foreign directory, a
    result whose kind or settings differ from the history's, a bad machine name."""
    decision = read_decision(decision_file)
    machine = machine or str(decision["host"])
    if not MACHINE.match(machine):
        raise HistoryError(f"machine name {machine!r}: use letters, digits, '.', '_', '-'")
    if commit is None and (decision["commit"] is None or decision.get("dirty")):
        raise HistoryError(f"{decision_file}: its tree was dirty or has no commit: what ran is "
                           "no commit's; gate a committed tree, or name the commit with --commit")
    commit = commit or decision["commit"]
    if not SHA.match(commit):
        raise HistoryError(f"--commit {commit!r}: not a git sha")
    fresh = not path.exists() or (path.is_dir() and not any(path.iterdir()))
    if fresh:
        head = {"format": FORMAT, "kind": decision["kind"], "settings": settings_of(decision),
                "written_by": "hicache-bench: bench history add"}
    else:
        head = read_marker(path)
        if decision["kind"] != head.get("kind"):
            raise HistoryError(f"{decision_file}: a {decision['kind']} result, and {path} "
                               f"keeps {head.get('kind')} results: keep them apart")
        diff = _mismatch(head["settings"], settings_of(decision))
        if diff:
            raise HistoryError(f"{decision_file}: refused: its settings differ from the "
                               f"history's ({path}): {diff}: start another history")
    target = path / machine / commit / f"{_stamp(decision['created'])}.json"
    kept = {**decision, "kept": {"machine": machine, "commit": commit,
                                 "source": str(Path(decision_file).resolve()),
                                 "added": dt.datetime.now(dt.timezone.utc)
                                 .strftime("%Y-%m-%dT%H:%M:%SZ")}}
    if target.exists():
        if json.loads(target.read_text()).get("created") == decision["created"]:
            return f"history: {machine} {commit[:10]}: already kept ({target})"
        target = target.with_name(f"{target.stem}_{len(list(target.parent.iterdir()))}.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    if fresh:
        write_json_atomic(path / MARKER, head)
    write_json_atomic(target, kept)
    earlier = len(list(target.parent.glob("*.json"))) - 1
    again = f" (gated again: {earlier} earlier result(s) kept, this one read)" if earlier else ""
    return f"history: kept {machine} {commit[:10]} {decision['verdict']} in {target}{again}"


def load(path: Path, machine: str | None = None) -> History:
    """The history at `path` (one machine's, or every machine's), each commit's latest
    result; HistoryError for an empty or foreign directory and for mixed settings."""
    head = read_marker(path)
    hist = History(path, head.get("kind", "gate"), head["settings"])
    names = sorted(d.name for d in path.iterdir() if d.is_dir() and MACHINE.match(d.name))
    if machine is not None:
        if machine not in names:
            raise HistoryError(f"{path}: no machine {machine!r} (it has: "
                               f"{', '.join(names) or 'none'})")
        names = [machine]
    for name in names:
        results = [_latest(d, head) for d in sorted((path / name).iterdir()) if d.is_dir()]
        if results := [r for r in results if r is not None]:
            hist.machines[name] = results
    if not hist.machines:
        raise HistoryError(f"{path}: a history with no results yet (add one with "
                           "bench history add)")
    return hist


def _latest(folder: Path, head: dict) -> dict | None:
    """The latest result kept for one commit, every file of it checked against the
    history's kind and settings."""
    best = None
    for f in sorted(folder.glob("*.json")):
        r = read_decision(f)
        diff = _mismatch(head["settings"], settings_of(r))
        if diff or r["kind"] != head.get("kind"):
            raise HistoryError(f"{f}: results of different settings mixed in one history: "
                               f"{diff or 'kind ' + repr(r['kind'])}")
        r["_file"] = str(f)
        r["_commit"] = folder.name  # the commit it was kept as (add's --commit, else its own)
        if best is None or str(r["created"]) >= str(best["created"]):
            best = r
    return best
