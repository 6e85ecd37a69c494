"""summarize() on a tiny hand-built run, against hand-computed numbers."""

import math

import pandas as pd
import pytest

from bench.analysis.summarize import (
    TABLE_HEADERS,
    expected_counts,
    format_table,
    summarize,
    table_headers,
    table_rows,
)
from bench.rundir.schema import REQUEST_COLUMNS, STEP_COLUMNS, SUMMARY_COLUMNS

CONFIG = dict(preset="t", tp=2, pp=1, world_size=2, device="cpu", backend="gloo",
              storage="sim", rate_rps=4.0, seed=0, page_size=64, extra_pool=False,
              race_guard=True)


def req(key, ttft, polls, decision, hit_tokens, ack, **kw):
    """One requests.csv row, `key` (protocol, policy, repeat, rid); a prefetch was issued
    when hit_tokens > 0."""
    protocol, policy, repeat, rid = key
    issued = hit_tokens > 0
    row = dict(CONFIG, protocol=protocol, policy=policy, repeat=repeat, rid=rid, arrival_s=0.0,
               ttft_ms=ttft, queue_ms=1.0, prefetch_io_ms=2.0, sched_lag_ms=float(polls),
               sync_ms=0.5, load_back_ms=1.0, prefill_ms=3.0, polls=polls,
               decision_collectives=decision, completion_collectives=0,
               hit_query_collectives=int(issued), ack_collectives=ack, pp_hops=0,
               terminated_by="ack" if issued else "none", op_issued=issued, io_issued=issued,
               prefetch_requested_tokens=hit_tokens, hit_tokens=hit_tokens,
               prefetched_tokens=hit_tokens, ranks_agree=True, data_ok=True)
    row.update(kw)
    return row


def requests_frame():
    # Acks at TP2: one per 128-page batch (the final ack is free): 10 pages -> 1, 200 -> 2.
    rows = [
        req(("pr27010", "wait_complete", 0, "a"), 100, 3, 3, 640, 1),
        req(("pr27010", "wait_complete", 0, "b"), 50, 0, 0, 0, 0),
        req(("pr27010", "wait_complete", 1, "a"), 120, 2, 2, 640, 1),
        req(("pr27010", "wait_complete", 1, "b"), 80, 1, 1, 12800, 2),
        req(("pr36425", "wait_complete", 0, "a"), 90, 3, 0, 640, 1),
        req(("pr36425", "wait_complete", 0, "b"), 40, 0, 0, 0, 0),
        req(("pr36425", "wait_complete", 1, "a"), 100, 2, 0, 640, 1, data_ok=False),
        req(("pr36425", "wait_complete", 1, "b"), 60, 1, 0, 12800, 2),
        req(("pr36425", "timeout", 0, "a"), 70, 2, 2, 640, 1, ranks_agree=False),
    ]
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def steps_frame():
    rows = [dict(CONFIG, protocol="pr27010", policy="wait_complete", repeat=r, step=s,
                 t_s=0.1 * s, waiting=1, polled=1, scheduled=1, request_broadcast=1,
                 per_step_min=1, model_allreduce=4, decision=1, completion=0, pp_hop=0,
                 sync_ms=float(ms))
            for r, s, ms in [(0, 0, 1), (0, 1, 2), (1, 0, 3)]]
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


@pytest.fixture(scope="module")
def summary():
    return summarize(requests_frame(), steps_frame())


