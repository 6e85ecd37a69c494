"""Several SGLangs in one run: one world of ranks per side, taking turns.

Two SGLangs cannot share an interpreter (both are the package `sglang`; their modules
would register under one name, and the decorators read environment switches at import:
docs/sglang.md), so each side imports its own on rank processes of its own: one world per
side (its own ranks, port, gloo groups and run directory under SIDES_DIR), all started
together by `run_sides`. They serve in turns, in `plan.cells()` order: side s serves only
its own cells (those whose protocol is its name), and a cell's ranks wait until every
earlier cell of every side has been served. So the run's cells are interleaved and paired
by seed exactly as `make bench` pairs protocols (one repeat serves every side once, the
order rotated per repeat), and no side's serve overlaps another's: the waiting side's ranks
block (no spin) and its SGLang threads have ended with its last serve (System.close).

Each side's ranks first take a turn for their setup (groups, calibration, SGLang's import),
so every calibration runs on a quiet machine too. With --model-beside one more world, the
project's cache serving the model of each side's release, takes its turns beside them.
The sides' rows are merged into the run directory (bench.rundir.lanes) and reported as any
run is, the first side the reference.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.run.plan import Cell, RunPlan
from bench.run.turns import SideAborted
from hicache.spec.cost_model import modelled

SIDES_DIR = "sides"
POLL_S = 1.0  # how often a waiting rank looks whether a failed side ended the run


@dataclass
class Turns:
    """Shared by every rank of every side (created in the launching process): whose turn
    it is, as a position in the run's order (each side's setup, then plan.cells())."""

    cond: object  # mp.Condition guarding `turn` and `done`
    turn: object  # mp.Value: the position being served
    done: object  # mp.Value: ranks that finished the position being served
    aborted: object  # mp.Value: 1 once a side failed
    world: int  # ranks per side

    def wait(self, position: int, deadline_s: float) -> None:
        """Returns when `position` is being served (SideAborted when a side failed)."""
        end = time.monotonic() + deadline_s
        with self.cond:
            while self.turn.value != position:
                if self.aborted.value or time.monotonic() > end:
                    raise SideAborted(f"stopped waiting for turn {position} (turn "
                                      f"{self.turn.value}: another side failed or hung)")
                self.cond.wait(POLL_S)

    def release(self) -> None:
        """This rank is done with the position being served; the last one passes it on.
        Once a side failed nothing is notified: a rank of the failed side may have been
        killed asleep in the condition, and a notify would wait on it forever."""
        with self.cond:
            self.done.value += 1
            if self.done.value == self.world:
                self.done.value, self.turn.value = 0, self.turn.value + 1
                if not self.aborted.value:
                    self.cond.notify_all()

    def abort(self) -> None:
        """A side failed: the waiting ranks see it within POLL_S, unnotified (release)."""
        self.aborted.value = 1


@dataclass
class Side:
    """What one rank of a world knows: its index among the worlds, the protocols it serves
    (a side's own name; the model beside: the model's protocols) and the shared turns."""

    index: int
    sides: int  # worlds: the sides, and the model beside them
    turns: Turns
    wait_s: float
    protocols: tuple[str, ...] = ()

    def cells(self, plan: RunPlan) -> list[Cell]:
        return [c for c in plan.cells() if c.protocol in self.protocols]

    def setup(self):
        return self._turn(self.index)

    def serve(self, cell: Cell):
        return self._turn(self.sides + cell.index)

    def end(self, plan: RunPlan) -> None:
        """Blocks until every cell of every side has been served: a side that is done does
        not write its rows while another side still serves."""
        self.turns.wait(self.sides + len(plan.cells()), self.wait_s)

    def _turn(self, position: int):
        side = self

        class _Turn:
            def __enter__(self):
                side.turns.wait(position, side.wait_s)

            def __exit__(self, *exc):
                side.turns.release()
        return _Turn()


def with_model(plan: RunPlan) -> RunPlan:
    """--model-beside: the project protocol modelling each side's release
    (hicache.spec.cost_model.modelled: 0.5.18 pre27010, 0.5.19 pr36425) served by one more
    world, after the sides in every repeat's turns. ValueError (one line) without several
    sides, or where two sides share a model (its ratio to itself is 1)."""
    if len(plan.sides) < 2:
        raise ValueError("--model-beside holds the model's ratios in SGLang's intervals: it "
                         "needs several SGLangs (--cache sglang --sglang A,B)")
    models = tuple(modelled(t.name) for t in plan.sides)
    twice = sorted({m for m in models if models.count(m) > 1})
    if twice:
        raise ValueError(f"--model-beside: two sides are modelled by {twice[0]}, whose ratio "
                         "to itself is 1: no model to hold against them")
    return replace(plan, beside=models, protocols=(*plan.protocols, *models))


def side_dirs(plan: RunPlan) -> list[Path]:
    """Each world's run directory: side0, side1, ... and `model` (the model beside)."""
    names = [f"side{i}" for i in range(len(plan.sides))] + (["model"] if plan.beside else [])
    return [Path(plan.out_dir) / SIDES_DIR / n for n in names]


def worlds(plan: RunPlan) -> list[tuple[RunPlan, tuple[str, ...]]]:
    """Each world's plan and the protocols it serves: a side's SGLang and name, then the
    model beside (the project's cache, the models' protocols)."""
    out = [(plan.side_plan(t), (t.name,)) for t in plan.sides]
    return out + ([(plan.side_plan(None), plan.beside)] if plan.beside else [])


def run_sides(plan: RunPlan, timeout_s: float) -> list[str]:
    """Runs every side's world at once (each launch in a thread of this process), taking
    turns; returns the errors of the sides that failed ([] when none did)."""
    from bench.run.launch import Entry, launch_worlds

    ctx = mp.get_context("spawn")
    turns = Turns(ctx.Condition(), ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("b", 0),
                  plan.world_size)
    served = worlds(plan)
    runs = []
    for i, path in enumerate(side_dirs(plan)):
        path.mkdir(parents=True, exist_ok=True)
        world_plan, protocols = served[i]
        name = f"{'side' if i < len(plan.sides) else 'model'} {', '.join(protocols)}"
        runs.append((name, (replace(world_plan, out_dir=str(path)), None,
                            Side(i, len(served), turns, timeout_s, protocols))))
    return launch_worlds(plan.world_size, Entry("bench.run.worker", "run_rank"), runs,
                         timeout_s, turns.abort)  # the other sides stop waiting for it
