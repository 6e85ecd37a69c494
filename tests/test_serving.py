"""Serving-regime metrics and the overhead model's columns against hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bench.analysis.serving_metrics import (
    itl_gaps,
    overhead_columns,
    ratio_columns,
    reference_protocol,
    serving_columns,
)
from bench.stats import stat_value


def reqs(protocol, ttfts, itls, classes):
    return pd.DataFrame({"protocol": protocol, "repeat": [0] * len(ttfts), "ttft_ms": ttfts,
                         "e2e_ms": [3 * t for t in ttfts], "itl_ms": itls,
                         "request_class": classes,
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
    cells = serving_columns(A, SA, cores_busy=1.5)
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


def repeats(frame, n, scale=lambda r: 1.0, columns=("ttft_ms", "e2e_ms", "step_ms")):
    """`frame` as repeats 0..n-1, repeat r's timing columns scaled by scale(r)."""
    parts = []
    for r in range(n):
        part = frame.assign(repeat=r)
        for c in columns:
            if c in part:
                part[c] = part[c] * scale(r)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def test_ratio_cells_against_a_run_twice_as_slow():
    slow = A.assign(ttft_ms=A["ttft_ms"] * 2, e2e_ms=A["e2e_ms"] * 2,
                    itl_ms=["20;40", "60", "", "80;100;120"], protocol="pr36425")
    drift = {0: 1.0, 1: 1.1, 2: 0.95}  # the machine drifts; both sides of a repeat alike
    cells, intervals = ratio_columns(repeats(slow, 3, drift.get),
                                   repeats(SA.assign(step_ms=SA["step_ms"] * 2), 3, drift.get),
                                   repeats(A, 3, drift.get), repeats(SA, 3, drift.get))
    for name in ("step_mean", "itl_p50", "itl_p99", "prefetch_ttft_p50",
                 "bystander_ttft_p99", "e2e_p50"):
        assert cells[f"{name}_ratio"] == pytest.approx(2.0)
        assert cells[f"{name}_ratio_repeats"] == 3
    # TTFT and steps drift alike on both sides: every repeat's ratio is exactly 2.
    assert cells["step_mean_ratio_ci_low"] == pytest.approx(2.0)
    assert cells["step_mean_ratio_mdd"] == pytest.approx(0.0, abs=1e-12)
    assert cells["step_mean_ratio_per_repeat"] == "2.0000;2.0000;2.0000"
    assert all(iv.has_interval for iv in intervals)
    one, _ = ratio_columns(slow, SA.assign(step_ms=SA["step_ms"] * 2), A, SA)  # one repeat
    assert one["step_mean_ratio"] == pytest.approx(2.0)
    assert math.isnan(one["step_mean_ratio_ci_low"]) and one["step_mean_ratio_repeats"] == 1
    empty, _ = ratio_columns(A, SA, None, None)
    assert math.isnan(empty["itl_p50_ratio"]) and empty["itl_p50_ratio_repeats"] == 0


def test_ratio_cells_pair_each_repeat_with_the_references_own():
    # B's step time is 2x in even repeats and 1x in odd ones; the reference is the same in
    # every repeat: the per-repeat ratios alternate and the interval is wide.
    ref = repeats(SA, 4)
    x = repeats(SA, 4, lambda r: 2.0 if r % 2 == 0 else 1.0)
    cells, _ = ratio_columns(repeats(A, 4), x, repeats(A, 4), ref)
    assert cells["step_mean_ratio_per_repeat"] == "2.0000;1.0000;2.0000;1.0000"
    assert cells["step_mean_ratio"] == pytest.approx(math.sqrt(2))
    assert cells["step_mean_ratio_mdd"] > 0.5


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
    # Three repeats of the same steps (with a little noise in the reference's, so the
    # interval is not a point).
    s = repeats(SA, 3, columns=())
    ref_s = repeats(ref_s, 3, columns=())
    ref_s["step_ms"] = ref_s["step_ms"] + ref_s["repeat"].map({0: 0.0, 1: 0.1, 2: -0.1})
    out = overhead_columns(row, s, ref, ref_s, CALIB)
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
    none = overhead_columns(row, s, None, None, CALIB)
    assert none["overhead_model_agrees"] is None and math.isnan(none["measured_extra_step_ms"])


def test_measured_extra_step_is_paired_by_repeat():
    row = {"protocol": "pr27010", "policy": "wait_complete", "tp": 2, "pp": 1,
           "itl_mean_ms": 40.0}
    ref = {"protocol": "step-clock", "step_mean_ms": 10.0, "itl_mean_ms": 20.0}
    # Host time per step (step - 5 ms forward): ours 20 ms x drift, the reference's 5 x drift
    drift = {0: 1.0, 1: 2.0, 2: 3.0}
    s = repeats(SA, 3, drift.get, columns=())
    s["step_ms"] = 5.0 + 20.0 * s["repeat"].map(drift)
    ref_s = repeats(steps("step-clock", [10.0, 10.0], [5.0, 5.0], [3, 3], [0, 0]), 3,
                    columns=())
    ref_s["step_ms"] = 5.0 + 5.0 * ref_s["repeat"].map(drift)
    out = overhead_columns(row, s, ref, ref_s, CALIB)
    # differences 15, 30, 45: mean 30, sd 15, t_{2, 0.975} = 4.302653
    h = 4.302653 * 15 / math.sqrt(3)
    assert out["measured_extra_step_ms"] == pytest.approx(30.0)
    assert (out["measured_extra_step_ci_low_ms"], out["measured_extra_step_ci_high_ms"]) == \
        pytest.approx((30 - h, 30 + h), rel=1e-6)
    assert out["measured_extra_step_repeats"] == 3
    one = overhead_columns(row, SA, ref, steps("step-clock", [8.0, 12.0], [5.0, 5.0], [3, 3],
                                             [0, 0]), CALIB)
    assert one["overhead_model_agrees"] is None and "too few repeats" in \
        one["overhead_model_note"]


def test_stat_value():
    assert stat_value(np.array([1.0, 2.0, 3.0, 4.0]), "p50") == 2.5
    assert stat_value(np.array([1.0, 2.0, 3.0, 4.0]), "mean") == 2.5
    with pytest.raises(ValueError, match="statistic"):
        stat_value(np.array([1.0]), "median")
