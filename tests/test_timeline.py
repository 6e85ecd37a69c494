"""The timeline: the event log, the clock offsets and waits (synthetic ranks), and a real
small run recorded with --timeline whose Perfetto trace, parsed back with the protobuf
classes, holds exactly the collectives requests.csv counts and every step of steps.csv."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from bench.commands.timeline import main as timeline_main
from bench.timeline.clock import estimate_offsets, waits
from hicache.comm.records import Stats
from hicache.memory.events import COLLECTIVE, SCHEDULER_THREAD, EventLog

RUN = ["--preset", "ci", "--requests", "6", "--bystanders", "2", "--repeats", "1",
       "--protocols", "pre27010,pr27010,pr36425", "--policies", "wait_complete"]
# requests.csv's per-request collective counts, by call site
COUNT_COLUMNS = {"decision": "decision_collectives", "completion": "completion_collectives",
                 "hit_query": "hit_query_collectives", "ack": "ack_collectives",
                 "ticket": "ticket_collectives", "pp_hop": "pp_hops"}


# ---- the event log ----------------------------------------------------------------------------

def test_each_thread_appends_to_its_own_list():
    log = EventLog()
    log.span("step", 1.0, 2.0, 0)

    def worker():
        for i in range(3):
            log.span("read", float(i), i + 0.5, "r", "kv", 4, 4, 64)

    t = threading.Thread(target=worker, name="io")
    t.start()
    t.join()
    dump = log.dump()
    assert dump == {SCHEDULER_THREAD: [["step", 1.0, 2.0, 0]],
                    "io": [["read", float(i), i + 0.5, "r", "kv", 4, 4, 64] for i in range(3)]}


def test_no_timeline_records_nothing():
    stats = Stats()
    assert stats.events is None and stats.counter.events is None and stats.timeline() is None
    stats.counter.record("decision", "tp_cpu", 1, "r0", 0.001, 5.0)  # counted, not recorded
    assert stats.counter.by_rid["r0"]["decision"] == 1
    on = Stats(events=EventLog())
    on.counter.record("decision", "tp_cpu", 1, "r0", 0.001, 5.0)
    assert on.timeline()["threads"][SCHEDULER_THREAD] == [
        [COLLECTIVE, 5.0, 5.001, "all_reduce", "decision", "tp_cpu", "r0", -1]]


# ---- clock offsets and waits on synthetic ranks ----------------------------------------------

def _rank(rank: int, calls: list[tuple[float, float, str]]) -> dict:
    events = [[COLLECTIVE, e, x, op, "per_step_min", "tp_cpu", None, k]
              for k, (e, x, op) in enumerate(calls)]
    return {"rank": rank, "groups": {"tp_cpu": [0, 1]}, "threads": {SCHEDULER_THREAD: events}}


def test_offset_is_bounded_by_shared_all_reduces():
    # Rank 1's clock runs 5 s ahead. Call 1: rank 0 enters at 10.0, rank 1 at 10.2 (true),
    # both leave at 10.3; call 2: rank 1 first (20.0), rank 0 at 20.4, both leave at 20.5.
    true = 5.0
    r0 = _rank(0, [(10.0, 10.3, "all_reduce"), (20.4, 20.5, "all_reduce")])
    r1 = _rank(1, [(10.2 + true, 10.3 + true, "all_reduce"),
                   (20.0 + true, 20.5 + true, "all_reduce")])
    off = estimate_offsets([r0, r1])[1]
    assert off.pairs == 2
    # bounds: e1 - x0 = 15.2 - 10.3 = 4.9 and 25.0 - 20.5 = 4.5 -> lo 4.9;
    # x1 - e0 = 15.3 - 10.0 = 5.3 and 25.5 - 20.4 = 5.1 -> hi 5.1
    assert off.seconds == pytest.approx(5.0) and off.half_width_s == pytest.approx(0.1)
    w = waits([r0, r1], estimate_offsets([r0, r1]))
    e0, e1 = r0["threads"][SCHEDULER_THREAD], r1["threads"][SCHEDULER_THREAD]
    # call 1: rank 0 waited 0.2 s for rank 1; call 2: rank 1 waited 0.4 s for rank 0
    assert w[0][id(e0[0])] == pytest.approx((0.2, 1)) and w[1][id(e1[0])] == (0.0, 1)
    assert w[1][id(e1[1])] == pytest.approx((0.4, 0)) and w[0][id(e0[1])] == (0.0, 0)


def test_a_broadcast_gives_only_an_upper_bound():
    r0 = _rank(0, [(1.0, 1.01, "broadcast")])
    r1 = _rank(1, [(2.5, 3.2, "broadcast")])  # rank 1 is 2 s ahead, left 0.2 s after root
    off = estimate_offsets([r0, r1])[1]
    assert off.seconds == pytest.approx(2.2) and off.half_width_s is None


def test_groups_whose_counts_differ_are_not_paired():
    r0 = _rank(0, [(1.0, 1.1, "all_reduce"), (2.0, 2.1, "all_reduce")])
    r1 = _rank(1, [(1.0, 1.1, "all_reduce")])
    assert estimate_offsets([r0, r1])[1].pairs == 0


# ---- a real run ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_dir(bench_run) -> Path:
    """The session's run with --timeline (conftest.py); these tests write traces into it."""
    return bench_run("timeline", *RUN, "--timeline")


