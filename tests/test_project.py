"""bench project: projected cells against hand-computed numbers, measured points carried into
the CSV and the plot, the CLI's files and exit codes, on synthetic run directories."""

import csv
import subprocess
import sys

import pytest

from bench.commands.project import main as main_project
from bench.project.grid import (
    PPS,
    QS,
    TPS,
    Assumptions,
    cost_classes,
    grid_rows,
    measured_rows,
    model_row,
)
from bench.rundir.env import collect_env
from bench.rundir.files import write_csv_atomic, write_json_atomic
from hicache.spec.cost_model import POLICIES, PROTOCOLS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY = ["protocol", "policy", "tp", "pp", "polls_per_step", "decode_step_p50_ms",
           "step_mean_ms", "predicted_extra_step_ms", "measured_extra_step_ms",
           "measured_extra_step_ci_low_ms", "measured_extra_step_ci_high_ms"]


def assume(c_ms=0.3, tp0=2, hop=0.15, scaling="ring", base=21.0):
    return Assumptions(c_ms, tp0, hop, scaling, base, "c", "hop", "base")


def point(protocol, policy, polls, step, measured=None, ci=(None, None), tp=2, pp=1):
    """A summary row; `ci`: the measured extra step time's interval (low, high)."""
    low, high = ci
    return dict(protocol=protocol, policy=policy, tp=tp, pp=pp, polls_per_step=polls,
                decode_step_p50_ms=step, step_mean_ms=step, predicted_extra_step_ms=None,
                measured_extra_step_ms=measured, measured_extra_step_ci_low_ms=low,
                measured_extra_step_ci_high_ms=high)


def calibration(tp=2, mean=0.3, hop=None):
    samples = [mean - 0.1, mean, mean + 0.1] if tp > 1 else []
    stats = dict(p50_ms=mean, p90_ms=mean, p99_ms=mean + 0.1, mean_ms=mean,
                 mean_ci_low_ms=mean - 0.05, mean_ci_high_ms=mean + 0.06)
    return {"tp": tp, "pp": 1, "group": "tp_cpu", "method": "test", "n": len(samples),
            "allreduce_ms": samples, "allreduce": stats if tp > 1 else {k: 0.0 for k in stats},
            "pp_hop_ms": hop, "per_rank_p50_ms": [mean] * tp}


def make_run(run_dir, calib=None, summary=True):
    run_dir.mkdir(parents=True)
    write_json_atomic(run_dir / "calibration.json", calib or calibration())
    write_json_atomic(run_dir / "env.json", collect_env("gloo", {"world_size": 2, "tp": 2,
                                                                 "pp": 1}))
    if summary:
        rows = [point("pr27010", "wait_complete", 26, 28.0, 8.5, (7.0, 10.0)),
                point("pr36425", "wait_complete", 30, 20.0, 0.1, (-0.3, 0.5)),
                point("step-clock", "timeout", 31, 22.0),
                point("pr36425", "timeout", 12, 25.0, 4.0, (3.0, 5.2)),
                point("pr27010", "timeout", None, 30.0, 3.0, (2.0, 4.0))]
        write_csv_atomic(run_dir / "summary.csv", rows, SUMMARY)
    return run_dir


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def projected(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("project") / "run")
    return run, main_project([str(run)])


def test_hand_computed_cells():
    a = assume()  # c 0.3 ms at TP2, ring: c(TP8) = 0.3 x 7 / 1 = 2.1 ms
    r = model_row(a, "pr27010", "wait_complete", 8, 1, 100)
    assert r["c_allreduce_ms"] == pytest.approx(2.1)
    assert r["per_poll_ms"] == pytest.approx(2.1)
    assert r["extra_step_ms"] == pytest.approx(210.0)  # 100 polls x 2.1 ms
    assert r["itl_inflation"] == pytest.approx(11.0)  # 1 + 210 / 21
    r = model_row(a, "pr27010", "best_effort", 8, 4, 10)  # + 3 hops of 0.15 ms per poll
    assert r["extra_step_ms"] == pytest.approx(10 * (2.1 + 3 * 0.15))
    assert model_row(a, "pre27010", "timeout", 8, 4, 10)["extra_step_ms"] == pytest.approx(21)
    r = model_row(assume(scaling="log2"), "pr36425", "timeout", 8, 1, 100)
    assert r["c_allreduce_ms"] == pytest.approx(0.9)  # 0.3 x log2(8) / log2(2)
    assert r["extra_step_ms"] == pytest.approx(90.0)
    r = model_row(assume(c_ms=0.6, tp0=4), "pr27010", "timeout", 16, 1, 30)
    assert r["c_allreduce_ms"] == pytest.approx(3.0)  # 0.6 x 15 / 3
    assert model_row(a, "pr27010", "timeout", 2, 1, float("nan"))["extra_step_ms"] is None


