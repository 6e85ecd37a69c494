"""The termination protocols of check_prefetch_progress, side by side (docs/design.md section 4).

Each protocol answers one question for one poll of a pending prefetch: may it stop now?
It splits the answer into a rank-local `vote` (pure, testable without a process group) and
`decide`, which turns the reduced vote into the answer. A vote of True/False is final and
costs no collective; a list is all-reduced (op `reduce_op`) over the TP group only
(`scope="tp"`) or over TP on PP stage 0 and then down the PP stages (`scope="tp_pp"`).

Who calls what, when: the scheduler thread polls (`Protocol.poll`) while walking the waiting
queue; `step_vote`/`step_decide` run once per step inside check_hicache_events. Three hooks
say where a protocol polls besides the walk, so an open PR is one class here: `bulk` (poll
the whole broadcast waiting queue once per step before the walk, which then only looks the
results up: PR #33029), `absent_vote` (what a rank without the prefetch contributes to the
poll's all-reduce; None: it returns at once: PR #38284) and `sweep` (poll every ongoing
prefetch at the step's safe point, after the queue drains: PR #32725). docs/prs.md says
what each models and what it simplifies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from hicache.agreement.step_agreement import (
    SGLANG_0_5_18,
    SGLANG_0_5_19,
    SGLANG_0_5_23,
    SGLANG_0_5_23_BUFFER_ONLY,
    StepAgreement,
)
from hicache.comm.comm import DECISION, Comm


@dataclass(frozen=True)
class Facts:
    """What one rank knows about one pending prefetch when it polls it."""

    completed: bool = False  # completed_tokens == len(hash_value) * page_size, and pages > 0
    timed_out: bool = False  # evaluated on this rank's clock (or rank 0's step stamp)
    terminated: bool = False  # operation.is_terminated()
    has_sidecar: bool = False  # the op carries extra-pool transfers
    sidecar_done: bool = True  # pool_transfers_done
    decided: bool = False  # a step-level decision already said "stop"
    ticketed: bool = False  # 0.5.23's PP-ticket path (buffer_only host memory, PP > 1)
    ticket_ready: bool = False  # its final ack was synced on this rank
    pp_rank: int = 0


Vote = bool | list[int]


class Protocol:
    name = ""
    uses_acks = True  # completion is published through agreed acks
    reduce_op = dist.ReduceOp.MAX
    scope = "tp_pp"
    step_agreement: StepAgreement = SGLANG_0_5_19  # check_hicache_events' reductions
    # What the timeout is measured from: "enqueue" (this rank's clock since the prefetch
    # was issued, budget from the agreed hit), "step" (rank 0's broadcast step clock) or
    # "first_blocked_poll" (0.5.23: this rank's clock since the first poll that found it
    # pending, budget from the requested pages, never once every KV page landed).
    clock = "enqueue"
    bulk = False  # PR #33029: bulk_check_prefetch_progress before the walk
    # PR #39903: check_hicache_events' agreement issued async at the end of a step and
    # waited on at the next (hicache.cache.step_events): what it lets through is seen a
    # step later.
    pipelined = False
    sweep = False  # PR #32725: every ongoing prefetch polled at the step's safe point
    # 0.5.23: a timeout poll that ends a running prefetch marks its deadline expired; it is
    # never issued again (hicache.cache.poll `_expire`).
    deadline_expiry = False
    # 0.5.23: a miss (a hit below the threshold, a poll that ended it before its hit, no
    # host memory, the rate limit) arms a storage prefetch retry (hicache.cache.retries).
    retries = False
    # The hit query's shape with a TRAILING_PAGES side-car (hicache.agreement.hit_query); any other
    # pool leaves it a MIN of the hit.
    trailing_hit_shape = "min"
    # PD prefill's bootstrap admission at PP > 1 (HiCacheConfig.pd_admission): False, each
    # stage admits the ring's agreed set by its own prefetch readiness (before PR #34568);
    # True, readiness folded into the ring (hicache.agreement.pd_admission).
    ready_in_ring = False

    def __init__(self, policy: str, race_guard: bool = True):
        self.policy, self.race_guard = policy, race_guard

    def agreement(self, host_memory: str) -> StepAgreement:
        return self.step_agreement

    def hit_shape(self, sidecar_hit_policy: str) -> str:
        return self.trailing_hit_shape if sidecar_hit_policy == "trailing_pages" else "min"

    def vote(self, f: Facts) -> Vote:
        raise NotImplementedError

    def decide(self, reduced: list[int]) -> bool:
        return reduced[0] == 1

    def absent_vote(self) -> list[int] | None:
        """A rank polled for a request it has no prefetch of: None returns True at once (no
        collective); a list is its contribution to the all-reduce the others enter."""
        return None

    def poll(self, f: Facts, comm: Comm, rid: str) -> bool:
        v = self.vote(f)
        if isinstance(v, bool):
            return v
        return self.decide(self.reduce(v, comm, rid))

    def reduce(self, v: list[int], comm: Comm, rid: str) -> list[int]:
        t = torch.tensor(v, dtype=torch.int32)
        # Blocks until every rank of the group polls this request: the ordering rule that
        # loop-count divergence (SGLang #30760) breaks.
        if self.scope == "tp":
            comm.all_reduce(t, self.reduce_op, "tp_cpu", DECISION, rid)
        else:
            comm.reduce_tp_then_pp(t, self.reduce_op, DECISION, rid)
        return t.tolist()

    def step_vote(self, f: Facts) -> int | None:
        """Per-step timeout flag packed into the per-step all-reduce (step-batched only)."""
        return None

    def step_decide(self, f: Facts) -> bool:
        """Per-step decision from inputs identical on all ranks (step-clock only)."""
        return False


class Pre27010(Protocol):
    """Before PR #27010: rank-local completion, one TP MAX per poll, no PP agreement."""

    name, uses_acks, scope = "pre27010", False, "tp"
    step_agreement = SGLANG_0_5_18  # the last release that ships it

    def vote(self, f: Facts) -> Vote:
        if self.policy == "best_effort":
            return True
        can = f.completed if self.policy == "wait_complete" else (f.completed or f.timed_out)
        # PR #27550: never stop while side-car pages are still being written to host memory.
        if self.race_guard and f.completed and f.has_sidecar and not f.sidecar_done:
            can = False
        return [1 - int(can), int(f.terminated)]

    def decide(self, reduced: list[int]) -> bool:
        # Stop when every rank can, or when any rank already terminated.
        return reduced[0] == 0 or reduced[1] == 1


