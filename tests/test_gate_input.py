"""The CI gate's refusals on the synthetic run of tests/test_gate.py: a malformed baseline,
run directory or argument exits 2 with one line, and a baseline made for another plan
(preset, repeats, workload, trace, sweep) is refused."""

import json
import shutil

import pandas as pd
import pytest

from bench.commands.gate import main as main_gate
from bench.rundir.files import write_json_atomic
from bench.rundir.schema import SUMMARY_COLUMNS
from tests.test_gate import gate, gated_run


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return gated_run(tmp_path_factory.mktemp("gate"))


def break_columns(base):
    pd.read_csv(base / "summary.csv").drop(columns=["decision_collectives_per_poll"]).to_csv(
        base / "summary.csv", index=False)


def break_numbers(base):
    frame = pd.read_csv(base / "summary.csv")
    frame["ttft_p50_ratio_vs_pr27010"] = frame["ttft_p50_ratio_vs_pr27010"].astype(object)
    frame.loc[0, "ttft_p50_ratio_vs_pr27010"] = "fast"
    frame.to_csv(base / "summary.csv", index=False)


def break_empty(base):
    (base / "summary.csv").write_text("")


def break_header_only(base):
    (base / "summary.csv").write_text(",".join(SUMMARY_COLUMNS) + "\n")


def break_gate_json(base):
    (base / "gate.json").write_text('{"thresholds": {"step_mean": "lots"}}')


def break_missing(base):
    shutil.rmtree(base)


@pytest.mark.parametrize("damage", [break_columns, break_numbers, break_empty,
                                    break_header_only, break_gate_json, break_missing])
def test_malformed_baseline_exits_2(clean, tmp_path, capsys, damage):
    baseline = tmp_path / "baseline"
    shutil.copytree(clean[1], baseline)
    damage(baseline)
    assert gate(clean[0], baseline) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench gate: ")
    assert "Traceback" not in err


def test_bad_run_dir_exits_2(clean, tmp_path, capsys):
    assert gate(tmp_path / "nope", clean[1]) == 2
    run = tmp_path / "run"
    shutil.copytree(clean[0], run)
    pd.read_csv(run / "requests.csv").drop(columns=["polls"]).to_csv(run / "requests.csv",
                                                                    index=False)
    assert gate(run, clean[1]) == 2
    (run / "requests.csv").write_text("")
    assert gate(run, clean[1]) == 2
    shutil.copy(clean[0] / "requests.csv", run / "requests.csv")
    frame = pd.read_csv(run / "requests.csv")
    frame["polls"] = frame["polls"].astype(object)
    frame.loc[3, "polls"] = "many"
    frame.to_csv(run / "requests.csv", index=False)
    assert gate(run, clean[1]) == 2
    frame.loc[3, "polls"] = None
    frame.to_csv(run / "requests.csv", index=False)
    assert gate(run, clean[1]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 5 and all(line.startswith("bench gate: ") for line in err)
    assert "non-numeric values in column polls" in err[3] and "empty cells" in err[4]


def test_bad_arguments_exit_2(clean, capsys):
    assert main_gate([]) == 2
    assert gate(*clean, "--tolerance", "-1") == 2
    assert gate(*clean, "--tolerance", "abc") == 2
    assert len(capsys.readouterr().err.splitlines()) == 3


def test_malformed_run_summary_exits_2(clean, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(clean[0], run)
    summary = pd.read_csv(run / "summary.csv")
    summary.loc[0, "data_errors"] = None
    summary.to_csv(run / "summary.csv", index=False)
    assert gate(run, clean[1]) == 2
    assert "empty cells in column data_errors" in capsys.readouterr().err


def _with_plan(run, **plan):
    env = json.loads((run / "env.json").read_text())
    write_json_atomic(run / "env.json", {**env, "plan": {"preset": "ci", "repeats": 3,
                                                         "workload": {"requests": 24},
                                                         **plan}})


def test_a_run_of_another_plan_is_refused(clean, tmp_path, capsys):
    """A run gated against a baseline made for another plan (preset, repeats, workload) is
    refused with one line naming what differs, exit 2; the same plan is gated."""
    run, baseline = tmp_path / "run", tmp_path / "baseline"
    shutil.copytree(clean[0], run)
    shutil.copytree(clean[1], baseline)
    _with_plan(baseline)
    _with_plan(run, preset="default", repeats=1, workload={"requests": 40})
    capsys.readouterr()
    assert gate(run, baseline) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bench gate: refused: ")
    assert "preset default vs ci" in err and "repeats 1 vs 3" in err
    assert "workload.requests 40 vs 24" in err
    _with_plan(run)
    assert gate(run, baseline) == 0


def test_ab_without_a_usable_revision_exits_2(clean, tmp_path, capsys):
    # The synthetic baseline's revision (forty zeros) is no commit of this repository.
    assert gate(*clean, "--ab") == 2
    err = capsys.readouterr().err
    assert err.startswith("bench gate: the baseline revision is not usable here") \
        and err.count("\n") == 1
    baseline = tmp_path / "baseline"
    shutil.copytree(clean[1], baseline)
    write_json_atomic(baseline / "gate.json", {"thresholds": {}})
    assert gate(clean[0], baseline, "--ab") == 2
    assert "gate.json has no ab settings" in capsys.readouterr().err


def test_a_setting_off_and_a_setting_not_yet_recorded_are_one_plan():
    from bench.run.plan import plan_differences

    old = {"preset": "ci", "repeats": 1}  # written before `trace` existed
    new = {"preset": "ci", "repeats": 1, "trace": None, "out_dir": "x"}
    assert plan_differences(old, new, "vs") == []
    assert plan_differences(old, {**new, "trace": {"file": "t.jsonl"}}, "vs") == [
        "trace.file (unset) vs t.jsonl"]
    # a run with no cost sweep and no SGLang sides against a baseline from before either
    # existed (make gate's own case): one plan; a sweep or sides set is not
    assert plan_differences(old, {**new, "delays_ms": [], "sides": []}, "vs") == []
    assert plan_differences(old, {**new, "delays_ms": [0.0, 1.0]}, "vs") == [
        "delays_ms (unset) vs [0.0, 1.0]"]
