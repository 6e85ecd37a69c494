"""sglang-0.5.23 by hand, no process group: its timeout clock, its PP-ticket path
(buffer_only host memory, PP > 1), its per-step reduce and what each costs.

Written out from the 0.5.23 wheel (mem_cache/unified_radix_cache.py
`_start_storage_prefetch_wait` 2259-2271, `_prefetch_deadline_expired` 2273-2283,
`_can_terminate_prefetch` 2298-2315, `_check_pp_prefetch_progress` 2325-2333,
`_sync_hicache_ready_counts` 3412-3459; mem_cache/hybrid_cache/hybrid_cache_controller.py
327-340 and `pp_prefetch_command_thread_func`), not derived from hicache.
"""

from __future__ import annotations

import queue
import threading
import time

import pytest

from hicache.agreement.protocols import Facts, make_protocol
from hicache.cache.operations import PrefetchOp
from hicache.comm.groups import Layout
from hicache.memory.storage import SimStorage, StorageSpec
from hicache.spec.config import HiCacheConfig
from hicache.spec.cost_model import POLICIES, Setting, decision_per_poll, expected_per_request
from tests.doubles import RecordingComm, admit, hashes_of, one_rank_cache, tokens
from tests.protocol_sim import simulate

PAGE = 64
PROMPT = tokens(9, PAGE)  # 8 pages in storage + one new
RELAYED = ("tp_cpu+pp_cpu", "per_step_min")
STAGE_LOCAL = ("tp_cpu", "per_step_min")
DECISION = ("tp_cpu+pp_cpu", "decision")  # a MAX over TP on stage 0, then the PP hop


def _cache(policy="timeout", pp=1, host_memory="cache", rank=0, **kw):
    cfg = HiCacheConfig(protocol="sglang-0.5.23", policy=policy, tp=2, pp=pp,
                        host_memory=host_memory, **kw)
    comm = RecordingComm(Layout(rank, 2, pp))
    return one_rank_cache(cfg, comm), comm


# ---- the timeout clock (cache host memory, or PP = 1) -------------------------------------

ZERO = {"timeout_base_s": 0.0, "timeout_per_ki_token_s": 0.0}


def test_first_blocked_poll_cannot_time_out_and_starts_the_clock():
    cache, comm = _cache(**ZERO)  # a zero budget
    admit(cache, "r0", PROMPT)
    op = cache.ongoing["r0"]
    assert not cache.check_prefetch_progress("r0")  # pending, and no clock yet
    assert op.wait_start is not None and comm.calls == [DECISION]
    time.sleep(0.002)
    assert cache.check_prefetch_progress("r0")  # the second poll: past the budget
    assert comm.calls == [DECISION] * 2


def test_pr36425_times_out_at_the_first_poll_on_the_same_budget():
    cfg = HiCacheConfig(protocol="pr36425", policy="timeout", tp=2, **ZERO)
    cache = one_rank_cache(cfg, RecordingComm())
    admit(cache, "r0", PROMPT)
    time.sleep(0.002)
    assert cache.check_prefetch_progress("r0")  # its clock runs from the enqueue


def _pending_op(cache, landed: bool, waited_s: float) -> PrefetchOp:
    admit(cache, "r0", PROMPT)
    op = cache.ongoing["r0"]
    op.hash_value, op.host_slots = hashes_of(9, PAGE)[:8], list(range(8))
    op.completed_tokens = 8 * PAGE if landed else 4 * PAGE
    op.wait_start = time.monotonic() - waited_s
    return op


def test_landed_kv_never_times_out():
    cache, _ = _cache(**ZERO)
    assert not cache._timed_out(_pending_op(cache, landed=True, waited_s=1e6))
    cache, _ = _cache(**ZERO)
    assert cache._timed_out(_pending_op(cache, landed=False, waited_s=0.001))


def test_budget_counts_the_requested_pages_not_the_hit():
    """576 requested tokens (9 pages) at 1 s per 1024: 0.5625 s, whatever the agreed hit
    (none yet here)."""
    cache, _ = _cache(timeout_base_s=0.0, timeout_per_ki_token_s=1.0)
    op = _pending_op(cache, landed=False, waited_s=0.4)
    op.hash_value, op.host_slots = [], None  # hit not agreed yet
    assert len(op.tokens) == 576 and not cache._timed_out(op)
    op.wait_start -= 0.2
    assert cache._timed_out(op)


@pytest.mark.parametrize("policy", ["best_effort", "wait_complete"])
def test_clock_runs_only_under_timeout(policy):
    cache, _ = _cache(policy=policy)
    admit(cache, "r0", PROMPT)
    cache.check_prefetch_progress("r0")
    assert "r0" not in cache.ongoing or cache.ongoing["r0"].wait_start is None


# ---- the ticket path's decision table -------------------------------------------------------

READY, NOT_READY = Facts(ticketed=True, ticket_ready=True), Facts(ticketed=True)


