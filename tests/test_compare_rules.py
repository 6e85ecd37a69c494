"""`bench compare`'s rules on counts and timings built by hand: exact fractions, the count
rows' verdicts and notes, and the timing rows' t intervals (no run needed; tests/test_compare.py
compares real runs)."""

from dataclasses import replace
from fractions import Fraction

import pandas as pd
import pytest

from bench.compare.metrics import TimingMetric, counts, itl_gaps, ttft
from bench.compare.rows import TimingOptions, count_rows, timing_rows
from bench.verdict.thresholds import timing_verdict

JUDGED_COUNTS = ["decision_collectives_per_req", "critical_collectives_per_req",
                 "background_collectives_per_req", "step_collectives_per_step"]


def test_timing_verdict_rule():
    assert timing_verdict(1.06, 1.5, 0.05) == "worse"
    assert timing_verdict(1.04, 1.5, 0.05) == "same"  # excludes 1, but not 1 + threshold
    assert timing_verdict(0.5, 0.94, 0.05) == "better"
    assert timing_verdict(0.5, 0.96, 0.05) == "same"
    assert timing_verdict(0.9, 1.1, 0.0) == "same"


def test_counts_are_exact_fractions():
    requests = pd.DataFrame({"polls": [3, 0, 4], "decision_collectives": [3, 0, 4],
                             "completion_collectives": [1, 0, 0], "pp_hops": [3, 0, 4],
                             "hit_query_collectives": [1, 1, 1], "ack_collectives": [2, 0, 3]})
    steps = pd.DataFrame({"request_broadcast": [1, 1, 1], "per_step_min": [1, 1, 0],
                          "model_allreduce": [2, 2, 0], "kind": ["decode", "decode", "idle"]})
    c = counts(requests, steps)
    assert c.decision_per_req == Fraction(7, 3) and c.critical_per_req == Fraction(15, 3)
    assert c.background_per_req == Fraction(8, 3) and c.decision_per_poll == 1
    assert c.poll_sites_per_poll == 2 and c.completion_per_req == Fraction(1, 3)
    assert c.step_per_step == Fraction(9, 3)
    assert c.step_per_step_by_kind == {"decode": 4, "idle": 1}


def test_itl_gaps_are_clustered_by_request():
    frame = pd.DataFrame({"repeat": [0, 0, 1], "itl_ms": ["1.0;2.0", None, "5"]})
    sample = itl_gaps(frame)
    assert list(sample.values[0]) == [1.0, 2.0] and list(sample.units[0]) == [0, 0]
    assert list(sample.values[1]) == [5.0]


def hand_counts(polls, decision, completion, step_kinds):
    """Counts of two requests and steps given as (kind, collectives) pairs."""
    requests = pd.DataFrame({"polls": polls, "decision_collectives": decision,
                             "completion_collectives": completion, "pp_hops": [0, 0],
                             "hit_query_collectives": [1, 1], "ack_collectives": [1, 1]})
    steps = pd.DataFrame({"kind": [k for k, _ in step_kinds],
                          "request_broadcast": [c for _, c in step_kinds],
                          "per_step_min": 0, "model_allreduce": 0})
    return counts(requests, steps)


def judged(a, b):
    return {r["metric"]: (r["verdict"], r["note"]) for r in count_rows(a, b, (1, 1))}


def test_count_rules_by_hand():
    a = hand_counts([2, 2], [2, 2], [1, 0], [("decode", 4), ("decode", 4), ("idle", 1)])
    # Fewer polls at one collective per poll, a different mix of step kinds: all same.
    b = hand_counts([1, 1], [1, 1], [1, 0], [("decode", 4), ("idle", 1), ("idle", 1)])
    got = judged(a, b)
    assert got["decision_collectives_per_req"][0] == "same"
    assert got["critical_collectives_per_req"][0] == "same"
    assert got["step_collectives_per_step"] == ("same", "judged per step kind: decode 4 -> 4, "
                                                        "idle 1 -> 1")
    assert got["polls_per_req"][0] == "info"
    # A completion collective added while polls differ: critical is worse, decision is not.
    c = hand_counts([1, 1], [1, 1], [1, 1], [("decode", 5), ("idle", 1)])
    got = judged(a, c)
    assert got["decision_collectives_per_req"][0] == "same"
    assert got["critical_collectives_per_req"][0] == "worse"
    assert got["step_collectives_per_step"][0] == "worse"
    assert judged(c, a)["critical_collectives_per_req"][0] == "better"


# ---- a mix of worse and better; a change far below one collective per request -------------

