"""`python -m bench review --sglang base=SPEC,head=SPEC`: the one page a reviewer of a pull
request to SGLang reads, and its decision.json.

Runs `bench run --cache sglang --sglang LIST` (pinned schedule unless --run-args names one;
more runs on the next seeds while a timing check is undecided, within --budget-repeats and
--budget-s: bench.hazards.review_stages) and `bench hazards --cache sglang --sglang LIST`
into one folder, each in a process of its own (this one imports no SGLang: each verb checks
its sides and its ranks import their own), then writes review.md: whether it passed and why
not, the run's headline (every side's ratios to the first, with intervals), the timing
checks, the counts side by side by call site, and the hazard cells whose outcome changed
from the first side's (docs/before-after.md, "A reviewer's page"); and decision.json beside
it (bench.hazards.review_decision). Exit codes: 0 PASS: the run ended OK, no hazard cell got
worse, every timing check PASSED or was NOT JUDGED; 1 FAIL: the run FAILED, a hazard cell's
outcome got worse than the first side's, the matrix failed (a hazard: a cell hung past its
bound or differed between two runs; or its harness failed: a cell it could not run, which
the page says apart; a cell refused before serving is neither), a timing check FAILED
(undecided at the budget on a quiet machine is FAIL), or under --strict-counts a count
difference that no --explained call site accounts for; 77 INCONCLUSIVE: nothing failed, but
a timing check stayed undecided at the budget on a disturbed machine; 2 bad input (one line,
nothing written, before any rank starts). docs/sglang-ci.md.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from bench.ab.sides import failing
from bench.commands.common import CliParser, run_verb
from bench.errors import UserError
from bench.hazards import review_decision, review_stages
from bench.hazards.classify import REFUSED
from bench.hazards.review import (
    Findings,
    Part,
    RunRows,
    closing_lines,
    exact_checks,
    page,
    strict_counts,
    verdict,
)
from bench.hazards.review_stages import BUDGET_REPEATS, BUDGET_S, REPEATS, StagePlan
from bench.hazards.scenarios import SCENARIOS, check_choice
from bench.report.printer import say
from bench.rundir.env import short_sha
from bench.rundir.files import write_text_atomic
from bench.rundir.rundir import REPO_DIR, RunDir

PROG = "bench review"
# The review sets them: for both verbs, or (--repeats, --seed) per timing stage
OWNED = ("--cache", "--sglang", "--out", "--repeats", "--seed")


def parser() -> CliParser:
    p = CliParser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--sglang", metavar="SPEC,SPEC", required=True,
      help="two SGLangs or more, each optionally LABEL=SPEC (base=0.5.23,"
      "head=~/sglang-pr/python), as bench run --sglang takes them: the first the reference")
    a("--run-args", default="", metavar="ARGS",
      help="more options for bench run, one quoted string (e.g. '--preset ci --policies "
      "wait_complete'); the schedule is pinned unless it names --schedule or --preset")
    a("--scenarios", default=",".join(SCENARIOS),
      help=f"the hazard cells, comma-separated of {', '.join(SCENARIOS)}")
    a("--sglang-consensus", action="store_true",
      help="bench hazards --sglang-consensus: SGLang's own checker's verdict counts too")
    a("--strict-counts", action="store_true",
      help="fail (exit 1) on a count difference no --explained site accounts for: a call "
      "site on one side only, collectives a side's release model does not expect, or "
      "(pinned schedule) a site's collectives per poll unlike the first side's (a CI job's "
      "setting: docs/sglang-ci.md)")
    a("--explained", default="", metavar="SITE,..",
      help="with --strict-counts: call sites the change is meant to touch, each a part of "
      "file:function (e.g. unified_radix_cache.py:_can_terminate_prefetch)")
    a("--repeats", type=int, default=REPEATS, metavar="N",
      help=f"the first timing stage's paired repeats (default {REPEATS})")
    a("--budget-repeats", type=int, default=BUDGET_REPEATS, metavar="N",
      help="paired repeats in all while a timing check is undecided: more stages, each on "
      f"the next seed (default {BUDGET_REPEATS}; at most --repeats: no stage is added)")
    a("--budget-s", type=float, default=BUDGET_S, metavar="S",
      help=f"seconds of timing stages; none starts after them (default {BUDGET_S:g})")
    a("--seed", type=int, default=0, help="the first stage's seed; stage k runs SEED+k")
    a("--out", default="", help="results directory (default results/review_<sha>_<UTC>)")
    return p


def _check(args) -> tuple[list[tuple[str, str]], list[str]]:
    """The sides' list and the run's extra options, checked before anything runs (each verb
    then checks the rest before any rank starts)."""
    from sglang_adapter import ChoiceError, SourceError, parse_sides, resolve

    try:
        sides = parse_sides(args.sglang)
        for label, spec in sides:
            try:
                resolve(spec)
            except SourceError as e:
                raise ChoiceError(f"{e} (side {label or spec})") from None
        check_choice([x for x in args.scenarios.split(",") if x], None)
    except ValueError as e:  # ChoiceError is one
        raise UserError(str(e)) from None
    if args.explained and not args.strict_counts:
        raise UserError("--explained names the sites a strict review lets differ: it needs "
                        "--strict-counts")
    if len(sides) < 2:
        raise UserError("--sglang: a review needs two sides or more (BASE,HEAD)")
    run_args = shlex.split(args.run_args)
    owned = [o for o in run_args if o.split("=")[0] in OWNED]
    if owned:
        name = owned[0].split("=")[0]
        also = f" (bench review {name} N)" if name in ("--repeats", "--seed") else ""
        raise UserError(f"--run-args: {name} is the review's own{also}")
    if args.repeats < 1 or args.budget_s <= 0:
        raise UserError("--repeats must be at least 1 and --budget-s above 0")
    if not any(o.split("=")[0] in ("--schedule", "--preset") for o in run_args):
        run_args = ["--schedule", "pinned", *run_args]  # exact counts per request and poll
    return sides, run_args


def _verb(verb: str, argv: list[str], out: Path) -> Part:
    """One verb in a process of its own, its output the user's; its Part."""
    cmd = [sys.executable, "-m", "bench", verb, *argv, "--out", str(out)]
    code = subprocess.run(cmd, cwd=REPO_DIR).returncode
    return Part(shlex.join(["python", *cmd[1:]]), str(out), code)