@pytest.mark.parametrize("policy", POLICIES)
def test_ticket_vote_is_stage_0_readiness_whatever_the_policy(policy):
    p = make_protocol("sglang-0.5.23", policy)
    assert p.vote(READY) == [1] and p.vote(NOT_READY) == [0]
    terminated = Facts(ticketed=True, terminated=True)  # a 0-page hit: terminated, not ready
    assert p.vote(terminated) == [0]
    later = Facts(ticketed=True, ticket_ready=True, pp_rank=1)
    assert p.vote(later) == [0]  # later stages take stage 0's answer
    assert simulate(p, [READY, NOT_READY]) is True  # MAX: any rank of stage 0 ready
    assert simulate(p, [NOT_READY, NOT_READY]) is False


@pytest.mark.parametrize("policy", POLICIES)
def test_ticket_path_cost_per_poll(policy):
    assert decision_per_poll("sglang-0.5.23", policy, 2, 2, "buffer_only") == (1, 1)
    assert decision_per_poll("sglang-0.5.23", policy, 1, 2, "buffer_only") == (0, 1)
    # PP = 1 takes no ticket: pr36425's poll
    want = (1, 0) if policy == "timeout" else (0, 0)
    assert decision_per_poll("sglang-0.5.23", policy, 2, 1, "buffer_only") == want


@pytest.mark.parametrize("k", [1, 4])
def test_ticket_path_per_request(k):
    """TP2 x PP2: k polls of T + P, the ticket broadcast, the hit MIN and one ack per batch
    over TP then PP (the final ack free)."""
    e = expected_per_request(Setting("sglang-0.5.23", "wait_complete", 2, 2,
                                     host_memory="buffer_only"),
                             k, 300, True, True)
    assert (e.decision, e.pp_hops, e.completion, e.hit_query, e.ack, e.ticket) == (
        k, k, 0, 2, 2 * 3, 1)
    e = expected_per_request(Setting("sglang-0.5.23", "wait_complete", 2, 2), k, 300, True, True)
    assert (e.decision, e.ticket) == (0, 0)  # cache host memory: no ticket


# ---- the ticket path in one process ----------------------------------------------------------

def test_ticket_poll_waits_then_takes_what_the_acks_agreed():
    cache, comm = _cache(policy="timeout", pp=2, host_memory="buffer_only")
    admit(cache, "r0", PROMPT)
    op = cache.ongoing["r0"]
    assert op.ticketed and not cache.controller.prefetch_queue.empty()
    assert not cache.check_prefetch_progress("r0")
    assert comm.calls == [DECISION] and op.wait_start is None  # no clock on this path
    op.hash_value, op.host_slots = hashes_of(9, PAGE)[:8], cache.host_kv.alloc(8)
    op.hit_drained = True  # what the ticket thread did, then the acks agreed 6 pages
    op.completed_tokens = 6 * PAGE
    op.io_done.set()
    op.ready.set()
    assert cache.check_prefetch_progress("r0")
    assert cache.stats.decisions["r0"] == ("poll", 6 * PAGE, 8 * PAGE)
    assert cache.cached_tokens("r0") == 6 * PAGE and cache.tree.total_pages == 0
    cache.free_stopped_tails()
    assert cache.host_slots_unaccounted() == 0  # 6 staged, 2 freed


def test_buffer_only_staging_is_freed_by_its_load_back():
    cache, _ = _cache(policy="wait_complete", host_memory="buffer_only")
    admit(cache, "r0", PROMPT)
    op = cache.ongoing["r0"]
    op.hash_value, op.host_slots = hashes_of(9, PAGE)[:8], cache.host_kv.alloc(8)
    op.completed_tokens = 8 * PAGE
    cache._finalize(op, 8 * PAGE, "ack")
    assert cache.host_kv.available == cache.host_kv.num_pages - 8
    _, _ = cache.load_back("r0")
    assert cache.host_kv.available == cache.host_kv.num_pages  # staging, not a tier
    assert cache.tree.total_pages == 0


@pytest.mark.parametrize(("host_memory", "pp", "sites"), [
    ("cache", 1, [RELAYED]), ("cache", 2, [RELAYED]),  # one packed reduce at any PP
    ("buffer_only", 2, [STAGE_LOCAL]), ("buffer_only", 1, [RELAYED])])
def test_one_per_step_reduce(host_memory, pp, sites):
    cache, comm = _cache(pp=pp, host_memory=host_memory)
    cache.check_hicache_events(0.0, busy=True)
    assert comm.calls == sites


# ---- who holds host memory: the prefetch thread, before the hit MIN ---------------------------

class _MinComm(RecordingComm):
    """The peers' smallest hit is `peer_hit` pages: the MIN lands there."""

    def __init__(self, layout, peer_hit):
        super().__init__(layout)
        self.peer_hit = peer_hit

    def all_reduce_groups(self, t, op, groups, site, rid=None):
        super().all_reduce_groups(t, op, groups, site, rid)
        t.clamp_(max=self.peer_hit)


