"""Decision tables of the termination protocols (docs/design.md section 4), no process group.

The expected votes below are written out by hand from docs/design.md section 4 and SGLang's
source (PR #36425's `_can_terminate_prefetch`; PR #27550's `can_terminate_prefetch` with
the extra-pool guard), not derived from `hicache.agreement.protocols`. A vote of True/False is
final and costs no collective; a list is what the rank contributes to the all-reduce.
"""

from __future__ import annotations

import itertools

import pytest

from hicache.agreement.protocols import Facts, make_protocol
from hicache.spec.cost_model import (
    POLICIES,
    PROTOCOLS,
    Setting,
    decision_per_poll,
    expected_per_request,
)
from tests.protocol_sim import simulate

T, F = True, False

# One rank's facts about one pending prefetch, at PP stage 0.
CASES = {
    "pending": Facts(),
    "completed": Facts(completed=T),
    "timed_out": Facts(timed_out=T),
    "completed_timed_out": Facts(completed=T, timed_out=T),
    "terminated": Facts(terminated=T),
    "decided": Facts(decided=T),
    # has_sidecar: the op carries extra-pool transfers; sidecar_done: pool_transfers_done.
    "side_pending": Facts(completed=T, has_sidecar=T, sidecar_done=F),
    "side_pending_timed_out": Facts(completed=T, timed_out=T, has_sidecar=T, sidecar_done=F),
    "side_done": Facts(completed=T, has_sidecar=T, sidecar_done=T),
    "side_incomplete_timed_out": Facts(timed_out=T, has_sidecar=T, sidecar_done=F),
    "side_incomplete": Facts(has_sidecar=T, sidecar_done=F),
}

# The columns of every table row, in CASES order.
COLS = list(CASES)
ALL_TRUE = [T] * len(COLS)

# pre27010, [1 - can_terminate, is_terminated] (PR #27550). With the guard, a completed op
# whose side-car pages are still being written cannot terminate (wait_complete and timeout).
CAN, CANNOT, TERM = [0, 0], [1, 0], [1, 1]
#                 pend    compl t_out   c+t_o term  decid   s_pend  s_p+to  s_done s_i+to s_inc
PRE_WAIT_GUARD = [CANNOT, CAN, CANNOT, CAN, TERM, CANNOT, CANNOT, CANNOT, CAN, CANNOT, CANNOT]
PRE_WAIT_NOGUARD = [CANNOT, CAN, CANNOT, CAN, TERM, CANNOT, CAN, CAN, CAN, CANNOT, CANNOT]
PRE_TO_GUARD = [CANNOT, CAN, CAN, CAN, TERM, CANNOT, CANNOT, CANNOT, CAN, CAN, CANNOT]
PRE_TO_NOGUARD = [CANNOT, CAN, CAN, CAN, TERM, CANNOT, CAN, CAN, CAN, CAN, CANNOT]
# pr27010, PP0 votes [is_terminated or can] (wait_complete: can is False, completion comes
# through the final ack); always a list: one all-reduce per poll.
PR27_BE = [[1]] * len(COLS)
PR27_WAIT = [[0], [0], [0], [0], [1], [0], [0], [0], [0], [0], [0]]
PR27_TO = [[0], [0], [1], [1], [1], [0], [0], [1], [0], [1], [0]]
# pr36425: terminated -> True at once; best_effort True, wait_complete False, no collective;
# timeout: PP0 votes [timed_out].
PR36_WAIT = [F, F, F, F, T, F, F, F, F, F, F]
PR36_TO = [[0], [0], [1], [1], T, [0], [0], [1], [0], [1], [0]]
# step-batched / step-clock under timeout: polls only read the step-level decision.
STEP_TO = [F, F, F, F, T, T, F, F, F, F, F]

