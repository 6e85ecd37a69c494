"""What the cost model says rank 0 issues for one request (hicache.spec.cost_model
expected_per_request), written out by hand from docs/design.md section 4's formulas: the
decision and completion collectives per poll, the hit query and the acks over TP then PP.
"""

from __future__ import annotations

import pytest

from hicache.spec.cost_model import Setting, expected_per_request


@pytest.mark.parametrize(("k", "hit_pages"), [(0, 8), (1, 8), (5, 8), (3, 300)])
def test_expected_per_request_spec(k, hit_pages):
    """Per request at TP2 x PP2: docs/design.md section 4's formulas, with hit query and acks."""
    batches = -(-hit_pages // 128)
    e = expected_per_request(Setting("pre27010", "wait_complete", 2, 2), k, hit_pages, True, True)
    assert (e.decision, e.completion, e.pp_hops, e.hit_query, e.ack) == (
        k, int(k > 0), 0, 1, 0)  # k*T + T; background groups TP only
    e = expected_per_request(Setting("pre27010", "best_effort", 2, 2), min(k, 1), hit_pages, True,
                             False)
    assert e.decision == 0 and e.completion == 0  # best_effort: no slots, no MIN
    e = expected_per_request(Setting("pr27010", "wait_complete", 2, 2), k, hit_pages, True, True)
    # Hit query and every per-batch ack: T + P (TP group, then PP group); the final ack 0.
    assert (e.decision, e.pp_hops, e.completion, e.hit_query, e.ack) == (
        k, k, 0, 2, 2 * batches)
    for policy in ("best_effort", "wait_complete"):
        e = expected_per_request(Setting("pr36425", policy, 2, 2), k, hit_pages, True, True)
        assert (e.decision, e.pp_hops) == (0, 0)
    e = expected_per_request(Setting("pr36425", "timeout", 2, 2), k, hit_pages, True, True)
    assert (e.decision, e.pp_hops) == (k, k)
    for proto in ("step-batched", "step-clock"):
        e = expected_per_request(Setting(proto, "timeout", 2, 2), k, hit_pages, True, True)
        assert (e.decision, e.pp_hops, e.completion) == (0, 0, 0)
    e = expected_per_request(Setting("pr27010", "timeout", 1, 1), k, hit_pages, True, True)
    assert e == type(e)(0, 0, 0, 0, 0)  # world size 1: nothing to agree on


def test_pre27010_completion_only_when_a_poll_ended_the_prefetch():
    """Polled, then revoked at the hit drain (hit below threshold): no completion MIN."""
    polled_then_revoked = expected_per_request(Setting("pre27010", "wait_complete", 2, 1), 2, 3,
                                               True, False, ended_by_poll=False)
    assert (polled_then_revoked.decision, polled_then_revoked.completion) == (2, 0)
    ended = expected_per_request(Setting("pre27010", "wait_complete", 2, 1), 2, 3, True, True,
                                 ended_by_poll=True)
    assert (ended.decision, ended.completion) == (2, 1)


@pytest.mark.parametrize(("ended_by_poll", "completion"), [(True, 1), (False, 0), (None, 1)])
def test_pre27010_completion_follows_ended_by_poll(ended_by_poll, completion):
    """Polled twice, holding host slots: only `ended_by_poll` differs, and it alone decides
    whether the completion MIN ran (unknown: any poll is taken to have ended it)."""
    e = expected_per_request(Setting("pre27010", "wait_complete", 2, 1), 2, 8, True, True,
                             ended_by_poll=ended_by_poll)
    assert (e.decision, e.completion) == (2, completion)


def test_pre27010_poll_before_host_slots_pays_no_completion_min():
    """A poll that ends a prefetch whose host slots were never allocated revokes it: the
    completion MIN runs only for ops holding host slots (SGLang hiradix_cache.py)."""
    e = expected_per_request(Setting("pre27010", "timeout", 2, 1), 3, 8, True, False,
                             ended_by_poll=True)
    assert (e.decision, e.completion) == (3, 0)
    e = expected_per_request(Setting("pre27010", "best_effort", 2, 1), 1, 0, True, False,
                             ended_by_poll=True)
    assert e.completion == 0


@pytest.mark.parametrize("proto", ["pr27010", "pr36425", "step-batched", "step-clock",
                                   "sglang-0.5.23"])
@pytest.mark.parametrize(("tp", "pp", "per"), [(2, 1, 1), (2, 2, 2), (1, 2, 1), (1, 1, 0),
                                                (4, 2, 2)])
def test_background_reductions_over_tp_then_pp(proto, tp, pp, per):
    """Ack protocols: hit query and each per-batch ack cost rank 0 T + (1 if PP > 1)."""
    for hit_pages, batches in ((8, 1), (128, 1), (300, 3)):
        e = expected_per_request(Setting(proto, "wait_complete", tp, pp), 2, hit_pages, True, True)
        assert (e.hit_query, e.ack) == (per, per * batches)  # no final ack
    e = expected_per_request(Setting(proto, "wait_complete", tp, pp), 1, 0, True, False)
    assert (e.hit_query, e.ack) == (per, 0)  # revoked: a hit query, no IO, no acks


def test_pre27010_background_reductions_are_tp_only():
    e = expected_per_request(Setting("pre27010", "wait_complete", 2, 2), 2, 300, True, True)
    assert (e.hit_query, e.ack) == (1, 0)


@pytest.mark.parametrize(("tp", "pp", "per"), [(2, 1, 1), (2, 2, 2)])
def test_extra_pool_adds_one_reduced_pool_ack(tp, pp, per):
    """hybrid_cache_controller: after the KV batches, one extra-pool ack (MIN-reduced)."""
    e = expected_per_request(Setting("pr36425", "wait_complete", tp, pp, extra_pool=True), 2, 300,
                             True, True)
    assert e.ack == per * (3 + 1)
    e = expected_per_request(Setting("pre27010", "wait_complete", tp, pp, extra_pool=True), 2, 300,
                             True, True)
    assert e.ack == 0
