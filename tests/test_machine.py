"""A disturbed serve (bench.run.machine): the machine's CPU account, not a step time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.run import machine
from bench.run.machine import CpuTimes
from bench.verdict.run_rules import THREAD_SLACK, disturbed_notes, thread_growth_notes

REPO = Path(__file__).resolve().parent.parent


def test_reads_this_linux_machines_account():
    now = machine.read()
    assert now is not None and now.busy_s > 0 and now.steal_s >= 0


def test_steal_and_other_processes_count_against_the_cores_time(monkeypatch):
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 2)
    quiet = machine.interference(CpuTimes(10.0, 1.0), CpuTimes(15.9, 1.0), 5.8, 3.0)
    assert quiet == {"steal_s": 0.0, "other_cpu_s": 0.1, "lost": round(0.1 / 6, 4)}
    assert machine.disturbed(quiet) is None  # 1.7% of 2 cores x 3 s
    stolen = machine.interference(CpuTimes(10.0, 1.0), CpuTimes(15.8, 1.4), 5.8, 3.0)
    assert stolen["steal_s"] == 0.4 and stolen["other_cpu_s"] == 0.0
    assert "steal 0.40 s" in machine.disturbed(stolen)  # 6.7% > 5%
    busy = machine.interference(CpuTimes(10.0, 1.0), CpuTimes(17.0, 1.0), 5.8, 3.0)
    assert "other processes 1.20 s: 20%" in machine.disturbed(busy)
    # the ranks' own CPU never counts, more of it than the machine saw is no negative load
    assert machine.interference(CpuTimes(10, 1), CpuTimes(12, 1), 5.0, 3.0)["lost"] == 0
    assert machine.interference(None, CpuTimes(1, 1), 1.0, 3.0)["lost"] is None
    assert machine.disturbed({"lost": None}) is None


def _ranks(attempts, lost):
    return pd.DataFrame([{"rank": r, "attempts": a, "cpu_lost": x}
                         for a, x in zip(attempts, lost, strict=True) for r in (0, 1)])


def test_the_verdict_says_how_many_serves_were_served_again_or_stayed_disturbed():
    assert disturbed_notes(_ranks([1, 1], [0.01, 0.02])) == []
    (again,) = disturbed_notes(_ranks([1, 3, 2], [0.01, 0.02, 0.0]))
    assert again.startswith("2 serve(s) were served again (3 extra serves)")
    notes = disturbed_notes(_ranks([3, 1], [0.2, 0.01]))
    assert len(notes) == 2 and notes[1].startswith("1 serve(s) kept were disturbed")
    assert disturbed_notes(None) == [] and disturbed_notes(pd.DataFrame({"rank": [0]})) == []


def test_threads_counts_this_processs_threads():
    # in a fresh interpreter: no thread of another test starts or ends between the counts
    code = ("import threading; from bench.run import machine; before = machine.threads(); "
            "gate = threading.Event(); t = threading.Thread(target=gate.wait); t.start(); "
            "print(before, machine.threads()); gate.set(); t.join()")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    before, during = map(int, done.stdout.split())
    assert before >= 1 and during == before + 1


def _threads(counts: dict) -> pd.DataFrame:
    return pd.DataFrame([{"protocol": p, "rank": r, "repeat": i, "threads": n}
                         for (p, r), ns in counts.items() for i, n in enumerate(ns)])


def test_the_verdict_names_a_rank_process_whose_threads_grew_over_the_repeats():
    steady = {("a", 0): [42, 42, 42], ("a", 1): [41, 41, 41]}
    assert thread_growth_notes(_threads(steady)) == []
    assert thread_growth_notes(_threads({("a", 0): [42, 42 + THREAD_SLACK]})) == []
    # the sides of a run are processes of their own: side b's rank 1 grew, a's did not
    grown = {**steady, ("b", 0): [42, 54, 66], ("b", 1): [41, 53, 65]}
    (note,) = thread_growth_notes(_threads(grown))
    assert note.startswith("rank 0 of b held 42 threads before its first repeat and 66 "
                           "before its last (and 1 more rank process(es))"), note
    assert thread_growth_notes(None) == [] and \
        thread_growth_notes(pd.DataFrame({"rank": [0]})) == []
    unknown = _threads(steady).assign(threads=None)  # not Linux: no count, no note
    assert thread_growth_notes(unknown) == []


@pytest.mark.long  # make test-long: a run beside CPU burners
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_pinned_run_serves_a_disturbed_cell_again_and_keeps_one_schedule(tmp_path):
    """Two CPU burners beside a pinned run: every serve loses far more than 5% of the cores'
    time, so each is served again once (--redo-disturbed 1), every rank agrees to, the
    schedule is the same (the digests are judged), and the verdict stays OK and says so."""
    burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        out = tmp_path / "run"
        done = subprocess.run([sys.executable, "-m", "bench", "run", "--preset", "ci",
                               "--requests", "4", "--bystanders", "0", "--repeats", "2",
                               "--repeat-seeds", "same", "--protocols", "pr27010,pr36425",
                               "--policies", "wait_complete", "--redo-disturbed", "1",
                               "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                              timeout=240, env={**os.environ, "BENCH_NO_PLOTS": "1"})
    finally:
        for p in burn:
            p.kill()
            p.wait()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.count("), again ...") == 4  # 4 cells, each served again once
    ranks = pd.read_csv(out / "ranks.csv")
    assert set(ranks["attempts"]) == {2} and (ranks["cpu_lost"] > 0.05).all()
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["ok"] and any("served again (4 extra serves)" in n for n in verdict["notes"])
    requests = pd.read_csv(out / "requests.csv")
    assert requests["schedule_digest"].nunique() == 1  # one seed, one schedule, 4 serves


def test_redo_disturbed_comes_from_the_flag_the_env_or_the_preset(monkeypatch, capsys):
    from bench.commands.run import build_plan, parser
    from bench.commands.run import main as main_run

    def redo(*argv):
        return build_plan(parser().parse_args(list(argv))).redo_disturbed

    monkeypatch.delenv("BENCH_REDO_DISTURBED", raising=False)
    assert redo("--preset", "cost") == redo("--preset", "queue") == 1
    assert redo() is None  # make bench is free-running: a serve is never served again
    assert redo("--preset", "ci") is None and redo("--preset", "cost", "--redo-disturbed",
                                                   "0") is None
    monkeypatch.setenv("BENCH_REDO_DISTURBED", "0")  # bench ab's block runs, both sides
    assert redo("--preset", "cost") is None
    assert redo("--preset", "cost", "--redo-disturbed", "2") == 2
    assert main_run(["--preset", "sweep", "--redo-disturbed", "1"]) == 2  # free: refused
    assert "--redo-disturbed needs a pinned schedule" in capsys.readouterr().err
