"""Usage: python -m bench ab REV_A REV_B [--preset ci] [--repeats 6] [--threshold 0.05]
                                  [--out DIR] [--seed 0] [--protocols P,..] [--policies P,..]
                                  [--metric NAME ...] [--design served|blocks]
                                  [--repeats-per-block 1] [--requests N] [--bystanders N]
                                  [--neighbour SPEC]

Did this commit make it better or worse? Both revisions on this machine, interleaved.

REV_A and REV_B are git revisions (a sha, a branch, HEAD~2, ...), checked out as detached
worktrees that share this environment, or WORKTREE: this working tree as it is, uncommitted
changes included (snapshotted into a worktree too, so both sides run from equivalent trees).
--design served (the default): the two revisions are sides of one run, `bench run --preset P
--repeats N --seed SEED` in each tree, each side's ranks importing its own tree's code
(bench/run/turns.py, the side interface; checked every run); each cell is served by A and
B back to back, the side first in a repeat drawn from --seed (as many repeats A-first as
B-first), so the pairs sit seconds apart. Blocks are kept only for a revision that cannot be
served as a side (older than the side interface): ab says so and runs blocks instead (the
gate refuses such a baseline). --design blocks: block k (k < --repeats) runs
`bench run --preset P --repeats 1 --seed SEED+k` for each revision, which first drawn from
--seed, each run only once the one before has left no process behind (--repeats-per-block
R: each run makes R repeats, paired by (block, repeat)). Per configuration: the counts
exactly over every repeat (compare's rules: any change is flagged), and per timing metric
the ratio B/A paired by repeat with a 95% interval over the pairs (exp(mean of ln(b / a))
with a t interval; bench.analysis.estimate holds the other methods), and beside it the Wilcoxon
signed-rank and sign tests; worse when the whole interval lies above 1 + threshold, better
when below 1 - threshold, else same. Per gated metric the order effect (the side second in
a pair over the first, warned when its interval excludes 1). Writes ab.md, ab.csv,
ab_ratios.png and ab.json (the design, the order, every run's exit code, how intervals were
made) into --out (default results/ab_<A>_vs_<B>_<UTC time>), every side's run under stages/
(served) or runs/ (blocks). The last line: `ab: N better, M worse, K same`. Exit 0: nothing
worse; 1: something worse; 2: an unknown revision, HEAD with a dirty working tree, a
revision that refuses the flags, or bad arguments (one line on stderr).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from bench.ab.blocks import DEFAULT_BLOCKS, DEFAULT_PRESET
from bench.commands.common import (
    CliParser,
    add_size_options,
    run_verb,
    size_of,
)
from bench.compare.metrics import metric_list
from bench.errors import UserError
from bench.neighbour import Neighbour, SpecError
from bench.neighbour import parse as parse_neighbour
from bench.report.printer import progress
from bench.rundir.files import write_json_atomic
from bench.verdict.thresholds import DEFAULT_THRESHOLD

PROG = "bench ab"


def parser() -> CliParser:
    p = CliParser.from_doc(PROG, __doc__)
    p.add_argument("rev_a", help="the revision before (or WORKTREE)")
    p.add_argument("rev_b", help="the revision after (or WORKTREE)")
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"bench run's preset "
                   f"(default {DEFAULT_PRESET})")
    p.add_argument("--repeats", type=int, default=DEFAULT_BLOCKS, metavar="N",
                   help=f"paired repeats (served) or blocks of one run per revision each "
                        f"(default {DEFAULT_BLOCKS}; an interval needs 3)")
    p.add_argument("--design", choices=("served", "blocks"), default="served",
                   help="served: both revisions as sides of one run (default); blocks: "
                        "whole runs per side")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="T",
                   help="worse/better only when the whole 95%% interval lies beyond "
                        f"1 +- T (default {DEFAULT_THRESHOLD})")
    p.add_argument("--seed", type=int, default=0, help="block k runs with seed SEED+k")
    p.add_argument("--repeats-per-block", type=int, default=1, metavar="R",
                   help="repeats of each block's runs (default 1)")
    p.add_argument("--protocols", help="passed to every run (comma list)")
    p.add_argument("--policies", help="passed to every run (comma list)")
    add_size_options(p.add_argument)
    p.add_argument("--metric", action="append", metavar="NAME",
                   help="timing metrics to judge (default all; see bench compare)")
    p.add_argument("--neighbour", metavar="SPEC", help="plant a noisy neighbour for the "
                   "whole A/B (bench run --neighbour's SPEC; e.g. default = "
                   "cpu=0.5,burst=50ms-2s,seed=0), recorded in neighbour.json of the A/B")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="results folder (default results/ab_<A>_vs_<B>_<UTC time>)")
    return p


def build_plan(argv: list[str]):
    """ab's command line, unpacked once into the engine's plan."""
    from bench.ab.blocks import AbSettings, make_plan

    args = parser().parse_args(argv)
    return make_plan(args.rev_a, args.rev_b, AbSettings(
        args.preset, args.repeats, args.seed, args.repeats_per_block, args.threshold,
        args.protocols, args.policies, metric_list(args.metric), args.out, size_of(args)))


def _main(argv: list[str]) -> int:
    from bench.ab.served import NotASide
    from bench.compare.report import print_comparison, write_outputs

    args = parser().parse_args(argv)
    spec = _neighbour(args.neighbour)  # bad input before any work
    plan = build_plan(argv)
    plan.out.mkdir(parents=True, exist_ok=True)
    comp, written = None, []
    with contextlib.ExitStack() as stack:
        planted = stack.enter_context(Neighbour(spec)) if spec else None
        if args.design == "served":
            try:
                comp, written = _served(plan)
            except NotASide as e:
                progress(f"ab: {e}: it cannot be a side of one run; whole runs per side "
                         "(--design blocks) instead, whose resolution the table shows")
        if comp is None:
            comp, written = _blocks(plan)
    if planted is not None:
        write_json_atomic(plan.out / "neighbour.json", planted.record())
    print_comparison(comp, written + write_outputs(comp, plan.out))
    return 1 if comp.tally()["worse"] else 0


def _served(plan):
    """Both revisions as sides of one run (bench.ab.served)."""
    from bench.ab import served

    sp = served.ServedPlan(plan.a, plan.b, plan.preset, plan.blocks * plan.per_block,
                           plan.seed, plan.threshold, plan.run_args, plan.metrics, plan.out)
    first = "".join(s.upper() for s in served.first_sides(sp.seed, sp.repeats))
    header = (f"ab: A = {plan.a.label}, B = {plan.b.label}: sides of one run, {sp.repeats} "
              f"paired repeats of preset {plan.preset} {' '.join(plan.run_args)}, first side "
              f"per repeat {first} (from seed {plan.seed}); results in {plan.out}")
    stages, comp = served.run(sp, log=progress, header=header)
    path = plan.out / "ab.json"
    write_json_atomic(path, served.record(sp, stages))
    return comp, [path]


def _blocks(plan):
    """Whole runs per side, block by block (bench.ab.blocks)."""
    from bench.ab.blocks import comparison, run_blocks, write_plan

    order = " ".join(f"{s.upper()}{'B' if s == 'a' else 'A'}" for s in plan.first_sides())
    progress(f"ab: A = {plan.a.label}, B = {plan.b.label}: {plan.blocks} blocks of preset "
             f"{plan.preset} {' '.join(plan.run_args)}, in the order {order} (from seed "
             f"{plan.seed}); results in {plan.out}")
    runs = run_blocks(plan, log=progress)
    comp = comparison(plan, runs)
    return comp, [write_plan(plan, runs)]


def _neighbour(text: str | None):
    """The A/B's neighbour spec (None: none); a bad one is a UserError (exit 2)."""
    try:
        return parse_neighbour(text)
    except SpecError as e:
        raise UserError(str(e)) from None


def main(argv: list[str]) -> int:
    """0 nothing worse, 1 something worse, 2 bad input (RevisionError and AbError are
    ResultFileErrors, hence ValueErrors)."""
    return run_verb(PROG, _main, argv, (ValueError, OSError))
