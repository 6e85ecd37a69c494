"""Two revisions as sides of one run: the conductor and the side interface (fake ranks on
real sockets, no torch), and the order of turns. The sequential rule that adds their stages:
tests/test_sequential_rule.py."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.ab.conductor import ConductError, Conductor, SideProc, first_sides, turn_order
from bench.ab.revisions import Revision
from bench.ab.served import interface_of, refusal
from bench.run import turns

REPO = Path(__file__).resolve().parent.parent

# ---- the order of turns -----------------------------------------------------------------


def test_each_repeat_has_a_first_side_drawn_and_balanced():
    for seed in range(5):
        first = first_sides(seed, 6)
        assert sorted(first) == ["a"] * 3 + ["b"] * 3 and first == first_sides(seed, 6)
    cells = ["0/inf/wait_complete/pr27010", "0/inf/wait_complete/pr36425",
             "1/inf/wait_complete/pr36425", "1/inf/wait_complete/pr27010"]
    order = turn_order(cells, ["b", "a"])
    assert order[:2] == [("b", "setup"), ("a", "setup")]
    assert order[2:] == [("b", 0), ("a", 0), ("b", 1), ("a", 1),
                         ("a", 2), ("b", 2), ("a", 3), ("b", 3)]


# ---- the conductor and the interface, with fake ranks -----------------------------------


class FakePlan:
    def __init__(self, cells):
        self._cells = cells

    def cells(self):
        return self._cells


class FakeCell:
    def __init__(self, index, repeat, protocol):
        self.index, self.repeat, self.protocol = index, repeat, protocol
        self.rate_rps, self.policy = math.inf, "wait_complete"


def fake_rank(address: str, rank: int, cells, served: list):
    """A rank as bench.run.worker drives its side: setup, then every cell, in turn."""
    side = turns.SocketSide(address, rank, 2, FakePlan(cells))
    try:
        with side.setup():
            pass
        for cell in cells:
            with side.serve(cell):
                served.append((side.name, rank, cell.index))
        side.end(FakePlan(cells))
        served.append((side.name, rank, "end"))
    except turns.SideAborted as e:
        served.append((side.name, rank, str(e)))


@pytest.fixture
def fake_modules(monkeypatch, tmp_path):
    """Each fake rank says its serve path lies in tmp_path/<side>."""
    def modules():
        name = threading.current_thread().name  # "a0", "b1", ...
        return {m: str(tmp_path / name[0] / f"{m}.py") for m in turns.SERVE_PATH}
    monkeypatch.setattr(turns, "modules", modules)
    return tmp_path


def start_fake_sides(conductor: Conductor, cells_of, served):
    threads = []
    for name in "ab":
        for rank in range(2):
            t = threading.Thread(target=fake_rank, name=f"{name}{rank}", daemon=True,
                                 args=(f"{conductor.address}:{name}", rank, cells_of(name),
                                       served))
            t.start()
            threads.append(t)
    return threads


def cells2():
    return [FakeCell(0, 0, "pr27010"), FakeCell(1, 0, "pr36425"), FakeCell(2, 1, "pr36425"),
            FakeCell(3, 1, "pr27010")]


def conductor_for(root: Path) -> Conductor:
    return Conductor([SideProc(s, root / s, root / "out" / s) for s in "ab"])


def test_the_conductor_serves_both_sides_in_turns(fake_modules):
    served: list = []
    c = conductor_for(fake_modules)
    try:
        threads = start_fake_sides(c, lambda name: cells2(), served)
        cells = c.connect()
        assert cells == [turns.cell_key(x) for x in cells2()]
        for side, position in turn_order(cells, ["a", "b"]):
            c.turn(side, position)
            if position != "setup":  # both ranks of that side served that cell, alone
                assert {x for x in served[-2:]} == {(side, 0, position), (side, 1, position)}
        for t in threads:
            t.join(0.2)
        # every turn served, and no rank has ended: a side's end (its reports) waits for the
        # run's end line, so it never runs beside the other side's last serve
        assert len(served) == 16 and all(t.is_alive() for t in threads)
        c.end()
        for t in threads:
            t.join(5)
        assert sorted(x for x in served if x[2] == "end") == [
            (s, r, "end") for s in "ab" for r in range(2)]
    finally:
        c.close()


def test_a_rank_importing_from_another_tree_is_refused(fake_modules, monkeypatch):
    monkeypatch.setattr(turns, "modules", lambda: {m: "/elsewhere/x.py"
                                                   for m in turns.SERVE_PATH})
    c = conductor_for(fake_modules)
    try:
        start_fake_sides(c, lambda name: cells2(), [])
        with pytest.raises(ConductError, match="imported .* from /elsewhere/x.py, outside"):
            c.connect()
    finally:
        c.close()


def test_sides_planning_different_cells_are_refused(fake_modules):
    c = conductor_for(fake_modules)
    try:
        start_fake_sides(c, lambda name: cells2() if name == "a" else cells2()[:2], [])
        with pytest.raises(ConductError, match="plan different cells: 4 cells against 2"):
            c.connect()
    finally:
        c.close()


def test_a_side_speaking_another_interface_is_refused(fake_modules):
    c = conductor_for(fake_modules)
    try:
        conn = socket.create_connection(("127.0.0.1", int(c.address.rsplit(":", 1)[1])))
        conn.sendall((json.dumps({"interface": turns.INTERFACE - 1, "side": "a", "rank": 0,
                                  "world": 2, "modules": {}, "cells": []}) + "\n").encode())
        with pytest.raises(ConductError, match="speaks side interface 1, this run 2"):
            c.connect()
        conn.close()
    finally:
        c.close()


def test_a_side_that_exits_before_its_ranks_connect_is_named(fake_modules):
    c = conductor_for(fake_modules)
    try:
        for s in c.sides.values():
            s.out.mkdir(parents=True)
            (s.out / "console.log").write_text("bench run: bad flag --x\n")
        c.sides["b"].proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
        c.sides["b"].proc.wait()
        with pytest.raises(ConductError, match="side B: bench run exited 2 .*bad flag --x"):
            c.connect()
    finally:
        c.close()


def test_a_stopped_side_raises_side_aborted_on_its_ranks(fake_modules):
    served: list = []
    c = conductor_for(fake_modules)
    threads = start_fake_sides(c, lambda name: cells2(), served)
    c.connect()
    c.close()  # the run ends before any turn: every rank reads its stop line
    for t in threads:
        t.join(5)
    assert len(served) == 4 and all("stopped by the run" in x[2] or "closed" in x[2]
                                    for x in served)


def test_an_in_process_side_ends_only_after_every_sides_last_cell():
    """bench.run.sglang_worlds: a side done with its own cells waits in end() until every cell of
    every side is served (it writes no rows beside another side's serve), and gives up with
    SideAborted when a side failed."""
    import multiprocessing as mp

    from bench.run import sglang_worlds

    ctx = mp.get_context("spawn")
    t = sglang_worlds.Turns(ctx.Condition(), ctx.Value("q", 0), ctx.Value("q", 0),
                            ctx.Value("b", 0), 1)
    plan = FakePlan(cells2())
    first = sglang_worlds.Side(0, 2, t, 5.0, ("pr27010",))
    ended = threading.Event()
    threading.Thread(target=lambda: (first.end(plan), ended.set()), daemon=True).start()
    for _ in range(2 + len(cells2()) - 1):  # both setups, every cell but the last
        t.release()
    assert not ended.wait(0.3)
    t.release()  # the last cell
    assert ended.wait(5)
    t.aborted.value = 1
    with pytest.raises(sglang_worlds.SideAborted):
        sglang_worlds.Side(1, 2, t, 5.0, ("pr36425",)).end(FakePlan(cells2() * 2))


# ---- which revisions can be sides -------------------------------------------------------


def test_this_tree_speaks_the_interface_and_an_older_one_is_refused(tmp_path):
    assert interface_of(REPO) == turns.INTERFACE
    assert refusal(Revision("HEAD", "f" * 40), REPO) is None
    old = refusal(Revision("old", "0" * 40), tmp_path)
    assert old == "old (0000000000) predates the side interface (bench/run/turns.py)"
    (tmp_path / "bench" / "run").mkdir(parents=True)
    (tmp_path / "bench" / "run" / "turns.py").write_text("INTERFACE = 7\n")
    assert "speaks side interface 7, this tree 2" in refusal(Revision("x", None), tmp_path)


# ---- the interface, pinned ---------------------------------------------------------------

# The flags a side's plan may use (bench/run/turns.py): every revision that speaks
# INTERFACE 2 accepts them, so a run must pass no other to a side.
INTERFACE_FLAGS = {"--preset", "--repeats", "--seed", "--out", "--protocols", "--policies",
                   "--schedule", "--requests", "--bystanders"}


def test_a_served_plan_passes_only_the_interfaces_flags_and_bench_run_takes_them():
    from bench.ab.served import ServedPlan
    from bench.commands.run import parser as run_parser
    from bench.gate.ab import _run_args
    from bench.gate.baseline import DEFAULT_AB

    args = _run_args({**DEFAULT_AB, "requests": 12, "bystanders": 12})
    plan = ServedPlan(Revision("a", None), Revision("b", None), "default", 3, run_args=args)
    flags = {x for x in [*plan.command(3, 0), "--out"] if x.startswith("--")}
    assert flags <= INTERFACE_FLAGS, flags - INTERFACE_FLAGS
    known = {o for a in run_parser()._actions for o in a.option_strings}
    assert INTERFACE_FLAGS <= known


def test_interface_2_says_exactly_this_on_the_wire(monkeypatch):
    """A rank's lines as interface 2 defines them (1's, and the end line a rank waits for
    after its last turn). A change here is a new interface: bump INTERFACE (a baseline of
    the old one is then refused in one line) and this test."""
    assert turns.INTERFACE == 2 and turns.ENV == "HICACHE_BENCH_TURNS"
    monkeypatch.setattr(turns, "modules", lambda: {"hicache": "/t/hicache/__init__.py"})
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    side = turns.SocketSide(f"127.0.0.1:{server.getsockname()[1]}:a", 1, 2,
                            FakePlan([FakeCell(0, 0, "pr27010")]))
    conn, _ = server.accept()
    lines = conn.makefile("r")
    assert json.loads(lines.readline()) == {
        "interface": 2, "side": "a", "rank": 1, "world": 2, "pid": side_pid(),
        "modules": {"hicache": "/t/hicache/__init__.py"}, "cells": ["0/inf/wait_complete/pr27010"]}
    conn.sendall(b'{"go": "setup"}\n{"go": 0}\n')
    with side.setup():
        pass
    with side.serve(FakeCell(0, 0, "pr27010")):
        pass
    assert [json.loads(lines.readline()) for _ in range(2)] == [{"done": "setup"}, {"done": 0}]
    conn.sendall(b'{"go": "end"}\n')
    side.end(FakePlan([FakeCell(0, 0, "pr27010")]))  # returns on the end line, says nothing
    conn.close()
    server.close()


def side_pid() -> int:
    import os

    return os.getpid()


def test_a_stages_run_directories_are_absolute_whatever_the_out(tmp_path, monkeypatch):
    """Each side's `bench run` starts in its own tree: a relative --out (make gate's
    results/latest/ab) must not land there."""
    from bench.ab.served import stage_dirs

    monkeypatch.chdir(tmp_path)
    dirs = stage_dirs(Path("results/latest/ab"), 1)
    assert dirs == {s: tmp_path / "results/latest/ab/stages/01" / s for s in "ab"}
    assert all(d.is_absolute() for d in dirs.values())
