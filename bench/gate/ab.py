"""`bench gate --ab`: the baseline revision (gate.json `ab.revision`) and this working tree
served as sides of one run on this machine (bench.ab.served) with gate.json's `ab` settings,
so that the gate's timing checks compare two revisions instead of this machine against
numbers recorded on another. Each cell is served by A and B back to back; stages are added
while a gated check is undecided (bench.ab.sequential) within `budget_repeats` and
`budget_s`. The serves' disturbance (ranks.csv cpu_lost) comes back with the comparison:
it decides what a check left undecided reads (bench.gate.timing.settle).

gate.json's `ab` must say `design: "served"`: a baseline recorded for the older blocks
design, or a baseline revision older than the side interface, is refused in one line that
says how to re-record the baseline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.ab import RUN_SIZES, served, size_args
from bench.ab.revisions import WORKTREE, Revision, RevisionError, resolve
from bench.ab.sequential import Budget
from bench.ab.served import ServedPlan, Stage
from bench.compare.comparison import Comparison
from bench.compare.report import write_outputs
from bench.gate.baseline import DEFAULT_AB
from bench.report.printer import progress
from bench.rundir.decision import Disturbance
from bench.rundir.files import ResultFileError, write_json_atomic
from bench.rundir.rundir import RunDir

REBASE = ("re-record the baseline at a commit that has it: bench run --preset ci --out DIR, "
          "then bench gate DIR --update-baseline (docs/testing.md, \"The gate\")")


def check_served(settings: dict, where: Path) -> dict:
    """gate.json's `ab`, refused (ResultFileError, one line) unless it is a served design."""
    ab = settings.get("ab")
    if ab is None:
        raise ResultFileError(f"{where}: gate.json has no ab settings: record a baseline "
                              "with --update-baseline first")
    design = ab.get("design")
    if design != "served":
        what = "has no design" if design is None else f"has design {design!r}"
        raise ResultFileError(f"{where}: gate.json's ab {what}; the gate serves both "
                              f"revisions as sides (design \"served\"): {REBASE}")
    return ab


def _baseline_revision(ab: dict) -> Revision:
    from bench.rundir.env import REPO_DIR

    try:
        return resolve(ab["revision"], REPO_DIR)
    except RevisionError as e:
        raise RevisionError(f"the baseline revision is not usable here ({e}); in a shallow "
                            "clone fetch it (git fetch --unshallow), or gate without "
                            "--ab") from None


def _run_args(ab: dict) -> tuple[str, ...]:
    """The flags gate.json's `ab` passes to both sides' `bench run`."""
    run_args = [x for key in ("schedule", "protocols", "policies") if ab.get(key)
                for x in (f"--{key}", ab[key])]
    return tuple(run_args + size_args({key: ab[key] for key in RUN_SIZES if key in ab}))


def served_plan(settings: dict, out: Path) -> ServedPlan:
    """The served A/B of gate.json's `ab`: A the baseline revision, B this working tree."""
    ab = settings["ab"]
    return ServedPlan(_baseline_revision(ab), Revision(WORKTREE, None), ab["preset"],
                      ab.get("repeats", DEFAULT_AB["repeats"]), run_args=_run_args(ab),
                      out=out)


def budget(settings: dict) -> Budget:
    ab = settings["ab"]
    return Budget(ab.get("budget_repeats", DEFAULT_AB["budget_repeats"]),
                  float(ab.get("budget_s", DEFAULT_AB["budget_s"])))


@dataclass(frozen=True)
class ServedAb:
    """What the gate's served A/B left: the comparison, its folder, the plan, its paired
    repeats and seconds, and the serves' disturbance."""

    comp: Comparison
    out: Path
    plan: ServedPlan
    pairs: int
    seconds: float
    disturbance: Disturbance


def disturbance(stages: list[Stage]) -> Disturbance:
    """The serves' cpu_lost over both sides of every stage (ranks.csv; bench.run.machine),
    unmeasured where no side wrote the column."""
    return Disturbance.from_ranks(RunDir(d).ranks() for s in stages for d in s.dirs.values())


def run_gate_served(settings: dict, out: Path, states) -> ServedAb:
    """The served A/B into `out` (ab.md, ab.csv, ab_ratios.png, ab.json, stages/); `states`
    gives the gated checks' states of a comparison (the sequential rule's input)."""
    plan = served_plan(settings, out)
    out.mkdir(parents=True, exist_ok=True)
    b = budget(settings)
    progress(f"gate: timings: {plan.a.label} (A, the baseline revision) and this tree (B) as "
             f"sides of one run, preset {plan.preset} {' '.join(plan.run_args)}: "
             f"{plan.repeats} paired repeats, more while a check is undecided (up to "
             f"{b.repeats} repeats, {b.seconds:.0f}s)")
    try:
        stages, comp = served.run(plan, b, states, log=progress)
    except served.NotASide as e:
        raise ResultFileError(f"the baseline revision cannot be served as a side: {e}; "
                              f"{REBASE}") from None
    write_outputs(comp, out)
    write_json_atomic(out / "ab.json", served.record(plan, stages))
    return ServedAb(comp, out, plan, sum(s.repeats for s in stages),
                    round(sum(s.seconds for s in stages), 1), disturbance(stages))
