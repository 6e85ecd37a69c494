"""SGLang 0.5.23's storage prefetch retries (PRs #36227, #39283, #40042) in the model:
the retry set (hicache.cache.retries, against SGLang's own `StoragePrefetchRetries` where its
wheel is here), where HiCache arms one and what a retry issues (one process, recorded
collectives), the storage tier's late landing, and the cost model's count of hit queries.

SGLang source (0.5.23): mem_cache/storage_prefetch.py `StoragePrefetchRetries`;
managers/scheduler.py `_process_storage_prefetch_retries`, `_retry_storage_prefetch`,
`_prefetch_kvcache`; mem_cache/unified_radix_cache.py `prefetch_from_storage` (cancel, the
deadline and ongoing checks, threshold, rate limit), `check_prefetch_progress` (a poll that
ends a prefetch without host slots arms a miss, unless its deadline expired), the hit drain
of `_drain_storage_control_queues_impl` (below the threshold, no host memory).
"""

from __future__ import annotations

import importlib.util
import random
import sys
import types
from pathlib import Path

import pytest
import torch

from hicache.cache.retries import PrefetchRetries
from hicache.comm.groups import Layout
from hicache.memory.storage import SimStorage, StorageSpec
from hicache.spec.config import HiCacheConfig
from hicache.spec.cost_model import Setting, background_cost, expected_per_request
from tests.doubles import RecordingComm, admit, hashes_of, one_rank_cache, tokens

PAGE = 64
PROMPT = tokens(9, PAGE)  # 8 pages in storage + one new
OTHER = tokens(9, PAGE, base=10_000_000)  # another request, ahead of r1 in the queue


# ---- the retry set, as SGLang's ------------------------------------------------------------

def test_a_poll_miss_is_due_interval_passes_after_the_first_pass_that_sees_it():
    r = PrefetchRetries()
    r.poll_miss("r1")
    popped = [r.pop_ready(["r0", "r1"], {}, 3, 8) for _ in range(4)]
    assert popped == [[], [], [], [("r1", None)]]
    assert not r.armed("r1")  # popped once: it is issued again, not re-armed


def test_the_queue_head_never_waits_on_a_paced_retry_but_an_immediate_one_fires():
    r = PrefetchRetries()
    r.poll_miss("r0")
    assert r.pop_ready(["r0", "r1"], {}, 1, 8) == [] and not r.armed("r0")
    r.refetch("r0", 512)
    assert r.pop_ready(["r0", "r1"], {}, 1, 8) == [("r0", 512)]


def test_the_attempt_cap_and_a_zero_interval_cancel_paced_retries():
    r = PrefetchRetries()
    r.poll_miss("r1")
    assert r.pop_ready(["r0", "r1"], {"r1": 8}, 1, 8) == [] and not r.armed("r1")
    r.poll_miss("r1")
    assert r.pop_ready(["r0", "r1"], {}, 0, 8) == [] and not r.armed("r1")
    r.refetch("r1")  # a zero interval disables miss retries only
    assert r.pop_ready(["r0", "r1"], {}, 0, 8) == [("r1", None)]


def test_due_retries_pop_in_waiting_queue_order_not_arming_order():
    r = PrefetchRetries()
    for rid in ("r3", "r1", "r2"):
        r.refetch(rid)
    assert [rid for rid, _ in r.pop_ready(["r0", "r1", "r2", "r3"], {}, 8, 8)] == \
        ["r1", "r2", "r3"]


def _sglang_retries_class():
    """SGLang 0.5.23's StoragePrefetchRetries, from its unpacked source (only its module's
    one import of another SGLang module stood in: ComponentType, read by a dataclass below
    it that this test does not use)."""
    from sglang_adapter.source import DEFAULT_CACHE, unpacked
    from tests.sglang_wheels import sglang_wheel

    root = unpacked(sglang_wheel("0.5.23"), DEFAULT_CACHE)
    path = next(Path(root).rglob("sglang/srt/mem_cache/storage_prefetch.py"))
    stub = types.ModuleType("component_type_stand_in")
    stub.ComponentType = object
    dep, name = "sglang.srt.mem_cache.unified_cache.component_type", "_sglang_storage_prefetch"
    saved = sys.modules.get(dep)
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
    sys.modules[dep], sys.modules[name] = stub, module  # its dataclasses look it up by name
    try:
        module.__spec__.loader.exec_module(module)
    finally:
        sys.modules.pop(name)
        if saved is None:
            sys.modules.pop(dep)
        else:
            sys.modules[dep] = saved
    return module.StoragePrefetchRetries


class _Req:
    def __init__(self, rid: str, attempts: int):
        self.rid, self.storage_prefetch_retry_attempts = rid, attempts


