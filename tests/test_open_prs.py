"""Decision tables of the open PRs' protocols (docs/prs.md), no process group.

What a TP group does when one request's prefetch is in some ranks' `ongoing_prefetch` and
not in others' (SGLang #38273): a rank without it answers True at once (no collective)
unless the protocol gives it a contribution to the poll's all-reduce (PR #38284). The
expected outcomes are written out by hand from the PR descriptions.
"""

from __future__ import annotations

import pytest

from hicache.agreement.protocols import Facts, make_protocol
from hicache.spec.cost_model import Setting, decision_per_poll, expected_per_request
from tests.protocol_sim import simulate_ranks

PENDING, TIMED_OUT = Facts(), Facts(timed_out=True)
ABSENT = None  # not in this rank's ongoing_prefetch
HANG = None  # the ranks would not pair up in the collective

# (protocol, policy, rank 0, rank 1, each rank's answer or HANG)
TABLE = [
    # Released pr36425 under timeout: the rank with the prefetch all-reduces, the other
    # returns: unpaired (#38273's production deadlock).
    ("pr36425", "timeout", PENDING, ABSENT, HANG),
    ("pr36425", "timeout", TIMED_OUT, ABSENT, HANG),
    ("pr33029", "timeout", PENDING, ABSENT, HANG),  # the bulk poll keeps the poll as it is
    ("pr32725", "timeout", PENDING, ABSENT, HANG),
    # pr38284: the absent rank contributes 0 and answers True; the MAX is the holder's vote.
    ("pr38284", "timeout", TIMED_OUT, ABSENT, [True, True]),
    ("pr38284", "timeout", PENDING, ABSENT, [False, True]),  # paired, but they disagree
    ("pr38284", "timeout", ABSENT, ABSENT, [True, True]),  # nobody has it: still one MAX
    # No collective under wait_complete: nobody hangs, the answers differ.
    ("pr36425", "wait_complete", PENDING, ABSENT, [False, True]),
    ("pr38284", "wait_complete", PENDING, ABSENT, [False, True]),
    # Both ranks hold it: the released behaviour is unchanged by every PR.
    ("pr38284", "timeout", TIMED_OUT, PENDING, [True, True]),
    ("pr33029", "timeout", PENDING, PENDING, [False, False]),
    ("pr32725", "timeout", TIMED_OUT, PENDING, [True, True]),
]


@pytest.mark.parametrize(("proto", "policy", "r0", "r1", "want"), TABLE)
def test_absent_rank_table(proto, policy, r0, r1, want):
    assert simulate_ranks(make_protocol(proto, policy), [r0, r1]) == want


@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_only_pr38284_reduces_for_an_absent_prefetch(policy):
    for proto in ("pre27010", "pr27010", "pr36425", "step-batched", "step-clock",
                  "sglang-0.5.23", "pr33029", "pr32725"):
        assert make_protocol(proto, policy).absent_vote() is None
    want = [0] if policy == "timeout" else None
    assert make_protocol("pr38284", policy).absent_vote() == want


def test_hooks_name_the_pr():
    assert [make_protocol(p, "timeout").bulk for p in ("pr33029", "pr38284", "pr32725")] == \
        [True, False, False]
    assert [make_protocol(p, "timeout").sweep for p in ("pr33029", "pr38284", "pr32725")] == \
        [False, False, True]


def test_absent_polls_cost_only_pr38284():
    """Per request at TP2 x PP2 under timeout: 3 polls of its prefetch plus 2 walks that
    reached it with nothing ongoing (after it ended). pr38284 pays T + P for all 5."""
    for proto, want in (("pr36425", (3, 3)), ("pr38284", (5, 5)), ("pr33029", (3, 3))):
        e = expected_per_request(Setting(proto, "timeout", 2, 2), 3, 8, True, True, absent_polls=2)
        assert (e.decision, e.pp_hops) == want, proto
    assert decision_per_poll("pr38284", "timeout", 2, 2) == (1, 1)
