"""decision.json of a `bench review` (kind "review", schema 1), beside its review.md: the
whole verdict and exit code, the sides, the timing checks with their intervals, pairs and
seconds, and the machine's disturbance. Scripts read this file, never console lines.
The schema: docs/sglang-ci.md, "The result file"; the gate writes the same kind of file.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.analysis.side_timings import ESTIMATOR, LEVEL, Verdict
from bench.rundir.env import git_info
from bench.rundir.files import write_json_atomic
from bench.rundir.rundir import REPO_DIR, RunDir, utc_time

SCHEMA = 1
KIND = "review"
EXIT = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 77}


def whole(exact_failed: int, timings: list[Verdict]) -> str:
    """FAIL if any check FAILs (exact or timing); else INCONCLUSIVE if any timing check is;
    else PASS. NOT JUDGED and REFUSED never make a PASS into a FAIL."""
    if exact_failed or any(v.state == "FAIL" for v in timings):
        return "FAIL"
    return "INCONCLUSIVE" if any(v.state == "INCONCLUSIVE" for v in timings) else "PASS"


@dataclass(frozen=True)
class Review:
    """What the review decided, for its decision.json."""

    sides: list[tuple[str, str]]  # (label, spec), the reference first
    plan: dict | None  # the first stage's run plan (env.json's)
    timings: object  # bench.hazards.review_stages.Timings
    exact_checks: int
    exact_failed: int
    thresholds: dict[str, float]
    refused: list[str]  # hazard cells refused on a side, a line each


def _branch() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=REPO_DIR,
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    name = out.stdout.strip()
    return name if out.returncode == 0 and name and name != "HEAD" else None


def _side(label: str, spec: str) -> dict:
    return {"label": label or spec, "commit": None, "spec": spec}


def _metric(v: Verdict, layout: str) -> dict:
    return {"metric": v.metric, "protocol": v.side, "policy": v.policy, "layout": layout,
            "ratio": v.point, "low": v.low, "high": v.high,
            "half_width": None if v.half_width is None else round(v.half_width, 5),
            "needed_half_width": None if v.needed_half_width is None
            else round(v.needed_half_width, 5),
            "threshold": v.threshold, "verdict": v.state, "pairs": v.pairs, "note": v.note}


def _schedule(plan: dict) -> str | None:
    return (plan.get("system") or {}).get("schedule") or plan.get("schedule")


def _layout(plan: dict) -> str:
    storage = plan.get("storage")
    kind = storage.get("kind", "sim") if isinstance(storage, dict) else storage or "sim"
    return f"tp{plan.get('tp', '?')} pp{plan.get('pp', 1)} {kind} {_schedule(plan) or '?'}"


def record(r: Review) -> dict:
    """The decision's content (docs/sglang-ci.md, "The result file")."""
    plan, t = r.plan or {}, r.timings
    verdict = whole(r.exact_failed, t.verdicts)
    git = git_info()
    return {
        "schema": SCHEMA, "kind": KIND, "verdict": verdict, "exit_code": EXIT[verdict],
        "created": utc_time().replace("+00:00", "Z"), "host": socket.gethostname(),
        "cores": os.cpu_count(), "commit": git["commit"], "dirty": git["dirty"],
        "branch": _branch(),
        "a": _side(*r.sides[0]), "b": _side(*r.sides[1]),
        "others": [_side(*s) for s in r.sides[2:]],
        "preset": plan.get("preset"), "schedule": _schedule(plan),
        "protocols": list(plan.get("protocols") or []),
        "policies": list(plan.get("policies") or []),
        "thresholds": r.thresholds, "estimator": ESTIMATOR, "level": LEVEL,
        "pairs": t.pairs, "pairs_kept": t.pairs, "seconds": t.seconds,
        "stages": [{"folder": s.folder, "exit": s.code, "repeats": s.repeats,
                    "seed": s.seed, "seconds": s.seconds} for s in t.stages],
        "disturbance": {k: t.disturbance[k] for k in
                        ("cpu_lost_p50", "cpu_lost_p90", "quiet", "quiet_limit")},
        "exact": {"checks": r.exact_checks, "failed": r.exact_failed},
        "refused": r.refused,
        "metrics": [_metric(v, _layout(plan)) for v in t.verdicts],
    }


def write(folder: Path | str, r: Review) -> dict:
    """decision.json into `folder`, atomically; its content."""
    out = record(r)
    write_json_atomic(RunDir(folder).file("decision"), out)
    return out