def test_the_retry_set_answers_as_sglangs_own_on_random_sequences():
    """Differential: the same random operations on SGLang's class and the model's, the same
    popped retries at every pass and the same set left armed."""
    theirs_cls = _sglang_retries_class()
    rng = random.Random(0)
    rids = [f"r{i}" for i in range(6)]
    for trial in range(200):
        theirs, ours = theirs_cls(), PrefetchRetries()
        interval, cap = rng.choice([0, 1, 2, 3, 8]), rng.choice([0, 1, 3, 8])
        attempts = {rid: 0 for rid in rids}
        for _ in range(40):
            op, rid = rng.random(), rng.choice(rids)
            end = rng.choice([None, 256, 512])
            if op < 0.3:
                theirs.poll_miss(rid, end), ours.poll_miss(rid, end)
            elif op < 0.4:
                theirs.refetch(rid, end), ours.refetch(rid, end)
            elif op < 0.5:
                theirs.cancel(rid), ours.cancel(rid)
            else:
                waiting = rng.sample(rids, rng.randint(0, len(rids)))
                got = [(req.rid, e) for req, e in theirs.pop_ready(
                    [_Req(r, attempts[r]) for r in waiting], interval, cap)]
                assert ours.pop_ready(waiting, attempts, interval, cap) == got, trial
                for r, _ in got:
                    attempts[r] += 1
            assert set(theirs._pending) == {r for r in rids if ours.armed(r)}, trial


# ---- HiCache: where 0.5.23 arms a retry and what the retry issues --------------------------

def _cache(protocol: str = "sglang-0.5.23", policy: str = "wait_complete", **kw):
    comm = RecordingComm(Layout(0, 2, 1))
    cfg = HiCacheConfig(protocol=protocol, policy=policy, tp=2, **kw)
    cache = one_rank_cache(cfg, comm)
    admit(cache, "r0", OTHER)
    admit(cache, "r1", PROMPT)
    return cache, comm


def _agreed_hit(cache, rid: str, pages: int) -> None:
    """The prefetch thread's agreed hit for `rid`, then the step's drain of it."""
    op = cache.ongoing[rid]
    op.hash_value = hashes_of(9, PAGE)[:pages]
    cache.controller.hit_queue.put(op)
    cache._drain_hits(1)


def _passes(cache, n: int, waiting=("r0", "r1")) -> None:
    for _ in range(n):
        cache.retry_prefetches(list(waiting), 0.0)


def test_0523_a_miss_is_looked_up_again_after_the_interval_while_it_waits():
    cache, _ = _cache()
    _agreed_hit(cache, "r1", 0)  # storage had none of it: revoked, armed
    assert "r1" not in cache.ongoing and cache.retries.armed("r1")
    _passes(cache, 8)
    assert "r1" not in cache.ongoing  # due at the 9th pass (the first sets its due step)
    _passes(cache, 1)
    st = cache.stats.requests["r1"]
    assert "r1" in cache.ongoing and (st.prefetch_ops, st.retries) == (2, 1)
    assert cache.controller.prefetch_queue.qsize() == 3  # r0, r1, r1 again: a hit query each


def test_0523_a_hit_below_the_threshold_arms_one_and_a_hit_does_not():
    cache, _ = _cache()
    _agreed_hit(cache, "r1", 3)  # 192 tokens < 256
    assert cache.retries.armed("r1")
    cache2, _ = _cache()
    _agreed_hit(cache2, "r1", 8)
    assert "r1" in cache2.ongoing and not cache2.retries.armed("r1")


def test_0519_never_retries():
    cache, _ = _cache(protocol="pr36425")
    _agreed_hit(cache, "r1", 0)
    _passes(cache, 20)
    assert cache.retries is None and cache.stats.requests["r1"].prefetch_ops == 1


def test_0523_the_queue_head_is_not_looked_up_again():
    cache, _ = _cache()
    _agreed_hit(cache, "r1", 0)
    _passes(cache, 20, waiting=("r1", "r0"))
    assert "r1" not in cache.ongoing and not cache.retries.armed("r1")


def test_0523_a_scheduled_request_cancels_its_retry():
    cache, _ = _cache()
    _agreed_hit(cache, "r1", 0)
    cache.load_back("r1")
    assert not cache.retries.armed("r1")


def test_0523_at_most_max_attempts_re_issues():
    cache, _ = _cache(retry_poll_interval=1, retry_max_attempts=3)
    for _ in range(10):
        if "r1" in cache.ongoing:
            _agreed_hit(cache, "r1", 0)
        _passes(cache, 2)
    st = cache.stats.requests["r1"]
    assert (st.retries, st.prefetch_ops) == (3, 4)


def test_0523_a_best_effort_poll_before_the_hit_arms_a_retry():
    cache, comm = _cache(policy="best_effort")
    assert cache.check_prefetch_progress("r1")  # ended before its hit was agreed
    assert cache.retries.armed("r1") and comm.calls == []


