"""The gate's outcome: its checks, its verdict (bench.verdict.checks.verdict_of) and the exit
code that goes with it, and the decision.json a served A/B leaves in RUN/ab
(bench.rundir.decision: the file; bench.gate.timing: the timing rule)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.analysis.estimate import ESTIMATOR
from bench.rundir.decision import (
    Decision,
    Disturbance,
    Exact,
    Metric,
    Side,
    now_utc,
)
from bench.stats import LEVEL
from bench.verdict.checks import Check, is_timing, state, verdict_of
from bench.verdict.words import EXIT_CODES

if TYPE_CHECKING:  # the served A/B's engine is not imported to judge or print a gate
    from bench.gate.ab import ServedAb


def metric_name(c: Check) -> str:
    return c.check.removesuffix("_ab").removesuffix("_ratio_vs_baseline")


@dataclass(frozen=True)
class GateOutcome:
    """What `bench gate` decided: its checks, a line on how the timings were made, the
    verdict, the disturbance the timings saw (None: not measured here) and the
    decision.json it wrote (None without --ab)."""

    checks: list[Check]
    context: str
    verdict: str
    disturbance: Disturbance | None = None
    decision: Path | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def _metric(c: Check) -> Metric:
    iv = c.interval
    decided = not c.unresolved
    return Metric(metric_name(c), c.protocol, c.policy, c.layout, iv.point,
                  iv.low if iv.has_interval else None, iv.high if iv.has_interval else None,
                  c.resolves, None if decided else c.needed, c.threshold or 0.0, state(c),
                  int(iv.n or 0), c.note)



def gate_decision(checks: list[Check], served: ServedAb, settings: dict,
                  thresholds: dict[str, float]) -> Decision:
    """The decision of a gate whose timings came from `served` (bench.gate.ab.ServedAb)."""
    from bench.rundir.env import git_branch, git_info

    timing = [c for c in checks if is_timing(c)]
    exact = [c for c in checks if not is_timing(c)]
    verdict = verdict_of(checks)
    git, ab, plan = git_info(), settings["ab"], served.plan
    gated = {metric_name(c) for c in timing}
    return Decision(
        kind="gate", verdict=verdict, exit_code=EXIT_CODES[verdict], created=now_utc(),
        host=socket.gethostname(), cores=os.cpu_count(), commit=git["commit"],
        dirty=git["dirty"], branch=git_branch(), a=Side(plan.a.label, plan.a.sha),
        b=Side("worktree", git["commit"]), preset=plan.preset, schedule=ab.get("schedule"),
        protocols=_listed(ab.get("protocols")), policies=_listed(ab.get("policies")),
        thresholds={m: t for m, t in thresholds.items() if m != "ttft" or m in gated},
        estimator=ESTIMATOR, level=LEVEL, pairs=served.pairs,
        pairs_kept=max((c.interval.n or 0 for c in timing), default=served.pairs),
        seconds=served.seconds, disturbance=served.disturbance,
        exact=Exact(len(exact), sum(not c.passed for c in exact)),
        metrics=[_metric(c) for c in timing])


def _listed(value: str | None) -> list[str]:
    return [x for x in (value or "").split(",") if x]
