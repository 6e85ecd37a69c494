"""Usage: python -m bench project RUN_DIR [--latency-us C] [--scaling ring|log2]
                                       [--base-step-ms MS] [--out DIR]

For TP in 2..64, PP in 1..4 and Q (waiting requests polled per step) in 10..1000, per protocol
and policy: the extra scheduler time per step the decision collectives cost, and the ITL
inflation it implies, with the run's own measured points beside them. c, one small
all-reduce, is the mean of the run's calibration.json (a step pays the tail too, so the mean,
not the median), or --latency-us: the latency of one small all-reduce over the run's TP ranks
(over 2 ranks when the run has TP 1), e.g. one measured across nodes. Either is scaled to
other TP sizes by --scaling (analysis.overhead). The base decode step is --base-step-ms, else the
median decode step of the run's rows that issue no decision collective.
Writes projection.csv, projection.md and projection.png into --out (default
RUN_DIR/projection). Projects the overhead model (docs/design.md section 8) to scales
this machine cannot run. Exit 0: written; 2: bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench.analysis.overhead import SCALINGS
from bench.commands.common import CliParser, run_verb
from bench.errors import UserError
from bench.report.printer import say, wrapped

PROG = "bench project"


def _positive(value: float | None, flag: str) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UserError(f"{flag} must be a finite number > 0, got {value:g}")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = CliParser(prog=PROG, description="Project the overhead model to larger TP, PP "
                       "and queues")
    parser.add_argument("run_dir", type=Path, help="a results/<run> directory")
    parser.add_argument("--latency-us", type=float, default=None,
                        help="one small all-reduce over the run's TP ranks (2 when the run "
                             "has TP 1), in us; default: the run's calibration mean")
    parser.add_argument("--scaling", choices=SCALINGS, default="ring",
                        help="how c grows with TP (default ring)")
    parser.add_argument("--base-step-ms", type=float, default=None,
                        help="decode step without decision collectives (default: the run's)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default RUN_DIR/projection)")
    args = parser.parse_args(argv)
    _positive(args.latency_us, "--latency-us")
    _positive(args.base_step_ms, "--base-step-ms")
    return args


def _main(argv: list[str]) -> int:
    from bench.project.projection import project

    args = _parse(argv)
    text, paths = project(args.run_dir, args.latency_us, args.scaling, args.base_step_ms,
                          args.out)
    assumptions = text[text.index("## Assumptions"):].split("## Files")[0].rstrip()
    say("\n".join(line if line.startswith("|") else "\n".join(wrapped([line]))
                  for line in assumptions.splitlines()))
    say("\n".join(f"wrote {p}" for p in paths))
    return 0


def main(argv: list[str]) -> int:
    """0 when written, 2 on bad input (ResultFileError is a ValueError)."""
    return run_verb(PROG, _main, argv, (ValueError, OSError))