def test_0523_an_expired_deadline_is_never_looked_up_again():
    cache, comm = _cache(policy="timeout", timeout_base_s=0.0, timeout_per_ki_token_s=0.0)
    assert not cache.check_prefetch_progress("r1")  # first blocked poll starts its clock
    assert cache.check_prefetch_progress("r1")  # past the budget: the agreed expiry
    assert not cache.retries.armed("r1") and "r1" in cache.expired
    cache.retries.poll_miss("r1")  # even armed, the issue refuses it (deadline final)
    _passes(cache, 10)
    assert "r1" not in cache.ongoing and cache.stats.requests["r1"].prefetch_ops == 1


def test_0523_a_retry_keeps_the_requests_timeout_clock():
    cache, _ = _cache(policy="timeout", retry_poll_interval=1)
    assert not cache.check_prefetch_progress("r1")
    first = cache.ongoing["r1"]
    _agreed_hit(cache, "r1", 0)
    _passes(cache, 2)
    again = cache.ongoing["r1"]
    assert again is not first and again.wait_start == first.wait_start
    assert again.wait_tokens == len(first.tokens)


def test_0523_no_host_memory_retries_assuming_the_hit_stored():
    cache, _ = _cache(retry_poll_interval=1)
    cache.host_kv.alloc(cache.host_kv.available)  # every host slot taken
    _agreed_hit(cache, "r1", 8)
    assert cache.retries.armed("r1")
    cache.host_kv.free(list(range(cache.host_kv.num_pages)))
    _passes(cache, 2)
    op = cache.ongoing["r1"]
    assert op.assume_stored and len(op.tokens) == 8 * PAGE  # cut to the known hit's end
    assert cache.controller._local_hit(op) == (8, 0)  # no batch_exists, still reduced


def test_0523_a_rate_limited_admission_is_retried():
    cache, _ = _cache(retry_poll_interval=1)
    cache.tokens_in_flight = cache.host_kv.num_pages * PAGE  # the limiter is on
    admit(cache, "r2", tokens(9, PAGE, base=20_000_000))
    assert "r2" not in cache.ongoing and cache.retries.armed("r2")
    cache.tokens_in_flight = 0
    _passes(cache, 2, waiting=("r0", "r2"))
    assert "r2" in cache.ongoing


def test_0523_a_retry_issues_nothing_on_the_schedulers_groups():
    """Its collective is the hit query, on the prefetch thread's own groups."""
    cache, comm = _cache(retry_poll_interval=1)
    _agreed_hit(cache, "r1", 0)
    _passes(cache, 2)
    assert "r1" in cache.ongoing and comm.calls == []


# ---- the storage tier: another writer's pages landing --------------------------------------

@pytest.mark.parametrize("tp_rank, visible_from", [(0, 4), (1, 7)])
def test_pages_stored_before_the_serve_land_at_their_step(tp_rank, visible_from):
    storage = SimStorage(StorageSpec(latency_ms=0.0, exists_latency_ms=0.0), tp_rank, tp_rank)
    storage.land_step = 4 + (3 if tp_rank else 0)
    hashes = hashes_of(8, PAGE)
    storage.put(hashes, "kv", 16)
    assert [storage.batch_exists(hashes, s) for s in range(9)] == \
        [0 if s < visible_from else 8 for s in range(9)]
    assert storage.batch_exists(hashes) == 8  # no step: whatever has landed by the end


def test_pages_written_during_the_serve_count_at_once():
    storage = SimStorage(StorageSpec(latency_ms=0.0, exists_latency_ms=0.0), 0, 0)
    storage.land_step = 5
    storage.put(hashes_of(4, PAGE), "kv", 16)  # before the serve: land at step 5
    written = hashes_of(8, PAGE)[4:]
    storage.batch_set(written, "kv", torch.zeros(4, 16))
    assert storage.batch_exists(written, 0) == 4
    assert storage.batch_exists(hashes_of(8, PAGE), 0) == 0


# ---- the cost model: every prefetch operation pays its hit query ---------------------------

@pytest.mark.parametrize("tp, pp", [(2, 1), (2, 2)])
def test_expected_hit_queries_count_every_prefetch_operation(tp, pp):
    one = expected_per_request(Setting("sglang-0.5.23", "timeout", tp, pp), 3, 8, True, True)
    assert expected_per_request(Setting("sglang-0.5.23", "timeout", tp, pp), 3, 8, True, True,
                                ops=1) == one
    three = expected_per_request(Setting("sglang-0.5.23", "timeout", tp, pp), 3, 8, True, True,
                                 ops=3)
    assert three.hit_query == 3 * background_cost("sglang-0.5.23", tp, pp) == 3 * one.hit_query
    assert (three.decision, three.ack, three.pp_hops) == (one.decision, one.ack, one.pp_hops)
    assert expected_per_request(Setting("sglang-0.5.23", "timeout", tp, pp), 0, 0, False, False,
                                ops=0).hit_query == 0
