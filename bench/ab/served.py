"""`bench ab`'s served design: two revisions as sides of one interleaved run, in stages.

A stage is one run of both sides (bench.ab.conductor): `bench run --preset P --repeats R
--seed S` in each revision's tree, their serves of each cell back to back. Repeats pair by
(stage, repeat): the two serves of a pair ran seconds apart on the same seed. A run may add
stages (fresh seeds) while its checks are undecided (bench.ab.sequential); the stages are
then read as one run per side whose repeat numbers continue from stage to stage, and
compared as `bench compare` compares two runs: exact counts over every repeat, timing ratios
B/A paired by repeat, with the served A/B's own interval over the pairs
(bench.analysis.estimate.served, named by estimate.SERVED) at the level of the planned look
(bench.ab.sequential.look_level).

A revision older than the side interface (bench/run/turns.py, INTERFACE) cannot be a side:
`interface_of` says so before anything runs, and `bench ab` falls back to its blocks.
"""

from __future__ import annotations

import ast
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.ab import order as order_effect
from bench.ab import sequential
from bench.ab.conductor import Conductor, SideProc, first_sides, turn_order
from bench.ab.revisions import Revision, checked_out
from bench.ab.sequential import Budget
from bench.analysis import estimate
from bench.compare.comparison import Comparison, Run, compare, stacked
from bench.compare.rows import TimingOptions
from bench.run import turns
from bench.rundir.env import REPO_DIR
from bench.rundir.files import ResultFileError
from bench.rundir.rundir import RunDir
from bench.stats import Interval
from bench.verdict import run_rules
from bench.verdict.thresholds import DEFAULT_THRESHOLD

DRIFT = ("A and B serve each cell of one run back to back, seconds apart, on the same seed, "
         "the side first in a repeat drawn from the seed (balanced), so drift slower than a "
         "serve cancels within the pair; the intervals hold the repeat-to-repeat variation")
TURNS_FILE = "turns.csv"


def interface_of(root: Path) -> int | None:
    """The side interface a tree speaks (bench/run/turns.py's INTERFACE), None before it."""
    path = Path(root) / "bench" / "run" / "turns.py"
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "INTERFACE" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def refusal(rev: Revision, root: Path) -> str | None:
    """One line on why `rev` cannot be served as a side here, or None."""
    got = interface_of(root)
    if got == turns.INTERFACE:
        return None
    if got is None:
        return f"{rev.label} predates the side interface (bench/run/turns.py)"
    return f"{rev.label} speaks side interface {got}, this tree {turns.INTERFACE}"


@dataclass(frozen=True)
class ServedPlan:
    """What both sides run: preset, repeats of the first stage, seed of the first stage
    and the flags passed to every `bench run`."""

    a: Revision
    b: Revision
    preset: str
    repeats: int
    seed: int = 0
    threshold: float = DEFAULT_THRESHOLD
    run_args: tuple[str, ...] = ()
    metrics: tuple[str, ...] | None = None
    out: Path = Path("results/ab")

    def command(self, repeats: int, seed: int) -> list[str]:
        return ["--preset", self.preset, "--repeats", str(repeats), "--seed", str(seed),
                *self.run_args]


@dataclass
class Stage:
    """One run of both sides: its seed and repeats, run directories, exit codes, the
    repeat's first side, and every turn's seconds."""

    index: int
    seed: int
    repeats: int
    dirs: dict[str, Path]
    codes: dict[str, int] = field(default_factory=dict)
    first: list[str] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    looks: tuple[int, ...] | None = None  # the run's planned looks (None: one look)


