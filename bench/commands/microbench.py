"""Usage: python -m bench microbench RUN_DIR [--no-run]

pytest-benchmark micro-benchmarks saved with a run and compared side by side inside it (what
they measure: bench.microbench). --no-run rebuilds microbench.md from an existing JSON.
Exit codes: 0 OK, 1 a benchmark failed (its checks or its run), 2 bad input.
"""

from __future__ import annotations

from pathlib import Path

from bench.commands.common import CliParser, run_verb
from bench.errors import UserError
from bench.microbench import (
    HEADLINE,
    JSON_NAME,
    MD_NAME,
    REFERENCE,
    build_markdown,
    headline,
    load,
    run_pytest,
)
from bench.report.printer import fit, say
from bench.rundir.files import write_text_atomic

PROG = "bench microbench"


def _main(argv: list[str]) -> int:
    parser = CliParser.from_doc(PROG, __doc__)
    parser.add_argument("run_dir", type=Path, help="a results/<run> directory")
    parser.add_argument("--no-run", action="store_true",
                        help=f"only rebuild {MD_NAME} from the run's {JSON_NAME}")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        raise UserError(f"{args.run_dir}: no such directory")
    code = 0
    if not args.no_run:
        (args.run_dir / JSON_NAME).unlink(missing_ok=True)  # never render a stale one
        code = run_pytest(args.run_dir.resolve())
        if code and not (args.run_dir / JSON_NAME).exists():
            say(f"FAILED: the micro-benchmarks wrote no {JSON_NAME} (pytest exit {code})")
            return 1
    data = load(args.run_dir / JSON_NAME)
    md = build_markdown(data)
    write_text_atomic(args.run_dir / MD_NAME, md)
    say(fit(f"{md.splitlines()[-1]}; per-poll {HEADLINE}/{REFERENCE}: {headline(data)} "
            f"({args.run_dir / MD_NAME})"))
    ok = code == 0 and md.rstrip().splitlines()[-1].startswith("OK")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    return run_verb(PROG, _main, argv)
