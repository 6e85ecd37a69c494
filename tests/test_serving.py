"""Serving-regime metrics and the overhead model's columns against hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bench.serving_metrics import (
    itl_gaps,
    overhead_cells,
    ratio_cells,
    reference_protocol,
    serving_cells,
)
from bench.stats import diff_of_means_ci, per_repeat_stat_ratios, ratio_of_stat_ci, stat_value


def reqs(protocol, ttfts, itls, classes):
    return pd.DataFrame({"protocol": protocol, "repeat": [0] * len(ttfts), "ttft_ms": ttfts,
                         "itl_ms": itls, "request_class": classes,
                         "output_tokens": [1 + len(s.split(";")) if s else 1 for s in itls]})


def steps(protocol, step_ms, forward_ms, polled, decision, kinds=None):
    n = len(step_ms)
    return pd.DataFrame({"protocol": protocol, "repeat": 0, "step_ms": step_ms,
                         "forward_ms": forward_ms, "polled": polled, "decision": decision,
                         "completion": 0, "pp_hop": 0,
                         "decision_sync_ms": [0.5 * d for d in decision],
                         "kind": kinds or ["decode"] * n, "waiting": [3] * n,
                         "prefetching": [2] * n})


A = reqs("pr27010", [100.0, 200.0, 10.0, 30.0], ["10;20", "30", "", "40;50;60"],
         ["prefetch", "prefetch", "bystander", "bystander"])
SA = steps("pr27010", [10.0, 20.0, 30.0, 40.0], [5.0, 5.0, 5.0, 5.0], [2, 2, 4, 0],
           [2, 2, 4, 0], ["prefill", "decode", "decode", "idle"])


def test_itl_pooling_and_class_ttft():
    assert itl_gaps(A["itl_ms"]).tolist() == [10, 20, 30, 40, 50, 60]
    cells = serving_cells(A, SA, cores_busy=1.5)
    assert cells["itl_p50_ms"] == pytest.approx(35.0)  # linear between 30 and 40
    assert cells["itl_mean_ms"] == pytest.approx(35.0)
    assert cells["prefetch_ttft_p50_ms"] == pytest.approx(150.0)
    assert cells["bystander_ttft_p50_ms"] == pytest.approx(20.0)
    assert cells["prefetch_requests"] == 2 and cells["bystander_requests"] == 2
    assert cells["step_mean_ms"] == pytest.approx(25.0)
    assert cells["decode_step_p50_ms"] == pytest.approx(25.0)  # the two decode steps
    assert cells["host_ms_per_step"] == pytest.approx(20.0)
    assert cells["polls_per_step"] == pytest.approx(2.0)
    assert cells["decision_sync_ms_per_step"] == pytest.approx(1.0)
    # 3 + 2 + 1 + 4 = 10 output tokens over 100 ms of steps
    assert cells["output_tok_per_s"] == pytest.approx(100.0)
    assert cells["cores_busy"] == 1.5


def test_ratio_cells_against_a_run_twice_as_slow():
    slow = A.assign(ttft_ms=A["ttft_ms"] * 2,
                    itl_ms=["20;40", "60", "", "80;100;120"], protocol="pr36425")
    cells = ratio_cells(slow, SA.assign(step_ms=SA["step_ms"] * 2), A, SA)
    for name in ("step_mean", "itl_p50", "itl_p99", "prefetch_ttft_p50",
                 "bystander_ttft_p99"):
        assert cells[f"{name}_ratio"] == pytest.approx(2.0)
        assert cells[f"{name}_ratio_ci_low"] <= 2.0 <= cells[f"{name}_ratio_ci_high"]
    assert cells["step_mean_ratio_per_repeat"] == "2.0000"
    empty = ratio_cells(A, SA, None, None)
    assert math.isnan(empty["itl_p50_ratio"])


def test_reference_protocol_choice():
    assert reference_protocol({"pr27010", "pr36425", "step-clock"}, "timeout") == "step-clock"
    assert reference_protocol({"pr27010", "pr36425"}, "wait_complete") == "pr36425"
    assert reference_protocol({"pr27010", "pr36425"}, "timeout") is None  # pays per poll


CALIB = {"tp": 2, "pp_hop_ms": None,
         "allreduce": {"mean_ms": 0.5, "p50_ms": 0.4, "mean_ci_low_ms": 0.4,
                       "mean_ci_high_ms": 0.6}}


def test_overhead_prediction_and_measurement():
    row = {"protocol": "pr27010", "policy": "wait_complete", "tp": 2, "pp": 1,
           "itl_mean_ms": 40.0}
    ref_s = steps("step-clock", [8.0, 12.0], [5.0, 5.0], [3, 3], [0, 0])
    ref = {"protocol": "step-clock", "step_mean_ms": 10.0, "itl_mean_ms": 20.0}
    out = overhead_cells(row, SA, ref, ref_s, CALIB)
    # 2 polls per step x 1 all-reduce x 0.5 ms = 1.0 ms, band from c's CI: [0.8, 1.2]
    assert out["predicted_extra_step_ms"] == pytest.approx(1.0)
    assert (out["predicted_extra_step_low_ms"], out["predicted_extra_step_high_ms"]) == \
        pytest.approx((0.8, 1.2))
    # host time 20 ms per step against the reference's 5 ms: 15 ms measured
    assert out["measured_extra_step_ms"] == pytest.approx(15.0)
    assert out["c_insitu_ms"] == pytest.approx(0.5)  # 4 ms over 8 decision collectives
    assert out["predicted_itl_inflation"] == pytest.approx(1.1)
    assert out["measured_itl_inflation"] == pytest.approx(2.0)
    assert out["overhead_model_agrees"] is False
    assert "more than its collectives" in out["overhead_model_note"]
    none = overhead_cells(row, SA, None, None, CALIB)
    assert none["overhead_model_agrees"] is None and math.isnan(none["measured_extra_step_ms"])


def test_stat_ratios_and_differences():
    x, y = {0: [2.0, 4.0, 6.0], 1: [8.0]}, {0: [1.0, 2.0, 3.0], 1: [4.0]}
    assert stat_value(np.array([1.0, 2.0, 3.0, 4.0]), "p50") == 2.5
    point, low, high = ratio_of_stat_ci(x, y, "mean")
    assert point == pytest.approx(2.0) and low <= 2.0 <= high
    assert ratio_of_stat_ci(x, y, "p99")[0] == pytest.approx(2.0)
    assert per_repeat_stat_ratios(x, y, "p50") == {0: 2.0, 1: 2.0}
    d, lo, hi = diff_of_means_ci({0: [3.0, 3.0]}, {0: [1.0, 1.0]})
    assert (d, lo, hi) == (2.0, 2.0, 2.0)
    assert ratio_of_stat_ci({}, y) == (None, None, None)
    with pytest.raises(ValueError, match="statistic"):
        stat_value(np.array([1.0]), "median")
