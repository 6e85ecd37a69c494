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


def sequential_gate(effect: float, sd: float, seed: int, t: float = 0.03,
                    first: int = 12) -> tuple[str, int]:
    """The rule driven by fake paired repeats (log-normal B/A about `effect`); 5 s a repeat."""
    rng = random.Random(seed)
    a, b, n = {}, {}, 0
    add = first
    while add:
        for r in range(n, n + add):
            a[r] = 10.0 * math.exp(rng.gauss(0, 0.05))
            b[r] = a[r] * effect * math.exp(rng.gauss(0, sd))
        n += add
        iv = ratio_interval(b, a)
        s = (decide(iv.low, iv.high, t), iv.point, iv.low, iv.high, t)
        add = more([s], n, 5.0 * n, BUDGET)
    return s[0], n


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


# ---- the power script's plant ----------------------------------------------------------


def test_the_power_scripts_plant_spins_a_share_of_each_step():
    """scripts/gate_power.py plants its regression into the scheduler's step as it is now:
    the anchors are found, the result compiles, and the spin is sized by the share."""
    sys.path.insert(0, str(REPO / "scripts"))
    import gate_power

    text = (REPO / "hicache" / "serve" / "scheduler.py").read_text()
    planted = gate_power.planted(text, 0.05)
    compile(planted, "scheduler.py", "exec")
    assert planted.count("_planted_t0 = time.perf_counter()") == 1
    assert "0.05 * (time.perf_counter() - _planted_t0)" in planted



def test_the_power_scripts_gates_interleave_and_a_resume_goes_on_to_the_counts(tmp_path):
    """One gate of each kind a round, in the order asked, until each kind has its count, the
    gates already run counted; --resume of a folder that is no study is refused in one line,
    the folder untouched."""
    sys.path.insert(0, str(REPO / "scripts"))
    import gate_power

    kinds = [("A/A quiet", 3), ("plant 5%", 2), ("plant 10%", 1), ("A/A neighbour", 0)]
    assert gate_power.interleaved(kinds, {}) == [
        "A/A quiet", "plant 5%", "plant 10%", "A/A quiet", "plant 5%", "A/A quiet"]
    assert gate_power.interleaved(kinds, {"A/A quiet": 2, "plant 5%": 5}) == [
        "A/A quiet", "plant 10%"]
    assert gate_power.interleaved(kinds, {"A/A quiet": 3, "plant 5%": 2,
                                          "plant 10%": 1}) == []
    (tmp_path / "x").write_text("kept")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gate_power.py"),
                           "--resume", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "not a study to go on with" in done.stderr
    assert [f.name for f in tmp_path.iterdir()] == ["x"]
    gate = {"label": "plant 5%", "exit": 1, "repeats": 12, "seconds": 121.4, "load_1m": 2.0,
            "intervals": {"pr27010 step_mean_ms": "1.054 [1.026, 1.083], n=12",
                          "pr27010 itl_p50_ms": "1.1 [1.0, 1.2], n=12"}}
    assert gate_power.gate_rows([gate])[-1] == (
        "| 0 | plant 5% | 1 | 12 | 121 | - | 1.054 [1.026, 1.083] |")
    stage = tmp_path / "g" / "ab" / "stages" / "00"
    for side, lost in (("a", [0.01, 0.02]), ("b", [0.03, 0.5])):
        (stage / side).mkdir(parents=True)
        (stage / side / "ranks.csv").write_text("rank,cpu_lost\n" + "".join(
            f"{i},{x}\n" for i, x in enumerate(lost)))
    assert gate_power.cpu_lost(str(tmp_path / "g")) == "2.5% / 35.9%"

def test_the_spread_behind_an_interval_is_read_back_exactly():
    """sequential.spread inverts the served A/B's t interval over paired log ratios."""
    pytest.importorskip("scipy")
    from scipy import stats

    for sd, n in ((0.043, 12), (0.02, 39)):
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        assert sequential.spread(math.exp(-half), math.exp(half), n) == pytest.approx(sd)


def test_the_chance_left_unresolved_matches_simulated_gates():
    """left_unresolved against 4,000 simulated stops at n pairs (a fixed seed: the same
    draws every run), with no lean and with a lean towards the threshold; more pairs leave
    less undecided, and a check far from its threshold is never left."""
    pytest.importorskip("scipy")
    import numpy as np
    from scipy import stats

    rng = np.random.default_rng(60)
    edge = math.log(1.03)
    for n, lean in ((24, 0.0), (24, 0.01), (42, 0.01)):
        x = rng.normal(math.log(1 + lean), 0.043, size=(4000, n))
        half = stats.t.ppf(0.975, n - 1) * x.std(axis=1, ddof=1) / math.sqrt(n)
        simulated = float(np.mean(np.abs(x.mean(axis=1) - edge) < half))
        model = sequential.left_unresolved(0.043, 0.03, n, lean)
        assert model == pytest.approx(simulated, abs=0.015), (n, lean)
    assert (sequential.left_unresolved(0.043, 0.03, 48)
            < sequential.left_unresolved(0.043, 0.03, 24))
    assert sequential.left_unresolved(0.01, 0.10, 24) < 1e-12


