"""`bench gate --ab`: the baseline revision (gate.json `ab.revision`) and this working tree,
measured side by side on this machine with gate.json's `ab` settings, so that the gate's
timing checks compare two revisions instead of this machine against numbers recorded on
another.

`ab.design` "served" (the default): both revisions as sides of one run (bench.ab.served),
each cell served by A and B back to back, stages added while a gated check is undecided
(bench.ab.sequential) within `budget_repeats` and `budget_s`. A baseline revision older than
the side interface is refused in one line that says how to re-record the baseline.
"blocks": whole `bench run`s per side (bench.ab.blocks); a failing check is confirmed by a
second A/B of as many fresh blocks (bench.gate.timing.confirmed)."""

from __future__ import annotations

from pathlib import Path

from bench.ab import RUN_SIZES, served, size_args
from bench.ab.blocks import AbPlan, comparison, run_blocks, write_plan
from bench.ab.revisions import WORKTREE, Revision, RevisionError, resolve
from bench.ab.sequential import Budget
from bench.ab.served import ServedPlan
from bench.compare.comparison import Comparison
from bench.compare.report import write_outputs
from bench.gate.baseline import DEFAULT_AB
from bench.rundir.files import ResultFileError, write_json_atomic
from bench.tables import progress

DEFAULT_BLOCKS = 2  # gate.json's `ab` without `blocks`


def gate_plan(settings: dict, out: Path, seed: int = 0) -> AbPlan:
    """The A/B plan of gate.json's `ab`: A the baseline revision, B this working tree, block
    k's runs seeded seed + k."""
    ab = settings.get("ab")
    if ab is None:
        raise ResultFileError("gate.json has no ab settings: record a baseline with "
                              "--update-baseline first")
    return AbPlan(_baseline_revision(ab), Revision(WORKTREE, None), ab["preset"],
                  ab.get("blocks", DEFAULT_BLOCKS), seed=seed,
                  per_block=ab.get("repeats_per_block", 1), run_args=_run_args(ab), out=out)


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


REBASE = ("re-record the baseline at a commit that has it: bench run --preset ci --out DIR, "
          "then bench gate DIR --update-baseline (docs/testing.md, \"The gate\")")


def run_gate_served(settings: dict, out: Path, states) -> tuple[Comparison, Path]:
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
        stages, comp = served.run(plan, b, states,
                                  log=progress)
    except served.NotASide as e:
        raise ResultFileError(f"the baseline revision cannot be served as a side: {e}; "
                              f"{REBASE}") from None
    write_outputs(comp, out)
    write_json_atomic(out / "ab.json", served.record(plan, stages))
    return comp, out


def confirmation_seed(settings: dict) -> int:
    """The first seed after the first A/B's blocks: the confirming A/B's workloads are new."""
    return int(settings["ab"].get("blocks", DEFAULT_BLOCKS))


def run_gate_ab(settings: dict, out: Path, seed: int = 0) -> tuple[Comparison, Path]:
    """Run the A/B into `out` (ab.md, ab.csv, ab_ratios.png, ab.json, runs/)."""
    plan = gate_plan(settings, out, seed)
    out.mkdir(parents=True, exist_ok=True)
    progress(f"gate: timings: {plan.a.label} (A, the baseline revision) and this tree (B), "
             f"{plan.blocks} blocks x {plan.per_block} repeats of preset {plan.preset} "
             f"(seeds {plan.seed}..{plan.seed + plan.blocks - 1}) "
             f"{' '.join(plan.run_args)}")
    runs = run_blocks(plan, log=progress)
    comp = comparison(plan, runs)
    write_outputs(comp, out)
    write_plan(plan, runs)
    return comp, out
