"""Usage: python -m bench report RUN_DIR [--percentile-method linear|nearest-rank]

Rebuilds a run directory's summary.csv, plots and report.md from its CSVs and env.json
alone; for a cost sweep's directory (sweep.json), every cost's, then sweep.md, sweep.csv
and sweep.png. Exit 0: written; 2: bad input (one line on stderr).
"""

from __future__ import annotations

from pathlib import Path

from bench.commands.common import CliParser, run_verb
from bench.errors import UserError
from bench.report.printer import say
from bench.stats import PERCENTILE_METHODS

PROG = "bench report"


def _main(argv: list[str]) -> int:
    from bench.analysis import sweep
    from bench.analysis.report import write_report  # matplotlib: only once the arguments are good

    parser = CliParser.from_doc(PROG, __doc__)
    parser.add_argument("run_dir", type=Path, help="a results/<run> directory")
    parser.add_argument("--percentile-method", choices=PERCENTILE_METHODS, default="linear")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        raise UserError(f"{args.run_dir}: no such directory")
    if sweep.is_sweep(args.run_dir):
        say("\n".join(sweep.write_sweep(args.run_dir).lines))
        return 0
    report = write_report(args.run_dir, args.percentile_method)
    say(f"wrote {report.path}; the run: {report.verdict.line}")
    return 0


def main(argv: list[str]) -> int:
    # ValueError: a ResultFileError, or a cell the cost model cannot read
    return run_verb(PROG, _main, argv, (ValueError,))
