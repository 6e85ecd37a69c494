"""Usage: python -m bench history add DIR DECISION_JSON [--machine NAME] [--commit SHA]
       python -m bench history DIR [--out OUT] [--machine NAME] [--repo PATH | --no-git]
                                   [--branch NAME] [--window W] [--min-step F]
                                   [--creep-threshold F] [--stale N] [--no-figures]

The gate's memory: keep each gate's decision.json per machine and commit, and draw the page.

`add` keeps one result in the history DIR (created when absent or empty), under its machine
(default: the result's host) and commit (default: the result's). A commit gated again keeps
both; the later is read. Refused with exit 2, nothing written: a foreign directory, a result
of another kind or other settings (preset, schedule, thresholds, level, estimator), a
schema newer than this bench reads.

Without `add`: per machine, the ratio per commit of every gated check with its interval and
verdict, the drift against the oldest kept commits, the steps and creep found (each with the
command that confirms it), and whether to re-record the baseline, into OUT (default
DIR/_page): history.md and one PNG per check. Commits are ordered by git's first parents of
--branch (default: the results' branch) in --repo (default: this checkout), else by their
created time. The rules: docs/history.md. Exit 0: page written; 2: bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.common import CliParser, run_verb
from bench.errors import UserError
from bench.report.printer import say

PROG = "bench history"


def _parse_add(argv: list[str]) -> argparse.Namespace:
    p = CliParser.from_doc(f"{PROG} add", __doc__)
    p.add_argument("dir", type=Path, help="the history directory")
    p.add_argument("decision", type=Path, help="a gate's decision.json (RUN/ab/decision.json)")
    p.add_argument("--machine", help="keep it under this machine (default: its host)")
    p.add_argument("--commit", help="keep it as this commit's (default: its commit)")
    return p.parse_args(argv)


def _parse(argv: list[str]) -> argparse.Namespace:
    from bench.history.advice import STALE
    from bench.history.rules import Rules

    d = Rules()
    p = CliParser.from_doc(PROG, __doc__)
    p.add_argument("dir", type=Path, help="the history directory")
    p.add_argument("--out", type=Path, help="the page's folder (default DIR/_page)")
    p.add_argument("--machine", help="this machine's history only (default: each machine's)")
    p.add_argument("--repo", type=Path, help="the git checkout that orders the commits "
                   "(default: this one)")
    p.add_argument("--no-git", action="store_true", help="order by created time")
    p.add_argument("--branch", help="whose first parents order the commits (default: the "
                   "results' branch)")
    p.add_argument("--window", type=int, default=d.window, metavar="W",
                   help="commits each side of a step, and the oldest kept ones creep is "
                   "measured against")
    p.add_argument("--min-step", type=float, default=d.min_step, metavar="F",
                   help="a step's interval must lie beyond +-F")
    p.add_argument("--creep-threshold", type=float, default=d.creep_threshold, metavar="F",
                   help="creep's drift interval must lie above +F")
    p.add_argument("--stale", type=int, default=STALE, metavar="N",
                   help="a baseline revision N commits old may be re-recorded")
    p.add_argument("--no-figures", action="store_true", help="write history.md without its "
                   "PNGs (a few seconds less)")
    args = p.parse_args(argv)
    if args.window < 2 or args.stale < 1:
        raise UserError("--window must be >= 2 and --stale >= 1")
    if not (0 <= args.min_step < 1 and 0 <= args.creep_threshold < 1):
        raise UserError("--min-step and --creep-threshold are fractions in [0, 1)")
    return args


def _main(argv: list[str]) -> int:
    if argv[:1] == ["add"]:
        from bench.history.store import add

        a = _parse_add(argv[1:])
        say(add(a.dir, a.decision, a.machine, a.commit))
        return 0
    import dataclasses

    from bench.history.page import PageOptions, render
    from bench.history.rules import Rules
    from bench.rundir.env import REPO_DIR

    args = _parse(argv)
    rules = dataclasses.replace(Rules(), window=args.window, min_step=args.min_step,
                                creep_threshold=args.creep_threshold)
    repo = None if args.no_git else (args.repo or REPO_DIR)
    done = render(PageOptions(args.dir, args.out or args.dir / "_page", args.machine, repo,
                              args.branch, rules, args.stale, not args.no_figures))
    say("\n".join(done.lines))
    return 0


def main(argv: list[str]) -> int:
    return run_verb(PROG, _main, argv, (ValueError, OSError))
