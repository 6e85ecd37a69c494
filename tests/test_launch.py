"""The launcher's two guards against a loaded machine (bench.run.launch):
- the rendezvous port (`reserve_port`) is held from the moment it is chosen until the
  ranks have ended, so no other process (another test's launch, an outgoing gloo
  connection) takes it before rank 0's TCPStore binds it;
- `launch_to_end` with `started` bounds a start-up and a serve apart, so a start-up slowed
  by other processes importing beside it is never killed as a hang, and a hang still is.
"""

from __future__ import annotations

import errno
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest

from bench.run.launch import Deadline, launch_to_end, reserve_port
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
