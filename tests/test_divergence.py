"""Divergence made visible: loop-count divergence (SGLang #30760), PP divergence (#22607),
the end-of-run decision comparison and the online rank-consensus checker.

Skewed walk (SKEW): TP2, rank 1's walk horizon is 10% of the batch budget (budget_skew 0.9).
Twelve requests with 1024-token prefixes arrive at once and every read takes 20 ms, so at
some step the front request is ready while later ones are still prefetching: rank 0 walks
on and polls them, rank 1 stops after the first. Any collective inside the poll then pairs
with a different call on the other rank.

What happens, per protocol (asserted below):
- pr27010 (every policy), pre27010 and pr36425 + timeout: the mispaired collective blocks
  until the group timeout; the launch fails naming call site, group, ranks and step.
- step-batched, step-clock (timeout, wait_complete) and pr36425 + wait_complete: the run
  completes and every request's decision agrees, although the walks differ.
- pr36425 / step-batched / step-clock + best_effort: no collective in the poll, but a
  best_effort poll ends the prefetch at the step the rank's walk reaches it, so ranks end
  the same request differently (revoked before its hit was agreed on one rank, cut at 0
  tokens with IO issued on the other); the IO issued on one rank only then leaves an ack
  that no other rank pairs, and the run fails after its last step.
- with consensus_check on, the checker flags every skewed run (call sequences differ),
  even where the decisions agree.
"""

from __future__ import annotations

import re

import pytest

from hicache.agreement.consensus import compare_decisions, describe_disagreements, disagreements
from tests.fault_helpers import (
    capturing_scenario,
    consensus_probe,
    launch_timed,
    stamped_scenario,
)
from tests.helpers import case, run_cases

T = 5.0  # collective timeout in these tests (the product default is 60 s)
SLACK_S = 12.0  # group set-up, populate and the steps before the divergence, on a busy box
SKEW = {"tp": 2, "budget_skew": 0.9, "collective_timeout_s": T}
SKEW_STORAGE = {"latency_ms": 20.0}
SKEW_LOAD = {"n": 12, "prefix_tokens": 1024, "new_tokens": 1024, "gap_s": 0.0}
SITE_RE = re.compile(r"call site '(\w+)' on group '(\w+)' \(ranks \[0, 1\]\) failed on "
                     r"rank ([01]) at step (\d+)")


def _skew_args(protocol: str, policy: str, **extra) -> tuple:
    load = SKEW_LOAD
    return ({**SKEW, "protocol": protocol, "policy": policy, **extra}, SKEW_STORAGE,
            load["n"], load["prefix_tokens"], load["new_tokens"], load["gap_s"])


def _walks_differ(per_rank: list[dict]) -> bool:
    return len({tuple(s["polled"] for s in res["steps"]) for res in per_rank}) > 1


# ---- the end-of-run comparison, on hand-built logs -------------------------------------------

def test_compare_decisions_agreeing_logs():
    logs = [{"r0": ("ack", 512, 512), "r1": ("poll", 0, 512)}] * 3
    assert compare_decisions(logs) == ({"r0": True, "r1": True}, None)
    assert disagreements(logs) == {}


def test_compare_decisions_names_the_first_disagreement():
    logs = [{"r0": ("ack", 512, 512), "r1": ("poll", 256, 512)},
            {"r0": ("ack", 512, 512), "r1": ("poll", 128, 512)}]
    agree, first = compare_decisions(logs)
    assert agree == {"r0": True, "r1": False}
    assert first == "request r1: rank 0=('poll', 256, 512), rank 1=('poll', 128, 512)"


def test_compare_decisions_request_missing_on_one_rank_disagrees():
    logs = [{"r0": ("ack", 512, 512), "r1": ("revoked", 0, None)}, {"r0": ("ack", 512, 512)}]
    agree, first = compare_decisions(logs)
    assert agree == {"r0": True, "r1": False}
    assert first == "request r1: rank 0=('revoked', 0, None), rank 1=None"
    assert disagreements(logs) == {"r1": [(("revoked", 0, None), [0]), (None, [1])]}


def test_compare_decisions_no_logs_and_no_requests():
    assert compare_decisions([]) == ({}, None)
    assert compare_decisions([{}, {}]) == ({}, None)


