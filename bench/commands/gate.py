"""Usage: python -m bench gate RUN_DIR [--baseline results/baseline] [--ab]
                                   [--update-baseline] [--tolerance FLOAT]

CI perf gate: a run's exact collective counts and correctness, and its timings.

The checks are bench.gate.evaluate's. With --ab the timings come from the baseline revision and this
working tree as two sides of one run on this machine (into RUN_DIR/ab; what it runs:
gate.json's `ab`), repeats added while a check is undecided; without it, from this run's
ratios against the baseline's numbers. A timing check passes when its whole 95% interval
lies below 1 + threshold and fails when it lies above; one still undecided at the budget is
INCONCLUSIVE when the machine was disturbed (its serves' cpu_lost p50 above 5%) and fails
when it was quiet (docs/testing.md, "The gate"; docs/gate-ci.md). --ab writes the verdicts to
RUN_DIR/ab/decision.json. --update-baseline makes the run (its commit) the new baseline.
Exit 0: all checks hold; 1: a check failed (table on stdout); 2: bad input (one line on
stderr); 77: INCONCLUSIVE, nothing failed but the machine was too noisy to decide.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.common import CliParser, run_verb
from bench.report.printer import say

PROG = "bench gate"


def _parse(argv: list[str]) -> argparse.Namespace:
    from bench.gate.baseline import check_tolerance
    from bench.verdict.thresholds import DEFAULT_THRESHOLD

    parser = CliParser.from_doc(PROG, __doc__)
    parser.add_argument("run_dir", type=Path, help="a results/<run> directory")
    parser.add_argument("--baseline", type=Path, default=Path("results/baseline"),
                        help="the committed baseline: summary.csv, env.json, gate.json")
    parser.add_argument("--update-baseline", action="store_true",
                        help="after the run's own checks pass, make it the new baseline")
    parser.add_argument("--ab", action="store_true",
                        help="run the baseline revision beside this tree for the timings")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="one threshold for every timing metric (default: gate.json's "
                             f"thresholds, else {DEFAULT_THRESHOLD})")
    args = parser.parse_args(argv)
    if args.tolerance is not None:
        check_tolerance(args.tolerance, "--tolerance")
    return args


def _main(argv: list[str]) -> int:
    from bench.gate.console import format_checks, last_line
    from bench.gate.evaluate import GateOptions, evaluate
    from bench.report.printer import fit

    args = _parse(argv)
    outcome = evaluate(GateOptions(
        run_dir=args.run_dir, baseline=args.baseline, ab=args.ab, tolerance=args.tolerance,
        update_baseline=args.update_baseline))
    say(format_checks(outcome.checks))
    say(fit(outcome.context))  # no line wider than a terminal (bench.report.printer.WIDTH)
    say(last_line(outcome.checks, outcome.disturbance))
    return outcome.exit_code


def main(argv: list[str]) -> int:
    # ValueError: a ResultFileError or a bad tolerance
    return run_verb(PROG, _main, argv, (ValueError,))
