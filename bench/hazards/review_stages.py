"""The timing half of `bench review`: a first run of the sides, then more runs (stages, each
on the next seed) while a timing check is undecided, within a budget of repeats and seconds
(bench.ab.sequential.staged, the stage loop `bench ab` and the gate run too), then each
check's verdict at the budget (bench.ab.sides.at_budget). The first stage's run
is the review's run: its counts, headline and call sites; the timings pool every stage's
paired repeats. docs/sglang-ci.md, "Timings".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.ab import sides
from bench.ab.sequential import Budget, deciding, look_level, looks_for, staged
from bench.ab.sides import Verdict
from bench.rundir.decision import Disturbance
from bench.rundir.rundir import RunDir

# A review's first stage and budget when the command names none: the gate's first stage
# (12 paired repeats), up to 96 in all and 900 s of stages. Two SGLangs' step and TTFT vary
# about twice as much from pair to pair as the gate's revisions on a 2-core runner, so an
# A/A needs 30-40 pairs there (docs/sglang-ci.md states what it measured).
REPEATS = 12
BUDGET_REPEATS = 96
BUDGET_S = 900.0


@dataclass(frozen=True)
class StagePlan:
    repeats: int = REPEATS  # the first stage's paired repeats
    seed: int = 0  # the first stage's; stage k runs seed + k
    budget_repeats: int = BUDGET_REPEATS  # paired repeats in all
    budget_s: float = BUDGET_S  # seconds of stages in all; none starts after them

    @property
    def budget(self) -> Budget:
        return Budget(self.budget_repeats, self.budget_s)


@dataclass(frozen=True)
class Stage:
    folder: str
    code: int  # its `bench run`'s exit code
    repeats: int
    seed: int
    seconds: float


@dataclass
class Timings:
    """What the stages found: each stage, the verdicts at the budget, the disturbance."""

    stages: list[Stage]
    verdicts: list[Verdict]
    disturbance: Disturbance
    seconds: float

    @property
    def pairs(self) -> int:
        return sum(s.repeats for s in self.stages if s.code == 0)

    def about(self) -> list[str]:
        """The page's lines on the stages and the machine, under the verdicts."""
        machine = (self.disturbance.line() if self.disturbance.cpu_lost_p50 is None else
                   f"{self.disturbance.line()}, p90 {self.disturbance.cpu_lost_p90:.1%}")
        stages = ", ".join(f"{s.repeats} on seed {s.seed} in {s.seconds:.0f} s"
                           f"{'' if s.code == 0 else f' (exit {s.code})'}" for s in self.stages)
        return [f"Stages: {stages}; {self.pairs} paired repeats in {self.seconds:.0f} s. "
                f"The machine: {machine}.", ""]

    def failed_stages(self) -> list[str]:
        """A later stage whose run failed (the first stage's failure is the run's)."""
        return [f"timing stage {i} FAILED (exit {s.code}): {s.folder}"
                for i, s in enumerate(self.stages) if i and s.code]


# (stage index, repeats, seed) -> (its folder, its exit code)
RunStage = Callable[[int, int, int], tuple[str, int]]


def run(plan: StagePlan, run_stage: RunStage, thresholds: dict[str, float],
        log: Callable[[str], None] = print) -> Timings:
    """The stages (module docstring); the first is always run, a later one only while the
    previous ended OK and the rule asks for more."""
    t0 = time.monotonic()
    looks = looks_for(plan.repeats, plan.budget_repeats)  # None: every look at 95 %

    def serve(index: int, repeats: int, seed: int) -> Stage:
        started = time.monotonic()
        folder, code = run_stage(index, repeats, seed)
        return Stage(folder, code, repeats, seed, round(time.monotonic() - started, 1))

    def judge(stages: list[Stage]):
        if stages[-1].code:
            return None
        n = sum(s.repeats for s in stages)
        found = _verdicts(stages, thresholds, look_level(n, looks))
        return sides.states(found), found

    stages, found = staged(plan.repeats, plan.seed, serve, judge,
                           deciding(plan.budget, looks), log, "review")
    ok = [s for s in stages if s.code == 0]
    shaken = Disturbance.from_ranks(RunDir(s.folder).ranks() for s in ok)
    return Timings(stages, sides.at_budget(found or [], shaken), shaken,
                   round(time.monotonic() - t0, 1))


def _verdicts(stages: list[Stage], thresholds: dict[str, float], level: float
              ) -> list[Verdict]:
    from bench.analysis.side_lead import side_names

    plan = RunDir(stages[0].folder).plan()
    names = list(side_names(plan))
    if len(names) < 2:
        return []
    return sides.verdicts([(s.folder, s.repeats) for s in stages], names, thresholds,
                                 level)
