"""Usage: python scripts/readme_excerpt.py RUN_DIR [--readme README.md]

Rewrites the README's output excerpt from a run directory, so the README shows what a real
run printed instead of a hand-pasted copy. The block between the two marker lines

    <!-- readme_excerpt: begin ... -->
    <!-- readme_excerpt: end -->

becomes: one line naming the run (commit, time, preset, layout, device and backend, cores;
from RUN_DIR/env.json; the all-reduce cost c from calibration.json), then, in a code block,
the lead's first table (the end-to-end headline; a pinned run's cost decomposition) and
what the run resolves, as `bench run` prints them (rebuilt from RUN_DIR/summary.csv by
bench.analysis.lead), and the run's OK/FAILED line (RUN_DIR/verdict.json; the console adds
the seconds the run took, which no result file keeps). Nothing outside the markers changes.

Exit status: 0 rewritten; 2 bad input (RUN_DIR lacks one of those files or they are
unusable, the run has no headline rows, or the README lacks the markers): one line on
stderr, the README untouched.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.analysis import lead  # noqa: E402
from bench.commands.common import CliParser  # noqa: E402
from bench.errors import UserError  # noqa: E402
from bench.rundir.files import (  # noqa: E402
    ResultFileError,
    write_text_atomic,
)
from bench.rundir.rundir import RunDir  # noqa: E402
from bench.verdict import run_rules  # noqa: E402

BEGIN = "<!-- readme_excerpt: begin (python scripts/readme_excerpt.py RUN_DIR rewrites it) -->"
END = "<!-- readme_excerpt: end -->"
HEADLINE_STARTS = (lead.HEADLINE_TITLE, lead.COST_TITLE)


def provenance(env: dict) -> str:
    """'commit abc1234 (2026-12-01T03:15:22+00:00), preset default, TP2 x PP1 on cpu/gloo,
    2 CPU cores' from env.json; unknown fields say so."""
    git, world = env.get("git") or {}, env.get("world") or {}
    commit = (git.get("commit") or "unknown")[:7] + ("+dirty" if git.get("dirty") else "")
    preset = (env.get("plan") or {}).get("preset", "unknown")
    return (f"commit {commit} ({env.get('utc_time', 'time unknown')}), preset {preset}, "
            f"TP{world.get('tp', '?')} x PP{world.get('pp', '?')} on "
            f"{world.get('device', '?')}/{world.get('backend', '?')}, "
            f"{env.get('cpu_count', '?')} CPU cores")


def headline_lines(summary, calib: dict | None) -> list[str]:
    """The console's first table (bench.analysis.lead: the end-to-end headline, or a pinned
    run's cost decomposition) with what the run resolves, up to the lead's next blank line."""
    lines = lead.lead_text(summary, calib)
    starts = [i for i, line in enumerate(lines) if line.startswith(HEADLINE_STARTS)]
    if not starts:
        raise ResultFileError("summary.csv has no headline rows (pr27010, pr36425 or "
                              "step-clock under wait_complete or timeout)")
    rest = lines[starts[0]:]
    return rest[: rest.index("")] if "" in rest else rest


def excerpt(run_dir: Path) -> list[str]:
    """The lines between the markers, from the run directory's files."""
    run = RunDir(run_dir)
    env = run.json("env", required=["git", "world"])
    summary, calib = run.summary(), run.calibration()
    judged = run_rules.read(run_dir)
    if judged is None:
        raise ResultFileError(f"{run_dir / run_rules.FILE}: no such file (a run written "
                              "before verdict.json existed: rebuild it with bench report)")
    # Every finding is read at the cost of one all-reduce on the machine that made it.
    cost = "" if calib is None else \
        f", one control-plane all-reduce c = {calib['allreduce']['mean_ms']:.2f} ms (mean)"
    return [f"What `bench run` printed at {provenance(env)}{cost}:", "", "```",
            *headline_lines(summary, calib), judged.line, "```"]


def rewrite(readme_text: str, block: list[str]) -> str:
    """readme_text with the lines between BEGIN and END replaced by `block`."""
    lines = readme_text.split("\n")
    begin = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    end = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(begin) != 1 or len(end) != 1 or end[0] < begin[0]:
        raise ResultFileError(f"the README needs one line {BEGIN!r} and, after it, one line "
                              f"{END!r}")
    return "\n".join(lines[: begin[0] + 1] + block + lines[end[0]:])


def main(argv: list[str]) -> int:
    p = CliParser.from_doc("scripts/readme_excerpt.py", __doc__)
    p.add_argument("run_dir", type=Path, help="a results/<run> directory")
    p.add_argument("--readme", type=Path, default=REPO / "README.md")
    try:
        args = p.parse_args(argv)
        text = rewrite(args.readme.read_text(), excerpt(args.run_dir))
    except (UserError, ResultFileError, OSError) as e:
        print(f"readme_excerpt: {e}".splitlines()[0], file=sys.stderr)
        return 2
    write_text_atomic(args.readme, text)
    print(f"readme_excerpt: {args.readme} rewritten from {args.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
