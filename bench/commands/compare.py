"""Usage: python -m bench compare RUN_A RUN_B [--metric NAME ...] [--threshold 0.05]
                                          [--out DIR]

Two runs side by side: what a code change did to collective counts and timings.

Rows are matched by configuration (protocol, policy, tp, pp, storage, rate, extra_pool,
race_guard, and page_size / model where both runs carry them). A run of SGLang's own code
(--cache sglang) against a model run pairs by the protocol that models its release; two
SGLang runs pair their sides by label (LABEL=SPEC), else one SGLang each as `sglang`, with
a warning where they ran different data paths. Per matched row:
- counts (rank 0, exact): polls, decision, critical and background collectives per request,
  step collectives per step; A, B and B - A. Any change is flagged whatever the threshold:
  worse when B issues more, better when fewer. Polls follow timing, so when polls/req differ
  the collectives issued inside polls are judged per poll (decision/poll; critical = in-poll
  collectives per poll and completions per request), and step collectives per step kind
  when steps carry `kind`. polls/req itself is shown, never judged.
- timings: per repeat (one whole serve) each metric's statistic in A and in B, paired by
  repeat (the same seed); ratio B/A = exp(mean of ln(b_r / a_r)) with a 95% t interval over
  the paired repeats. worse: interval entirely above 1 + threshold; better: entirely below
  1 - threshold; else same; not comparable with fewer than 3 paired repeats (or without
  scipy). The runs were made at different times, so drift between them is not in the
  intervals: `python -m bench ab REV_A REV_B` interleaves two revisions instead.
Refused (exit 2, one line): different presets, layouts (tp, pp) or schema versions; no
configuration in both runs; bad input. env.json differences that make timings incomparable
are warned about at the top. Writes compare.csv, compare.md and compare_ratios.png into
--out (default results/compare_<A>_vs_<B>). Exit 1 when anything is worse, else 0.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench.commands.common import CliParser, run_verb
from bench.compare.metrics import METRIC_NAMES, metric_list
from bench.errors import UserError
from bench.verdict.thresholds import DEFAULT_THRESHOLD

PROG = "bench compare"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = CliParser.from_doc(PROG, __doc__)
    parser.add_argument("run_a", type=Path, help="the run before (a results/<run> directory)")
    parser.add_argument("run_b", type=Path, help="the run after")
    parser.add_argument("--metric", action="append", metavar="NAME",
                        help=f"timing metrics to compare (repeat or comma-separate; default: "
                             f"all present): {', '.join(METRIC_NAMES)}. Counts are always "
                             "compared")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="T",
                        help="a timing ratio is worse/better only when its whole 95%% CI lies "
                             f"beyond 1 +- threshold (default {DEFAULT_THRESHOLD})")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="output directory (default results/compare_<A>_vs_<B>)")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.threshold) and args.threshold >= 0):
        raise UserError(f"--threshold must be a finite number >= 0, got {args.threshold}")
    try:
        args.metric = metric_list(args.metric)
    except ValueError as e:
        raise UserError(str(e)) from None
    return args


def _main(argv: list[str]) -> int:
    # matplotlib (in compare_report) is imported only when there is something to write
    from bench.compare.comparison import compare, load_run
    from bench.compare.report import default_out, print_comparison, write_outputs

    args = _parse(argv)
    comp = compare(load_run(args.run_a), load_run(args.run_b), args.threshold, args.metric)
    written = write_outputs(comp, args.out or default_out(comp))
    print_comparison(comp, written)
    return 1 if comp.tally()["worse"] else 0


def main(argv: list[str]) -> int:
    """0 when nothing is worse, 1 when something is, 2 on bad input or runs that cannot be
    compared (ResultFileError is a ValueError)."""
    return run_verb(PROG, _main, argv, (ValueError, OSError))
