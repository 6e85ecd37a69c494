"""The decision a TP group reaches from each rank's facts, computed without a process group:
the decision tables' oracle (tests/test_protocols.py, test_open_prs.py, test_sglang_0523.py).
It mirrors `Protocol.poll`: final local votes decide for themselves; otherwise the votes are
combined element-wise with the protocol's reduce op, as the all-reduce would."""

from __future__ import annotations

import torch.distributed as dist

from hicache.agreement.protocols import Facts, Protocol


def simulate(protocol: Protocol, facts_per_rank: list[Facts]) -> bool:
    """The decision a TP group reaches when each rank votes `facts_per_rank[i]` (no PG).

    Mirrors `poll`: final local votes decide for themselves (rank 0's is returned);
    otherwise the votes are combined element-wise with the protocol's reduce op. Ranks that
    mix the two paths fail an assertion. Used by the decision tables.
    """
    votes = [protocol.vote(f) for f in facts_per_rank]
    # A rank that returns at once while another all-reduces would leave the collective
    # unpaired (a hang or a mismatched pairing), whichever rank it is.
    assert len({isinstance(v, bool) for v in votes}) == 1, "ranks took different paths"
    if isinstance(votes[0], bool):
        return votes[0]
    combine = max if protocol.reduce_op == dist.ReduceOp.MAX else min
    return protocol.decide([combine(col) for col in zip(*votes, strict=True)])


def simulate_ranks(protocol: Protocol, facts_per_rank: list[Facts | None]) -> list[bool] | None:
    """Each rank's answer when some ranks have no prefetch of the request (None: not in its
    `ongoing_prefetch`, SGLang #38273); None when the ranks would not pair up in the
    collective (one enters the all-reduce, another returns): a deadlock. No PG."""
    votes = [protocol.absent_vote() if f is None else protocol.vote(f) for f in facts_per_rank]
    entering = [v is not None and not isinstance(v, bool) for v in votes]
    if any(entering) and not all(entering):
        return None
    if not any(entering):
        return [True if v is None else v for v in votes]
    combine = max if protocol.reduce_op == dist.ReduceOp.MAX else min
    reduced = [combine(col) for col in zip(*votes, strict=True)]
    return [True if f is None else protocol.decide(reduced) for f in facts_per_rank]
