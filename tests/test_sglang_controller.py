"""SGLang's own controller path on real gloo ranks (sglang_adapter.controller,
docs/sglang.md "SGLang's own controller path"): `prefetch_from_storage`, the controller's
hit-query, IO and ack-sync threads with their collectives on the groups SGLang makes, the
drains in `check_hicache_events`, the poll, the end of a prefetch, over the harness's
storage tier through a subclass of the wheel's own `HiCacheStorage`; counted at the door
per request and held against torch's sequence numbers. The wheel comes from the release
cache (a test whose wheel is absent is skipped, never passed)."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.run.launch import launch
from sglang_adapter.controller import controller_rank
from sglang_adapter.source import DEFAULT_CACHE, resolve

pytestmark = pytest.mark.dist

HIT = ("managers/cache_controller.py:_all_reduce:447",
       "_sync_prefetch_hit_query:1502 < prefetch_thread_func:1356")
ACK = ("managers/cache_controller.py:_all_reduce:447",
       "_reduce_prefetch_ack:1482 < _reduce_prefetch_ack:1922 < prefetch_sync_thread_func:1947")
STEP = "_all_reduce:386 < _sync_hicache_ready_counts:3459 < check_hicache_events:3681"
DECISION = "_all_reduce:386 < _can_terminate_prefetch:2311 < check_prefetch_progress:2405"
# rid, policy, prompt pages, pages in storage (a 130-page hit is read in two 128-page batches)
CASES = [("wc-part", "wait_complete", 4, 3), ("wc-long", "wait_complete", 130, 130),
         ("be", "best_effort", 4, 4), ("to", "timeout", 4, 4), ("wc-miss", "wait_complete", 4, 0)]


def _wheel(version: str):
    found = sorted(DEFAULT_CACHE.glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.skip(f"no sglang {version} wheel in {DEFAULT_CACHE} (make sglang-fetch)")
    return resolve(str(found[-1]))


def _by_request(calls) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for site, group, op, rid, via, n in calls:
        out.setdefault(rid, Counter())[(group, op, site, via)] += n
    return out


@pytest.fixture(scope="module")
def served():
    return launch(2, controller_rank, (_wheel("0.5.23"), 2, CASES), timeout_s=280)


def test_every_rank_ends_every_prefetch_at_the_same_poll(served):
    assert served[0]["outcomes"] == served[1]["outcomes"]
    assert all(o["issued"] for o in served[0]["outcomes"].values())


def test_the_hit_query_min_is_sglangs_on_its_own_group_once_per_request(served):
    for r in served:
        calls = _by_request(r["calls"])
        for rid, *_ in CASES:
            assert calls[rid][("sglang_hit", "all_reduce", *HIT)] == 1, (rid, calls[rid])


def test_one_ack_min_per_read_batch_on_sglangs_completion_group(served):
    """wait_complete reads every agreed page: one MIN per 128-page batch that carries a
    count (the final ack is passed on unreduced); a miss (0 pages agreed, below the
    threshold) is revoked in the hit drain and never read."""
    for r in served:
        calls = _by_request(r["calls"])
        acks = {rid: calls[rid][("sglang_ack", "all_reduce", *ACK)] for rid, *_ in CASES}
        assert (acks["wc-part"], acks["wc-long"], acks["wc-miss"]) == (1, 2, 0), acks


def test_decisions_and_the_step_are_sglangs_on_the_tp_group(served):
    for r in served:
        calls = _by_request(r["calls"])
        site = "mem_cache/unified_radix_cache.py:_all_reduce_attn_groups:359"
        for rid, policy, *_ in CASES:
            decisions = calls[rid][("tp", "all_reduce", site, DECISION)]
            polls = r["outcomes"][rid]["polls"]
            assert decisions == 0 if policy != "timeout" else 1 <= decisions <= polls
            assert calls[f"{rid}/step"][("tp", "all_reduce", site, STEP)] == polls


def test_what_sglang_loaded_is_what_storage_holds(served):
    """Every page SGLang's IO thread wrote into a host slot and its ack drain inserted is
    the stored page (digest against the tier's content), on every rank."""
    for r in served:
        pages, good = r["loaded"]
        assert pages >= 3 + 130 and good == pages


def test_the_door_missed_nothing_on_any_group(served):
    """Counted at the door = torch's sequence numbers, on the TP group and on each group
    SGLang made for itself (its hit and completion groups)."""
    for r in served:
        assert set(r["crosscheck"]) == {"tp", "sglang_hit", "sglang_ack"}
        assert all(counted == seen > 0 for counted, seen in r["crosscheck"].values()), \
            r["crosscheck"]


def test_sglangs_page_names_are_the_tiers_for_an_unnamespaced_prompt(served):
    """SGLang's chain (0.5.23's compiled hash_binding.cpp, built from the wheel) and the
    project's (hicache/hashing.py) name every page of these prompts alike."""
    for r in served:
        assert r["names"] == sum(pages for _, _, pages, _ in CASES) == r["same_names"]
