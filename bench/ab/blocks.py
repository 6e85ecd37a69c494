"""`bench ab`'s engine: two revisions on one machine, interleaved, paired by block.

Block k runs `bench run --preset P --repeats R --seed SEED+k` once for each revision (R = 1
by default); which side runs first in a block is drawn from the seed, balanced (as many
A B blocks as B A ones), so neither side is favoured by running first or second, and a
steady drift of the machine hits both alike and cancels in the pairs; the two runs of a
block have the same seeds, so the same workloads and storage noise. Both sides run from
equivalent trees (detached worktrees; WORKTREE is snapshotted into one too), with the same
environment, and each run starts only once every process of the run before has gone
(bench.ab.procs). The order effect is reported (bench.ab.order). Each side's runs are
then read as one run whose repeat k * R + r is repeat r of block k, and compared as `bench
compare` compares two runs (compare.comparison): exact counts over every block, timing
ratios B/A paired by (block, repeat) with a t interval over those pairs. Only flags every
revision since the serving regime understands are passed (--preset, --repeats, --seed,
--out, --protocols, --policies).
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.ab import RUN_SIZES, procs, size_args
from bench.ab import order as order_effect
from bench.ab.revisions import Revision, checked_out
from bench.analysis.plot_switch import NO_PLOTS
from bench.compare.comparison import Comparison, Run, compare, load_run
from bench.plan.options import REDO_ENV
from bench.rundir.files import ResultFileError, write_json_atomic
from bench.rundir.rundir import RunDir, utc_time
from bench.verdict import run_rules
from bench.verdict.thresholds import DEFAULT_THRESHOLD

RUN_TIMEOUT_S = 1800.0  # one block's run; `bench run` bounds itself well below this
DRIFT = ("A and B run side by side in every block on this machine with the same seeds, "
         "first or second as drawn from the seed (balanced), so drift that is steady over a "
         "block pair cancels and running first favours neither side; the intervals hold the "
         "block-to-block variation")


class AbError(ResultFileError):
    """A revision whose runs cannot be compared (refused its flags, wrote no rows)."""


@dataclass(frozen=True)
class AbPlan:
    a: Revision
    b: Revision
    preset: str
    blocks: int
    seed: int = 0
    per_block: int = 1  # repeats of each run; pairs are (block, repeat)
    threshold: float = DEFAULT_THRESHOLD
    run_args: tuple[str, ...] = ()  # --protocols / --policies, passed to every run
    metrics: tuple[str, ...] | None = None  # compare's --metric (None: all)
    out: Path = Path("results/ab")

    def first_sides(self) -> list[str]:
        """Per block, the side that runs first: half the blocks each (the odd one out a
        coin), in an order drawn from the seed."""
        rng = random.Random(f"bench-ab-order:{self.seed}")
        sides = ["a", "b"] * (self.blocks // 2) + [rng.choice("ab")] * (self.blocks % 2)
        rng.shuffle(sides)
        return sides

    def order(self) -> list[tuple[int, str]]:
        """(block, side) in the order they run."""
        return [(k, side) for k, first in enumerate(self.first_sides())
                for side in (first, "b" if first == "a" else "a")]

    def run_dir(self, k: int, side: str) -> Path:
        return self.out / "runs" / f"{k:02d}_{side}"

    def command(self, k: int, out: Path) -> list[str]:
        return [sys.executable, "-m", "bench", "run", "--preset", self.preset, "--repeats",
                str(self.per_block), "--seed", str(self.seed + k), "--out", str(out),
                *self.run_args]


DEFAULT_PRESET = "ci"
DEFAULT_BLOCKS = 6


@dataclass(frozen=True)
class AbSettings:
    """What `bench ab` (and each bisect step) was asked for besides its two revisions, as
    given on its command line; `size` the runs' --requests / --bystanders; `out` None: a
    new results folder."""

    preset: str = DEFAULT_PRESET
    blocks: int = DEFAULT_BLOCKS
    seed: int = 0
    per_block: int = 1
    threshold: float = DEFAULT_THRESHOLD
    protocols: str | None = None
    policies: str | None = None
    metrics: list[str] | None = None
    out: Path | None = None
    size: dict[str, int] | None = None


def make_plan(rev_a: str, rev_b: str, settings: AbSettings = AbSettings()) -> AbPlan:
    """The plan of `bench ab REV_A REV_B` (and of each bisect step). ValueError (one line)
    for bad settings, RevisionError for an unknown or dirty revision."""
    from bench.ab.revisions import resolve
    from bench.rundir.env import REPO_DIR

    preset, blocks, seed = settings.preset, settings.blocks, settings.seed
    per_block, threshold, metrics = settings.per_block, settings.threshold, settings.metrics
    protocols, policies, out, size = (settings.protocols, settings.policies, settings.out,
                                      settings.size)

    if blocks < 1 or per_block < 1:
        raise ValueError(f"--repeats and --repeats-per-block must be >= 1, got {blocks} "
                         f"and {per_block}")
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"--threshold must be a finite number >= 0, got {threshold}")
    size = size or {}
    for key, least in RUN_SIZES.items():
        if key in size and size[key] < least:
            raise ValueError(f"--{key} must be >= {least}, got {size[key]}")
    a, b = resolve(rev_a, REPO_DIR), resolve(rev_b, REPO_DIR)
    run_args = [x for flag, v in (("--protocols", protocols), ("--policies", policies))
                if v for x in (flag, v)]
    run_args += size_args(size)
    out = out or RunDir.new("ab", a.short, "vs", b.short).path
    return AbPlan(a, b, preset, blocks, seed, per_block, threshold, tuple(run_args),
                  tuple(metrics) if metrics else None, out)


@dataclass
class Outcome:
    """One block run: where it wrote, its exit code, its last console line, its seconds,
    its start and end (UTC, ISO), and its processes still alive after it exited (waited
    for, or ended: bench.ab.procs)."""

    path: Path
    code: int
    last_line: str
    seconds: float
    start_utc: str = ""
    end_utc: str = ""
    lingered: int = 0


Runner = Callable[[AbPlan, int, str, Path], Outcome]  # (plan, block, side, root) -> outcome


def run_one(plan: AbPlan, k: int, side: str, root: Path) -> Outcome:
    """`bench run` of one block for one side, in `root` (that revision's tree), its console
    into console.log beside the results."""
    out = plan.run_dir(k, side).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # No plots, and no disturbed serve served again: revisions from before --redo-disturbed
    # never do, so neither side may (bench.plan.options.REDO_ENV).
    env = {**os.environ, NO_PLOTS: "1", REDO_ENV: "0", "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    start, t0 = utc_time(), time.monotonic()
    with open(RunDir(out).console_log(), "w") as log:
        code, lingered = procs.run_in_session(plan.command(k, out), root, env, log,
                                              RUN_TIMEOUT_S)
    lines = RunDir(out).console_log().read_text(errors="replace").strip().splitlines()
    return Outcome(out, code, lines[-1] if lines else "", time.monotonic() - t0, start,
                   utc_time(), lingered)


def checked(rev: Revision, outcome: Outcome) -> Outcome:
    """The outcome, or AbError when the revision refused the flags or wrote nothing."""
    if outcome.code == 2:
        raise AbError(f"{rev.label}: bench run refused the flags: {outcome.last_line}")
    if not RunDir(outcome.path).has("requests"):
        raise AbError(f"{rev.label}: bench run wrote no rows (exit {outcome.code}): "
                      f"{outcome.last_line}")
    return outcome


@dataclass
class AbRuns:
    """Every block's outcome per side, in block order."""

    a: list[Outcome] = field(default_factory=list)
    b: list[Outcome] = field(default_factory=list)


def run_blocks(plan: AbPlan, runner: Runner = run_one,
               log: Callable[[str], None] = print) -> AbRuns:
    """Every block of both sides, interleaved; each revision checked out once."""
    runs = AbRuns()
    with checked_out(plan.a, _repo(), plan.out) as root_a, \
            checked_out(plan.b, _repo(), plan.out) as root_b:
        roots = {"a": root_a, "b": root_b}
        for i, (k, side) in enumerate(plan.order()):
            rev = plan.a if side == "a" else plan.b
            outcome = checked(rev, runner(plan, k, side, roots[side]))
            getattr(runs, side).append(outcome)
            log(f"ab: [{i + 1:2d}/{2 * plan.blocks}] block {k} {side.upper()} "
                f"{rev.label} ({outcome.seconds:.0f}s, {outcome.start_utc} .. "
                f"{outcome.end_utc}):\n  {outcome.last_line}")
            if outcome.lingered:
                log(f"ab: warning: {outcome.lingered} process(es) of that run outlived it")
    return runs


def _repo() -> Path:
    from bench.rundir.env import REPO_DIR

    return REPO_DIR


def merged(outcomes: list[Outcome], per_block: int = 1) -> Run:
    """One side's runs as one Run whose repeat k * per_block + r is repeat r of block k
    (the pairing unit: A's and B's have the same seeds and ran next to each other)."""
    parts = [load_run(o.path) for o in outcomes]

    def renumbered(frame: pd.DataFrame, k: int) -> pd.DataFrame:
        return frame.assign(repeat=k * per_block + frame["repeat"].astype(int))
    requests = pd.concat([renumbered(p.requests, k) for k, p in enumerate(parts)],
                         ignore_index=True)
    steps = None
    if all(p.steps is not None for p in parts):
        steps = pd.concat([renumbered(p.steps, k) for k, p in enumerate(parts)],
                          ignore_index=True)
    return Run(outcomes[0].path.parent, parts[0].env, requests, steps)


def failed_run_warnings(runs: AbRuns) -> list[str]:
    """Block runs that did not pass their own checks: their counts and timings are suspect."""
    out = []
    for side, outcomes in (("A", runs.a), ("B", runs.b)):
        for k, o in enumerate(outcomes):
            v = run_rules.read(o.path)
            if (v is not None and not v.ok) or o.code != 0:
                out.append(f"warning: block {k} of {side} did not pass its own checks: "
                           f"{v.line if v is not None else o.last_line}")
    return out


def comparison(plan: AbPlan, runs: AbRuns) -> Comparison:
    """B against A, paired by block, with ab's own context lines."""
    comp = compare(merged(runs.a, plan.per_block), merged(runs.b, plan.per_block),
                   plan.threshold, list(plan.metrics) if plan.metrics else None)
    comp.verb, comp.drift_note = "ab", DRIFT
    comp.header = failed_run_warnings(runs) + comp.header + lingered_warnings(runs)
    b_first = [first == "b" for first in plan.first_sides()]
    order_effect.annotate(comp, dict(enumerate(b_first)), plan.per_block)
    comp.sections += block_section(plan, runs)
    comp.extra_rows += block_rows(plan, runs)
    comp.extra_columns += BLOCK_COLUMNS
    each = f"{plan.per_block} repeats" if plan.per_block > 1 else "1 repeat"
    comp.run_lines = [f"{side} = {rev.label}: {plan.blocks} runs of preset {plan.preset} "
                      f"({each} each, seeds {plan.seed}..{plan.seed + plan.blocks - 1}) in "
                      f"{plan.out / 'runs'}" for side, rev in (("A", plan.a), ("B", plan.b))]
    return comp


BLOCK_COLUMNS = ["block", "side", "position", "start_utc", "end_utc", "seconds", "exit",
                 "lingered"]


def _timeline(plan: AbPlan, runs: AbRuns) -> list[dict]:
    """Every block run in the order they ran (ab.csv's `block` rows)."""
    out = []
    for k, side in plan.order():
        o = getattr(runs, side)[k]
        position = "first" if plan.first_sides()[k] == side else "second"
        out.append({"block": k, "side": side.upper(), "position": position,
                    "start_utc": o.start_utc, "end_utc": o.end_utc,
                    "seconds": round(o.seconds, 1), "exit": o.code, "lingered": o.lingered})
    return out


def block_rows(plan: AbPlan, runs: AbRuns) -> list[dict]:
    return [{"metric": f"block {r['block']} {r['side']}", "kind": "block", **r}
            for r in _timeline(plan, runs)]


def block_section(plan: AbPlan, runs: AbRuns) -> list[str]:
    from bench.report.printer import markdown_table

    rows = [[str(r["block"]), r["side"], r["position"], r["start_utc"], r["end_utc"],
             f"{r['seconds']:g}", str(r["exit"]), str(r["lingered"])]
            for r in _timeline(plan, runs)]
    return ["## Block runs", "", "In the order they ran; `lingered`: processes of the run "
            "still alive when it exited (the next run started only after they had gone).", "",
            markdown_table(["block", "side", "position", "start (UTC)", "end (UTC)",
                            "seconds", "exit", "lingered"], rows), ""]


def lingered_warnings(runs: AbRuns) -> list[str]:
    return [f"warning: block {k} of {side}: {o.lingered} process(es) outlived the run"
            for side, outcomes in (("A", runs.a), ("B", runs.b))
            for k, o in enumerate(outcomes) if o.lingered]


def write_plan(plan: AbPlan, runs: AbRuns) -> Path:
    """ab.json: the revisions, the block order and every run's exit code and seconds."""
    def side(rev: Revision, outcomes: list[Outcome]) -> dict:
        return {"name": rev.name, "commit": rev.sha, "runs": [
            {"dir": str(o.path), "exit": o.code, "seconds": round(o.seconds, 1),
             "start_utc": o.start_utc, "end_utc": o.end_utc, "lingered": o.lingered}
            for o in outcomes]}
    path = plan.out / "ab.json"
    write_json_atomic(path, {
        "a": side(plan.a, runs.a), "b": side(plan.b, runs.b), "preset": plan.preset,
        "blocks": plan.blocks, "repeats_per_block": plan.per_block, "seed": plan.seed,
        "threshold": plan.threshold,
        "run_args": list(plan.run_args), "order": [f"{k}{s}" for k, s in plan.order()],
        "utc_time": utc_time()})
    return path
