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
from hicache.spec.cost_model import POLICIES, PROTOCOLS, decision_per_poll
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
