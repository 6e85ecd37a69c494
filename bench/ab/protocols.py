"""The A/B engine's third kind of side: the protocols of one run, staged. `bench run
--resolve F` (make bench's default) serves them in stages until the headline's p50 ratios
(bench.analysis.lead.RESOLVED, each protocol against pr27010 in its policy) each resolve F,
or the budget's seconds or repeats are spent.

Stage k serves the plan's cells for its repeats on seed SEED + k into OUT/stages/KK, as any
run would (serially, in duet lanes or as SGLang sides). After each stage the stages so far
are merged into OUT (bench.rundir.lanes.merge_stages: repeats numbered on from stage to
stage) and OUT's summary read: its intervals are the served A/B's (bench.analysis.estimate
.served, through the summary), the loop and its sizing the sequential A/B's
(bench.ab.sequential.staged, resolving). The report is OUT's, built once at the end; its
env.json names the stages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bench import stats as base
from bench.ab.sequential import Budget, resolving, staged
from bench.analysis.lead import half_widths
from bench.analysis.report import summary_of
from bench.run.plan import RunPlan
from bench.rundir.lanes import merge_stages
from bench.rundir.rundir import RunDir
from bench.stats import NO_SCIPY

WHO = "bench run"
PLANNED = ("seed", "resolve", "budget_s", "budget_repeats")  # the run's, not a stage's


@dataclass(frozen=True)
class Stage:
    """One stage: its seed and repeats, its folder, its seconds and its error (None: every
    cell served)."""

    index: int
    seed: int
    repeats: int
    folder: Path
    seconds: float
    error: str | None = None

    def record(self) -> dict:
        return {"stage": self.index, "seed": self.seed, "repeats": self.repeats,
                "seconds": round(self.seconds, 1), "folder": str(self.folder),
                **({"error": self.error} if self.error else {})}


def serve_staged(plan: RunPlan, serve: Callable[[RunPlan], str | None],
                 log: Callable[[str], None]) -> str | None:
    """Every stage of `plan` served by `serve` (a stage's plan -> its error, or None) and
    merged into plan.out_dir; the stages' errors joined, or None."""
    out = RunDir(plan.out_dir)
    size = resolving(plan.resolve, Budget(plan.budget_repeats, plan.budget_s))
    if base._scipy_stats() is None:  # no interval to resolve: the first stage alone
        log(f"{WHO}: --resolve: {NO_SCIPY}: one stage of {plan.repeats} repeats")
        size = None

    def serve_one(index: int, repeats: int, seed: int) -> Stage:
        folder = out.path / "stages" / f"{index:02d}"
        t0 = time.monotonic()
        error = serve(replace(plan, repeats=repeats, seed=seed, out_dir=str(folder),
                              resolve=None, budget_s=None, budget_repeats=None))
        return Stage(index, seed, repeats, folder, time.monotonic() - t0, error)

    def judge(stages: list[Stage]):
        served = [s for s in stages  # a stage that failed before any row adds its failure
                  if RunDir(s.folder).has("requests") or RunDir(s.folder).has("failures")]
        if served:
            merge_stages(out, [(s.folder, s.repeats) for s in served],
                         [s.record() for s in stages], {k: getattr(plan, k) for k in PLANNED})
        if stages[-1].error is not None:
            return None  # a failed stage ends the run; the stages merged so far stand
        widths = half_widths(summary_of(out.path))
        return widths, widths

    stages, _ = staged(plan.repeats, plan.seed, serve_one, judge, size, log, WHO)
    return "; ".join(s.error for s in stages if s.error) or None