def serve_stage(plan: ServedPlan, roots: dict[str, Path], index: int, seed: int,
                repeats: int, log: Callable[[str], None]) -> Stage:
    """Both sides' runs of one stage, their turns conducted; ConductError for a side that
    failed or broke the interface (both sides are stopped then)."""
    stage = Stage(index, seed, repeats, stage_dirs(plan.out, index))
    stage.first = first_sides(seed, repeats)
    conductor = Conductor([SideProc(s, roots[s], stage.dirs[s]) for s in "ab"])
    t0 = time.monotonic()
    try:
        conductor.start(plan.command(repeats, seed))
        cells = conductor.connect()
        order = turn_order(cells, stage.first)
        for i, (side, position) in enumerate(order):
            seconds = conductor.turn(side, position)
            stage.turns.append({"stage": index, "turn": i, "side": side.upper(),
                                "position": position, "seconds": round(seconds, 3)})
        stage.codes = conductor.finish()
    finally:
        conductor.close()
    stage.seconds = time.monotonic() - t0
    log(f"ab: stage {index}: {repeats} paired repeats (seed {seed}), {len(stage.turns)} turns "
        f"in {stage.seconds:.0f}s;\n  A {_last(stage.dirs['a'])};\n  B {_last(stage.dirs['b'])}")
    for s in "ab":
        if not RunDir(stage.dirs[s]).has("requests"):
            raise ResultFileError(f"side {s.upper()} wrote no rows (exit {stage.codes[s]}): "
                                  f"{_last(stage.dirs[s])}")
    return stage


def stage_dirs(out: Path, index: int) -> dict[str, Path]:
    """Each side's run directory of stage `index`, absolute: a side's `bench run` starts in
    its own tree, so a relative --out would land there, not here."""
    base = Path(out).resolve() / "stages" / f"{index:02d}"
    return {s: base / s for s in "ab"}


def _last(out: Path) -> str:
    path = RunDir(out).console_log()
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return lines[-1] if lines else "(no output)"


def merged(stages: list[Stage], side: str) -> Run:
    """One side's stages as one Run whose repeats continue from stage to stage."""
    return stacked([(s.dirs[side], s.repeats) for s in stages],
                   path=stages[0].dirs[side].parent.parent)


def b_first(stages: list[Stage]) -> dict[int, bool]:
    """Merged repeat -> whether B served first in it."""
    out, offset = {}, 0
    for s in stages:
        out |= {offset + r: side == "b" for r, side in enumerate(s.first)}
        offset += s.repeats
    return out


def timing(threshold: float, level: float = estimate.LEVEL) -> TimingOptions:
    """The served A/B's intervals: bench.analysis.estimate.served at `level`."""
    return TimingOptions(threshold, lambda b, a, lb, la: estimate.served(b, a, lb, la, level),
                         f"{estimate.SERVED} {level:.4g}")


def comparison(plan: ServedPlan, stages: list[Stage],
               looks: tuple[int, ...] | None = None) -> Comparison:
    """B against A over every stage, paired by repeat, with the served run's context; the
    intervals at the level of the planned look this many pairs make (95 % without)."""
    n = sum(s.repeats for s in stages)
    comp = compare(merged(stages, "a"), merged(stages, "b"), plan.threshold,
                   list(plan.metrics) if plan.metrics else None,
                   timing(plan.threshold, sequential.look_level(n, looks)))
    comp.verb, comp.drift_note = "ab", DRIFT
    comp.header = failed_sides(stages) + comp.header
    order_effect.annotate(comp, b_first(stages), 1)
    seeds = ", ".join(str(s.seed) for s in stages)
    comp.run_lines = [f"{side} = {rev.label}: one side of {len(stages)} served run(s) of "
                      f"preset {plan.preset} ({n} repeats, seeds {seeds}) in "
                      f"{plan.out / 'stages'}" for side, rev in (("A", plan.a), ("B", plan.b))]
    comp.extra_rows += [{"metric": f"turn {t['stage']}.{t['turn']}", "kind": "turn", **t}
                        for s in stages for t in s.turns]
    comp.extra_columns += [c for c in ("stage", "turn", "side", "position", "seconds")
                           if c not in comp.extra_columns]
    return comp


# summary.csv's gated ratio metrics -> bench compare's (and ab's) timing metrics
AB_METRICS = {"step_mean": "step_mean_ms", "itl_p50": "itl_p50_ms",
              "prefetch_ttft_p50": "prefetch_ttft_p50_ms",
              "bystander_ttft_p50": "bystander_ttft_p50_ms", "ttft": "ttft_p50_ms"}


