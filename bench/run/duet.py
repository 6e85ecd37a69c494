"""Duet serves: every protocol of a repeat serves at the same time, each on ranks of its own.

Under serial serving (the default) the protocols of a repeat serve one after the other, and
a burst of steal or of another process lands on one side's serve and not the other's:
whole-serve repeats cannot cancel it. Duet benchmarking (Bulej et al., ICPE 2020) runs A and
B at the same time on one machine, so a burst hits both; each pair of concurrent serves is
one paired sample, and the ratio of the pair is what is kept (bench.analysis pairs the
protocols of a repeat already, so nothing downstream changes).

How it runs: one independent world per protocol lane (its own ranks, port, gloo groups, and
run directory under LANES_DIR), started together by `run_duet`. `plan.cells()` groups the
protocols of each (repeat, rate, policy); lane l serves the l-th cell of every group, so the
rotation of protocols per repeat also rotates which lane serves which protocol (a lane's
bias cancels over repeats). Every rank of every lane meets at one barrier before each serve
(`DuetSync.start`). A lane that finishes first keeps its cores as busy as its own serve kept
them (a duty-cycled spin at its serve's CPU share) until every lane is done
(`DuetSync.finish`): each side's run length is equal, so the slower side's tail does not
run on an emptier machine (which would bias its ratio toward 1). The lanes' rows are then
merged into the run directory and reported as any run is.

Limits (the paper's too): the sides compete with each other for the cores (2 lanes x TP2
on 2 cores run 4 ranks), so absolute times are not a lone serve's; only ratios are kept.
No serve is run again for a disturbance (--redo-disturbed is off): a burst hits both sides.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.run.plan import Cell, RunPlan

LANES_DIR = "lanes"
SPIN_PERIOD_S = 0.01  # the filler's duty cycle period
WAIT_S = 600.0  # the longest one lane waits for the others at a barrier
START_POLL_S = 0.0005  # how often a rank at a start looks whether every rank is there


def lanes(plan: RunPlan) -> int:
    return len(plan.protocols)


def lane_cells(plan: RunPlan, lane: int) -> list[Cell]:
    """Lane `lane`'s cells: the lane-th of every (repeat, rate, policy) group of plan.cells()
    (each group holds every protocol once, rotated per repeat)."""
    n = lanes(plan)
    cells = plan.cells()
    assert len(cells) % n == 0, "plan.cells() groups every protocol of a configuration"
    return cells[lane::n]


@dataclass
class DuetSync:
    """Shared by every rank of every lane (created in the launching process). Plain shared
    counters, polled: a rank killed while it waits (its lane failed) leaves nothing behind
    that a live rank or the launcher would wait on, as a killed sleeper in a
    multiprocessing Barrier or Condition does (its notify then blocks forever)."""

    arrived: object  # mp.Value: ranks that reached a start, summed over every start
    done: object  # mp.Value: serves finished, summed over every rank of every lane
    broken: object  # mp.Value: 1 once a lane failed
    ranks: int  # every rank of every lane

    def start(self) -> None:
        """Returns when every rank of every lane is about to serve (each start is the next
        `ranks` arrivals: no rank reaches a start before every rank finished the serve
        before it); BrokenBarrierError once a lane failed or after WAIT_S."""
        with self.arrived.get_lock():
            self.arrived.value += 1
            target = -(-self.arrived.value // self.ranks) * self.ranks
        deadline = time.monotonic() + WAIT_S
        while self.arrived.value < target:
            if self.broken.value or time.monotonic() > deadline:
                raise threading.BrokenBarrierError("another lane failed or hung before "
                                                   "this serve's start")
            time.sleep(START_POLL_S)

    def abort(self) -> None:
        """A lane failed: every rank waiting at a start stops waiting."""
        self.broken.value = 1

    def finish(self, serve: int, duty: float) -> None:
        """After this rank's `serve`-th serve (1-based): keep the CPU `duty` busy until every
        rank of every lane has finished its serve-th serve."""
        with self.done.get_lock():
            self.done.value += 1
        target, deadline = self.ranks * serve, time.monotonic() + WAIT_S
        duty = min(max(duty, 0.0), 1.0)
        while self.done.value < target and time.monotonic() < deadline \
                and not self.broken.value:
            end = time.perf_counter() + duty * SPIN_PERIOD_S
            while time.perf_counter() < end:
                pass
            time.sleep((1 - duty) * SPIN_PERIOD_S)


@dataclass
class Lane:
    """What one rank of a duet knows: its lane and the shared sync."""

    index: int
    sync: DuetSync
    serves: int = 0

    def start(self) -> None:
        self.sync.start()

    def finish(self, duty: float) -> None:
        self.serves += 1
        self.sync.finish(self.serves, duty)


def lane_dirs(plan: RunPlan) -> list[Path]:
    return [Path(plan.out_dir) / LANES_DIR / f"lane{i}" for i in range(lanes(plan))]


def run_duet(plan: RunPlan, timeout_s: float) -> list[str]:
    """Runs every lane at once (each launch in a thread of this process); returns the
    errors of the lanes that failed ([] when none did). The lanes' rows are merged into
    plan.out_dir by bench.rundir (RunDir.merge_lanes)."""
    from bench.run.launch import Entry, launch_worlds

    ctx = mp.get_context("spawn")
    n = lanes(plan)
    sync = DuetSync(ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("b", 0),
                    n * plan.world_size)
    dirs = lane_dirs(plan)
    for path in dirs:
        path.mkdir(parents=True, exist_ok=True)
    return launch_worlds(plan.world_size, Entry("bench.run.worker", "run_rank"),
                         [(f"lane {i}", (replace(plan, out_dir=str(p)), Lane(i, sync)))
                          for i, p in enumerate(dirs)],
                         timeout_s, sync.abort)  # the others stop waiting for it