def _body(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    sides, run_args = _check(args)
    names = [label or spec for label, spec in sides]
    out = Path(args.out) if args.out else RunDir.new("review", short_sha()).path
    chosen = ["--cache", "sglang", "--sglang", args.sglang]
    limits = _thresholds()

    def stage(index: int, repeats: int, seed: int) -> tuple[str, int]:
        part = _verb("run", [*run_args, *chosen, "--repeats", str(repeats), "--seed",
                             str(seed)], out / ("run" if index == 0 else f"run.stage{index}"))
        parts.append(part)
        return part.folder, part.code

    parts: list[Part] = []
    plan = StagePlan(args.repeats, args.seed, args.budget_repeats, args.budget_s)
    timings = review_stages.run(plan, stage, limits)
    run = parts[0]
    if run.code == 2:
        return 2  # its one line is on stderr; it wrote nothing
    consensus = ["--sglang-consensus"] if args.sglang_consensus else []
    hazards = _verb("hazards", [*chosen, "--scenarios", args.scenarios, *consensus],
                    out / "hazards")
    if hazards.code == 2:
        return 2
    rows = RunDir(hazards.folder).hazards(optional=True) or []
    got = _run_rows(RunDir(run.folder))
    explained = tuple(x for x in args.explained.split(",") if x)
    counts = strict_counts(got, explained) if args.strict_counts else None
    found = Findings(run, hazards, rows, args.sglang_consensus, counts, timings)
    lines = page(names, found, got, explained)
    write_text_atomic(RunDir(out).file("review"), "\n".join(lines) + "\n")
    why = verdict(run, hazards, rows, args.sglang_consensus, counts, timings)
    why += timings.failed_stages()
    exact = exact_checks(rows, run, hazards, counts)
    decided = review_decision.write(out, review_decision.Review(
        sides, got.plan, timings, exact, len(why) - len(failing(timings.verdicts)), limits,
        [f"{r['scenario']} on {r['protocol']}: {r['detail']}" for r in rows
         if r["outcome"] == REFUSED]))
    say("\n".join(closing_lines(PROG, why, timings.verdicts, str(RunDir(out).file("review")))))
    return decided["exit_code"]


def _thresholds() -> dict[str, float]:
    """The gate's thresholds (results/baseline/gate.json's, else the gate's default)."""
    from bench.gate.baseline import read_settings
    from bench.gate.evaluate import thresholds

    return thresholds(read_settings(REPO_DIR / "results" / "baseline"), None)


def _run_rows(run: RunDir) -> RunRows:
    summary = run.summary(optional=True)
    requests = run.table("requests", optional=True)
    return RunRows(summary, requests, run.plan())


def main(argv: list[str]) -> int:
    return run_verb(PROG, _body, argv)