VOTES = {
    ("pre27010", "best_effort", True): ALL_TRUE,
    ("pre27010", "best_effort", False): ALL_TRUE,
    ("pre27010", "wait_complete", True): PRE_WAIT_GUARD,
    ("pre27010", "wait_complete", False): PRE_WAIT_NOGUARD,
    ("pre27010", "timeout", True): PRE_TO_GUARD,
    ("pre27010", "timeout", False): PRE_TO_NOGUARD,
    ("pr27010", "best_effort", True): PR27_BE,
    ("pr27010", "wait_complete", True): PR27_WAIT,
    ("pr27010", "timeout", True): PR27_TO,
    ("pr36425", "best_effort", True): ALL_TRUE,
    ("pr36425", "wait_complete", True): PR36_WAIT,
    ("pr36425", "timeout", True): PR36_TO,
    ("step-batched", "best_effort", True): ALL_TRUE,
    ("step-batched", "wait_complete", True): PR36_WAIT,
    ("step-batched", "timeout", True): STEP_TO,
    ("step-clock", "best_effort", True): ALL_TRUE,
    ("step-clock", "wait_complete", True): PR36_WAIT,
    ("step-clock", "timeout", True): STEP_TO,
    # cache host memory: pr36425's poll (its timeout clock: tests/test_sglang_0523.py)
    ("sglang-0.5.23", "best_effort", True): ALL_TRUE,
    ("sglang-0.5.23", "wait_complete", True): PR36_WAIT,
    ("sglang-0.5.23", "timeout", True): PR36_TO,
    # pr39267 on 0.5.23 changes the hit query only (tests/test_pr39267.py)
    ("pr39267", "best_effort", True): ALL_TRUE,
    ("pr39267", "wait_complete", True): PR36_WAIT,
    ("pr39267", "timeout", True): PR36_TO,
    # The open PRs poll as pr36425 does (#33029 moves the polls before the walk, #32725 adds
    # polls at the safe point, #38284 adds a dummy for an absent prefetch:
    # tests/test_open_prs.py).
    # pr39903 too (its change is the per-step agreement's timing: tests/test_pr39903.py),
    # and pr34568 (PD prefill's admission ring only: tests/test_pp_admission.py).
    **{(pr, policy, True): row for pr in ("pr33029", "pr38284", "pr32725", "pr39903",
                                          "pr34568")
       for policy, row in (("best_effort", ALL_TRUE), ("wait_complete", PR36_WAIT),
                           ("timeout", PR36_TO))},
}


def _vote_cases():
    for (proto, policy, guard), row in VOTES.items():
        assert len(row) == len(COLS), (proto, policy, guard)
        for case, want in zip(COLS, row, strict=True):
            yield pytest.param(proto, policy, guard, case, want,
                               id=f"{proto}-{policy}-{'guard' if guard else 'noguard'}-{case}")


def test_table_covers_every_protocol_and_policy():
    assert {(p, q) for p, q, _ in VOTES} == set(itertools.product(PROTOCOLS, POLICIES))


@pytest.mark.parametrize(("proto", "policy", "guard", "case", "want"), list(_vote_cases()))
def test_local_vote(proto, policy, guard, case, want):
    vote = make_protocol(proto, policy, guard).vote(CASES[case])
    assert type(vote) is type(want) and vote == want


@pytest.mark.parametrize(("proto", "policy", "guard", "case", "want"), list(_vote_cases()))
def test_one_rank_decision(proto, policy, guard, case, want):
    """A one-rank group decides what its vote says (a list: the protocol's own rule)."""
    if isinstance(want, bool):
        expected = want
    elif proto == "pre27010":
        expected = want[0] == 0 or want[1] == 1  # all can, or any already terminated
    else:
        expected = want[0] == 1  # MAX of the PP0 votes
    assert simulate(make_protocol(proto, policy, guard), [CASES[case]]) is expected


# Two TP ranks with different facts: (protocol, policy, guard, rank 0, rank 1, decision).
TWO_RANKS = [
    # pre27010: terminate only if every rank can, or any rank already terminated.
    ("pre27010", "wait_complete", T, "completed", "pending", F),
    ("pre27010", "wait_complete", T, "completed", "completed", T),
    ("pre27010", "wait_complete", T, "pending", "terminated", T),
    ("pre27010", "wait_complete", T, "completed", "side_pending", F),  # PR #27550 guard
    ("pre27010", "wait_complete", F, "completed", "side_pending", T),  # the race
    ("pre27010", "wait_complete", T, "side_done", "side_done", T),
    ("pre27010", "timeout", T, "timed_out", "pending", F),
    ("pre27010", "timeout", T, "timed_out", "completed", T),
    ("pre27010", "timeout", T, "side_pending_timed_out", "timed_out", F),
    ("pre27010", "timeout", F, "side_pending_timed_out", "timed_out", T),
    ("pre27010", "timeout", T, "side_incomplete_timed_out", "timed_out", T),
    ("pre27010", "best_effort", T, "pending", "pending", T),
    # pr27010: MAX of [terminated or can]: any rank that may stop stops them all.
    ("pr27010", "timeout", T, "timed_out", "pending", T),
    ("pr27010", "timeout", T, "pending", "pending", F),
    ("pr27010", "wait_complete", T, "completed", "completed", F),
    ("pr27010", "wait_complete", T, "pending", "terminated", T),
    ("pr27010", "best_effort", T, "pending", "pending", T),
    # pr36425: only timeout reduces, MAX of timed_out.
    ("pr36425", "timeout", T, "pending", "timed_out", T),
    ("pr36425", "timeout", T, "completed", "pending", F),
    ("pr36425", "wait_complete", T, "completed", "completed", F),
    ("pr36425", "best_effort", T, "pending", "pending", T),
    # step protocols: the poll reads the step-level decision, identical on all ranks.
    ("step-batched", "timeout", T, "decided", "decided", T),
    ("step-batched", "timeout", T, "timed_out", "timed_out", F),
    ("step-clock", "timeout", T, "decided", "decided", T),
    ("step-clock", "wait_complete", T, "completed", "completed", F),
]


