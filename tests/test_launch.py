"""The launcher's two guards against a loaded machine (bench.run.launch):
- the rendezvous port (`reserve_port`) is held from the moment it is chosen until the
  ranks have ended, so no other process (another test's launch, an outgoing gloo
  connection) takes it before rank 0's TCPStore binds it;
- `launch_to_end` with `started` bounds a start-up and a serve apart, so a start-up slowed
  by other processes importing beside it is never killed as a hang, and a hang still is.
And `launch_worlds`, the one launcher of a run's several worlds (its sides, its duet lanes):
a world that fails is named, and the others are told so they stop waiting for it.
"""

from __future__ import annotations

import errno
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest

from bench.run.launch import Deadline, Entry, launch_to_end, launch_worlds, reserve_port
from tests.helpers import START


def test_a_held_port_is_handed_to_no_other_socket():
    held = reserve_port()
    port = held.getsockname()[1]
    try:
        with socket.socket() as other, pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", port))  # what any other process's socket would meet
        assert taken.value.errno == errno.EADDRINUSE
        others = [reserve_port() for _ in range(200)]
        try:
            assert port not in {s.getsockname()[1] for s in others}
        finally:
            for s in others:
                s.close()
    finally:
        held.close()
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))  # free again once the launch has closed it


def test_rank_0s_store_binds_and_serves_on_the_held_port():
    from torch.distributed import TCPStore

    held = reserve_port()
    port = held.getsockname()[1]
    try:
        master = TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=10),
                          wait_for_workers=False)
        client = TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10))
        client.set("k", "v")
        assert master.get("k") == b"v" and master.port == port
    finally:
        held.close()


def test_the_serves_bound_runs_from_the_end_of_the_start_up():
    now, up = [0.0], [False]
    deadline = Deadline(1.0, started=lambda: up[0], start_s=60.0, clock=lambda: now[0])
    now[0] = 59.0  # a start-up 59 times the serve's bound: not a hang
    assert not deadline.passed()
    up[0], now[0] = True, 59.5
    assert not deadline.passed()  # started: 1 s from here
    now[0] = 60.4
    assert not deadline.passed()  # past the start-up's bound, within the serve's
    now[0] = 60.5
    assert deadline.passed()
    late = Deadline(1.0, started=lambda: False, start_s=60.0, clock=lambda: now[0])
    now[0] += 60.0
    assert late.passed()  # a start-up that never ends is bounded too
    plain = Deadline(1.0, clock=lambda: now[0])
    now[0] += 1.0
    assert plain.passed()


def _hangs_after_its_start_up(rank: int, world: int, marks: str):
    (Path(marks) / f"{rank}.started").touch()
    time.sleep(50.0)  # a hung serve


@pytest.mark.timeout(60)
def test_a_serve_past_its_bound_is_killed_there(tmp_path):
    t0 = time.monotonic()
    got, dead = launch_to_end(2, _hangs_after_its_start_up, (str(tmp_path),), timeout_s=1.0,
                              method=START, start_s=60.0,
                              started=lambda: len(list(tmp_path.glob("*.started"))) == 2)
    assert got == {} and dead == {}  # killed at the bound: in neither
    assert time.monotonic() - t0 < 30.0



def world_rank(rank: int, world: int, name: str, broken: bool, wait) -> str:
    """A rank of one world for launch_worlds: a broken world's rank 1 fails a moment after its
    rank 0 has gone to sleep in `wait` (the run's shared wait: a duet's start, a side's turn),
    so that its launch kills rank 0 asleep; every other rank sleeps in `wait` until the
    failure is announced (and fails with it), or returns at once where `wait` is None."""
    if broken and rank == 1:
        time.sleep(2.0)
        raise RuntimeError(f"{name} broke")
    if wait is not None:
        wait()
    return name


class DuetStart:
    def __init__(self, sync):
        self.sync = sync

    def __call__(self):
        self.sync.start()


class SideTurn:
    def __init__(self, turns):
        self.turns = turns

    def __call__(self):
        self.turns.wait(99, 600.0)  # a turn no side reaches, and no deadline within the test's


def test_worlds_run_at_once_and_each_is_named():
    fn = Entry("tests.test_launch", "world_rank")
    assert launch_worlds(2, fn, [(n, (n, False, None)) for n in ("side0", "side1")], 60,
                         lambda: pytest.fail("no world failed")) == []


@pytest.mark.dist
@pytest.mark.timeout(120)
@pytest.mark.parametrize("shared", ["duet start", "side turn"])
def test_a_world_failing_while_its_rank_sleeps_ends_the_run_and_hangs_nothing(shared):
    """The failing world's rank 0 is killed asleep in the shared wait; the announcement
    (DuetSync.abort, Turns.abort) must then still reach the other world's sleeping ranks and
    return: a multiprocessing Barrier or Condition would block forever notifying the dead
    sleeper (the run hung, and this test hit its timeout). Every wait's own deadline (the
    launch's, the turn's, the duet's WAIT_S) lies past the test's timeout, so the run ends
    within it only if the announcement reached the sleeping ranks."""
    import multiprocessing as mp

    from bench.run.duet import DuetSync
    from bench.run.sglang_worlds import Turns

    ctx = mp.get_context("spawn")
    if shared == "duet start":
        sync = DuetSync(ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("b", 0), 4)
        wait, announce = DuetStart(sync), sync.abort
    else:
        turns = Turns(ctx.Condition(), ctx.Value("q", 0), ctx.Value("q", 0),
                      ctx.Value("b", 0), 2)
        wait, announce = SideTurn(turns), turns.abort
    errors = launch_worlds(2, Entry("tests.test_launch", "world_rank"),
                           [("lane 0", ("lane 0", False, wait)),
                            ("lane 1", ("lane 1", True, wait))], 600, announce)
    named = sorted(errors)
    assert len(named) == 2 and "lane 1 broke" in named[1], errors  # the cause, named
    assert named[0].startswith("lane 0: ") and ("BrokenBarrierError" in named[0]
                                               or "SideAborted" in named[0]), errors
