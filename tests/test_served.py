"""Two revisions as sides of one run: the sequential rule (fake samples), the conductor and
the side interface (fake ranks on real sockets, no torch), and the order of turns."""

from __future__ import annotations

import json
import math
import random
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.ab import sequential
from bench.ab.conductor import ConductError, Conductor, SideProc, first_sides, turn_order
from bench.ab.revisions import Revision
from bench.ab.sequential import Budget, more
from bench.ab.served import interface_of, refusal
from bench.run import turns
from bench.stats import ratio_interval
from bench.verdict.thresholds import decide
from bench.verdict.words import FAIL, PASS, UNRESOLVED

REPO = Path(__file__).resolve().parent.parent

# ---- the sequential rule ----------------------------------------------------------------


@pytest.mark.parametrize("low, high, state", [
    (0.98, 1.02, PASS), (0.90, 1.029, PASS), (1.031, 1.10, FAIL),
    (0.99, 1.05, UNRESOLVED), (0.99, 1.03, UNRESOLVED), (1.03, 1.06, UNRESOLVED),
    (None, None, UNRESOLVED), (math.nan, 1.0, UNRESOLVED)])
def test_a_check_passes_below_and_fails_above_one_plus_threshold(low, high, state):
    assert decide(low, high, 0.03) == state


def state(point, half, t=0.03):
    low, high = point / (1 + half), point * (1 + half)
    return (decide(low, high, t), point, low, high, t)


BUDGET = Budget(repeats=60, seconds=300.0, least_more=4)


def test_the_rule_stops_when_every_check_is_decided_or_one_fails():
    assert more([state(1.0, 0.01), state(0.9, 0.05)], 12, 60.0, BUDGET) == 0
    assert more([state(1.10, 0.02), state(1.0, 0.05)], 12, 60.0, BUDGET) == 0  # a FAIL


def test_the_rule_sizes_the_next_stage_by_the_most_undecided_check():
    # point 1.0, half-width 4.5 % over 12 pairs against 3 %: needs 12 * (ln 1.045 / ln 1.03)^2
    add = more([state(1.0, 0.045), state(1.0, 0.01)], 12, 60.0, BUDGET)
    want = sequential.needed(1.0, 1 / 1.045, 1.045, 0.03, 12)
    assert 26.5 < want < 26.7 and add == min(math.ceil(want * 1.2) - 12, 12)
    # fewer than double: the stage the check needs
    assert more([state(1.0, 0.031)], 24, 60.0, BUDGET) == math.ceil(
        sequential.needed(1.0, 1 / 1.031, 1.031, 0.03, 24) * 1.2) - 24 < 24
    # a point at the threshold can never be decided: the smallest stage, within the budget
    assert more([state(1.03, 0.02)], 12, 60.0, BUDGET) == BUDGET.least_more


def test_a_stage_at_most_doubles_the_pairs():
    """A check far from decided at 12 pairs gets 12 more, not the budget: its point read off
    12 pairs is too rough to spend the budget on."""
    for n in (4, 12, 24):
        assert more([state(1.02, 0.03)], n, 5.0 * n, Budget(200, 10_000.0)) == n
    assert more([state(1.02, 0.03)], 2, 10.0, Budget(200, 10_000.0)) == BUDGET.least_more


def test_the_rule_stays_within_its_budget():
    assert more([state(1.0, 0.045)], 60, 100.0, BUDGET) == 0  # no repeats left
    assert more([state(1.0, 0.045)], 12, 300.0, BUDGET) == 0  # no seconds left
    # 5 s a repeat so far and 30 s left: 6 repeats at most
    assert more([state(1.0, 0.045)], 12, 270.0, Budget(60, 300.0)) <= 6


@dataclass
class FakeStage:
    repeats: int
    seed: int
    ok: bool = True


def sequential_gate(effect: float, sd: float, seed: int, t: float = 0.03,
                    first: int = 12) -> tuple[str, int]:
    """The one stage loop (sequential.staged) driven by fake paired repeats (log-normal B/A
    about `effect`, each stage's drawn from its own seed); the budget's seconds never bind."""
    a, b = {}, {}

    def serve(index, repeats, stage_seed):
        rng = random.Random(f"{seed}:{stage_seed}")
        for r in range(len(a), len(a) + repeats):
            a[r] = 10.0 * math.exp(rng.gauss(0, 0.05))
            b[r] = a[r] * effect * math.exp(rng.gauss(0, sd))
        return FakeStage(repeats, stage_seed)

    def judge(stages):
        iv = ratio_interval(b, a)
        s = (decide(iv.low, iv.high, t), iv.point, iv.low, iv.high, t)
        return [s], s[0]

    stages, verdict = sequential.staged(first, 0, serve, judge, BUDGET, None, print, "fake")
    return verdict, sum(s.repeats for s in stages)


def test_one_stage_loop_seeds_each_stage_and_stops_where_the_rule_says():
    """sequential.staged, the loop of `bench ab`, the gate and `bench review`: stage k on
    seed + k, the first stage always, one stage without a budget, a failed stage ends the run
    keeping the last judged result, and each added stage is announced with its seed."""
    undecided = [state(1.0, 0.045)]  # wants more pairs
    said = []

    def serve(index, repeats, seed):
        return FakeStage(repeats, seed, ok=index < 2)

    def judge(stages):
        return None if not stages[-1].ok else (undecided, len(stages))

    stages, last = sequential.staged(12, 5, serve, judge, Budget(200, 1e6), None, said.append,
                                     "fake")
    assert [(s.seed, s.repeats) for s in stages] == [(5, 12), (6, 12), (7, 24)]
    assert last == 2  # the third stage failed: the second's result stands
    assert said == ["fake: 1 gated check(s) undecided after 12 paired repeats: a stage of 12 "
                    "more (seed 6)", "fake: 1 gated check(s) undecided after 24 paired "
                    "repeats: a stage of 24 more (seed 7)"]
    stages, last = sequential.staged(12, 5, serve, judge, None, None, said.append, "fake")
    assert len(stages) == 1 and last == 1  # no budget: one stage
    decided = sequential.staged(12, 0, serve, lambda st: ([state(1.0, 0.01)], "PASS"),
                                Budget(200, 1e6), None, said.append, "fake")
    assert len(decided[0]) == 1 and decided[1] == "PASS" and len(said) == 2


def test_on_fake_samples_same_code_passes_and_a_regression_fails():
    """Paired noise of 4 % a repeat: no change ends PASS, 10 % slower ends FAIL, and a
    change exactly at the threshold never reads PASS (nor, mostly, FAIL)."""
    assert all(sequential_gate(1.0, 0.04, s)[0] == PASS for s in range(20))
    assert all(sequential_gate(1.10, 0.04, s)[0] == FAIL for s in range(20))
    at = [sequential_gate(1.03, 0.04, s) for s in range(20)]
    assert sum(x[0] == PASS for x in at) <= 2 and all(x[1] <= BUDGET.repeats for x in at)


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
