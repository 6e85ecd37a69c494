"""bench_serving's result fields from requests.csv rows, against hand-computed numbers."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.analysis.serving_json import summary


def test_fields_by_hand():
    # Two requests: arrivals 0 and 1 s; the last token of the second at 1 + 0.4 = 1.4 s.
    rows = pd.DataFrame({
        "arrival_s": [0.0, 1.0], "ttft_ms": [100.0, 200.0], "e2e_ms": [300.0, 400.0],
        "prompt_tokens": [1000, 3000], "output_tokens": [3, 1],
        "itl_ms": ["100.0;100.0", ""]})
    s = summary(rows)
    assert s["duration"] == pytest.approx(1.4) and s["completed"] == 2
    assert s["request_throughput"] == pytest.approx(2 / 1.4)
    assert s["input_throughput"] == pytest.approx(4000 / 1.4)
    assert s["output_throughput"] == pytest.approx(4 / 1.4)
    assert s["total_throughput"] == pytest.approx(4004 / 1.4)
    assert (s["mean_ttft_ms"], s["median_ttft_ms"], s["std_ttft_ms"]) == (150.0, 150.0, 50.0)
    assert s["p99_ttft_ms"] == pytest.approx(199.0)  # linear: 100 + 0.99 x 100
    # TPOT only for requests with more than one token: (300 - 100) / (3 - 1) = 100.
    assert s["mean_tpot_ms"] == s["p99_tpot_ms"] == 100.0
    assert s["mean_itl_ms"] == 100.0 and s["std_itl_ms"] == 0.0
    assert s["mean_e2e_latency_ms"] == 350.0
    assert s["concurrency"] == pytest.approx(0.7 / 1.4)


def test_no_multi_token_request_leaves_tpot_unknown():
    rows = pd.DataFrame({"arrival_s": [0.0], "ttft_ms": [10.0], "e2e_ms": [10.0],
                         "prompt_tokens": [5], "output_tokens": [1], "itl_ms": [""]})
    s = summary(rows)
    assert s["mean_tpot_ms"] is None and s["p99_itl_ms"] is None
