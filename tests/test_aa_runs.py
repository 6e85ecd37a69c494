"""scripts/aa_runs.py's reading of an ab.csv and its summary: an A/A run's false calls, its
order-effect intervals that exclude 1 and its metrics whose blocks all fall on one side are
counted, not lost."""

import importlib.util
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