def test_describe_disagreements_names_pp_stages_and_split_tp_ranks():
    a, b = ("poll", 4096, 8192), ("poll", 2048, 8192)
    logs = [{"r0": a, "r1": a}, {"r0": a, "r1": a}, {"r0": b, "r1": a}, {"r0": b}]
    assert describe_disagreements(logs, tp=2) == [
        f"request r0: ranks [0, 1] (PP stage 0) = {a}; ranks [2, 3] (PP stage 1) = {b}",
        f"request r1: ranks [0, 1, 2] (stage 0 tp 0, stage 0 tp 1, stage 1 tp 0) = {a}; "
        "ranks [3] (stage 1 tp 1) = None"]
    one_stage = [f"request r0: ranks [0, 1] = {a}; ranks [2, 3] = None",
                 f"request r1: ranks [0, 1] = {a}; ranks [2, 3] = None"]
    assert describe_disagreements(logs[:2] + [{}, {}], tp=4) == one_stage
    assert describe_disagreements(logs[:2] + [{}, {}]) == one_stage


# ---- loop-count divergence ----------------------------------------------------------------

FAILING = [
    ("pr27010", "timeout"), ("pr36425", "timeout"),
    pytest.param("pr27010", "best_effort", marks=pytest.mark.slow),
    pytest.param("pr27010", "wait_complete", marks=pytest.mark.slow),
    pytest.param("pre27010", "timeout", marks=pytest.mark.slow),
]


@pytest.mark.dist
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("protocol", "policy"), FAILING)
def test_collective_in_the_poll_fails_fast_and_names_it(tmp_path, protocol, policy):
    out = launch_timed(2, stamped_scenario, _skew_args(protocol, policy), str(tmp_path),
                       timeout_s=45)
    if out.error is None:
        # The mispaired collectives happened to complete: the comparison must catch it.
        agree, first = compare_decisions([res["decisions"] for res in out.results])
        assert not all(agree.values()), "walks diverged and nothing noticed"
        return
    m = SITE_RE.search(out.error)
    assert m, out.error
    print(f"{protocol}/{policy}: detected {out.run_s:.2f}s after the ranks started "
          f"({out.wall_s:.2f}s wall), site {m[1]} on {m[2]}, rank {m[3]}, step {m[4]}")
    assert out.run_s < T + SLACK_S

SURVIVING = [("step-batched", "timeout"), ("step-clock", "timeout"),
             ("pr36425", "wait_complete")]
SURVIVING_SLOW = [("step-batched", "wait_complete"), ("step-clock", "wait_complete")]


def _check_survivors(pairs: list[tuple[str, str]], per_case: list[list[dict]]) -> None:
    for (p, q), per_rank in zip(pairs, per_case, strict=True):
        assert _walks_differ(per_rank), f"{p}/{q}: the skew did not change the walk"
        for res in per_rank:
            assert all(r["first_token"] is not None for r in res["rows"]), f"{p}/{q}"
            assert all(r["data_errors"] == 0 for r in res["rows"]), f"{p}/{q}"
        agree, first = compare_decisions([res["decisions"] for res in per_rank])
        assert len(agree) == SKEW_LOAD["n"] and all(agree.values()), f"{p}/{q}: {first}"


def _skew_case(protocol: str, policy: str) -> dict:
    return case({**SKEW, "protocol": protocol, "policy": policy}, SKEW_STORAGE, **SKEW_LOAD)


@pytest.mark.dist
@pytest.mark.timeout(90)
def test_no_collective_in_the_poll_survives_the_skew_and_the_checker_passes_a_clean_run():
    # One launch (start-up is the expensive part): the skewed runs that must survive, then
    # an unskewed run with the online consensus checker on, which must pass.
    checked = case({"protocol": "pr36425", "policy": "timeout", "tp": 2,
                    "consensus_check": True, "consensus_interval_s": 0.01,
                    "collective_timeout_s": T}, {"latency_ms": 10.0}, n=8)
    *skewed, clean = run_cases(2, [*(_skew_case(p, q) for p, q in SURVIVING), checked],
                               timeout_s=75)
    _check_survivors(SURVIVING, skewed)
    agree, first = compare_decisions([res["decisions"] for res in clean])
    assert all(agree.values()), first
    assert all(res["by_site"].get("consensus", 0) >= 3 for res in clean), "checker idle"


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_no_collective_in_the_poll_survives_the_skew_wait_complete():
    cases = [_skew_case(p, q) for p, q in SURVIVING_SLOW]
    _check_survivors(SURVIVING_SLOW, run_cases(2, cases, timeout_s=75))


# step-batched and step-clock take pr36425's best_effort path (no step-level decision): the
# slow run of step-clock shows the finding holds for them too.
BEST_EFFORT = ["pr36425", pytest.param("step-clock", marks=pytest.mark.slow)]


