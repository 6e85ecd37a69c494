"""Analytic collective counts of docs/design.md section 4 (with its corrections), per poll and per
request.

The tests and the CI gate compare what a run measured against these numbers, computed from
the run's own polls and layout. Counts are those issued by global rank 0 (PP stage 0,
TP rank 0): a PP hop costs rank 0 one point-to-point send.

Background reductions (hit-query MIN, per-batch ack MINs) run on the background threads'
own groups: for the ack protocols over TP and then PP, T + (1 if PP > 1) each; for
pre27010 over TP only. The final "request complete" ack carries nothing and costs nothing.
Per step (not per request, `per_step`): one packed MIN with PP = 1; with PP > 1 the
release's shape (hicache.agreement.step_agreement): relayed reductions (a TP MIN on stage 0,
then the PP hop) and stage-local ones (a TP MIN on every stage, no hop).
"""

from __future__ import annotations

from dataclasses import dataclass

IO_BATCH_PAGES = 128  # pages per storage read batch and per completion ack

PROTOCOLS = ("pre27010", "pr27010", "pr36425", "step-batched", "step-clock", "sglang-0.5.23",
             "pr33029", "pr38284", "pr32725", "pr39903", "pr39267", "pr34568")
# Open pull requests modelled on the released poll of pr36425 (docs/prs.md): their poll
# costs what pr36425's does; they differ in where and how often a poll is issued.
OPEN_PRS = ("pr33029", "pr38284", "pr32725")
# Pull requests on pr36425 that change no count: pr39903 (closed) waits on check_hicache_events'
# agreement a step later; the same collectives, issued at the same step. pr34568 changes
# only PD prefill's admission ring, a stage off by default (HiCacheConfig.pd_admission).
SAME_COUNTS_AS_PR36425 = OPEN_PRS + ("pr39903", "pr34568")
# Protocols whose change lives only in the PD-prefill admission stage: the hazard matrix
# runs them only in the scenarios that turn it on (elsewhere they are pr36425's cell).
ADMISSION_PROTOCOLS = ("pr34568",)
# 0.5.23 and pr39267 on it (open): its poll, per-step reduce and PP-ticket path; pr39267
# adds a hit-query reduction with a TRAILING_PAGES side-car (hicache.agreement.hit_query).
RELEASE_0523 = ("sglang-0.5.23", "pr39267")
POLICIES = ("best_effort", "wait_complete", "timeout")
ACK_PROTOCOLS = frozenset(PROTOCOLS) - {"pre27010"}
# Host memory: "cache" (an L2 tier, the default) or "buffer_only" (staging between storage
# and the device only: UnifiedRadixCache from 0.5.19 on; 0.5.18, pre27010's last release,
# has no such mode). Only 0.5.23 (and pr39267 on it) takes the PP-ticket path with it.
HOST_MEMORY = ("cache", "buffer_only")
BUFFER_ONLY_PROTOCOLS = tuple(p for p in PROTOCOLS if p != "pre27010")
# The releases a run of SGLang's own code names (`sglang-<release>@<cache class>`,
# sglang_adapter.target) -> the project protocol that models that release (docs/releases.md).
RELEASE_MODELS = {"sglang-0.5.18": "pre27010", "sglang-0.5.19": "pr36425",
                  "sglang-0.5.23": "sglang-0.5.23"}
# Protocols that decide in the poll from the same facts, so one poll can ask both
# (hicache.cache.twin, the step-paired design): the headline pair.
TWINS = ("pr27010", "pr36425")


def modelled(protocol: str) -> str:
    """The project protocol a protocol column is modelled by: itself, or for a run of
    SGLang's own code (`sglang-0.5.23@unified`, or a labelled side of several,
    `base=sglang-0.5.23@unified`) its release's; a source tree or a release not read: the
    newest release's."""
    if "@" not in protocol:
        return protocol
    release = protocol.split("@", 1)[0].rpartition("=")[2]
    return RELEASE_MODELS.get(release, "sglang-0.5.23")