@pytest.mark.parametrize(("proto", "policy", "guard", "f0", "f1", "want"), TWO_RANKS,
                         ids=[f"{r[0]}-{r[1]}-{r[3]}+{r[4]}{'' if r[2] else '-noguard'}"
                              for r in TWO_RANKS])
def test_two_rank_decision(proto, policy, guard, f0, f1, want):
    p = make_protocol(proto, policy, guard)
    assert simulate(p, [CASES[f0], CASES[f1]]) is want
    assert simulate(p, [CASES[f1], CASES[f0]]) is want  # rank order does not matter


def test_different_paths_are_a_mismatch():
    """pr36425 relies on `terminated` being identical on all ranks: one rank returning at
    once while the other all-reduces is the pairing hazard, and simulate refuses it."""
    p = make_protocol("pr36425", "timeout")
    with pytest.raises(AssertionError):
        simulate(p, [CASES["terminated"], CASES["pending"]])


def _at_stage(f: Facts, pp_rank: int) -> Facts:
    return Facts(**{**f.__dict__, "pp_rank": pp_rank})


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", COLS)
def test_pr27010_later_stage_contributes_zero(policy, case):
    p = make_protocol("pr27010", policy)
    assert p.vote(_at_stage(CASES[case], 1)) == [0]


@pytest.mark.parametrize("case", [c for c in COLS if c != "terminated"])
def test_pr36425_timeout_later_stage_contributes_zero(case):
    p = make_protocol("pr36425", "timeout")
    assert p.vote(_at_stage(CASES[case], 1)) == [0]


@pytest.mark.parametrize("proto", ["pr27010", "pr36425"])
@pytest.mark.parametrize(("s0", "s1"), list(itertools.product(
    ["pending", "timed_out", "completed"], ["pending", "timed_out", "completed"])))
def test_later_stages_follow_stage_zero(proto, s0, s1):
    """Stage 0 decides on its own facts: whatever stage 1 knows (here: its clock says
    timed out while stage 0's does not) does not change the decision it receives."""
    p = make_protocol(proto, "timeout")
    stage0 = [CASES[s0], CASES[s0]]
    alone = simulate(p, stage0)
    assert alone is (s0 == "timed_out")
    with_stage1 = simulate(p, stage0 + [_at_stage(CASES[s1], 1)] * 2)
    assert with_stage1 is alone


def test_step_batched_flags():
    """The per-step flag: PP0's timed_out for timeout, nothing for other policies."""
    p = make_protocol("step-batched", "timeout")
    assert p.step_vote(CASES["timed_out"]) == 1
    assert p.step_vote(CASES["pending"]) == 0
    assert p.step_vote(_at_stage(CASES["timed_out"], 1)) == 0
    for policy in ("best_effort", "wait_complete"):
        assert make_protocol("step-batched", policy).step_vote(CASES["timed_out"]) is None
    assert not p.step_decide(CASES["timed_out"])  # decided by the packed MIN instead


def test_step_clock_decides_locally():
    p = make_protocol("step-clock", "timeout")
    assert p.step_vote(CASES["timed_out"]) is None  # nothing rides in the per-step MIN
    assert p.step_decide(CASES["timed_out"]) and not p.step_decide(CASES["pending"])
    for policy in ("best_effort", "wait_complete"):
        assert not make_protocol("step-clock", policy).step_decide(CASES["timed_out"])
    for proto in ("pre27010", "pr27010", "pr36425"):
        q = make_protocol(proto, "timeout")
        assert q.step_vote(CASES["timed_out"]) is None
        assert not q.step_decide(CASES["timed_out"])


# ---- the cost model agrees with what the votes imply ------------------------------------

class _RecordingComm:
    """Stands in for hicache.comm.comm.Comm: records collectives instead of running them."""

    def __init__(self):
        self.calls = []

    def all_reduce(self, t, op, group, site, rid=None):
        self.calls.append(("all_reduce", group, site))

    def reduce_tp_then_pp(self, t, op, site, rid=None):
        self.calls.append(("reduce_tp_then_pp", "tp_cpu+pp_cpu", site))