def test_grid_covers_everything_and_zero_rows_are_zero():
    rows = grid_rows(assume())
    assert len(rows) == len(PROTOCOLS) * len(POLICIES) * len(TPS) * len(PPS) * len(QS)
    free = [r for r in rows if (r["protocol"], r["policy"]) == ("pr36425", "wait_complete")]
    assert len(free) == len(TPS) * len(PPS) * len(QS)
    assert all(r["extra_step_ms"] == 0.0 and r["itl_inflation"] == 1.0 for r in free)
    assert all(r["extra_step_ms"] == 0.0 for r in rows if r["protocol"] == "step-clock")


def test_cost_classes():
    classes = {k.label.split(":")[0]: k.pays for k in cost_classes()}
    assert classes["pr27010 (any policy), pr36425/timeout, sglang-0.5.23/timeout, "
                   "pr33029/timeout, pr38284/timeout, pr32725/timeout, pr39903/timeout, "
                   "pr39267/timeout, pr34568/timeout"]
    assert classes["pre27010/wait_complete, pre27010/timeout"]
    free = [k for k in cost_classes() if not k.pays][0]
    assert ("pr36425", "wait_complete") in free.members
    assert ("step-clock", "timeout") in free.members


def test_measured_points_carried():
    summary = [point("pr27010", "wait_complete", 26.0, 28.0, 8.5, (7.0, 10.0)),
               point("pr27010", "timeout", float("nan"), 28.0, float("nan")),
               point("mystery", "timeout", 5.0, 28.0, 1.0)]
    rows = measured_rows(summary, assume())
    assert len(rows) == 2  # an unknown protocol has nothing to project
    assert rows[0]["source"] == "measured"
    assert rows[0]["extra_step_ms"] == pytest.approx(26 * 0.3)
    assert (rows[0]["measured_extra_step_ms"], rows[0]["measured_extra_step_ci_low_ms"],
            rows[0]["measured_extra_step_ci_high_ms"]) == (8.5, 7.0, 10.0)
    assert rows[1]["extra_step_ms"] is None and rows[1]["measured_extra_step_ms"] is None


