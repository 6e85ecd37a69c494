"""Usage: python -m bench bisect GOOD BAD --metric NAME [--config PROTOCOL/POLICY]
                                      [--preset ci] [--repeats 6] [--repeats-per-block 1]
                                      [--threshold 0.05] [--protocols P,..]
                                      [--policies P,..] [--requests N] [--bystanders N]
                                      [--out DIR] [--no-verify]

The first commit between GOOD and BAD that made a timing metric worse.

A binary search over the commits after GOOD up to BAD (first parents, oldest first), with
`bench ab GOOD COMMIT` at each step: a step is bad when the metric (of --config, or of any
configuration) is worse than GOOD's, i.e. its whole 95% interval of B/A lies above
1 + threshold. It first checks that BAD is worse (skip with --no-verify). Each step prints
its verdict; the last line names the first bad commit. Every step's ab output is kept under
--out (default results/bisect_<GOOD>_<BAD>_<UTC time>). The search assumes one change made
the metric worse and it stayed so; an unlucky step (a false "same" or "worse") sends it the
wrong way, so read the steps' intervals. Exit 0: found; 1: BAD is not worse than GOOD; 2: bad
input (unknown revisions, GOOD not an ancestor of BAD, an unknown metric).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.common import CliParser, add_size_options, run_verb, size_of
from bench.errors import UserError
from bench.report.printer import fit, progress, say
from bench.verdict.thresholds import DEFAULT_THRESHOLD

PROG = "bench bisect"


def _parse(argv: list[str]) -> argparse.Namespace:
    from bench.ab.blocks import DEFAULT_BLOCKS, DEFAULT_PRESET

    p = CliParser.from_doc(PROG, __doc__)
    p.add_argument("good", help="a revision where the metric was fine")
    p.add_argument("bad", help="a later revision where it is worse")
    p.add_argument("--metric", required=True, help="a timing metric of bench compare, e.g. "
                   "step_mean_ms")
    p.add_argument("--config", metavar="PROTOCOL/POLICY",
                   help="judge this configuration only (default: any)")
    p.add_argument("--preset", default=DEFAULT_PRESET, help="bench run's preset for ab's blocks")
    p.add_argument("--repeats", type=int, default=DEFAULT_BLOCKS, metavar="N",
                   help="ab's blocks at each step")
    p.add_argument("--repeats-per-block", type=int, default=1, metavar="R",
                   help="repeats of each block's runs")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="T",
                   help="ab's: worse only when the whole 95%% interval lies above 1 + T")
    p.add_argument("--protocols", help="passed to every run (comma list)")
    p.add_argument("--policies", help="passed to every run (comma list)")
    add_size_options(p.add_argument)
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="results folder (default results/bisect_<GOOD>_<BAD>_<UTC time>)")
    p.add_argument("--no-verify", action="store_true",
                   help="do not first check that BAD is worse than GOOD")
    args = p.parse_args(argv)
    from bench.compare.metrics import metric_list

    metric_list([args.metric])
    if args.config is not None and args.config.count("/") != 1:
        raise UserError(f"--config must be PROTOCOL/POLICY, got {args.config!r}")
    return args


def _main(argv: list[str]) -> int:
    from bench.ab.bisect import ab_judge, search
    from bench.ab.blocks import AbSettings, make_plan
    from bench.ab.revisions import commits_between, resolve, subject
    from bench.rundir.env import REPO_DIR
    from bench.rundir.rundir import RunDir

    args = _parse(argv)
    settings = AbSettings(args.preset, args.repeats, 0, args.repeats_per_block, args.threshold,
                          args.protocols, args.policies, [args.metric], size=size_of(args))
    base = make_plan(args.good, args.good, settings)  # checks GOOD and the settings as ab
    bad = resolve(args.bad, REPO_DIR)
    commits = commits_between(base.a, bad, REPO_DIR)
    if not commits:
        raise UserError(f"no commits after {base.a.label} up to {bad.label}")
    out = args.out or RunDir.new("bisect", base.a.short, bad.short).path
    say(fit(f"bisect: {len(commits)} commits after {base.a.label} up to {bad.label}; "
            f"{args.metric}{' of ' + args.config if args.config else ''}, ab with "
            f"{args.repeats} blocks of preset {args.preset} at each step; results in {out}"))
    judge = ab_judge(base, args.metric, args.config, out,
                     log=progress)
    n = [0]

    def show(step) -> None:
        n[0] += 1
        say(fit(f"bisect: step {n[0]}: {step.commit[:10]} {subject(step.commit, REPO_DIR)}: "
                f"{step.verdict} ({step.detail})"))
    first, _ = search(commits, judge, verify=not args.no_verify, log=show)
    if first is None:
        say(f"bisect: {bad.label} is not worse than {base.a.label} on {args.metric}: "
            "nothing to bisect")
        return 1
    say(f"bisect: first bad commit {first} {subject(first, REPO_DIR)}")
    return 0


def main(argv: list[str]) -> int:
    return run_verb(PROG, _main, argv, (ValueError, OSError))
