"""`python -m bench timeline RUN_DIR [--cell protocol/policy/repeat] [--steps A:B]`: the
timeline of a run recorded with `bench run --timeline`, as RUN_DIR/timeline.pftrace (open
it in ui.perfetto.dev) and RUN_DIR/timeline.png (a few steps, pr27010 beside pr36425).
Exit codes: 0 written, 2 bad input (a cell or window the run did not record, no timeline,
or no perfetto package: then only the PNG is written)."""

from __future__ import annotations

from pathlib import Path

from bench.commands.common import CliParser, run_verb
from bench.errors import UserError
from bench.report.printer import say, say_err
from bench.rundir.files import ResultFileError
from bench.timeline.load import TimelineInputError

PROG = "bench timeline"


def parser() -> CliParser:
    p = CliParser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--cell", help="protocol/policy/repeat, e.g. pr27010/wait_complete/0 "
                   "(default: the first cell the run recorded)")
    p.add_argument("--steps", help="A:B, the cell's steps A to B-1 (default: every step)")
    p.add_argument("--out", type=Path, help="the trace's path (default RUN_DIR/timeline.pftrace)")
    return p


def _main(argv: list[str]) -> int:
    from bench.timeline.outputs import write_outputs
    from bench.timeline.summary import site_table

    args = parser().parse_args(argv)
    if not args.run_dir.is_dir():
        raise UserError(f"{args.run_dir}: no such run directory")
    done = write_outputs(args.run_dir, args.cell, args.steps, args.out)
    tl = done.timeline
    offsets = ", ".join(f"rank {r} {o.seconds * 1e3:+.3f} ms"
                        + (f" ± {o.half_width_s * 1e3:.3f}" if o.half_width_s is not None
                           else " (upper bound)")
                        for r, o in enumerate(tl.offsets) if r > 0)
    say(f"{PROG}: cell {tl.label}, steps {tl.window[0]}:{tl.window[1]}, {len(tl.slices)} "
        f"slices; clock offsets to rank 0: {offsets or 'one rank'}")
    say("\n".join(site_table(tl)))
    say(f"wrote {done.figure}")
    if done.trace is None:
        say_err(f"{PROG}: cannot write the trace: {done.missing}")
        return 2
    size = done.trace.stat().st_size / 1e6
    say(f"wrote {done.trace} ({size:.1f} MB): open it at https://ui.perfetto.dev "
        "(Open trace file)")
    return 0


def main(argv: list[str]) -> int:
    return run_verb(PROG, _main, argv, (UserError, ResultFileError, TimelineInputError))