def test_cli_writes_files(projected, capsys):
    run, code = projected
    assert code == 0
    out = run / "projection"
    for name in ("projection.csv", "projection.md", "projection.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "projection.png").read_bytes().startswith(PNG_MAGIC)
    rows = read_rows(out / "projection.csv")
    model = [r for r in rows if r["source"] == "model"]
    assert len(model) == len(PROTOCOLS) * len(POLICIES) * len(TPS) * len(PPS) * len(QS)
    cell = next(r for r in model if (r["protocol"], r["policy"], r["tp"], r["pp"],
                                     r["polls_per_step"]) == ("pr27010", "timeout", "8", "1",
                                                              "100"))
    assert float(cell["extra_step_ms"]) == pytest.approx(210.0)
    # base step: median decode step of pr36425/wait_complete (20) and step-clock (22) = 21
    assert float(cell["itl_inflation"]) == pytest.approx(11.0)
    measured = [r for r in rows if r["source"] == "measured"]
    assert len(measured) == 5
    assert measured[0]["measured_extra_step_ms"] == "8.5"
    assert measured[2]["measured_extra_step_ms"] == ""  # unknown stays empty


def test_markdown_says_its_assumptions(projected):
    run, _ = projected
    md = (run / "projection" / "projection.md").read_text()
    assert "c = 0.3 ms, the mean of the run's 3 calibration all-reduces over TP2" in md
    assert "ring: c(TP) = c x (TP - 1) / (TP0 - 1)" in md
    assert "base decode step = 21 ms" in md and "pr36425/wait_complete, step-clock/timeout" in md
    assert "half a 2-rank all-reduce" in md and "git commit:" in md
    assert "| 1 | 8 | 21.0 (2.00x) | 63.0 (4.00x) | 210 (11.00x) |" in md
    assert "PP 2, 4: the same as PP 1" in md  # pre27010 pays no hop
    assert "step-clock (any policy), sglang-0.5.23/best_effort, sglang-0.5.23/wait_complete, " \
        "pr33029/best_effort, pr33029/wait_complete, pr38284/best_effort, " \
        "pr38284/wait_complete, pr32725/best_effort, pr32725/wait_complete, " \
        "pr39903/best_effort, pr39903/wait_complete, pr39267/best_effort, " \
        "pr39267/wait_complete, pr34568/best_effort, pr34568/wait_complete issue no decision " \
        "collective" in md
    assert "2 of 5 points are marked in the plot" in md  # pr27010 and pr36425 timeout


def test_latency_flag_and_tp1_run(tmp_path, capsys):
    run = make_run(tmp_path / "tp1", calibration(tp=1), summary=False)
    assert main_project([str(run), "--base-step-ms", "7"]) == 2
    err = capsys.readouterr().err
    assert "TP 1" in err and "--latency-us" in err and len(err.strip().splitlines()) == 1
    out = tmp_path / "out"
    assert main_project([str(run), "--latency-us", "500", "--base-step-ms", "7",
                         "--scaling", "log2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no summary.csv: no measured points" in printed and str(out) in printed
    rows = read_rows(out / "projection.csv")
    cell = next(r for r in rows if (r["protocol"], r["policy"], r["tp"], r["pp"],
                                    r["polls_per_step"]) == ("pr27010", "timeout", "4", "2",
                                                             "10"))
    # 0.5 ms over TP2 (the run had TP1); log2: 1.0 ms at TP4; hop 0.25 ms
    assert float(cell["c_allreduce_ms"]) == pytest.approx(1.0)
    assert float(cell["extra_step_ms"]) == pytest.approx(12.5)
    assert float(cell["itl_inflation"]) == pytest.approx(1 + 12.5 / 7)


def test_measured_hop_used_unless_latency_given(tmp_path):
    run = make_run(tmp_path / "hop", calibration(hop=0.05))
    out = tmp_path / "o1"
    assert main_project([str(run), "--out", str(out)]) == 0
    assert {r["c_hop_ms"] for r in read_rows(out / "projection.csv")} == {"0.05"}
    out = tmp_path / "o2"
    assert main_project([str(run), "--out", str(out), "--latency-us", "400"]) == 0
    assert {r["c_hop_ms"] for r in read_rows(out / "projection.csv")} == {"0.2"}


def _bad(tmp_path, name, calib=None, summary=True, raw_calibration=None):
    run = make_run(tmp_path / name, calib, summary)
    if raw_calibration is not None:
        (run / "calibration.json").write_text(raw_calibration)
    return run


@pytest.mark.parametrize("case,extra,message", [
    ("missing_dir", [], "no such directory"),
    ("no_calibration", [], "calibration.json: no such file"),
    ("bad_json", [], "unreadable JSON"),
    ("negative", ["--latency-us", "-5"], "--latency-us must be a finite number > 0"),
    ("nan", ["--latency-us", "nan"], "--latency-us must be"),
    ("zero_base", ["--base-step-ms", "0"], "--base-step-ms must be"),
    ("scaling", ["--scaling", "star"], "invalid choice"),
    ("no_summary", [], "pass --base-step-ms"),
    ("no_free_row", [], "pass --base-step-ms"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case, extra, message):
    run = tmp_path / "absent"
    if case == "no_calibration":
        run = _bad(tmp_path, case)
        (run / "calibration.json").unlink()
    elif case == "bad_json":
        run = _bad(tmp_path, case, raw_calibration="{not json")
    elif case == "no_summary":
        run = _bad(tmp_path, case, summary=False)
    elif case == "no_free_row":
        run = _bad(tmp_path, case)
        write_csv_atomic(run / "summary.csv", [point("pr27010", "timeout", 3, 20.0)], SUMMARY)
    elif case != "missing_dir":
        run = _bad(tmp_path, case)
    assert main_project([str(run), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert err.startswith("bench project: ")


def test_module_entry_point(tmp_path):
    bench = [sys.executable, "-m", "bench"]
    done = subprocess.run([*bench, "project", str(tmp_path / "nope")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    done = subprocess.run([*bench, "--help"], capture_output=True, text=True, timeout=60)
    assert "python -m bench project RUN_DIR" in done.stdout