def _serve_one_ticket(peer_hit: int, free_pages: int):
    cfg = HiCacheConfig(protocol="sglang-0.5.23", policy="wait_complete", tp=2, pp=2,
                        host_memory="buffer_only", host_pool_pages=16)
    storage = SimStorage(StorageSpec(latency_ms=0.0, exists_latency_ms=0.0), 0, 0)
    comm = _MinComm(Layout(0, 2, 2), peer_hit)
    cache = one_rank_cache(cfg, comm, storage)
    storage.put(hashes_of(9, PAGE)[:8], "kv", cfg.kv_page_elems)
    cache.host_kv.alloc(16 - free_pages)  # held elsewhere
    admit(cache, "r0", PROMPT)
    ctl = cache.controller
    ctl.prefetch_queue.put(None)
    thread = threading.Thread(target=ctl._prefetch_loop)
    thread.start()
    thread.join(10)
    return cache, comm, cache.ongoing["r0"], ctl.io_queue


def test_ticket_thread_allocates_its_hit_and_frees_past_the_agreed_one():
    cache, comm, op, io = _serve_one_ticket(peer_hit=5, free_pages=16)
    assert io.get_nowait() is op and len(op.host_slots) == len(op.hash_value) == 5
    assert cache.host_kv.available == 16 - 5  # 8 allocated, 3 freed after the MIN
    # the ticket, its hit MIN (TP then PP), the stop broadcast
    assert comm.calls == [("ticket", "ticket"), ("prefetch", "hit_query"),
                          ("prefetch_pp", "hit_query"), ("ticket", "ticket")]


def test_ticket_hit_cut_to_free_host_memory_or_voted_zero():
    cache, _, op, io = _serve_one_ticket(peer_hit=8, free_pages=5)
    assert len(op.host_slots) == 5  # 8 hit, 5 fit (320 tokens >= the 256 threshold)
    cache, _, op, io = _serve_one_ticket(peer_hit=8, free_pages=3)
    # 192 tokens do not reach the threshold: a vote of 0, terminated, still read (nothing)
    assert op.host_slots == [] and op.terminated.is_set() and io.get_nowait() is op
    assert cache.host_kv.available == 3


def test_buffer_only_not_for_pre27010():
    """0.5.18, pre27010's last release, has no buffer_only mode; UnifiedRadixCache has it
    from 0.5.19 on (pr36425's poll there, no PP tickets)."""
    with pytest.raises(ValueError, match="buffer_only"):
        HiCacheConfig(protocol="pre27010", host_memory="buffer_only")
    assert HiCacheConfig(protocol="pr36425", host_memory="buffer_only", pp=2)
    with pytest.raises(ValueError, match="host_memory"):
        HiCacheConfig(host_memory="l2")


def test_idle_ticket_relay_broadcasts_nothing_to_carry():
    cache, comm = _cache(pp=2, host_memory="buffer_only")
    relay = cache.controller.tickets
    relay.idle_s = 0.01
    assert relay.next(queue.Queue()) is None  # idle: an empty broadcast
    assert comm.calls == [("ticket", "ticket")]


# ---- an agreed expiry (unified_radix_cache.py:2285-2289, 2404-2414, 2098-2100) -------------

@pytest.mark.parametrize(("proto", "marks"), [("sglang-0.5.23", True), ("pr36425", False)])
def test_agreed_expiry_ends_with_deadline_and_is_never_reissued(proto, marks):
    """0.5.23: the poll that ends a running prefetch under timeout marks its deadline
    expired: finish reason "deadline", and prefetch_from_storage (admit here) never issues
    it again. pr36425 (0.5.19) has neither: the same request is issued afresh."""
    cfg = HiCacheConfig(protocol=proto, policy="timeout", tp=2, **ZERO)
    cache = one_rank_cache(cfg, RecordingComm())
    admit(cache, "r0", PROMPT)
    while not cache.check_prefetch_progress("r0"):  # 0.5.23: the first poll starts the clock
        time.sleep(0.002)
    st = cache.stats.requests["r0"]
    assert st.terminated_by == "poll" and "r0" not in cache.ongoing
    assert st.prefetch_finish == ("deadline" if marks else None)
    cache.admit("r0", PROMPT, 0.0)  # a retry's re-issue enters here
    assert ("r0" in cache.ongoing) is not marks


def test_best_effort_end_is_no_deadline():
    """best_effort ends a prefetch at its first poll: no expiry, and it may be issued again."""
    cache, _ = _cache(policy="best_effort")
    admit(cache, "r0", PROMPT)
    assert cache.check_prefetch_progress("r0")
    assert cache.stats.requests["r0"].prefetch_finish is None and not cache.expired
    cache.admit("r0", PROMPT, 0.0)
    assert "r0" in cache.ongoing
