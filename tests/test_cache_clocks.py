"""The prefetch timeout clocks in one process, with recorded collectives: step-clock decides
on rank 0's broadcast stamp, sglang-0.5.23 runs its budget from the first blocked poll, and
step-batched's per-step flags decide exactly the timed-out ops.

SGLang source these follow (sgl-project/sglang): mem_cache/unified_radix_cache.py (the
timeout budget) and mem_cache/hiradix_cache.py `_can_terminate_prefetch` (each rank's own
clock, the contrast).
"""

from __future__ import annotations

import time

import torch

from hicache.comm.groups import Layout
from hicache.spec.config import HiCacheConfig
from tests.doubles import RecordingComm, admit, hashes_of, one_rank_cache, tokens
from tests.test_cache_events import PAGE, PROMPT, _hit  # the events tests' prompt and hit

# ---- step-clock's clock: rank 0's broadcast step stamp, never this rank's own clock ------
#
# A rank whose own clock disagrees with rank 0's stamps (a late or early start, a slow
# scheduler) must still decide as rank 0 does: the step-clock protocol has no collective to
# repair a rank that used its own clock. Each case puts the two clocks on opposite sides of
# the 1 s timeout.

CLOCKS = {"policy": "timeout", "tp": 2, "timeout_base_s": 1.0, "timeout_per_ki_token_s": 0.0}
ENQUEUED = 100.0  # rank 0's step stamp when the request arrived


def _held(protocol: str, local_age_s: float):
    """A pending prefetch holding host slots, enqueued at stamp ENQUEUED, whose start on
    this rank's own clock lies `local_age_s` in the past."""
    comm = RecordingComm(Layout(0, 2, 1))
    cache = one_rank_cache(HiCacheConfig(protocol=protocol, **CLOCKS), comm)
    admit(cache, "r0", PROMPT, stamp=ENQUEUED)
    cache.ongoing["r0"].start_time = time.monotonic() - local_age_s
    _hit(cache, "r0", 8)
    cache.check_hicache_events(ENQUEUED, busy=True)  # drains the hit: host slots, IO queued
    assert cache.ongoing["r0"].host_slots is not None
    return cache, comm


def test_step_clock_times_out_on_the_stamp_while_the_local_clock_says_fresh():
    cache, comm = _held("step-clock", local_age_s=0.0)
    cache.check_hicache_events(ENQUEUED + 5.0, busy=True)
    decided = cache.ongoing["r0"].decided
    assert decided, "5 s after enqueue on the stamps: step-clock must time out"
    assert cache.check_prefetch_progress("r0")
    assert "decision" not in comm.sites()  # the stamp is the agreement: no collective


def test_step_clock_waits_on_the_stamp_while_the_local_clock_says_timed_out():
    cache, comm = _held("step-clock", local_age_s=1000.0)
    cache.check_hicache_events(ENQUEUED + 0.5, busy=True)
    decided = cache.ongoing["r0"].decided
    assert not decided, "0.5 s after enqueue on the stamps: step-clock must not time out"
    assert not cache.check_prefetch_progress("r0")


def test_other_protocols_time_out_on_this_ranks_clock():
    """The contrast (SGLang's `_can_terminate_prefetch`: each rank's own time.monotonic()):
    the same op and stamps, decided by the local clock, then agreed by a collective."""
    cache, comm = _held("pr36425", local_age_s=1000.0)
    cache.check_hicache_events(ENQUEUED + 0.5, busy=True)
    assert cache.check_prefetch_progress("r0")
    assert comm.sites().count("decision") == 1


def test_scheduler_hands_the_cache_rank_zeros_stamp():
    """The stamp the cache decides on is the broadcast one (msg["now"]), at enqueue and at
    every step, not the receiving rank's clock at that moment."""
    from hicache.comm.groups import Groups
    from hicache.serve.system import System

    cfg = HiCacheConfig(protocol="step-clock", **{**CLOCKS, "tp": 1})
    layout = Layout(0, 1, 1)
    system = System(cfg, layout, Groups(layout, "gloo", 1.0), torch.device("cpu"))
    stamp = time.monotonic() + 1000.0  # rank 0's clock, far from this one
    msg = {"now": stamp, "reqs": [("r0", PROMPT, stamp, 1, "prefetch")], "all_arrived": False}
    system.scheduler._step(0, msg)
    start_stamp = system.cache.ongoing["r0"].start_stamp
    assert start_stamp == stamp
    assert system.cache.step_stamp == stamp
    system.close()