@dataclass(frozen=True)
class Expected:
    decision: int
    completion: int
    pp_hops: int
    hit_query: int
    ack: int
    ticket: int = 0  # the PP-ticket relay's broadcast (buffer_only, PP > 1)


def tp_cost(tp: int) -> int:
    """T: one collective per TP all-reduce when TP > 1."""
    return 1 if tp > 1 else 0


def pp_cost(pp: int) -> int:
    """P: the PP hop (rank 0 sends once to stage 1) when PP > 1."""
    return 1 if pp > 1 else 0


def background_cost(protocol: str, tp: int, pp: int) -> int:
    """Collectives one background reduction (hit query, per-batch ack) costs rank 0."""
    t = tp_cost(tp)
    return t + pp_cost(pp) if protocol in ACK_PROTOCOLS else t


# (relayed, stage-local) reductions per step with PP > 1: 0.5.19's two relayed ones (the
# project's default), 0.5.18's writing_check + loading_check relayed and the queue drain
# stage-local (pre27010).
# sglang-0.5.23: one packed reduce, relayed; with buffer_only every stage's own TP MIN.
STEP_REDUCTIONS_PP = {"pre27010": (2, 1), "pr27010": (2, 0), "pr36425": (2, 0),
                      "step-batched": (2, 0), "step-clock": (2, 0), "sglang-0.5.23": (1, 0),
                      "pr39267": (1, 0),
                      **dict.fromkeys(SAME_COUNTS_AS_PR36425, (2, 0))}


def ticket_path(protocol: str, pp: int, host_memory: str = "cache") -> bool:
    """0.5.23's PP-ticket path: buffer_only host memory with PP > 1 (hybrid_cache_controller
    .py:327-340); a poll then asks whether stage 0's ticket is ready, whatever the policy."""
    return protocol in RELEASE_0523 and host_memory == "buffer_only" and pp > 1


# check_hicache_events' agreement issued async and waited on a step later (PR #39903).
PIPELINED = ("pr39903",)


def hidden_per_step(protocol: str, tp: int, pp: int) -> int:
    """TP all-reduces of the per-step agreement rank 0 no longer waits for inside its step
    (pipelined: issued at the end of one step, normally done by the next); the PP relay
    still blocks where it is waited on."""
    protocol = modelled(protocol)
    return per_step(protocol, tp, pp)[0] if protocol in PIPELINED else 0


def hit_query_rounds(protocol: str, trailing_sidecar: bool) -> int:
    """Reductions of one hit query (each over TP, then PP for the ack protocols)."""
    return 2 if protocol == "pr39267" and trailing_sidecar else 1


def per_step(protocol: str, tp: int, pp: int, pp_rank: int = 0,
             host_memory: str = "cache") -> tuple[int, int]:
    """(TP all-reduces, PP hop ops) check_hicache_events' agreement costs a rank of PP stage
    `pp_rank` in one step. A relay costs stage 0 one send, the last stage one receive, a
    stage between them both; only stage 0 all-reduces a relayed value."""
    protocol = modelled(protocol)
    t = tp_cost(tp)
    if pp == 1:
        return t, 0
    relayed, local = (0, 1) if ticket_path(protocol, pp, host_memory) else \
        STEP_REDUCTIONS_PP[protocol]
    hops = int(pp_rank > 0) + int(pp_rank < pp - 1)
    return (relayed if pp_rank == 0 else 0) * t + local * t, relayed * hops


def decision_per_poll(protocol: str, policy: str, tp: int, pp: int,
                      host_memory: str = "cache") -> tuple[int, int]:
    """(TP all-reduces, PP hops) that one poll of a pending prefetch costs rank 0."""
    protocol = modelled(protocol)
    t, p = tp_cost(tp), pp_cost(pp)
    if ticket_path(protocol, pp, host_memory):
        return (t, p)  # the ticket's readiness, MAX-reduced on every poll
    if protocol in RELEASE_0523 or protocol in SAME_COUNTS_AS_PR36425:
        protocol = "pr36425"  # the same poll; its clock or where it is issued differs
    if protocol == "pre27010":
        return (0, 0) if policy == "best_effort" else (t, 0)
    if protocol == "pr27010":
        return (t, p)
    if protocol == "pr36425":
        return (t, p) if policy == "timeout" else (0, 0)
    if protocol in ("step-batched", "step-clock"):
        return (0, 0)
    raise ValueError(f"unknown protocol {protocol!r}")


