"""Rank 0's result sink: every rank's host-slot self-check lands in ranks.csv, and a rank
with host slots neither in the tree nor free fails the run, named (like data errors), in
the one verdict that verdict.json, report.md and the console line share."""

from __future__ import annotations

import csv

from bench.commands.report import main as main_report
from bench.run.plan import RunPlan
from bench.run.sink import ResultSink
from bench.rundir.schema import RANK_COLUMNS
from bench.verdict import run_rules as verdict
from hicache.comm.records import RequestStats, Stats


def _payload(rank: int, unaccounted: int) -> dict:
    stats = Stats()  # the rows a rank really sends (Stats.request_rows)
    stats.requests["r000"] = RequestStats("r000", 0.0, enqueued=0.0, ready=0.001,
                                          scheduled=0.002, first_token=0.01,
                                          token_times=[0.01], finished=0.01)
    return {"rank": rank, "tp_rank": rank, "pp_rank": 0, "requests": stats.request_rows(),
            "steps": [], "decisions": {"r000": ("none", 0, None)}, "by_site": {},
            "crosscheck": {}, "host_slots_unaccounted": unaccounted, "cpu_s": 0.0,
            "wall_s": 1.0}


def _sink(tmp_path, unaccounted: list[int]) -> ResultSink:
    plan = RunPlan(protocols=("pr36425",), policies=("timeout",), repeats=1,
                   out_dir=str(tmp_path))
    sink = ResultSink(plan)
    sink.add(plan.cells()[0], [_payload(r, n) for r, n in enumerate(unaccounted)])
    return sink


def test_host_slot_self_check_is_a_ranks_column(tmp_path):
    assert "host_slots_unaccounted" in RANK_COLUMNS
    _sink(tmp_path, [0, 3])
    with (tmp_path / "ranks.csv").open() as f:
        assert [r["host_slots_unaccounted"] for r in csv.DictReader(f)] == ["0", "3"]


def test_unaccounted_host_slots_fail_the_run_naming_the_rank(tmp_path, capsys):
    _sink(tmp_path, [0, 3]).finish()
    assert main_report([str(tmp_path)]) == 0  # `bench report` rebuilt it from the CSVs
    line = verdict.read(tmp_path).line
    assert line.startswith("FAILED: ") and "rank 1: 3 host slot(s)" in line, line
    assert "pr36425/timeout repeat 0" in line
    report = (tmp_path / "report.md").read_text()
    assert line in report and "OK: every rank agreed" not in report
    assert line in capsys.readouterr().out
    (tmp_path / "ok").mkdir()
    _sink(tmp_path / "ok", [0, 0]).finish()
    assert main_report([str(tmp_path / "ok")]) == 0
    assert verdict.read(tmp_path / "ok").line == "OK"
    assert "OK: every rank agreed" in (tmp_path / "ok" / "report.md").read_text()
