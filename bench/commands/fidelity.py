"""Usage: python -m bench fidelity CANDIDATE_RUN FREE_RUN

Holds a run's ratios to pr27010 (TTFT p50 of each class, ITL p50, step time) against a
free-running run of the same workload and seed: a schedule mode may lead make bench only while
its ratios lie inside the free run's 95% intervals, the end-to-end effect a server sees
(docs/metrics.md, "The fidelity check").

Exit 0: every judged ratio lies inside; 1: one does not, or nothing could be judged; 2: bad
input (one line on stderr).
"""

from __future__ import annotations

from pathlib import Path

from bench.commands.common import CliParser, run_verb
from bench.errors import UserError
from bench.report.printer import interval_text, markdown_table, say, verdict_lines

PROG = "bench fidelity"
HEADERS = ["protocol", "policy", "metric", "candidate", "free", "inside"]


def _main(argv: list[str]) -> int:
    from bench.compare import fidelity
    from bench.rundir.rundir import RunDir

    parser = CliParser.from_doc(PROG, __doc__)
    parser.add_argument("candidate", type=Path, help="the run whose mode is judged")
    parser.add_argument("free", type=Path, help="a free-running run of the same workload")
    args = parser.parse_args(argv)
    for path in (args.candidate, args.free):
        if not path.is_dir():
            raise UserError(f"{path}: no such directory")
    a, b = RunDir(args.candidate), RunDir(args.free)
    free = b.summary()
    fidelity.check_comparable(a.plan(), b.plan(), free)
    rows = fidelity.fidelity_rows(a.summary(), free)
    say(markdown_table(HEADERS, [
        [r.protocol, r.policy, r.metric, interval_text(*r.candidate), interval_text(*r.free),
         ("yes" if r.inside else "NO") if r.judged else "-"] for r in rows]))
    ok, line = fidelity.verdict(rows)
    say("\n".join(verdict_lines(line)))
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    return run_verb(PROG, _main, argv, (ValueError,))
