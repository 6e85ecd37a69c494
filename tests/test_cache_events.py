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

import time

import pytest

from hicache.cache.operations import KV, SIDECAR
from hicache.comm.groups import Layout
from hicache.memory.storage import SimStorage, StorageSpec
from hicache.spec.config import HiCacheConfig
from tests.doubles import RecordingComm, admit, hashes_of, one_rank_cache, patch_dist, tokens

PAGE = 64
PROMPT = tokens(9, PAGE)  # 8 pages in storage + one new


def _hit(cache, rid: str, pages: int) -> None:
    """The prefetch thread's agreed hit for `rid`, queued for the next step's drain."""
    op = cache.ongoing[rid]
    op.hash_value = hashes_of(9, PAGE)[:pages]
    cache.controller.hit_queue.put(op)


# ---- pre27010 pays the completion MIN only for ops holding host slots --------------------

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


# ---- per-step reductions --------------------------------------------------------------------

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


def test_the_model_beside_pads_the_step_with_the_min_sglangs_own_step_adds():
    """--model-beside: every step of an SGLang side issues SGLang's own per-step MIN before
    the harness's agreement, so the model's step issues one more TP MIN there
    (HiCacheConfig.step_pad_min); none on a one-rank TP group."""
    for protocol in ("pre27010", "pr36425"):
        comm = RecordingComm(Layout(0, 2, 1))
        cfg = HiCacheConfig(protocol=protocol, tp=2, step_pad_min=True)
        one_rank_cache(cfg, comm).check_hicache_events(0.0, busy=True)
        assert comm.calls == [("tp_cpu", "per_step_min"), RELAYED], protocol
    comm = RecordingComm(Layout(0, 1, 1))
    cache = one_rank_cache(HiCacheConfig(protocol="pr36425", tp=1, step_pad_min=True), comm)
    cache.check_hicache_events(0.0, busy=True)
    assert ("tp_cpu", "per_step_min") not in comm.calls


# ---- host pool pressure ---------------------------------------------------------------------

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


# ---- the host-slot self-check ---------------------------------------------------------------

def test_host_slot_self_check_counts_slots_neither_in_tree_nor_free():
    cache = one_rank_cache(HiCacheConfig(tp=2), RecordingComm())
    assert cache.host_slots_unaccounted() == 0
    held = cache.host_kv.alloc(3)
    assert cache.host_slots_unaccounted() == 3
    cache.host_kv.free(held)
    assert cache.host_slots_unaccounted() == 0


SHARED = 8  # stored pages both prompts share; each then has one new page of its own


def _shared_prompt(i: int) -> list[int]:
    return tokens(SHARED, PAGE) + tokens(1, PAGE, base=10_000 * (i + 1))


def _serve_together(protocol: str, n: int = 2, extra_pool: bool = False):
    """n requests sharing one stored prefix, served to the end of their prefetches."""
    storage = SimStorage(StorageSpec(latency_ms=0.0, exists_latency_ms=0.0), 0, 0)
    cfg = HiCacheConfig(protocol=protocol, policy="wait_complete", tp=2, extra_pool=extra_pool)
    storage.put(hashes_of(SHARED, PAGE), KV, cfg.kv_page_elems)
    if extra_pool:
        storage.put(hashes_of(SHARED, PAGE), SIDECAR, cfg.sidecar_page_elems)
    cache = one_rank_cache(cfg, RecordingComm(Layout(0, 2, 1)), storage)
    rids = [f"r{i}" for i in range(n)]
    for i, rid in enumerate(rids):
        admit(cache, rid, _shared_prompt(i))
    assert len(cache.ongoing) == n  # all in flight together: none found it in the tree
    cache.controller.start()
    deadline = time.monotonic() + 10.0
    while cache.ongoing:
        assert time.monotonic() < deadline, f"prefetches still ongoing: {list(cache.ongoing)}"
        cache.check_hicache_events(0.0, busy=True)
        for rid in rids:
            cache.check_prefetch_progress(rid)  # pre27010 ends by a poll, the others by acks
        time.sleep(0.001)
    cache.controller.stop()
    assert cache.controller.error is None, cache.controller.error
    cache.free_stopped_tails()
    return cache, rids


