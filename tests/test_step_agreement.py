"""The per-step agreement of check_hicache_events per release (hicache.agreement.step_agreement), no
process group: how the lists are packed into reductions, what one step costs each PP stage
(written out by hand from the wheels: 0.5.18 hiradix_cache.py:1525-1529 and 1567, 0.5.19
unified_radix_cache.py:2807-2821 and 2471), and what a stage-local queue drain changes.
"""

from __future__ import annotations

import pytest

from hicache.agreement.step_agreement import (
    SGLANG_0_5_18,
    SGLANG_0_5_19,
    Reduction,
    StepAgreement,
)
from hicache.comm.groups import Layout
from hicache.spec.config import HiCacheConfig
from hicache.spec.cost_model import PROTOCOLS, per_step
from tests.doubles import RelayComm, admit, hashes_of, one_rank_cache, tokens

PAGE = 64
VALUES = {"head": [-1, 0, -1], "loads": [0], "queues": [3, 5]}


def _run(agreement: StepAgreement, pp: int):
    calls = []

    def reduce(packed, relay):
        calls.append((list(packed), relay))
        return [10 * v for v in packed]  # a visible "reduction"

    return agreement.agree(VALUES, pp, reduce), calls


def test_packed_at_pp1_one_reduction_every_list_back_in_place():
    agreed, calls = _run(SGLANG_0_5_19, 1)
    assert calls == [([3, 5, 0, -1, 0, -1], True)]
    assert agreed == {"head": [-10, 0, -10], "loads": [0], "queues": [30, 50]}


def test_0_5_19_with_pp_two_relayed_reductions():
    agreed, calls = _run(SGLANG_0_5_19, 2)
    assert calls == [([-1, 0, -1, 0], True), ([3, 5], True)]
    assert agreed["head"] == [-10, 0, -10] and agreed["queues"] == [30, 50]


def test_0_5_18_with_pp_writing_loading_relayed_then_the_queues_stage_local():
    agreed, calls = _run(SGLANG_0_5_18, 2)
    assert calls == [([-1, 0, -1], True), ([0], True), ([3, 5], False)]
    assert agreed == {"head": [-10, 0, -10], "loads": [0], "queues": [30, 50]}


def test_a_value_appended_to_a_list_rides_in_its_reduction():
    """What the write path needs: one more finished count in `head`, one more queue."""
    values = {"head": [-1, 7], "loads": [0], "queues": [3, 5, 9]}
    one = StepAgreement("x", (Reduction(("queues", "loads", "head")),), ())
    agreed = one.agree(values, 1, lambda packed, relay: packed)
    assert agreed == values


# ---- per-step cost per PP stage, by hand ------------------------------------------------------

# (TP all-reduces, PP hop ops) per step, stage 0 and stage 1, TP2 x PP2.
BY_HAND_TP2_PP2 = {
    "pre27010": ((3, 2), (1, 2)),  # 0.5.18: 5 on stage 0, 3 on stage 1
    "pr27010": ((2, 2), (0, 2)),
    "pr36425": ((2, 2), (0, 2)),
    "step-batched": ((2, 2), (0, 2)),
    "step-clock": ((2, 2), (0, 2)),
    "sglang-0.5.23": ((1, 1), (0, 1)),  # one packed reduce at any PP
    "pr39267": ((1, 1), (0, 1)),  # on 0.5.23: its hit query differs, not its step
    "pr39903": ((2, 2), (0, 2)),  # 0.5.19's two relayed reductions, waited a step later
}
BUFFER_ONLY_TP2_PP2 = ((1, 0), (1, 0))  # 0.5.23 buffer_only: each stage's own TP MIN


def test_per_step_0_5_23():
    assert per_step("sglang-0.5.23", 2, 1) == (1, 0)
    assert (per_step("sglang-0.5.23", 1, 2, 0), per_step("sglang-0.5.23", 1, 2, 1)) == \
        ((0, 1), (0, 1))
    assert tuple(per_step("sglang-0.5.23", 2, 2, s, "buffer_only") for s in (0, 1)) == \
        BUFFER_ONLY_TP2_PP2
    assert per_step("sglang-0.5.23", 1, 2, 1, "buffer_only") == (0, 0)  # nothing at all
    assert per_step("sglang-0.5.23", 2, 1, 0, "buffer_only") == (1, 0)


@pytest.mark.parametrize("proto", list(BY_HAND_TP2_PP2))
def test_per_step_tp2_pp2(proto):
    assert (per_step(proto, 2, 2, 0), per_step(proto, 2, 2, 1)) == BY_HAND_TP2_PP2[proto]


@pytest.mark.parametrize("proto", [p for p in PROTOCOLS if p not in ("sglang-0.5.23", "pr39267")])
def test_per_step_unchanged_at_pp1_and_tp1_pp2(proto):
    assert per_step(proto, 2, 1) == (1, 0)
    assert per_step(proto, 1, 1) == (0, 0)
    # TP = 1: the stage-local drain is a no-op, so 0.5.18 and 0.5.19 agree: two relays.
    assert (per_step(proto, 1, 2, 0), per_step(proto, 1, 2, 1)) == ((0, 2), (0, 2))


def test_per_step_middle_stage_receives_and_sends():
    assert per_step("pre27010", 2, 3, 1) == (1, 4)
    assert per_step("pr36425", 2, 3, 2) == (0, 2)


# ---- the stage-local drain's consequence ----------------------------------------------------

def _stage1_with_a_queued_hit(agreement: StepAgreement):
    """PP stage 1 of TP2 x PP2 whose own prefetch thread agreed a hit (pre27010's hit MIN
    is over its TP group only) while stage 0 has not counted it yet."""
    cfg = HiCacheConfig(protocol="pre27010", policy="wait_complete", tp=2, pp=2)
    cache = one_rank_cache(cfg, RelayComm(Layout(2, 2, 2)))
    cache.agreement = agreement
    admit(cache, "r0", tokens(9, PAGE))
    op = cache.ongoing["r0"]
    op.hash_value = hashes_of(9, PAGE)[:8]
    cache.controller.hit_queue.put(op)
    return cache, op


def test_stage_local_drain_lets_a_later_stage_allocate_before_stage_0():
    """0.5.18: stage 1 drains what its own TP group counted, so its host slots (and its IO)
    start in a step where stage 0's have not: the stages' prefetches run on different
    schedules and can end differently (SGLang #22607)."""
    cache, op = _stage1_with_a_queued_hit(SGLANG_0_5_18)
    cache.check_hicache_events(0.0, busy=True)
    assert op.host_slots is not None and cache.controller.io_queue.get_nowait() is op


def test_relayed_drain_holds_a_later_stage_to_stage_0s_count():
    """0.5.19's shape: stage 1 drains stage 0's count (0 here) and allocates nothing yet."""
    cache, op = _stage1_with_a_queued_hit(SGLANG_0_5_19)
    cache.check_hicache_events(0.0, busy=True)
    assert op.host_slots is None and cache.controller.hit_queue.qsize() == 1