def test_the_power_scripts_budget_rows_size_the_budget_from_the_quiet_aas():
    """budget_rows reads only the quiet A/As' intervals; a row per check with its spread and
    lean, and a last row (any check) at least each check's chance; [] with no quiet A/A."""
    pytest.importorskip("scipy")
    sys.path.insert(0, str(REPO / "scripts"))
    import gate_power

    def gate(label, step, ttft):
        return {"label": label, "intervals": {"p step_mean_ms": step,
                                              "p prefetch_ttft_p50_ms": ttft}}
    results = [gate("A/A quiet", "1.010 [0.996, 1.024], n=24", "1.00 [0.97, 1.03], n=24"),
               gate("A/A quiet", "0.998 [0.985, 1.011], n=36", "1.01 [0.98, 1.04], n=36"),
               gate("plant 5%", "1.050 [1.020, 1.080], n=12", "1.05 [1.0, 1.1], n=12")]
    rows = gate_power.budget_rows(results, {"step_mean": 0.03, "prefetch_ttft_p50": 0.05},
                                  budgets=(24, 48))
    assert len(rows) == 2 + 2 + 1
    step = rows[3].split(" | ")
    assert step[0] == "| p step_mean_ms" and step[1] == "3%" and step[3].startswith("+0.40% [")
    cells = [[float(c.strip(" |%")) for c in row.split(" | ")[-2:][0].split(" / ")]
             for row in rows[2:]]
    assert cells[-1][0] >= max(c[0] for c in cells[:-1])
    assert gate_power.budget_rows(results[2:], {}) == []


def test_the_power_scripts_tables_join_studies_and_refuse_differing_thresholds(tmp_path):
    """--tables prints one set of tables over several studies' gates and writes nothing;
    studies whose thresholds differ are refused in one line (exit 2)."""
    gate = {"label": "A/A quiet", "exit": 0, "repeats": 24, "seconds": 250.0, "states": {},
            "intervals": {"p step_mean_ms": "1.004 [0.990, 1.018], n=24"}}
    for name, step in (("one", 0.03), ("two", 0.03), ("odd", 0.05)):
        (tmp_path / name / "baseline").mkdir(parents=True)
        (tmp_path / name / "gate_power.json").write_text(json.dumps({"results": [gate]}))
        (tmp_path / name / "baseline" / "gate.json").write_text(
            json.dumps({"thresholds": {"step_mean": step}}))
    script = [sys.executable, str(REPO / "scripts" / "gate_power.py"), "--tables"]
    done = subprocess.run(script + [str(tmp_path / "one"), str(tmp_path / "two")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "| A/A quiet | 2 | 0 | 0 | 2 | 24 | 250 |" in done.stdout
    assert "| p step_mean_ms | 3% |" in done.stdout
    done = subprocess.run(script + [str(tmp_path / "one"), str(tmp_path / "odd")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "thresholds differ" in done.stderr
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["baseline",
                                                                    "gate_power.json"]


def fake_gate(root: Path, ratio: dict[str, float]) -> Path:
    """A gate's folder as `bench gate --ab` leaves it: one stage, each side's steps.csv and
    ranks.csv; B's step is A's times `ratio[protocol]` (alternately 0.1 % over and under);
    A serves first but for the second protocol of odd repeats."""
    stage = {"index": 0, "dirs": {s: str(root / "ab" / "stages" / "00" / s) for s in "ab"}}
    (root / "ab").mkdir(parents=True)
    (root / "ab" / "ab.json").write_text(json.dumps({"stages": [stage]}))
    for k, side in enumerate("ab"):
        out = Path(stage["dirs"][side])
        out.mkdir(parents=True)
        steps, ranks = ["protocol,repeat,t_s,step_ms"], ["protocol,repeat,other_cpu_s,wall_s"]
        for r in range(6):
            for j, protocol in enumerate(ratio):
                ms = 10.0 * (ratio[protocol] * (1 + (-1) ** r / 1000) if side == "b" else 1)
                t = 100 * r + 10 * j + (1 - k if j == 1 and r % 2 else k)  # B first there
                steps += [f"{protocol},{r},{t},{ms}", f"{protocol},{r},{t + 1},{ms}"]
                ranks.append(f"{protocol},{r},{0.01 * (r + k)},2.0")
        (out / "steps.csv").write_text("\n".join(steps) + "\n")
        (out / "ranks.csv").write_text("\n".join(ranks) + "\n")
    return root


def test_the_lean_script_reads_a_studys_pairs_and_refuses_what_is_no_study(tmp_path):
    """scripts/gate_lean.py: each protocol's lean over the quiet A/As' pairs, the serve order
    read from the serves' clocks (where B goes first it follows its own serve, and A's next
    serve follows A's);
    a folder that is no study is refused in one line (exit 2)."""
    pytest.importorskip("scipy")
    sys.path.insert(0, str(REPO / "scripts"))
    import gate_lean

    gate = fake_gate(tmp_path / "g", {"p1": 1.01, "p2": 1.0})
    (tmp_path / "gate_power.json").write_text(json.dumps(
        {"results": [{"label": "A/A quiet", "dir": str(gate)}]}))
    pairs = gate_lean.gates([tmp_path])
    assert len(pairs) == 12 and pairs["b_first"].sum() == 3
    assert pairs.groupby("protocol")["follows"].apply(list).to_dict() == {
        "p1": [0, 0, -1, 0, -1, 0], "p2": [0, 1, 0, 1, 0, 1]}
    rows = gate_lean.report(pairs)
    assert rows[2].startswith("| p1 | 6 | +1.00% [") and rows[3].startswith("| p2 | 6 | -0.00% [")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gate_lean.py"),
                           str(tmp_path / "g")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


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
