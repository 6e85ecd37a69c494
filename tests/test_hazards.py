"""`bench hazards`: the classification of a cell from its ranks' reports (hand-written
reports, no process group), bad input, and a subset of the matrix run twice on real gloo
groups (each outcome repeats; a deadlock is named within two collective timeouts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.commands.hazards import main
from bench.hazards.classify import classify, first_divergence
from bench.hazards.matrix import MatrixSpec, run_one
from bench.hazards.scenarios import SCENARIOS

GROUPS = {"tp_cpu": [0, 1], "ticket": [0, 1]}


def rep(rank: int, records=(), sequence=(), error=None, data_errors=0, steps=None,
        decisions=None) -> dict:
    return {"rank": rank, "records": list(records), "sequence": [list(c) for c in sequence],
            "record_steps": list(steps or [0] * len(records)), "group_ranks": GROUPS,
            "error": error, "recent": [], "data_errors": data_errors,
            "decisions": decisions or {}, "steps": 5}


def test_first_divergence_ignores_a_shorter_log():
    assert first_divergence([["a", "b"], ["a"]]) is None
    assert first_divergence([["a", "b", "c"], ["a", "x"]]) == (1, ["b", "x"])


def test_agreeing_ranks_are_ok():
    seq = [("tp_cpu", "per_step_min", None, 0), ("tp_cpu", "decision", "r1", 1)]
    assert classify([rep(0, ["p", "t"], seq), rep(1, ["p", "t"], seq)])["outcome"] == "OK"


def test_unpaired_collective_is_a_deadlock_even_when_gloo_paired_it():
    """Rank 0 polls r1 where rank 1 polls r2 (same size: gloo pairs them, no error)."""
    a = [("tp_cpu", "per_step_min", None, 3), ("tp_cpu", "decision", "r1", 3)]
    b = [("tp_cpu", "per_step_min", None, 3), ("tp_cpu", "decision", "r2", 3)]
    row = classify([rep(0, sequence=a), rep(1, sequence=b)])
    assert (row["outcome"], row["site"], row["step"]) == ("deadlock", "decision", 3)
    assert "rank 0: decision(r1)" in row["detail"] and "rank 1: decision(r2)" in row["detail"]


def test_a_receiver_that_does_not_know_the_request_is_not_unpaired():
    a, b = [("ticket", "ticket", "r1", 0)], [("ticket", "ticket", None, 0)]
    assert classify([rep(0, sequence=a), rep(1, sequence=b)])["outcome"] == "OK"


def test_the_earlier_finding_wins():
    """The ranks answered a poll differently at step 1, then paired wrongly at step 4."""
    a = [("tp_cpu", "decision", "r1", 4)]
    b = [("tp_cpu", "decision", "r2", 4)]
    row = classify([rep(0, ["p", "-> False"], a, steps=[1, 1]),
                    rep(1, ["p", "-> True"], b, steps=[1, 1])])
    assert (row["outcome"], row["step"]) == ("divergence", 1)


def test_failed_collective_is_named():
    err = ("CollectiveError: collective at call site 'decision' on group 'tp_cpu' (ranks "
           "[0, 1]) failed on rank 0 at step 7 for request r3: timed out")
    row = classify([rep(0, error=err), rep(1)])
    assert (row["outcome"], row["site"], row["step"]) == ("deadlock", "decision", 7)
    assert "(r3)" in row["detail"]


def test_missing_report_is_the_harness_an_aborted_rank_its_journal():
    assert classify([rep(0), None])["outcome"] == "harness"
    assert "rank 1: killed at the cell's bound" in classify([rep(0), None])["detail"]
    assert classify([rep(0), {**rep(1), "aborted": -6}])["outcome"] == "deadlock"
    # its journal still shows the divergence that came first
    row = classify([rep(0, ["p", "-> False"]), {**rep(1, ["p", "-> True"]), "aborted": -6}])
    assert row["outcome"] == "divergence" and "rank 1 (exit -6) aborted" in row["detail"]


def test_corrupt_pages_and_late_disagreement():
    assert classify([rep(0, data_errors=3), rep(1)])["outcome"] == "corrupt"
    row = classify([rep(0, decisions={"r1": ["poll", 64, 512]}),
                    rep(1, decisions={"r1": ["poll", 0, 512]})])
    assert row["outcome"] == "divergence" and "r1" in row["detail"]


@pytest.mark.parametrize("argv", [["--scenarios", "nope"], ["--scenarios", "pp-stages", "--pp",
                                                            "1"], ["--protocols", "x"],
                                  ["--collective-timeout", "0"]])
def test_bad_input_is_one_line_and_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench hazards: ")


# (scenario, protocol, outcome) a subset of the matrix: one of each outcome.
SUBSET = [("ongoing-skew", "pr36425", "deadlock"), ("ongoing-skew", "pr38284", "divergence"),
          ("walk-skew", "pr36425", "deadlock"), ("sidecar-race", "pre27010", "corrupt"),
          ("sidecar-race", "pr32725", "OK")]


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory) -> tuple[MatrixSpec, list[dict]]:
    """Each cell of the subset run once (the fast tier's check; the slow tier runs it again)."""
    spec = MatrixSpec((), (), seed=0, timeout_s=2.0, out=tmp_path_factory.mktemp("hazards"))
    return spec, [run_one(spec, SCENARIOS[scenario], protocol) for scenario, protocol, _ in SUBSET]


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_subset_names_each_outcome_and_deadlocks_in_time(first_runs):
    spec, rows = first_runs
    for (scenario, protocol, want), first in zip(SUBSET, rows, strict=True):
        assert first["outcome"] == want, (scenario, protocol, first)
        if want == "deadlock":
            assert first["named_s"] is not None and first["named_s"] <= 2 * spec.timeout_s
            assert "1" in first["exit_codes"]  # a failed rank exits nonzero
            assert (spec.out / "cells" / f"{scenario}__{protocol}" / "rank0.json").exists()
        if want == "OK":
            assert first["decision_per_poll"] == 0.0  # wait_complete: pr36425's free poll


# Slow: a second serve of every cell (about half this file's time); the fast tier checks
# each outcome once above.
@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(240)
def test_subset_is_deterministic(first_runs):
    spec, rows = first_runs
    for (scenario, protocol, want), first in zip(SUBSET, rows, strict=True):
        second = run_one(spec, SCENARIOS[scenario], protocol, tag="__again")
        assert first["outcome"] == second["outcome"] == want, (scenario, protocol, second)
        assert first["site"] == second["site"]


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_the_verb_writes_its_files(tmp_path: Path, capsys):
    out = tmp_path / "run"
    assert main(["--protocols", "pre27010,pr36425", "--scenarios", "sidecar-race",
                 "--out", str(out)]) == 0
    for name in ("hazards.csv", "hazards.md", "hazards.png", "env.json"):
        assert (out / name).exists(), name
    text = (out / "hazards.md").read_text()
    assert "| sidecar-race (#27550) | **corrupt** load_back | OK 0/poll 1/step |" in text
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("bench hazards: OK")


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_span_skew_aborts_0523_with_both_sizes_and_pr39267_is_ok(tmp_path: Path):
    """SGLang PR #39267's report at TP 2 x PP 2: 0.5.23's hit-query masks sized by each
    stage's own span (40 and 48 elements); gloo aborts stage 0's ranks, whose peers name
    the hit query; twice the same. pr39267's fixed-size first reduction pairs: OK, with
    its cost."""
    spec = MatrixSpec((), (), seed=0, timeout_s=2.0, out=tmp_path)
    s = SCENARIOS["span-skew"]
    first, second = (run_one(spec, s, "sglang-0.5.23", tag=t) for t in ("", "__again"))
    for row in (first, second):
        assert (row["outcome"], row["site"]) == ("abort", "hit_query"), row
        assert "prefetch_pp" in row["detail"] and "48 vs 40 bytes" in row["detail"]
        assert row["exit_codes"].split()[:2] == ["-6", "-6"]
        # how long the peers sat before naming it is a latency: absent where the abort took
        # them first (a loaded fresh-clone CI), never beyond the bound where present
        assert row["named_s"] is None or row["named_s"] <= 2 * spec.timeout_s
    ok = run_one(spec, s, "pr39267")
    assert ok["outcome"] == "OK" and ok["decision_per_poll"] == 0.0, ok



def test_a_gloo_abort_names_the_collective_the_peer_died_in():
    """Survivors failing only at the next request broadcast: the background thread's
    failed collective is the site; with gloo's size message the outcome is an abort. A
    scheduler collective that failed itself keeps its name."""
    bcast = ("CollectiveError: collective at call site 'request_broadcast' on group 'sched' "
             "(ranks [0, 1]) failed on rank 1 at step 1: Connection reset by peer")
    hit = ("CollectiveError: collective at call site 'hit_query' on group 'prefetch_pp' "
           "(ranks [0, 1]) failed on rank 1 at step 1 for request r00: Connection reset")
    dead = {**rep(0), "aborted": -6, "gloo": "op.preamble.length <= op.nbytes: 48 vs 40 bytes"}
    row = classify([dead, {**rep(1, error=bcast), "thread_error": hit}])
    assert (row["outcome"], row["site"]) == ("abort", "hit_query")
    assert "48 vs 40 bytes" in row["detail"]
    decision = bcast.replace("'request_broadcast' on group 'sched'", "'decision' on group "
                             "'tp_cpu'")
    row = classify([dead, {**rep(1, error=decision), "thread_error": hit}])
    assert (row["outcome"], row["site"]) == ("abort", "decision")
    cascade = bcast.replace("'request_broadcast' on group 'sched'", "'model_allreduce' on "
                            "group 'data'").replace("[0, 1]", "[1, 2]")
    row = classify([dead, {**rep(1, error=cascade), "thread_error": hit}])
    assert (row["outcome"], row["site"]) == ("abort", "hit_query")
    row = classify([{**dead, "gloo": None}, {**rep(1, error=bcast), "thread_error": hit}])
    assert (row["outcome"], row["site"]) == ("deadlock", "request_broadcast")


def test_a_rank_without_a_report_is_named_by_what_the_launcher_heard():
    from bench.hazards.matrix import unreported

    got = {0: (1.0, "error", "DistNetworkError: address already in use"), 1: (1.0, "ok", {})}
    heard = unreported(got, {2: (-9, 2.0)}, 84.0, 4)
    assert heard == {0: "failed: DistNetworkError: address already in use", 1: "ended",
                     2: "died with exit code -9",
                     3: "still running at the cell's bound (84 s), killed"}
    row = classify([None, rep(1), rep(2), None], heard)
    assert row["outcome"] == "harness" and row["detail"] == (
        "rank(s) [0, 3] wrote no report (rank 0: failed: DistNetworkError: address already "
        "in use; rank 3: still running at the cell's bound (84 s), killed)")


def test_an_abort_in_sglangs_own_collective_is_named_by_the_site_it_plays():
    """early-return under --cache sglang: gloo aborts rank 1; rank 0 failed in SGLang's
    decision MAX (sglang_adapter.decisions.cache names the harness site it plays). Whether rank 0's
    ack thread failed too is a race; the outcome is an abort at the decision either way."""
    sglang = ("CollectiveError: SGLang's collective all_reduce at mem_cache/unified_radix_"
              "cache.py:_all_reduce_attn_groups:359 < _all_reduce:386 < _can_terminate_"
              "prefetch:2311 < check_prefetch_progress:2405, call site 'decision' on group "
              "'tp_cpu' (ranks [0, 1]) failed on rank 0 at step 2 for request r02: reset")
    ack = ("CollectiveError: collective at call site 'ack' on group 'ack' (ranks [0, 1]) "
           "failed on rank 0 at step 2 for request r01: Connection reset by peer")
    dead = {**rep(1), "aborted": -6, "gloo": "op.preamble.length <= op.nbytes: 8 vs 4 bytes"}
    for thread in (None, ack):
        row = classify([{**rep(0, error=sglang), "thread_error": thread}, dead])
        assert (row["outcome"], row["site"], row["step"]) == ("abort", "decision", 2), row


def test_an_sglang_the_rig_cannot_drive_in_the_cell_is_the_harness():
    """0.5.20 has no PP-ticket path: a buffer_only cell at PP > 1 is one the harness could
    not run (exit 3), whatever its peers' collectives did after."""
    unfit = {**rep(0, error="LoadError: sglang 0.5.20: cannot drive a buffer_only prefetch "
                            "at PP > 1: no PP-ticket path (PPPrefetchState)"),
             "error_kind": "LoadError"}
    row = classify([unfit, rep(1, error="CollectiveError: collective at call site 'decision' "
                                        "on group 'tp_cpu' (ranks [0, 1]) failed on rank 1 "
                                        "at step 0: reset")])
    assert row["outcome"] == "harness" and "no PP-ticket path" in row["detail"], row