class Pr27010(Protocol):
    """PR #27010 ("before"): one MAX all-reduce with the PP hop in every poll."""

    name = "pr27010"

    def vote(self, f: Facts) -> Vote:
        if f.pp_rank != 0:
            return [0]  # PP stages > 0 follow stage 0's decision
        can = {"best_effort": True, "wait_complete": False}.get(self.policy, f.timed_out)
        return [int(f.terminated or can)]


class Pr36425(Protocol):
    """PR #36425 ("after"): the all-reduce only where wall-clock time decides (timeout)."""

    name = "pr36425"

    def vote(self, f: Facts) -> Vote:
        if f.terminated:
            return True
        if self.policy == "best_effort":
            return True
        if self.policy == "wait_complete":
            return False
        return [int(f.timed_out) if f.pp_rank == 0 else 0]


class StepBatched(Pr36425):
    """Timeout flags of all pending ops ride in the per-step all-reduce; polls just read."""

    name = "step-batched"

    def vote(self, f: Facts) -> Vote:
        if self.policy != "timeout":
            return super().vote(f)
        return f.terminated or f.decided

    def step_vote(self, f: Facts) -> int | None:
        if self.policy != "timeout":
            return None
        return int(f.timed_out) if f.pp_rank == 0 else 0


class StepClock(StepBatched):
    """Every rank evaluates the timeout on rank 0's broadcast step clock: no collective."""

    name, clock = "step-clock", "step"

    def step_vote(self, f: Facts) -> int | None:
        return None

    def step_decide(self, f: Facts) -> bool:
        return self.policy == "timeout" and f.timed_out