@dataclass(frozen=True)
class Setting:
    """What one request's collectives depend on besides the request itself: the protocol
    and policy, the layout, and the pools.

    host_memory: on 0.5.23's PP-ticket path stage 0 also broadcasts each ticket to the
    later stages (one collective on rank 0).
    extra_pool: side-car pages ride along; the ack protocols then reduce one extra-pool
    ack after the batches.
    trailing_sidecar: the side-car has the TRAILING_PAGES hit policy; pr39267's hit query
    is then two reductions (the fixed-size bound, then the equal-size masks); 0.5.23's
    stays one (a larger tensor).
    """

    protocol: str
    policy: str
    tp: int
    pp: int
    host_memory: str = "cache"
    extra_pool: bool = False
    trailing_sidecar: bool = False


def expected_per_request(
    setting: Setting,
    polls: int,
    hit_pages: int,
    op_issued: bool,
    io_issued: bool,
    ended_by_poll: bool | None = None,
    absent_polls: int = 0,
    ops: int | None = None,
) -> Expected:
    """Collectives rank 0 issues for one request served in `setting`.

    polls: calls of check_prefetch_progress that found the prefetch still ongoing.
    hit_pages: pages the prefetch fetches: the hit all ranks agreed storage holds, cut to
    the host slots it got under memory pressure (0 when no prefetch was issued).
    op_issued: a PrefetchOperation was created, so the prefetch thread ran its hit query.
    io_issued: the prefetch got host slots and went to the IO thread (not revoked).
    ended_by_poll: a poll terminated the prefetch (terminated_by == "poll"); when unknown,
    any poll is taken to have ended it.
    absent_polls: calls of check_prefetch_progress that found no prefetch on this rank;
    pr38284 pays the poll's all-reduce for each (its dummy contribution), every other
    protocol nothing.
    ops: PrefetchOperations issued for the request, each with its own hit query (and on the
    PP-ticket path its own ticket); None: one if `op_issued`, else none. More than one where
    0.5.23's retries looked it up again after a miss (hicache.cache.retries). A miss never
    goes to IO, so `hit_pages`, `io_issued` and the acks are the last operation's; `polls`
    count every operation's.
    """
    protocol, policy, tp, pp = modelled(setting.protocol), setting.policy, setting.tp, setting.pp
    host_memory = setting.host_memory
    t = tp_cost(tp)
    ar, hop = decision_per_poll(protocol, policy, tp, pp, host_memory)
    # pre27010 agrees on the usable length with one MIN when a poll terminates a prefetch
    # holding host slots; one stopped before its hit was agreed is revoked with none.
    by_poll = polls > 0 if ended_by_poll is None else ended_by_poll
    completion = t if protocol == "pre27010" and by_poll and io_issued else 0
    bg = background_cost(protocol, tp, pp)
    acks = 0
    if protocol in ACK_PROTOCOLS and io_issued:
        # One per 128-page batch, plus the extra-pool ack; the final ack is free.
        acks = bg * (-(-hit_pages // IO_BATCH_PAGES) + int(setting.extra_pool))
    n_ops = int(op_issued) if ops is None else ops
    hit_query = bg * hit_query_rounds(protocol, setting.trailing_sidecar) * n_ops
    ticket = n_ops * int(ticket_path(protocol, pp, host_memory))
    absent = absent_polls if protocol == "pr38284" else 0
    return Expected((polls + absent) * ar, completion, (polls + absent) * hop, hit_query, acks,
                    ticket)
