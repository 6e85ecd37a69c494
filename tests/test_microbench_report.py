"""microbench.md from a small hand-made pytest-benchmark JSON: per-policy tables, ratios vs
pr27010 computed by hand, the headline, and the gate's information line."""

import json

import pytest

from bench.commands.microbench import main as main_microbench
from bench.microbench import (
    build_markdown,
    gate_note,
    headline,
    load,
    poll_ratios,
)
from bench.rundir.files import ResultFileError

# Median seconds per poll: timeout costs a collective in both; wait_complete only in pr27010.
MEDIANS = {("pr27010", "wait_complete"): 400e-6, ("pr36425", "wait_complete"): 10e-6,
           ("pr27010", "timeout"): 500e-6, ("pr36425", "timeout"): 450e-6,
           ("step-clock", "timeout"): 20e-6}


def bench(kind, median, **info):
    stats = {"median": median, "q1": median * 0.9, "q3": median * 1.2, "rounds": 300}
    return {"name": f"test_{kind}", "stats": stats, "extra_info": {"kind": kind, **info}}


def poll(protocol, policy, median, agree=True):
    coll = 1.0 if protocol == "pr27010" or (protocol, policy) == ("pr36425", "timeout") else 0.0
    return bench("poll", median, protocol=protocol, policy=policy, polls=330,
                 decision_collectives_per_poll=coll, completion_collectives_per_poll=0.0,
                 ranks_agree=agree)


def data(agree=True):
    benches = [poll(pro, pol, m) for (pro, pol), m in MEDIANS.items()]
    benches[-1] = poll("step-clock", "timeout", MEDIANS[("step-clock", "timeout")], agree)
    benches.append(bench("hash_chain", 115e-6, pages=64))
    return {"version": "5.3.1", "datetime": "2026-01-01T00:00:00",
            "commit_info": {"id": "a" * 40, "dirty": False},
            "machine_info": {"node": "ci", "python_version": "3.11"}, "benchmarks": benches}


def test_ratios_by_hand():
    r = poll_ratios(data())
    assert r["wait_complete"] == pytest.approx({"pr27010": 1.0, "pr36425": 0.025})
    assert r["timeout"] == pytest.approx({"pr27010": 1.0, "pr36425": 0.9, "step-clock": 0.04})
    assert headline(data()) == "wait_complete 0.025x, timeout 0.900x"


def test_markdown_tables():
    md = build_markdown(data())
    lines = md.splitlines()
    assert "**Headline, per-poll cost pr36425 / pr27010:** wait_complete 0.025x, timeout " \
           "0.900x" in md
    i = lines.index("### policy timeout")
    assert lines[i + 2].split(" | ")[0] == "| protocol"
    assert lines[i + 2].endswith("ratio_vs_pr27010 |")
    rows = {ln.split(" | ")[0][2:]: ln for ln in lines[i + 4: i + 7]}
    assert rows["pr27010"] == "| pr27010 | 500.0 | 450.0 | 600.0 | 300 | 1.0 | 0.0 | True | 1.000 |"
    assert rows["pr36425"].endswith("| 450.0 | 405.0 | 540.0 | 300 | 1.0 | 0.0 | True | 0.900 |")
    assert rows["step-clock"].endswith("| 0.040 |")
    assert "| hash_chain | 115.00 | 103.50 | 138.00 | 300 | pages=64 |" in md
    assert lines[-1] == "OK: 6 benchmarks"


def test_markdown_flags_disagreeing_ranks():
    assert build_markdown(data(agree=False)).splitlines()[-1].startswith("FAILED")


def test_no_run_rebuilds_markdown_and_gate_note(tmp_path, capsys):
    (tmp_path / "microbench.json").write_text(json.dumps(data()))
    assert main_microbench([str(tmp_path), "--no-run"]) == 0
    assert (tmp_path / "microbench.md").read_text() == build_markdown(data())
    assert gate_note(tmp_path).endswith("pr36425/pr27010 wait_complete 0.025x, timeout 0.900x")
    assert gate_note(tmp_path / "missing") == ""


def test_bad_json_is_bad_input(tmp_path, capsys):
    (tmp_path / "microbench.json").write_text('{"benchmarks": [{"name": "x"}]}')
    with pytest.raises(ResultFileError):
        load(tmp_path / "microbench.json")
    assert main_microbench([str(tmp_path), "--no-run"]) == 2
    assert main_microbench([str(tmp_path / "nope"), "--no-run"]) == 2
    assert "not gated" in gate_note(tmp_path)
