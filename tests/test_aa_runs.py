"""scripts/aa_runs.py's reading of an ab.csv and its summary: an A/A run's false calls, its
order-effect intervals that exclude 1 and its metrics whose blocks all fall on one side are
counted, not lost."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pandas as pd

SPEC = importlib.util.spec_from_file_location(
    "aa_runs", Path(__file__).resolve().parent.parent / "scripts" / "aa_runs.py")
aa = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(aa)


def row(metric, verdict, order=(1.0, 0.9, 1.1), sides=(3, 3), kind="timing"):
    return {"protocol": "pr36425", "policy": "wait_complete", "metric": metric, "kind": kind,
            "verdict": verdict, "ratio_b_over_a": 1.0, "ratio_ci_low": 0.9,
            "ratio_ci_high": 1.1, "second_over_first": order[0], "order_ci_low": order[1],
            "order_ci_high": order[2], "blocks_favour_a": sides[0],
            "blocks_favour_b": sides[1]}


def test_an_ab_csv_is_read_into_false_calls_order_and_sides():
    rows = pd.DataFrame([
        row("step_mean_ms", "same"),
        row("itl_p50_ms", "worse", order=(1.3, 1.1, 1.5)),  # order interval excludes 1
        row("prefetch_ttft_p50_ms", "same", sides=(6, 0)),  # all blocks favour A
        row("itl_p99_ms", "same", order=(None, None, None)),  # not gated: no order cells
        row("decision_collectives", "same", kind="count"),
    ])
    got = aa.read_ab(rows)
    assert (got["timing_rows"], got["timing_same"]) == (4, 3)
    assert (got["gated_rows"], got["gated_same"]) == (3, 2)
    flags = {g["metric"]: (g["order_holds_1"], g["one_side"]) for g in got["gated"]}
    assert flags == {"step_mean_ms": (True, False), "itl_p50_ms": (False, False),
                     "prefetch_ttft_p50_ms": (True, True)}
    text = "\n".join(aa.summary([got | {"kind": "X X", "exit": 1, "seconds": 10.0,
                                        "last_line": "ab: 0 better, 1 worse, 3 same"}]))
    assert "3/4 (75.0%)" in text and "2/3 (66.7%)" in text
    assert "| pr36425/wait_complete | itl_p50_ms | 0/1 | 0/1 | 0/1 |" in text
    assert "| pr36425/wait_complete | prefetch_ttft_p50_ms | 1/1 | 1/1 | 1/1 |" in text


def test_a_used_out_folder_is_refused_in_one_line_and_kept(tmp_path):
    """Both measurement scripts refuse an --out that already holds something (or is a
    file), before any work, so an earlier measurement is never written over."""
    used = tmp_path / "used"
    used.mkdir()
    (used / "gate_power.json").write_text("{}")
    plain = tmp_path / "plain"
    plain.write_text("x")
    for script in ("gate_power.py", "aa_runs.py"):
        for out in (used, plain):
            done = subprocess.run([sys.executable, str(Path(aa.__file__).parent / script),
                                   "--out", str(out)], capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode != 0, (script, out)
            assert done.stderr.strip().count("\n") == 0, done.stderr
            assert "is not an empty folder" in done.stderr, done.stderr
    assert (used / "gate_power.json").read_text() == "{}" and plain.read_text() == "x"