def _trace(path: Path):
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace.FromString(path.read_bytes())
    pid_of, name_of = {}, {}
    for p in trace.packet:
        d = p.track_descriptor
        if p.HasField("track_descriptor") and d.HasField("thread"):
            pid_of[d.uuid], name_of[d.uuid] = d.thread.pid, d.thread.thread_name
    begins, instants = [], []
    depth = Counter()
    for p in trace.packet:
        ev = p.track_event
        if not p.HasField("track_event"):
            continue
        if ev.type == TrackEvent.TYPE_SLICE_BEGIN:
            depth[ev.track_uuid] += 1
            args = {a.name: a.string_value or a.int_value for a in ev.debug_annotations}
            begins.append((pid_of[ev.track_uuid] - 1000, name_of[ev.track_uuid],
                           ev.categories[0], ev.name, args, list(ev.flow_ids)))
        elif ev.type == TrackEvent.TYPE_INSTANT:
            instants.append((pid_of[ev.track_uuid] - 1000, ev.name, list(ev.flow_ids)))
        elif ev.type == TrackEvent.TYPE_SLICE_END:
            depth[ev.track_uuid] -= 1
            assert depth[ev.track_uuid] >= 0, "a slice ended that never began"
    assert not +depth, "a slice never ended"
    return begins, instants


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["pre27010", "pr27010", "pr36425"])
def test_trace_holds_every_counted_collective_and_every_step(run_dir, protocol, capsys):
    cell = f"{protocol}/wait_complete/0"
    out = run_dir / f"{protocol}.pftrace"
    assert timeline_main([str(run_dir), "--cell", cell, "--out", str(out)]) == 0
    assert "ui.perfetto.dev" in capsys.readouterr().out
    begins, instants = _trace(out)
    requests = pd.read_csv(run_dir / "requests.csv")
    requests = requests[requests.protocol == protocol]
    found = Counter((a["rid"], a["site"]) for r, _, kind, _, a, _ in begins
                    if r == 0 and kind == "collective" and a["rid"])
    want = Counter({(row.rid, site): getattr(row, col) for row in requests.itertuples()
                    for site, col in COUNT_COLUMNS.items() if getattr(row, col)})
    assert sum(want.values()) > 0 and found == want
    steps = pd.read_csv(run_dir / "steps.csv")
    steps = steps[steps.protocol == protocol]
    drawn = {a["step"]: a["kind"] for r, thread, kind, _, a, _ in begins
             if r == 0 and kind == "step"}
    assert drawn == dict(zip(steps.step, steps.kind, strict=True))
    polls = sum(1 for r, _, kind, _, _, _ in begins if r == 0 and kind == "poll")
    assert polls == requests.polls.sum()  # one poll slice per poll that found it ongoing
    # Each request's flow on rank 0 runs from its arrival through its load-back to its first
    # token (one id, the same on all three).
    flow = {name.split()[-1]: ids for r, name, ids in instants
            if r == 0 and name.startswith("arrival")}
    tokens = {name.split()[-1]: ids for r, name, ids in instants
              if r == 0 and name.startswith("first token")}
    loads = {a["rid"]: ids for r, _, kind, _, a, ids in begins if r == 0 and kind == "load_back"}
    assert set(flow) == set(tokens) == set(loads) == set(requests.rid)
    assert all(flow[rid] == tokens[rid] == loads[rid] and len(flow[rid]) == 1 for rid in flow)
    assert len({ids[0] for ids in flow.values()}) == len(flow)  # one flow per request