@pytest.mark.dist
@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", BEST_EFFORT)
def test_best_effort_under_skew_ends_requests_differently(tmp_path, protocol):
    """A finding, not a wish: best_effort has no collective in the poll, but the poll ends
    the prefetch at whatever step each rank's walk reaches it."""
    out = launch_timed(2, capturing_scenario, _skew_args(protocol, "best_effort"),
                       str(tmp_path), timeout_s=45)
    assert out.error is None, out.error
    logs = [res["decisions"] for res in out.results]
    agree, first = compare_decisions(logs)
    assert not all(agree.values()), "expected the skewed best_effort polls to disagree"
    split = disagreements(logs)
    print(f"{protocol}/best_effort:", *describe_disagreements(logs), sep="\n  ")
    # Typically r001: rank 0 polls it at step 0, before any hit query is agreed (hit None),
    # rank 1 a step later. Rank 0's terminated op still joins the hit MIN with 0 pages (as
    # SGLang does), so usually rank 1 revokes it too; but when rank 1 had its IO issued
    # first, acks the other rank never pairs fail the run after its last step, naming the
    # ack site.
    one_sided = [rid for rid, groups in split.items()
                 if sum(d is not None and d[2] is None for d, _ in groups) == 1
                 and any(d is not None and d[0] != "revoked" and d[2] for d, _ in groups)]
    errors = [res["error"] for res in out.results if res["error"]]
    if one_sided:
        assert errors and all("call site 'ack'" in e for e in errors), errors
    else:  # every prefetch revoked on both sides or none: nothing is left unpaired
        assert not errors, errors
    print(f"  errors: {[e[:150] for e in errors]}")


# ---- PP divergence (4 ranks) --------------------------------------------------------------

# 16-token pages (a 128-page read batch is 2048 tokens), 8192-token prefixes (4 batches),
# 30 ms reads and a timeout that lands in the middle of the IO: each PP stage stops at its own
# progress unless stage 0 decides for all. Storage seed 40 draws per-rank slowdowns (jitter)
# of about 1.1x on stage 0's ranks and up to 2x on stage 1's, so the stages' progress differs
# on most requests, not by luck.
PP = {"tp": 2, "pp": 2, "policy": "timeout", "page_size": 16, "timeout_base_s": 0.15,
      "timeout_per_ki_token_s": 0.0, "collective_timeout_s": 10.0}
PP_STORAGE = {"latency_ms": 30.0, "jitter": 1.0, "seed": 40}
PP_LOAD = {"n": 6, "prefix_tokens": 8192, "new_tokens": 64, "gap_s": 0.3}
PP_AGREEING = ["pr27010", "pr36425", "step-clock"]


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pp_stages_disagree_before_27010_and_agree_after():
    protocols = ["pre27010", *PP_AGREEING]
    cases = [case({**PP, "protocol": p}, PP_STORAGE, **PP_LOAD) for p in protocols]
    results = dict(zip(protocols, run_cases(4, cases, timeout_s=100), strict=True))
    logs = [res["decisions"] for res in results["pre27010"]]
    split = disagreements(logs)
    assert split, "pre27010: expected the PP stages to end some prefetch differently"
    for rid, groups in split.items():
        # TP ranks of a stage agree (pre27010's TP MIN); the stages do not.
        assert sorted(sorted(ranks) for _, ranks in groups) == [[0, 1], [2, 3]], rid
    lines = describe_disagreements(logs, tp=2)
    assert all("(PP stage 0)" in line and "(PP stage 1)" in line for line in lines), lines
    print("pre27010 TP2xPP2:", *lines, sep="\n  ")
    for p in PP_AGREEING:
        agree, first = compare_decisions([res["decisions"] for res in results[p]])
        assert len(agree) == PP_LOAD["n"] and all(agree.values()), f"{p}: {first}"


# ---- the online consensus checker ---------------------------------------------------------

@pytest.mark.dist
@pytest.mark.timeout(60)
def test_consensus_checker_catches_injected_divergence():
    from tests.helpers import launch

    variants = ["same", "different", "extra", "late"]
    per_rank = launch(2, consensus_probe, (variants, T), timeout_s=45)
    for rank, (same, different, extra, late) in enumerate(per_rank):
        assert same is None and late is None, (rank, same, late)
        assert different.startswith("ConsensusError: ranks diverged within the first"), different
        assert extra == "ConsensusError: ranks recorded different numbers of calls (20 vs 21)"


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_consensus_checker_flags_the_skewed_walk_even_where_decisions_agree(tmp_path):
    # pr36425 + wait_complete survives the skew (decisions agree), but rank 0 polls pending
    # requests that rank 1 never reaches: the recorded call sequences differ.
    out = launch_timed(2, stamped_scenario,
                       _skew_args("pr36425", "wait_complete", consensus_check=True,
                                  consensus_interval_s=0.01), str(tmp_path), timeout_s=45)
    assert out.error is not None and "ConsensusError: ranks diverged" in out.error, out.error
    print(f"consensus check on the skewed walk: failed after {out.run_s:.2f}s: {out.error}")
