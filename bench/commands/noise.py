"""Usage: python -m bench noise [--runs 3] [--preset queue] [--from RUN_DIR ...] [--out DIR]
                                     [--repeats N] [--protocols P,..] [--policies P,..]
                                     [--bootstrap] [--update-gate BASELINE_DIR]

Are this commit's intervals honest? Runs the preset --runs times back to back (or reads the
runs given with --from) and prints, per headline metric (each protocol's ratio to pr27010 in
summary.csv), the coverage: how often each run's 95% interval holds another run's point,
over every ordered pair of runs and every configuration (about 83% is honest for two 95%
intervals; the target is 80%), with the intervals' median and largest half-width (what a
run resolves) and the largest run-to-run deviation of the points. --bootstrap also checks
the two-stage bootstrap's intervals (slower). Writes noise.json (every run's points and
intervals) and noise.md into --out (default results/noise_<preset>_<UTC time>).
--update-gate writes the gate's per-metric thresholds into BASELINE_DIR/gate.json: for each
gated metric the largest half-width the runs had, rounded up to 0.01 (at least 0.02).
Exit 0: every metric's coverage reached 80%; 1: some did not; 2: bad input.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bench.commands.common import CliParser, RunFailed, run_verb
from bench.errors import UserError
from bench.report.printer import progress
from bench.rundir.rundir import RunDir

PROG = "bench noise"


def _parse(argv: list[str]) -> argparse.Namespace:
    p = CliParser.from_doc(PROG, __doc__)
    p.add_argument("--runs", type=int, default=3, help="runs to make (default 3)")
    p.add_argument("--preset", default="queue", help="bench run's preset for every run")
    p.add_argument("--repeats", type=int, help="repeats of every run (default: the preset's)")
    p.add_argument("--from", dest="runs_from", type=Path, nargs="+", metavar="RUN_DIR",
                   help="read these runs instead of making new ones")
    p.add_argument("--protocols", help="passed to every run (comma list)")
    p.add_argument("--policies", help="passed to every run (comma list)")
    p.add_argument("--bootstrap", action="store_true",
                   help="also check the two-stage bootstrap's intervals")
    p.add_argument("--update-gate", type=Path, metavar="BASELINE_DIR",
                   help="write the derived thresholds into BASELINE_DIR/gate.json")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="results folder (default results/noise_<preset>_<UTC time>)")
    args = p.parse_args(argv)
    if (args.runs_from and len(args.runs_from) < 2) or (not args.runs_from and args.runs < 2):
        raise UserError("noise needs at least 2 runs")
    for d in args.runs_from or []:
        if not RunDir(d).has("summary"):
            raise UserError(f"{d}: no summary.csv (not a finished run)")
    return args


def make_runs(args: argparse.Namespace, out: Path) -> tuple[list[Path], dict[str, float]]:
    """--runs runs of the preset into out/run_<i>; the 1-minute load average after each."""
    from bench.rundir.env import REPO_DIR

    extra = [x for f, v in (("--protocols", args.protocols), ("--policies", args.policies),
                            ("--repeats", args.repeats and str(args.repeats))) if v
             for x in (f, v)]
    dirs, load = [], {}
    for i in range(args.runs):
        run = out / f"run_{i}"
        cmd = [sys.executable, "-m", "bench", "run", "--preset", args.preset, "--out",
               str(run), *extra]
        done = subprocess.run(cmd, cwd=REPO_DIR, capture_output=True, text=True)
        last = (done.stdout.strip().splitlines() or [""])[-1]
        progress(f"noise: run {i + 1}/{args.runs}: {last}")
        if done.returncode != 0 or not RunDir(run).has("summary"):
            raise RunFailed(f"run {i} failed (exit {done.returncode}): {last or done.stderr}")
        dirs.append(run)
        load[run.name] = round(os.getloadavg()[0], 2)
    return dirs, load


def _main(argv: list[str]) -> int:

    from bench.ab import noise
    from bench.ab.noise_report import print_figures, update_gate, write_outputs
    from bench.verdict import schedule_digests

    args = _parse(argv)
    out = args.out or RunDir.new("noise", args.preset).path
    out.mkdir(parents=True, exist_ok=True)
    dirs, load = (args.runs_from, {}) if args.runs_from else make_runs(args, out)
    runs = [noise.from_summary(d) for d in dirs]
    per_metric = noise.figures(runs)
    boot = noise.figures([noise.from_bootstrap(d) for d in dirs]) if args.bootstrap else None
    written = write_outputs(out, dirs, runs, per_metric, boot, load)
    if args.update_gate:
        written.append(update_gate(args.update_gate, per_metric, dirs, load))
    summaries = [RunDir(d).summary() for d in dirs]
    return print_figures(per_metric, boot, written, schedule_digests.across_runs(summaries))


def main(argv: list[str]) -> int:
    return run_verb(PROG, _main, argv, (ValueError, OSError))