PENDING_FACTS = [f for f in CASES.values() if not f.terminated and not f.decided]


@pytest.mark.parametrize(("proto", "policy"), list(itertools.product(PROTOCOLS, POLICIES)))
def test_decision_per_poll_matches_votes(proto, policy):
    """A list vote is exactly one collective per poll (TP all-reduce, plus the PP hop for
    protocols that agree over PP); a bool vote is none. The cost model must say the same."""
    p = make_protocol(proto, policy)
    for f in PENDING_FACTS:
        comm = _RecordingComm()
        p.poll(f, comm, "r0")
        collective = isinstance(p.vote(f), list)
        assert len(comm.calls) == int(collective)
        hop = collective and comm.calls[0][0] == "reduce_tp_then_pp"
        assert decision_per_poll(proto, policy, 2, 1) == (int(collective), 0)
        assert decision_per_poll(proto, policy, 2, 2) == (int(collective), int(hop))
        assert decision_per_poll(proto, policy, 1, 1) == (0, 0)  # TP=1: no all-reduce
        assert decision_per_poll(proto, policy, 1, 2) == (0, int(hop))


# docs/design.md section 4, per poll at TP2 (T = 1) and at TP2 x PP2 (P = 1): (T, P) tuples.
SPEC_PER_POLL = {
    ("pre27010", "best_effort"): ((0, 0), (0, 0)),
    ("pre27010", "wait_complete"): ((1, 0), (1, 0)),  # TP only: no PP agreement
    ("pre27010", "timeout"): ((1, 0), (1, 0)),
    ("pr27010", "best_effort"): ((1, 0), (1, 1)),  # T + P whatever the policy
    ("pr27010", "wait_complete"): ((1, 0), (1, 1)),
    ("pr27010", "timeout"): ((1, 0), (1, 1)),
    ("pr36425", "best_effort"): ((0, 0), (0, 0)),
    ("pr36425", "wait_complete"): ((0, 0), (0, 0)),
    ("pr36425", "timeout"): ((1, 0), (1, 1)),
    ("step-batched", "best_effort"): ((0, 0), (0, 0)),
    ("step-batched", "wait_complete"): ((0, 0), (0, 0)),
    ("step-batched", "timeout"): ((0, 0), (0, 0)),
    ("step-clock", "best_effort"): ((0, 0), (0, 0)),
    ("step-clock", "wait_complete"): ((0, 0), (0, 0)),
    ("step-clock", "timeout"): ((0, 0), (0, 0)),
    ("sglang-0.5.23", "best_effort"): ((0, 0), (0, 0)),  # cache host memory
    ("sglang-0.5.23", "wait_complete"): ((0, 0), (0, 0)),
    ("sglang-0.5.23", "timeout"): ((1, 0), (1, 1)),
    ("pr39267", "best_effort"): ((0, 0), (0, 0)),
    ("pr39267", "wait_complete"): ((0, 0), (0, 0)),
    ("pr39267", "timeout"): ((1, 0), (1, 1)),
    **{(pr, policy): cost for pr in ("pr33029", "pr38284", "pr32725", "pr39903", "pr34568")
       for policy, cost in (("best_effort", ((0, 0), (0, 0))),
                            ("wait_complete", ((0, 0), (0, 0))),
                            ("timeout", ((1, 0), (1, 1))))},
}


@pytest.mark.parametrize(("proto", "policy"), list(SPEC_PER_POLL))
def test_decision_per_poll_spec_table(proto, policy):
    tp2, tp2pp2 = SPEC_PER_POLL[(proto, policy)]
    assert decision_per_poll(proto, policy, 2, 1) == tp2
    assert decision_per_poll(proto, policy, 2, 2) == tp2pp2


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


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("ready", "want"), [(True, [1]), (False, [0])])
def test_sglang_0523_ticket_vote_is_stage_zeros_readiness(policy, ready, want):
    """The ticket path (buffer_only, PP > 1): stage 0 votes its readiness, whatever the
    policy; a later stage contributes 0 and follows, even when it is ready itself."""
    p = make_protocol("sglang-0.5.23", policy)
    f = Facts(ticketed=True, ticket_ready=ready)
    assert p.vote(f) == want
    assert p.vote(_at_stage(f, 1)) == [0]
    assert simulate(p, [f, f, _at_stage(Facts(ticketed=True, ticket_ready=True), 1)]) is ready