def row(summary, protocol, policy):
    hit = summary[(summary.protocol == protocol) & (summary.policy == policy)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_columns_and_groups(summary):
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert list(zip(summary.protocol, summary.policy, strict=True)) == [
        ("pr27010", "wait_complete"), ("pr36425", "wait_complete"), ("pr36425", "timeout")]


def test_reference_counts(summary):
    r = row(summary, "pr27010", "wait_complete")
    assert (r.requests, r.repeats, r.tp, r.pp, r.world_size) == (2, 2, 2, 1, 2)
    assert r.polls_per_req == 1.5  # (3 + 0 + 2 + 1) / 4
    assert r.decision_collectives_per_req == 1.5
    assert r.decision_collectives_per_poll == 1.0  # 6 / 6: T + P = 1 per poll at TP2 PP1
    assert r.expected_decision_collectives_per_req == 1.5
    assert r.critical_collectives_per_req == 1.5
    assert r.background_collectives_per_req == 1.75  # (2 + 0 + 2 + 3) / 4
    assert r.expected_background_collectives_per_req == 1.75


def test_after_counts(summary):
    r = row(summary, "pr36425", "wait_complete")
    assert r.decision_collectives_per_req == 0
    assert r.decision_collectives_per_poll == 0.0
    assert r.expected_decision_collectives_per_req == 0
    assert r.background_collectives_per_req == r.expected_background_collectives_per_req == 1.75


def test_step_columns(summary):
    r = row(summary, "pr27010", "wait_complete")
    assert r.step_collectives_per_step == 6.0  # 1 broadcast + 1 per-step MIN + 4 model
    assert r.step_collectives_per_req == 4.5  # 18 step collectives / 4 requests
    assert r.sync_ms_per_step == 2.0
    assert math.isnan(row(summary, "pr36425", "wait_complete").step_collectives_per_step)


def test_ttft_percentiles_linear(summary):
    r = row(summary, "pr27010", "wait_complete")  # TTFTs 50, 80, 100, 120
    assert r.ttft_p50_ms == 90.0
    assert r.ttft_p90_ms == pytest.approx(114.0)  # 100 + 0.7 * 20
    assert r.ttft_p99_ms == pytest.approx(119.4)  # 100 + 0.97 * 20
    assert r.ttft_mean_ms == 87.5
    assert r.sched_lag_p50_ms == 1.5  # lags 0, 1, 2, 3
    assert r.percentile_method == "linear"


def test_prefetch_sched_lag_percentiles(summary):
    """SGLang #32724's IO done -> scheduled, over the requests whose prefetch was issued
    (lags 3, 2, 1; the one without a prefetch, lag 0, is left out)."""
    r = row(summary, "pr27010", "wait_complete")
    assert r.prefetch_sched_lag_p50_ms == 2.0
    assert r.prefetch_sched_lag_p95_ms == pytest.approx(2.9)  # 2 + 0.9 * 1
    assert r.prefetch_sched_lag_p99_ms == pytest.approx(2.98)


def test_ttft_percentiles_nearest_rank():
    r = row(summarize(requests_frame(), steps_frame(), "nearest-rank"), "pr27010",
            "wait_complete")
    assert (r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms) == (80.0, 120.0, 120.0)
    assert r.percentile_method == "nearest-rank"


def test_ratio_vs_reference(summary):
    r = row(summary, "pr36425", "wait_complete")
    # Per repeat, median over median: repeat 0 65 / 75, repeat 1 80 / 100; the point is
    # their geometric mean, and two repeats are too few for an interval.
    assert r.ttft_p50_ratio_per_repeat == "0.8667;0.8000"
    assert r.ttft_p50_ratio_vs_pr27010 == pytest.approx(math.sqrt(65 / 75 * 0.8))
    assert math.isnan(r.ttft_p50_ratio_ci_low) and math.isnan(r.ttft_p50_ratio_ci_high)
    assert r.ttft_p50_ratio_repeats == 2
    assert "too few repeats for an interval (2 paired, needs 3)" in r.interval_note
    ref = row(summary, "pr27010", "wait_complete")
    assert ref.ttft_p50_ratio_vs_pr27010 == 1.0
    assert ref.ttft_p50_ratio_per_repeat == "1.0000;1.0000"


def test_no_reference_group_leaves_ratio_empty(summary):
    r = row(summary, "pr36425", "timeout")
    assert math.isnan(r.ttft_p50_ratio_vs_pr27010)
    assert math.isnan(r.ttft_p50_ratio_ci_low) and math.isnan(r.ttft_p50_ratio_ci_high)
    assert pd.isna(r.ttft_p50_ratio_per_repeat)


def test_correctness_columns(summary):
    assert row(summary, "pr27010", "wait_complete").ranks_agree
    assert row(summary, "pr27010", "wait_complete").data_errors == 0
    assert row(summary, "pr36425", "wait_complete").data_errors == 1
    assert not row(summary, "pr36425", "timeout").ranks_agree


def test_expected_counts_per_request():
    exp = expected_counts(requests_frame())
    assert exp["decision"].tolist() == [3, 0, 2, 1, 0, 0, 0, 0, 2]
    assert exp["background"].tolist() == [2, 0, 2, 3, 2, 0, 2, 3, 2]


def test_csv_round_trip_gives_the_same_summary(tmp_path, summary):
    requests_frame().to_csv(tmp_path / "requests.csv", index=False)
    steps_frame().to_csv(tmp_path / "steps.csv", index=False)
    again = summarize(pd.read_csv(tmp_path / "requests.csv"),
                      pd.read_csv(tmp_path / "steps.csv"))
    pd.testing.assert_frame_equal(again, summary, check_dtype=False)


def test_bad_method():
    with pytest.raises(ValueError):
        summarize(requests_frame(), steps_frame(), "midpoint")


def test_format_table(summary):
    """Too wide for a terminal whole, the table stacks in column groups, each led by
    protocol and policy, no line over 120 characters."""
    text = format_table(summary)
    lines = text.splitlines()
    assert len(lines) == 2 * (1 + len(summary)) and max(map(len, lines)) <= 120
    first, second = lines[:4], lines[4:]
    assert first[0].split()[:2] == second[0].split()[:2] == ["protocol", "policy"]
    for header in TABLE_HEADERS:
        assert header in first[0] + " " + second[0]
    assert "0.833 [" in second[2]  # ratio with its CI
    assert second[3].split()[-2:] == ["NO", "0"]  # timeout row: ranks disagreed
    assert "-" in second[3].split()  # its ratio is unknown


def test_table_shows_config_columns_only_when_they_vary(summary):
    assert "rate_rps" not in format_table(summary).splitlines()[0]
    frame = requests_frame()
    frame.loc[frame.policy == "timeout", "rate_rps"] = 16.0
    header = format_table(summarize(frame, steps_frame())).splitlines()[0].split()
    assert header[:5] == ["protocol", "policy", "tp", "pp", "rate_rps"]


def test_expected_counts_on_the_ticket_path_and_for_runs_before_host_memory():
    """sglang-0.5.23, buffer_only, TP2 x PP2, 4 polls of 10 pages: 4 decisions; background
    hit MIN 2 + one ack 2 + the ticket 1. A run without the column is "cache": no ticket."""
    kw = dict(pp=2, host_memory="buffer_only", ticket_collectives=1, hit_query_collectives=2)
    rows = pd.DataFrame([req(("sglang-0.5.23", "wait_complete", 0, "a"), 90, 4, 4, 640, 2, **kw)],
                        columns=REQUEST_COLUMNS)
    e = expected_counts(rows)
    assert (e["decision"].iloc[0], e["background"].iloc[0]) == (4, 5)
    old = rows.drop(columns=["host_memory", "ticket_collectives"])
    e = expected_counts(old)
    assert (e["decision"].iloc[0], e["background"].iloc[0]) == (0, 4)
    assert summarize(rows, pd.DataFrame(columns=STEP_COLUMNS)).iloc[0][
        "background_collectives_per_req"] == 5


def test_table_cells_carry_their_own_columns(summary):
    """Every cell of the human table is its column's value, in its format."""
    headers = table_headers(summary)
    for r, cells in zip(summary.itertuples(), table_rows(summary), strict=True):
        got = dict(zip(headers, cells, strict=True))
        assert got["protocol"] == r.protocol and got["policy"] == r.policy
        assert (got["tp"], got["pp"]) == (str(r.tp), str(r.pp))
        assert got["polls/req"] == f"{r.polls_per_req:.3f}"
        assert got["decision/req"] == f"{r.decision_collectives_per_req:.3f}"
        assert got["expected"] == f"{r.expected_decision_collectives_per_req:.3f}"
        assert got["critical/req"] == f"{r.critical_collectives_per_req:.3f}"
        assert got["background/req"] == f"{r.background_collectives_per_req:.3f}"
        for q in ("p50", "p90", "p99"):
            assert got[f"{q}_ms"] == f"{getattr(r, f'ttft_{q}_ms'):.1f}"
        assert got["data_err"] == str(r.data_errors)
        if math.isnan(r.ttft_p50_ratio_vs_pr27010):
            assert got["ratio [95% ci]"] == "-"
        elif math.isnan(r.ttft_p50_ratio_ci_low):  # too few repeats: the point alone
            assert got["ratio [95% ci]"] == f"{r.ttft_p50_ratio_vs_pr27010:.3f} [no CI]"
        else:
            assert got["ratio [95% ci]"] == (f"{r.ttft_p50_ratio_vs_pr27010:.3f} "
                                             f"[{r.ttft_p50_ratio_ci_low:.3f}, "
                                             f"{r.ttft_p50_ratio_ci_high:.3f}]")
    pr27 = dict(zip(headers, table_rows(summary)[0], strict=True))
    assert pr27["step/step"] == "6.000" and pr27["agree"] == "yes"


@pytest.mark.parametrize(("agree", "unexplained", "cell"), [
    (True, 0, "yes"), (False, 0, "stages"), (False, 2, "NO"), (False, None, "NO")])
def test_agree_cell(summary, agree, unexplained, cell):
    """yes; "stages" when the only disagreements are pre27010's known PP-stage hazard."""
    frame = summary.head(1).copy()
    frame["ranks_agree"] = agree
    if unexplained is None:
        frame = frame.drop(columns=["unexplained_disagreements"], errors="ignore")
    else:
        frame["unexplained_disagreements"] = unexplained
    assert dict(zip(table_headers(frame), table_rows(frame)[0], strict=True))["agree"] == cell


def test_format_table_aligns_names_left_and_numbers_right(summary):
    lines = format_table(summary).splitlines()
    assert lines[0].startswith("protocol  policy") and lines[1].startswith("pr27010 ")
    for group in (lines[:4], lines[4:]):  # each group's last column right-aligned: one edge
        assert len({len(line) for line in group}) == 1
    assert lines[1].index("wait_complete") == lines[0].index("policy")  # names left-aligned
