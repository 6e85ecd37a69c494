"""`bench gate --ab`: the baseline revision (gate.json `ab.revision`) and this working tree,
run interleaved on this machine by bench.ab.blocks with gate.json's `ab` settings, so that the
gate's timing checks compare two revisions measured side by side instead of this machine
against numbers recorded on another. A timing check that fails is confirmed by a second A/B of
as many fresh blocks (the next seeds), run after the first (bench.gate.timing.confirmed)."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.ab import RUN_SIZES, size_args
from bench.ab.blocks import AbPlan, comparison, run_blocks, write_plan
from bench.ab.revisions import WORKTREE, Revision, RevisionError, resolve
from bench.compare.comparison import Comparison
from bench.compare.report import write_outputs
from bench.rundir.files import ResultFileError

DEFAULT_BLOCKS = 2  # gate.json's `ab` without `blocks`


def gate_plan(settings: dict, out: Path, seed: int = 0) -> AbPlan:
    """The A/B plan of gate.json's `ab`: A the baseline revision, B this working tree, block
    k's runs seeded seed + k."""
    from bench.rundir.env import REPO_DIR

    ab = settings.get("ab")
    if ab is None:
        raise ResultFileError("gate.json has no ab settings: record a baseline with "
                              "--update-baseline first")
    try:
        a = resolve(ab["revision"], REPO_DIR)
    except RevisionError as e:
        raise RevisionError(f"the baseline revision is not usable here ({e}); in a shallow "
                            "clone fetch it (git fetch --unshallow), or gate without "
                            "--ab") from None
    run_args = [x for key in ("schedule", "protocols", "policies") if ab.get(key)
                for x in (f"--{key}", ab[key])]
    run_args += size_args({key: ab[key] for key in RUN_SIZES if key in ab})
    return AbPlan(a, Revision(WORKTREE, None), ab["preset"], ab.get("blocks", DEFAULT_BLOCKS),
                  seed=seed, per_block=ab.get("repeats_per_block", 1),
                  run_args=tuple(run_args), out=out)


def confirmation_seed(settings: dict) -> int:
    """The first seed after the first A/B's blocks: the confirming A/B's workloads are new."""
    return int(settings["ab"].get("blocks", DEFAULT_BLOCKS))


def run_gate_ab(settings: dict, out: Path, seed: int = 0) -> tuple[Comparison, Path]:
    """Run the A/B into `out` (ab.md, ab.csv, ab_ratios.png, ab.json, runs/)."""
    plan = gate_plan(settings, out, seed)
    out.mkdir(parents=True, exist_ok=True)
    print(f"gate: timings: {plan.a.label} (A, the baseline revision) and this tree (B), "
          f"{plan.blocks} blocks x {plan.per_block} repeats of preset {plan.preset} "
          f"(seeds {plan.seed}..{plan.seed + plan.blocks - 1}) "
          f"{' '.join(plan.run_args)}", file=sys.stderr, flush=True)
    runs = run_blocks(plan, log=lambda line: print(line, file=sys.stderr, flush=True))
    comp = comparison(plan, runs)
    write_outputs(comp, out)
    write_plan(plan, runs)
    return comp, out
