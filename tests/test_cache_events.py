"""The scheduler side of HiCache in one process, with recorded collectives: which
collectives a poll and a step issue, how a hit is given host slots under memory pressure,
and the host-slot self-check.

SGLang source these follow (sgl-project/sglang): mem_cache/hiradix_cache.py
`check_prefetch_progress` (pre-PR-#27010 style: revoke with no MIN while `host_indices` is
None, `_sync_and_clamp_prefetch_result` otherwise) and mem_cache/unified_radix_cache.py
`check_hicache_events` (PP > 1: two `_all_reduce` calls) and `_try_alloc_storage_hit`
(memory-pressure fallback to the longest prefix that fits).
"""

from __future__ import annotations

from hicache.comm import Layout
from hicache.config import HiCacheConfig
from tests.doubles import RecordingComm, admit, hashes_of, one_rank_cache, tokens

PAGE = 64
PROMPT = tokens(9, PAGE)  # 8 pages in storage + one new


def _hit(cache, rid: str, pages: int) -> None:
    """The prefetch thread's agreed hit for `rid`, queued for the next step's drain."""
    op = cache.ongoing[rid]
    op.hash_value = hashes_of(9, PAGE)[:pages]
    cache.controller.hit_queue.put(op)


# ---- item 1: pre27010 pays the completion MIN only for ops holding host slots ------------

def test_pre27010_poll_before_hit_agreed_revokes_without_completion_min():
    cfg = HiCacheConfig(protocol="pre27010", policy="timeout", tp=2, timeout_base_s=0.0,
                        timeout_per_ki_token_s=0.0)
    comm = RecordingComm(Layout(0, 2, 1))
    cache = one_rank_cache(cfg, comm)
    admit(cache, "r0", PROMPT)
    assert cache.check_prefetch_progress("r0")  # timed out before its hit was agreed
    assert comm.sites() == ["decision"]
    assert cache.stats.decisions["r0"] == ("poll", 0, None)
    assert cache.host_kv.available == cfg.host_pool_pages


def test_pre27010_poll_of_an_op_holding_host_slots_agrees_on_the_usable_length():
    cfg = HiCacheConfig(protocol="pre27010", policy="timeout", tp=2, timeout_base_s=0.0,
                        timeout_per_ki_token_s=0.0)
    comm = RecordingComm(Layout(0, 2, 1))
    cache = one_rank_cache(cfg, comm)
    admit(cache, "r0", PROMPT)
    _hit(cache, "r0", 8)
    cache._drain_hits(1)
    assert cache.ongoing["r0"].host_slots is not None
    assert cache.check_prefetch_progress("r0")
    assert comm.sites() == ["decision", "completion"]


# ---- item 5: per-step reductions ------------------------------------------------------------

def _step_sites(pp: int, protocol: str = "pr36425") -> list:
    comm = RecordingComm(Layout(0, 2, pp))
    cache = one_rank_cache(HiCacheConfig(protocol=protocol, tp=2, pp=pp), comm)
    cache.check_hicache_events(0.0, busy=True)
    return comm.calls


def test_one_packed_per_step_min_without_pp():
    assert _step_sites(1) == [("tp_cpu+pp_cpu", "per_step_min")]


RELAYED = ("tp_cpu+pp_cpu", "per_step_min")  # TP MIN on stage 0, then the PP hop
STAGE_LOCAL = ("tp_cpu", "per_step_min")  # this stage's TP group only


def test_two_per_step_reductions_with_pp():
    """unified_radix_cache.check_hicache_events with pp_size != 1 (0.5.19): finished-op
    counts, then the storage queue sizes, each through `_all_reduce` (TP on stage 0, then
    the PP hop)."""
    for protocol in ("pr27010", "pr36425", "step-batched", "step-clock"):
        assert _step_sites(2, protocol) == [RELAYED] * 2


def test_pre27010_per_step_agreement_with_pp_is_0_5_18s():
    """0.5.18 (hiradix_cache.py:1525-1529): writing_check and loading_check, each relayed,
    then drain_storage_control_queues over each stage's own TP group, no PP hop."""
    assert _step_sites(2, "pre27010") == [RELAYED, RELAYED, STAGE_LOCAL]
    assert _step_sites(1, "pre27010") == [RELAYED]  # one packed MIN without PP


# ---- item 7: host pool pressure -------------------------------------------------------------

def _pressured(free_pages: int):
    cfg = HiCacheConfig(protocol="pr36425", policy="wait_complete", tp=2, host_pool_pages=16)
    cache = one_rank_cache(cfg, RecordingComm())
    cache.host_kv.alloc(16 - free_pages)  # held elsewhere (not evictable)
    admit(cache, "r0", PROMPT)
    _hit(cache, "r0", 8)
    cache._drain_hits(1)
    return cache


def test_hit_larger_than_free_host_memory_gets_the_longest_prefix_that_fits():
    cache = _pressured(free_pages=5)  # 5 pages = 320 tokens >= threshold 256
    op = cache.ongoing["r0"]
    assert op.host_slots is not None and len(op.host_slots) == 5
    assert len(op.hash_value) == 5 and cache.controller.io_queue.get_nowait() is op
    assert cache.stats.requests["r0"].hit_tokens == 5 * PAGE  # what it will fetch
    assert cache.host_kv.available == 0


def test_hit_is_revoked_when_what_fits_is_below_the_threshold():
    cache = _pressured(free_pages=3)  # 192 tokens < 256
    assert "r0" not in cache.ongoing
    assert cache.stats.decisions["r0"] == ("revoked", 0, 8 * PAGE)
    assert cache.host_kv.available == 3


# ---- item 9: the host-slot self-check -------------------------------------------------------

def test_host_slot_self_check_counts_slots_neither_in_tree_nor_free():
    cache = one_rank_cache(HiCacheConfig(tp=2), RecordingComm())
    assert cache.host_slots_unaccounted() == 0
    held = cache.host_kv.alloc(3)
    assert cache.host_slots_unaccounted() == 3
    cache.host_kv.free(held)
    assert cache.host_slots_unaccounted() == 0