def test_a_mix_of_worse_and_better_components_is_worse():
    """When polls differ, critical collectives are judged as in-poll per poll and completion
    per request, and steps per step kind: one part worse and another better is worse, in
    either direction (an improvement elsewhere does not hide a regression)."""
    a = hand_counts([2, 2], [2, 2], [0, 0], [("decode", 4), ("idle", 1)])
    # In-poll 1 -> 0.5 per poll (better), completion 0 -> 0.5 per request (worse);
    # decode steps 4 -> 5 (worse), idle 1 -> 0 (better).
    b = hand_counts([1, 1], [0, 1], [1, 0], [("decode", 5), ("idle", 0)])
    for x, y in ((a, b), (b, a)):
        got = judged(x, y)
        assert got["critical_collectives_per_req"][0] == "worse", got
        assert got["step_collectives_per_step"][0] == "worse", got
    assert "judged per step kind: decode 4 -> 5, idle 1 -> 0" in judged(a, b)[
        "step_collectives_per_step"][1]


def large_counts(n: int, polls: int, extra: dict) -> tuple:
    """n requests of `polls` polls at one decision collective each, and n decode steps of 3
    collectives; `extra` adds to one request's (or step's) column."""
    requests = pd.DataFrame({"polls": [polls] * n, "decision_collectives": [polls] * n,
                             "completion_collectives": 0, "pp_hops": 0,
                             "hit_query_collectives": 1, "ack_collectives": 1})
    steps = pd.DataFrame({"kind": ["decode"] * n, "request_broadcast": 1, "per_step_min": 1,
                          "model_allreduce": [1] * n})
    for column, add in extra.items():
        frame = steps if column in steps else requests
        frame.loc[0, column] += add
    return counts(requests, steps)


N_LARGE = 10_000


@pytest.mark.parametrize(("column", "metric"), [
    ("decision_collectives", "decision_collectives_per_req"),
    ("completion_collectives", "critical_collectives_per_req"),
    ("ack_collectives", "background_collectives_per_req"),
    ("model_allreduce", "step_collectives_per_step"),
])
def test_one_collective_in_one_request_of_a_large_run_is_not_same(column, metric):
    a = large_counts(N_LARGE, 2, {})
    b = large_counts(N_LARGE, 2, {column: 1})
    rows = {r["metric"]: r for r in count_rows(a, b, (N_LARGE, N_LARGE))}
    assert rows[metric]["verdict"] == "worse"
    assert rows[metric]["b_minus_a"] == pytest.approx(1 / N_LARGE, rel=1e-9)
    rows = {r["metric"]: r for r in count_rows(b, a, (N_LARGE, N_LARGE))}
    assert rows[metric]["verdict"] == "better"


def test_one_collective_more_per_poll_path_is_not_same():
    """Polls differ, so decisions are judged per poll: one extra collective in 30,000
    polls still makes it worse."""
    a = large_counts(N_LARGE, 2, {})
    b = large_counts(N_LARGE, 3, {"decision_collectives": 1})
    got = judged(a, b)
    assert got["decision_collectives_per_req"][0] == "worse", got
    assert "per poll, 1 -> 1" in got["decision_collectives_per_req"][1]  # 4 digits hide it


# ---- timing rows by hand (constant per-repeat ratios: the t interval is the point) --------

TTFT_P50 = TimingMetric("ttft_p50_ms", "requests", "p50", ("ttft_ms",), ttft())


def _ttft_frame(values_by_repeat: dict) -> pd.DataFrame:
    return pd.DataFrame([{"repeat": r, "ttft_ms": v} for r, vs in values_by_repeat.items()
                         for v in vs], columns=["repeat", "ttft_ms"])


def _timing(a: pd.DataFrame | None, b: pd.DataFrame | None, present=(True, True)) -> list:
    frames = {("a", "requests"): a, ("b", "requests"): b}
    shown = {("a", TTFT_P50): present[0], ("b", TTFT_P50): present[1]}
    return timing_rows([TTFT_P50], frames, shown, TimingOptions(threshold=0.25))


@pytest.mark.parametrize(("b_value", "verdict"), [
    (20.0, "worse"), (12.6, "worse"), (12.4, "same"), (10.0, "same"), (7.6, "same"),
    (7.4, "better"), (4.0, "better")])  # threshold 0.25: worse above 12.5, better below 7.5
def test_timing_rows_by_hand(b_value, verdict):
    a = _ttft_frame({0: [10.0] * 3, 1: [10.0] * 2, 2: [10.0] * 2})
    b = _ttft_frame({0: [b_value] * 2, 1: [b_value] * 2, 2: [b_value]})
    (row,) = _timing(a, b)
    assert row["verdict"] == verdict and row["note"] == ""
    assert (row["metric"], row["kind"], row["n_a"], row["n_b"]) == ("ttft_p50_ms", "timing",
                                                                    7, 5)
    assert row["repeats"] == 3 and row["ratio_mdd"] == pytest.approx(0.0)
    assert (row["a"], row["b"]) == (10.0, b_value)
    assert row["b_minus_a"] == pytest.approx(b_value - 10.0)
    ratio = b_value / 10.0
    assert (row["ratio_b_over_a"], row["ratio_ci_low"], row["ratio_ci_high"]) == \
        pytest.approx((ratio, ratio, ratio))


