"""Helpers for the divergence and fault tests: scenarios that stamp their start (pid and wall
time) so a test can time detection from the start of the run and signal a rank from outside,
and a scenario that returns a rank's error instead of raising it. The launcher that lets the
surviving ranks end on their own when one rank dies is bench.run.launch.launch_to_end.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from bench.run.launch import LaunchError
from hicache.agreement.consensus import ConsensusChecker
from hicache.comm.comm import CollectiveCounter, CollectiveError, Comm
from hicache.comm.groups import Layout
from hicache.serve.system import setup_distributed
from tests.helpers import build_scenario, launch, scenario


def stamp(stamp_dir: str, rank: int) -> None:
    """Writes `pid wall_time` to stamp_dir/rank{rank} (atomically: readers poll for it)."""
    path = Path(stamp_dir) / f"rank{rank}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{os.getpid()} {time.time()}")
    tmp.replace(path)


def read_stamps(stamp_dir: str) -> dict[int, tuple[int, float]]:
    """rank -> (pid, wall time the rank started its scenario)."""
    out = {}
    for p in Path(stamp_dir).glob("rank*"):
        if p.suffix == "":
            pid, t = p.read_text().split()
            out[int(p.name[4:])] = (int(pid), float(t))
    return out


def wait_for_stamps(stamp_dir: str, ranks: int, timeout_s: float) -> dict[int, tuple[int, float]]:
    deadline = time.monotonic() + timeout_s
    while len(stamps := read_stamps(stamp_dir)) < ranks:
        assert time.monotonic() < deadline, f"ranks did not start within {timeout_s}s"
        time.sleep(0.05)
    return stamps


def stamped_scenario(rank: int, world: int, stamp_dir: str, *args) -> dict:
    stamp(stamp_dir, rank)
    return scenario(rank, world, *args)


def capturing_scenario(rank: int, world: int, stamp_dir: str, *args) -> dict:
    """Like helpers.scenario (`args` as its, after `world`), but a run that fails in a
    collective returns its error (and the decisions logged so far) instead of raising, so a
    test sees every rank's side of a divergence. Any other exception is raised: the launch
    fails and names it."""
    stamp(stamp_dir, rank)
    system, reqs = build_scenario(rank, *args)
    t0, error = time.time(), None
    try:
        system.run(reqs)
    except Exception as e:
        if not _collective_failure(e):
            raise  # any other error is a bug, not a side of the divergence
        error = f"{type(e).__name__}: {e}"
    stats = system.stats
    return {"error": error, "run_s": time.time() - t0, "decisions": dict(stats.decisions),
            "rows": stats.request_rows(), "steps": stats.step_rows()}


def _collective_failure(e: BaseException | None) -> bool:
    """A collective that failed or timed out: raised on the scheduler thread, or a
    background thread's, re-raised by the scheduler with it as the cause."""
    while e is not None:
        if isinstance(e, CollectiveError):
            return True
        e = e.__cause__
    return False


@dataclass
class Outcome:
    results: list | None  # per rank, when the launch succeeded
    error: str | None  # the LaunchError text otherwise
    wall_s: float  # launch call to return or LaunchError (spawn and imports included)
    run_s: float | None  # earliest rank start stamp to return or LaunchError


def launch_timed(world: int, fn, args: tuple, stamp_dir: str, timeout_s: float) -> Outcome:
    """launch(fn, (stamp_dir, *args)); a LaunchError is returned, not raised."""
    t0 = time.monotonic()
    results, error = None, None
    try:
        results = launch(world, fn, (stamp_dir, *args), timeout_s=timeout_s)
    except LaunchError as e:
        error = str(e)
    wall_end, now = time.monotonic(), time.time()
    stamps = read_stamps(stamp_dir)
    run_s = now - min(t for _, t in stamps.values()) if stamps else None
    return Outcome(results, error, wall_end - t0, run_s)


def consensus_probe(rank: int, world: int, variants: list[str], timeout_s: float) -> list:
    """Feeds a ConsensusChecker the same 20 records on every rank, except that in variant
    "different" rank 1's 8th record differs, in "extra" rank 1 has a 21st, and in "late"
    rank 1 records its last 10 only after rank 0 has already stopped its checker (as a lagging
    PP stage may). Returns, per variant, the checker's error text (None when it passed)."""
    layout = Layout(rank, world, 1)
    groups = setup_distributed(layout, torch.device("cpu"), timeout_s)
    out = []
    for variant in variants:
        checker = ConsensusChecker(Comm(layout, groups, CollectiveCounter()), 0.01)
        lines = [f"check_prefetch_progress('r{i:03d}',)" for i in range(20)]
        if rank == 1 and variant == "different":
            lines[7] = "check_prefetch_progress -> True"
        if rank == 1 and variant == "extra":
            lines.append("check_prefetch_progress('r020',)")
        split = 10 if rank == 1 and variant == "late" else len(lines)
        for line in lines[:split]:
            checker.record(line)
        checker.start()
        if split < len(lines):
            time.sleep(0.3)
            for line in lines[split:]:
                checker.record(line)
        checker.stop(timeout_s)
        err = checker.error
        out.append(None if err is None else f"{type(err).__name__}: {err}")
        dist.barrier()  # the next variant starts on a quiet group
    return out
