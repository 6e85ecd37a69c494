"""pr39903 (SGLang PR #39903, closed): check_hicache_events' agreement issued async at the
end of a step and waited on at the next.

By hand: the same collectives as pr36425 at the same step (so the count contract's numbers
are pr36425's, request by request and per step), torch's sequence numbers and the flight
recorder agree with the counter for the async all-reduce too; what the agreement lets
through (a hit query's result, an ack, a finished copy) is seen one step later.
"""

from __future__ import annotations

import pytest

from hicache.agreement.protocols import make_protocol
from hicache.agreement.step_agreement import SGLANG_0_5_19
from hicache.spec.cost_model import Setting, decision_per_poll, expected_per_request, per_step
from tests.helpers import case, run_cases
from tests.test_counts import FAST_TIMEOUT, N_REQUESTS, PREFIX, STORAGE, WRITE_THROUGH
from tests.test_counts import _check_layout as check_contract
from tests.test_pinned import STEP


def test_agree_later_issues_every_reduction_at_once_and_unpacks_on_wait():
    """0.5.19's shape at PP 2: two relayed reductions, both issued by the call, waited on
    (in order) only by the function it returns."""
    issued, waited = [], []

    def start(packed, relay):
        issued.append((list(packed), relay))
        return lambda: waited.append(len(issued)) or [v - 1 for v in packed]

    values = {"head": [0, 5], "loads": [0], "queues": [3, 4]}
    finish = SGLANG_0_5_19.agree_later(values, 2, start)
    assert issued == [([0, 5, 0], True), ([3, 4], True)] and waited == []
    assert finish() == {"head": [-1, 4], "loads": [-1], "queues": [2, 3]}
    assert waited == [2, 2]


@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_counts_are_pr36425s_by_hand(policy):
    """Per poll 0 / 0 / T + P, per step one TP MIN at TP2; at TP2 x PP2 stage 0 issues two
    TP MINs and two sends a step, stage 1 two receives (0.5.19's shape, unchanged)."""
    assert make_protocol("pr39903", policy).pipelined
    want = {"best_effort": ((0, 0), (0, 0)), "wait_complete": ((0, 0), (0, 0)),
            "timeout": ((1, 0), (1, 1))}[policy]
    assert (decision_per_poll("pr39903", policy, 2, 1),
            decision_per_poll("pr39903", policy, 2, 2)) == want
    assert per_step("pr39903", 2, 1) == (1, 0)
    assert per_step("pr39903", 2, 2, 0) == (2, 2) and per_step("pr39903", 2, 2, 1) == (0, 2)
    # 3 polls, 8 pages: hit query T + P, one ack T + P, decisions as pr36425's.
    e = expected_per_request(Setting("pr39903", policy, 2, 2), 3, 8, True, True)
    assert (e.hit_query, e.ack) == (2, 2)
    assert (e.decision, e.pp_hops) == (3 * want[1][0], 3 * want[1][1])


# ---- on real gloo groups -------------------------------------------------------------------

VARIANTS = [("pr39903", "wait_complete", ""), ("pr39903", "timeout", ""),
            ("pr39903", "timeout", "fast"), ("pr39903", "wait_complete", "wt")]
PINNED = {"schedule": "pinned", "step_time": STEP}


def _cases(tp: int, pp: int) -> list[dict]:
    return [case({"protocol": p, "policy": q, "tp": tp, "pp": pp,
                  **(FAST_TIMEOUT if v == "fast" else {}),
                  **(WRITE_THROUGH if v == "wt" else {})}, STORAGE, n=N_REQUESTS,
                 prefix_tokens=PREFIX, new_tokens=64)
            for p, q, v in VARIANTS if not (pp > 1 and v == "wt")]


@pytest.fixture(scope="module")
def tp2():
    return dict(zip(VARIANTS, run_cases(2, _cases(2, 1), timeout_s=100, flight_recorder=True),
                    strict=True))


@pytest.mark.dist
@pytest.mark.timeout(150)
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(x for x in v if x))
def test_contract_tp2(tp2, variant):
    """Request by request and call site, the cost model's counts; the counter equals
    torch's sequence numbers and the flight recorder on every group (the async
    all-reduce is counted when issued); one per-step MIN issued every step."""
    check_contract(tp2, variant, 2, 1)
    for res in tp2[variant]:
        assert all(s.get("coll_per_step_min", 0) == 1 for s in res["steps"])


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_contract_tp2pp2():
    """TP2 x PP2 by hand: per request as the cost model; per step stage 0 issues two TP
    MINs (the relayed reductions) and stage 1 none; the relays (two sends on stage 0, two
    receives on stage 1) are taken when the reductions are waited on, a step later, so
    over the serve (the last wait is after the last step) they total two a step, per step
    besides the polls' hops."""
    variants = [v for v in VARIANTS if v[2] != "wt"]
    results = dict(zip(variants, run_cases(4, _cases(2, 2), timeout_s=150,
                                           flight_recorder=True), strict=True))
    for variant in variants:
        check_contract(results, variant, 2, 2)
        hop_per_poll = decision_per_poll("pr39903", variant[1], 2, 2)[1]
        for res in results[variant]:
            stage = res["layout"][1]
            steps = res["steps"]
            assert all(s.get("coll_per_step_min", 0) == (2 if stage == 0 else 0)
                       for s in steps)
            relays = sum(s.get("coll_pp_hop", 0) - (s["polled"] + s["polled_extra"])
                         * hop_per_poll for s in steps)
            assert relays == 2 * len(steps), (variant, stage)
            assert steps[0].get("coll_pp_hop", 0) == steps[0]["polled"] * hop_per_poll


def _ready_steps(rows: list[dict]) -> dict[str, float]:
    return {r["rid"]: r["ready_vt"] for r in rows}


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_seen_one_step_later_pinned():
    """On one pinned schedule (the virtual clock), every prefetch is ready later under
    pr39903 than under pr36425: its hit is drained a step later (so its IO starts a step
    later) and its final ack is drained a step later again."""
    cases = [case({"protocol": p, "policy": "wait_complete", "tp": 2, **PINNED}, STORAGE,
                  n=N_REQUESTS, prefix_tokens=PREFIX, new_tokens=64)
             for p in ("pr36425", "pr39903")]
    base, piped = (res[0]["rows"] for res in run_cases(2, cases, timeout_s=100))
    before, after = _ready_steps(base), _ready_steps(piped)
    assert set(before) == set(after) and len(before) == N_REQUESTS
    assert all(after[rid] > before[rid] for rid in before), (before, after)