class Sglang0523(Pr36425):
    """The newest release read (0.5.23, UnifiedRadixCache): pr36425's poll with the timeout
    clock started at the first blocked poll, one packed per-step reduce at any PP, and with
    buffer_only host memory at PP > 1 the ticket path: stage 0's readiness MAX-reduced on
    every poll, whatever the policy (unified_radix_cache.py `_check_pp_prefetch_progress`)."""

    name, clock, step_agreement = "sglang-0.5.23", "first_blocked_poll", SGLANG_0_5_23
    deadline_expiry, trailing_hit_shape, retries = True, "span_mask", True

    def vote(self, f: Facts) -> Vote:
        if f.ticketed:
            return [int(f.ticket_ready) if f.pp_rank == 0 else 0]
        return super().vote(f)

    def agreement(self, host_memory: str) -> StepAgreement:
        return SGLANG_0_5_23_BUFFER_ONLY if host_memory == "buffer_only" else SGLANG_0_5_23


# ---- open pull requests (sgl-project/sglang), each on the released poll of pr36425 --------


class Pr33029(Pr36425):
    """PR #33029 (closes #30760): `bulk_check_prefetch_progress` polls every request of the
    broadcast waiting queue once per step, in queue order, before the walk; the walk then
    looks each result up locally, so its rank-local trip count issues no collective."""

    name, bulk = "pr33029", True


class Pr38284(Pr36425):
    """PR #38284 (for #38273): a rank whose `ongoing_prefetch` lacks the request still
    enters the poll's all-reduce (timeout policy), contributing 0, which cannot change the
    MAX; it then returns True (nothing of its own to wait for)."""

    name = "pr38284"

    def absent_vote(self) -> list[int] | None:
        return [0] if self.policy == "timeout" else None


class Pr32725(Pr36425):
    """PR #32725 (for #32724): at the step's safe point (after the queue drains) every
    ongoing prefetch holding host slots is polled, in request-id order, and finalized if
    the poll says it may stop, wherever the FCFS walk would have reached it."""

    name, sweep = "pr32725", True


class Pr39903(Pr36425):
    """PR #39903 (closed): check_hicache_events' MIN all-reduce issued with
    `async_op=True` at the end of the step and waited on at the next; the counts it
    agrees (finished hit queries, acks, copies, backups) are drained a step later. The
    poll is pr36425's."""

    name, pipelined = "pr39903", True


class Pr39267(Sglang0523):
    """PR #39267 (open) on 0.5.23: with a TRAILING_PAGES side-car the hit query first
    agrees, in a fixed-size MIN, on the hit's upper bound and whether every rank has
    endpoint metadata, then MIN-reduces restorable flags sized by that agreed bound, so
    every rank's tensors have one size whatever its own request span."""

    name, trailing_hit_shape = "pr39267", "bounded_mask"


class Pr34568(Pr36425):
    """PR #34568 (open, for #34572), on 0.5.19's two-pass bootstrap RID ring, which 0.5.23
    no longer has: PD prefill at PP > 1 admits a bootstrapped request only when every
    stage's prefetch of it is ready, folded into the ring's first pass
    (hicache.agreement.pd_admission `stage_sets`). The poll is pr36425's; without the
    admission stage (off by default) it is pr36425."""

    name, ready_in_ring = "pr34568", True


REGISTRY: dict[str, type[Protocol]] = {
    p.name: p for p in (Pre27010, Pr27010, Pr36425, StepBatched, StepClock, Sglang0523,
                        Pr33029, Pr38284, Pr32725, Pr39903, Pr39267, Pr34568)
}


def make_protocol(name: str, policy: str, race_guard: bool = True) -> Protocol:
    return REGISTRY[name](policy, race_guard)