def test_timing_rows_that_cannot_be_compared():
    a = _ttft_frame({0: [10.0, 12.0]})
    (row,) = _timing(a, None, present=(True, False))
    assert (row["verdict"], row["note"]) == ("not comparable", "only A carries ('ttft_ms',)")
    (row,) = _timing(None, a, present=(False, True))
    assert row["note"] == "only B carries ('ttft_ms',)"
    (row,) = _timing(None, a)  # the configuration has no rows in A
    assert (row["verdict"], row["note"], row["n_a"]) == ("not comparable", "no samples in A", 0)
    (row,) = _timing(a, _ttft_frame({0: []}))
    assert row["note"] == "no samples in B"
    assert _timing(None, None) == []  # no samples on either side: left out
    (row,) = _timing(_ttft_frame({0: [0.0, 0.0]}), a)
    assert (row["verdict"], row["note"]) == (
        "not comparable", "ratio undefined (no repeat of both with a value > 0)")
    (row,) = _timing(a, a)  # one paired repeat: the point, no interval, no verdict
    assert row["verdict"] == "not comparable" and "too few repeats" in row["note"]


# ---- count rows whole: every cell, the notes, and what cannot be judged -------------------

def _steps_counts(step_kinds, polls=(2, 2), decision=(2, 2)):
    return hand_counts(list(polls), list(decision), [0, 0], step_kinds)


def test_count_rows_are_whole_rows():
    a = _steps_counts([("decode", 4), ("idle", 1)])
    b = _steps_counts([("decode", 4), ("idle", 1)], polls=(3, 3), decision=(3, 3))
    rows = count_rows(a, b, (5, 7))
    assert [r["metric"] for r in rows] == ["polls_per_req", *JUDGED_COUNTS]
    assert rows[0] == {"metric": "polls_per_req", "kind": "count", "a": 2.0, "b": 3.0,
                       "b_minus_a": 1.0, "n_a": 2, "n_b": 2, "verdict": "info",
                       "note": "follows timing; not judged"}
    assert rows[1] == {"metric": "decision_collectives_per_req", "kind": "count", "a": 2.0,
                       "b": 3.0, "b_minus_a": 1.0, "n_a": 2, "n_b": 2, "verdict": "same",
                       "note": "polls/req differ: judged per poll, 1 -> 1"}
    assert rows[2]["verdict"] == "same" and rows[2]["note"] == (
        "polls/req differ: judged as in-poll per poll 1 -> 1 and completion per request "
        "0 -> 0")
    assert (rows[3]["verdict"], rows[3]["note"]) == ("same", "")
    assert rows[4] == {"metric": "step_collectives_per_step", "kind": "count", "a": 2.5,
                       "b": 2.5, "b_minus_a": 0.0, "n_a": 5, "n_b": 7, "verdict": "same",
                       "note": ""}


def test_steps_without_kinds_are_judged_per_step():
    a, b = (replace(_steps_counts([("decode", n), ("decode", 1)]), step_per_step_by_kind={})
            for n in (4, 5))  # steps.csv without `kind`
    row = count_rows(a, b, (2, 2))[4]
    assert (row["verdict"], row["note"]) == ("worse", "")
    assert count_rows(b, a, (2, 2))[4]["verdict"] == "better"


@pytest.mark.parametrize("side", ["A", "B"])
def test_a_run_without_steps_is_not_comparable_per_step(side):
    with_steps = _steps_counts([("decode", 4)])
    without = _steps_counts([])
    assert without.step_per_step is None
    a, b = (without, with_steps) if side == "A" else (with_steps, without)
    row = count_rows(a, b, (1, 0))[4]
    assert (row["verdict"], row["note"]) == ("not comparable", f"no steps.csv rows in {side}")
    assert row["b_minus_a"] is None and (row["a"] is None) == (side == "A")


def test_a_configuration_without_requests_is_not_comparable():
    empty = counts(pd.DataFrame(columns=["polls", "decision_collectives",
                                         "completion_collectives", "pp_hops",
                                         "hit_query_collectives", "ack_collectives"]), None)
    full = _steps_counts([("decode", 4)])
    for a, b in ((empty, full), (full, empty)):
        rows = {r["metric"]: r for r in count_rows(a, b, (1, 1))}
        for metric in JUDGED_COUNTS[:3]:
            assert rows[metric]["verdict"] == "not comparable", (metric, rows[metric])
            assert rows[metric]["b_minus_a"] is None
    rows = {r["metric"]: r for r in count_rows(empty, empty, (0, 0))}
    assert rows["decision_collectives_per_req"]["verdict"] == "same"  # nothing vs nothing
