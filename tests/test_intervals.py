"""Where intervals are printed: the summary's interval columns, the headline's resolvable
differences, and a node without scipy (points, counts and verdicts, no interval, the reason
once)."""

import math

import numpy as np
import pandas as pd
import pytest

from bench import stats
from bench.analysis import lead
from bench.analysis.summarize import summarize
from tests.test_gate_quiet import serving_requests, serving_steps


def noisy(protocol, repeat):
    """Every repeat's speed differs a little, pr36425's by a further 2%."""
    return (1 + 0.03 * math.sin(repeat)) * (1.02 if protocol == "pr36425" and repeat % 2
                                            else 1.0)


@pytest.fixture(scope="module")
def frames():
    return serving_requests(noisy), serving_steps(noisy)


def test_summary_has_intervals_half_widths_and_repeat_counts(frames):
    s = summarize(*frames)
    r = s[(s.protocol == "pr36425") & (s.policy == "wait_complete")].iloc[0]
    assert r.step_mean_ratio_repeats == 3 and r.itl_p50_ratio_repeats == 3
    assert r.step_mean_ratio_ci_low < r.step_mean_ratio < r.step_mean_ratio_ci_high
    half = math.log(r.step_mean_ratio_ci_high / r.step_mean_ratio)
    assert r.step_mean_ratio_mdd == pytest.approx(math.expm1(half))
    assert r.interval_note == ""


def test_headline_states_what_the_run_resolves(frames):
    lines = lead.resolution_lines(summarize(*frames))
    assert lines[0].startswith("Resolvable differences (the largest 95% half-width over "
                               "these rows, 3 paired repeats each): step ")
    assert "ITL p50" in lines[0]


def test_without_scipy_points_counts_and_verdicts_stay_and_intervals_go(frames, monkeypatch):
    with_scipy = summarize(*frames)
    monkeypatch.setattr(stats, "_scipy_stats", lambda: None)
    without = summarize(*frames)
    ci = [c for c in without.columns if c.endswith(("_ci_low", "_ci_high", "_mdd"))
          and "predicted" not in c]
    assert without[ci].isna().all().all()
    assert set(without.interval_note) == {"scipy is not installed"}
    counts = ["decision_collectives_per_req", "background_collectives_per_req",
              "step_collectives_per_step", "ranks_agree", "data_errors"]
    pd.testing.assert_frame_equal(without[counts], with_scipy[counts])
    points = ["step_mean_ratio", "itl_p50_ratio", "prefetch_ttft_p50_ratio"]
    assert np.allclose(without[points], with_scipy[points])
    lines = lead.lead_text(without, None)
    said = [line for line in lines if "scipy is not installed" in line]
    assert said == ["No intervals: scipy is not installed."]
    assert "[no CI]" in "\n".join(lines)


def test_at_tp1_there_is_no_c_and_the_lead_says_so_not_0_ms():
    """TP1 has no TP group: calibration times nothing, and the lead says that rather
    than 'one all-reduce took 0.000 ms (n=0)'."""
    from bench.analysis.lead import expectation_lines
    from bench.run.calibrate import summarize

    calib = summarize([[], []], tp=1, pp=2)
    assert calib["n"] == 0
    assert expectation_lines(pd.DataFrame(), calib) == [
        "No c at TP1: no TP group to all-reduce on, so the model expects no "
        "decision-collective time."]