@pytest.mark.parametrize("protocol", ["pre27010", "pr36425"])
def test_shared_prefix_in_flight_frees_the_duplicate_host_slots(protocol):
    cache, rids = _serve_together(protocol)
    for rid in rids:  # both fetched the whole prefix
        assert cache.stats.decisions[rid][1] == SHARED * PAGE, cache.stats.decisions
    assert cache.host_slots_unaccounted() == 0
    assert cache.tree.total_pages == SHARED  # one copy in the tree
    assert cache.host_kv.available == cache.host_kv.num_pages - SHARED
    for rid in rids:  # each loads the tree's copy back, with the right bytes
        dev, _ = cache.load_back(rid)
        assert len(dev) == SHARED and cache.stats.requests[rid].data_errors == 0


@pytest.mark.parametrize("protocol", ["pre27010", "pr36425"])
def test_shared_prefix_with_sidecar_pages(protocol):
    """The same, with side-car pages riding along: both pools' duplicates go back, and each
    request loads both pools' pages back intact."""
    cache, rids = _serve_together(protocol, extra_pool=True)
    assert cache.host_slots_unaccounted() == 0
    assert cache.host_side is not None and cache.dev_side is not None
    for rid in rids:
        dev, _ = cache.load_back(rid)
        assert len(dev) == SHARED and cache.stats.requests[rid].data_errors == 0
        assert cache.stats.requests[rid].load_back_bytes == SHARED * 4 * (
            cache.cfg.kv_page_elems + cache.cfg.sidecar_page_elems)


# ---- pre27010's completion MIN over two real ranks (threads) ------------------------------
#
# Each rank's rank-local progress differs; the MIN of [KV tokens, side-car tokens] over the
# TP group is the usable length on both ranks. Side-car pages count once their read was
# issued until pool_transfers_done (the PR #27550 race), and not at all before it began.

SIDE_CASES = {  # rank 1's (KV pages, side-car pages, side-car read over, read begun) -> usable
    "sidecar_fewest": ((8, 3, True, True), 3),
    "kv_fewest": ((6, 8, True, True), 6),
    "sidecar_in_flight_counts_issued": ((8, 2, False, True), 8),
    "sidecar_not_begun": ((8, 0, False, False), 0),
}


@pytest.mark.parametrize("case", list(SIDE_CASES))
def test_pre27010_completion_min_over_two_ranks(monkeypatch, case):
    from hicache.comm.comm import CollectiveCounter, Comm
    from hicache.comm.groups import Groups
    from tests.doubles import ThreadWorld

    (kv, side, done, begun), usable = SIDE_CASES[case]
    world = ThreadWorld(2)  # a peer that never joins fails after 10 s, not a hang
    patch_dist(monkeypatch, world)
    cfg = HiCacheConfig(protocol="pre27010", policy="timeout", tp=2, extra_pool=True,
                        race_guard=False, timeout_base_s=0.0, timeout_per_ki_token_s=0.0)

    def rank(r):
        layout = Layout(r, 2, 1)
        comm = Comm(layout, Groups(layout, "gloo", 10.0), CollectiveCounter())
        cache = one_rank_cache(cfg, comm)
        admit(cache, "r0", PROMPT)
        _hit(cache, "r0", 8)
        cache.check_hicache_events(0.0, busy=True)
        op = cache.ongoing["r0"]
        mine = (8, 8, True, True) if r == 0 else (kv, side, done, begun)
        op.completed_tokens, op.sidecar_pages = mine[0] * PAGE, mine[1]
        op.pool_transfers_done, op.sidecar_started = mine[2], mine[3]
        assert cache.check_prefetch_progress("r0")
        return cache.stats.decisions["r0"], dict(comm.counter.by_rid["r0"])
    out = world.run(rank)
    assert out[0] == out[1], out
    assert out[0][0] == ("poll", usable * PAGE, 8 * PAGE)
    assert out[0][1] == {"decision": 1, "completion": 1}