@pytest.mark.slow
def test_a_window_keeps_only_its_steps(run_dir):
    out = run_dir / "window.pftrace"
    assert timeline_main([str(run_dir), "--cell", "pr27010/wait_complete/0", "--steps", "2:5",
                          "--out", str(out)]) == 0
    steps = [a["step"] for r, _, kind, _, a, _ in _trace(out)[0] if kind == "step"]
    assert sorted(steps) == [2, 2, 3, 3, 4, 4]  # both ranks
    assert (run_dir / "timeline.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "message"), [
    (["--cell", "pr27010/timeout/0"], "unknown cell 'pr27010/timeout/0'; recorded:"),
    (["--cell", "pr27010"], "expected protocol/policy/repeat"),
    (["--steps", "0:100000"], "outside the run"),
    (["--steps", "5:5"], "outside the run"),
    (["--steps", "a:b"], "expected A:B"),
])
def test_bad_input_is_one_line_and_exit_2(run_dir, argv, message, capsys):
    assert timeline_main([str(run_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_run_without_a_timeline_is_exit_2(tmp_path, capsys):
    assert timeline_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "recorded no timeline" in err and "--timeline" in err and err.count("\n") == 1


@pytest.mark.slow
def test_without_perfetto_the_png_is_written_and_exit_2(run_dir, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "perfetto.trace_builder.proto_builder", None)
    (run_dir / "timeline.png").unlink(missing_ok=True)
    out = run_dir / "none.pftrace"
    assert timeline_main([str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "perfetto package is not installed" in err and err.count("\n") == 1
    assert (run_dir / "timeline.png").exists() and not out.exists()


@pytest.mark.slow
def test_the_figure_shows_pr27010s_poll_collectives_and_none_in_pr36425(run_dir):
    from bench.timeline import load
    from bench.timeline.outputs import pair_panels

    record = load.load_cell(run_dir, load.find_cell(run_dir, "pr36425/wait_complete/0"))
    before, after = pair_panels(run_dir, record)
    assert (before.protocol, after.protocol) == ("pr27010", "pr36425")
    for rank in (0, 1):
        polls = before.of_kind("poll", rank)
        decisions = [s for s in before.of_kind("collective", rank) if s.name == "decision"]
        assert polls and len(decisions) == len(polls)  # one MAX in every poll
        inside = [s for s in decisions if any(p.start <= s.start <= s.end <= p.end
                                              for p in polls)]
        assert len(inside) == len(decisions)
        assert after.of_kind("poll", rank)
        assert not [s for s in after.of_kind("collective", rank)
                    if s.name in ("decision", "completion")]


@pytest.mark.slow
def test_the_report_shows_the_figure_when_the_run_recorded_a_timeline(run_dir, tmp_path):
    from bench.analysis.report import write_report

    write_report(run_dir)
    assert "## Where a step's time goes" in (run_dir / "report.md").read_text()
    assert (run_dir / "timeline.png").exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("requests.csv", "steps.csv", "ranks.csv", "env.json", "calibration.json"):
        (plain / name).write_bytes((run_dir / name).read_bytes())
    write_report(plain)
    assert "Where a step's time goes" not in (plain / "report.md").read_text()
    assert not (plain / "timeline.png").exists()