# ---- shared prefixes in flight: the duplicate host slots go back -------------------------
#
# Two requests with the same stored prefix, admitted before either prefetch ends, each get
# host slots for it. The first to end inserts its pages into the tree; the second finds
# them there (`RadixTree.insert` returns the overlap) and must free its own copies
# (`HiCache._finalize`'s `dup`), or those slots leak. Real controller threads, no latency.


# ---- 0.5.23's clock: from the first blocked poll, over the requested pages ---------------
#
# unified_radix_cache.py: the timeout budget counts the requested pages (not the agreed
# hit), runs from the first poll that found the prefetch pending, and a prefetch whose KV
# pages all landed never times out.

FIRST_BLOCKED = {"policy": "timeout", "tp": 2, "timeout_base_s": 1.0,
                 "timeout_per_ki_token_s": 1.0}


def _blocked_once(hit_pages: int = 8):
    cache = one_rank_cache(HiCacheConfig(protocol="sglang-0.5.23", **FIRST_BLOCKED),
                           RecordingComm(Layout(0, 2, 1)))
    admit(cache, "r0", PROMPT)
    _hit(cache, "r0", hit_pages)
    cache.check_hicache_events(0.0, busy=True)
    op = cache.ongoing["r0"]
    assert op.wait_start is None  # no poll yet: no clock
    assert not cache.check_prefetch_progress("r0")
    assert op.wait_start is not None  # the first blocked poll started it
    return cache, op


def test_sglang_0523_clock_starts_at_the_first_blocked_poll_and_only_then():
    cache, op = _blocked_once()
    first = op.wait_start
    assert not cache.check_prefetch_progress("r0")
    assert op.wait_start == first  # a later blocked poll does not restart it
    assert not cache._timed_out(op)


def test_sglang_0523_budget_counts_the_requested_pages():
    """9 requested pages (576 tokens): 1 s + 576/1024 s = 1.5625 s, whatever the hit."""
    cache, op = _blocked_once(hit_pages=5)
    assert len(op.tokens) == 9 * PAGE
    op.wait_start = time.monotonic() - 1.5
    assert not cache._timed_out(op)  # the hit's budget (1.3125 s) would have passed
    op.wait_start = time.monotonic() - 1.6
    assert cache._timed_out(op)


def test_sglang_0523_never_times_out_once_every_kv_page_landed():
    cache, op = _blocked_once()
    op.wait_start = time.monotonic() - 100.0
    op.completed_tokens = op.hit_tokens - PAGE
    assert cache._timed_out(op)
    op.completed_tokens = op.hit_tokens
    assert not cache._timed_out(op)


def test_sglang_0523_clock_runs_only_under_the_timeout_policy():
    cfg = HiCacheConfig(protocol="sglang-0.5.23", **{**FIRST_BLOCKED, "policy": "wait_complete"})
    cache = one_rank_cache(cfg, RecordingComm(Layout(0, 2, 1)))
    admit(cache, "r0", PROMPT)
    _hit(cache, "r0", 8)
    cache.check_hicache_events(0.0, busy=True)
    assert not cache.check_prefetch_progress("r0")
    assert cache.ongoing["r0"].wait_start is None


# ---- step-batched: the per-step flags decide, op by op -----------------------------------

def test_step_batched_flags_decide_exactly_the_timed_out_ops():
    """Three pending ops; only the middle one timed out: its flag (negated into the
    per-step MIN) decides it, and no other, at the step; the poll then just reads it."""
    cfg = HiCacheConfig(protocol="step-batched", policy="timeout", tp=2,
                        timeout_base_s=1.0, timeout_per_ki_token_s=0.0)
    comm = RecordingComm(Layout(0, 2, 1))
    cache = one_rank_cache(cfg, comm)
    for i in range(3):
        admit(cache, f"r{i}", tokens(9, PAGE, base=1000 * i))
        op = cache.ongoing[f"r{i}"]
        op.hash_value = hashes_of(9, PAGE, base=1000 * i)[:8]
        cache.controller.hit_queue.put(op)
    cache.check_hicache_events(0.0, busy=True)  # drains the hits: all three hold slots
    cache.ongoing["r1"].start_time -= 5.0  # only r1 is past its 1 s on this rank's clock
    cache.check_hicache_events(0.0, busy=True)
    assert [cache.ongoing[f"r{i}"].decided for i in range(3)] == [False, True, False]
    assert cache.check_prefetch_progress("r1") and not cache.check_prefetch_progress("r0")
    assert "decision" not in comm.sites()
    assert comm.sites().count("per_step_min") == 2  # one packed MIN per step