def gated_rows(comp: Comparison) -> Iterator[tuple[dict, str, Interval]]:
    """(row, gated metric, interval of B/A) per configuration's gated timing metric: TTFT
    p50 per request class where the run has both classes, else over every request. The gate's
    revisions and the review's sides are judged from these."""
    wanted = {v: k for k, v in AB_METRICS.items()}
    if any(r.get("metric") == "prefetch_ttft_p50_ms" for r in comp.rows):
        wanted.pop("ttft_p50_ms")  # gated per request class instead
    for row in comp.rows:
        m = wanted.get(row.get("metric"))
        if row.get("kind") != "timing" or m is None or row.get("ratio_b_over_a") is None:
            continue
        yield row, m, Interval(row["ratio_b_over_a"], row.get("ratio_ci_low"),
                               row.get("ratio_ci_high"), int(row.get("repeats") or 0),
                               row.get("ratio_mdd"), row.get("note") or "",
                               row.get("interval") or "")


def failed_sides(stages: list[Stage]) -> list[str]:
    """A side's run that did not pass its own checks: its counts and timings are suspect."""
    out = []
    for st in stages:
        for s in "ab":
            v = run_rules.read(st.dirs[s])
            if (v is not None and not v.ok) or st.codes.get(s, 1) != 0:
                out.append(f"warning: stage {st.index} side {s.upper()} did not pass its own "
                           f"checks: {v.line if v is not None else _last(st.dirs[s])}")
    return out


def record(plan: ServedPlan, stages: list[Stage]) -> dict:
    """ab.json's content for a served A/B; `interval` says how its intervals were made."""
    n, looks = sum(s.repeats for s in stages), stages[-1].looks if stages else None
    spending = sequential.SPEND if looks else None
    return {"design": "served", "interface": turns.INTERFACE,
            "interval": {"method": estimate.SERVED, "level": sequential.look_level(n, looks),
                         "looks": list(looks or [n]), "spending": spending},
            "a": {"name": plan.a.name, "commit": plan.a.sha},
            "b": {"name": plan.b.name, "commit": plan.b.sha}, "preset": plan.preset,
            "threshold": plan.threshold, "run_args": list(plan.run_args),
            "python": sys.executable,
            "stages": [{"index": s.index, "seed": s.seed, "repeats": s.repeats,
                        "first": "".join(s.first), "exit": s.codes,
                        "seconds": round(s.seconds, 1),
                        "dirs": {k: str(v) for k, v in s.dirs.items()}} for s in stages]}


States = Callable[[Comparison], list[sequential.State]]


def run(plan: ServedPlan, budget: Budget | None = None, states: States | None = None,
        log: Callable[[str], None] = print, header: str | None = None
        ) -> tuple[list[Stage], Comparison]:
    """The served A/B: a first stage of plan.repeats, then (with a budget and the gated
    checks' `states`) more stages while bench.ab.sequential says so; each stage's seed the
    next. `header` is logged once both revisions are known to be sides; a revision that
    cannot be one is NotASide (one line)."""
    with checked_out(plan.a, REPO_DIR, plan.out) as root_a, \
            checked_out(plan.b, REPO_DIR, plan.out) as root_b:
        roots = {"a": root_a, "b": root_b}
        for side, rev in (("a", plan.a), ("b", plan.b)):
            why = refusal(rev, roots[side])
            if why:
                raise NotASide(why)
        if header:  # once both trees are known to be sides
            log(header)
        looks = looks_of(plan, budget, states)

        def serve(index: int, repeats: int, seed: int) -> Stage:
            stage = serve_stage(plan, roots, index, seed, repeats, log)
            stage.looks = looks
            return stage

        def judge(stages: list[Stage]):
            comp = comparison(plan, stages, looks)
            return (states(comp) if states is not None else []), comp

        return sequential.staged(plan.repeats, plan.seed, serve, judge,
                                 sequential.deciding(budget if states is not None else None,
                                                     looks), log, "ab")


def looks_of(plan: ServedPlan, budget: Budget | None, states: States | None
             ) -> tuple[int, ...] | None:
    """The planned looks of a sequential run (None: one stage, or every look at 95 %:
    bench.ab.sequential.PLAN_LOOKS)."""
    if budget is None or states is None:
        return None
    return sequential.looks_for(plan.repeats, budget.repeats)


class NotASide(ResultFileError):
    """A revision whose tree does not speak this tree's side interface."""
