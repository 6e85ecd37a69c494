"""decision.json of a `bench review` (kind "review"), beside its review.md, written through
bench.rundir.decision (the file's one owner): the whole verdict and exit code, the sides, the
timing checks with their intervals, pairs and seconds, and the machine's disturbance.
Scripts read this file, never console lines (docs/sglang-ci.md, "The result file")."""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.ab.sides import ESTIMATOR, LEVEL, Verdict
from bench.rundir import decision
from bench.rundir.env import git_branch, git_info
from bench.verdict.words import EXIT_CODES, overall

KIND = "review"


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



def _side(label: str, spec: str) -> decision.Side:
    return decision.Side(label or spec, None, spec)


def _metric(v: Verdict, layout: str) -> decision.Metric:
    return decision.Metric(
        v.metric, v.side, v.policy, layout, v.point, v.low, v.high,
        None if v.half_width is None else round(v.half_width, 5),
        None if v.needed_half_width is None else round(v.needed_half_width, 5),
        v.threshold, v.state, v.pairs, v.note)


def _schedule(plan: dict) -> str | None:
    return (plan.get("system") or {}).get("schedule") or plan.get("schedule")


def _layout(plan: dict) -> str:
    storage = plan.get("storage")
    kind = storage.get("kind", "sim") if isinstance(storage, dict) else storage or "sim"
    return f"tp{plan.get('tp', '?')} pp{plan.get('pp', 1)} {kind} {_schedule(plan) or '?'}"


def build(r: Review) -> decision.Decision:
    """The review's Decision (bench.rundir.decision's schema)."""
    plan, t = r.plan or {}, r.timings
    verdict = overall([v.state for v in t.verdicts], r.exact_failed)
    git = git_info()
    return decision.Decision(
        kind=KIND, verdict=verdict, exit_code=EXIT_CODES[verdict],
        created=decision.now_utc(), host=socket.gethostname(), cores=os.cpu_count(),
        commit=git["commit"], dirty=git["dirty"], branch=git_branch(),
        a=_side(*r.sides[0]), b=_side(*r.sides[1]),
        preset=plan.get("preset"), schedule=_schedule(plan),
        protocols=list(plan.get("protocols") or []),
        policies=list(plan.get("policies") or []),
        thresholds=r.thresholds, estimator=ESTIMATOR, level=LEVEL,
        pairs=t.pairs, pairs_kept=t.pairs, seconds=t.seconds, disturbance=t.disturbance,
        exact=decision.Exact(r.exact_checks, r.exact_failed),
        metrics=[_metric(v, _layout(plan)) for v in t.verdicts],
        others=[_side(*s) for s in r.sides[2:]],
        stages=[{"folder": s.folder, "exit": s.code, "repeats": s.repeats, "seed": s.seed,
                 "seconds": s.seconds} for s in t.stages],
        refused=list(r.refused))


def record(r: Review) -> dict:
    """The decision's content, as written."""
    return asdict(build(r))


def write(folder: Path | str, r: Review) -> dict:
    """decision.json into `folder`, atomically; its content."""
    built = build(r)
    decision.write(built, Path(folder))
    return asdict(built)
