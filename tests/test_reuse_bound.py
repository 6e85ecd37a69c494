"""Replaying the shipped trace excerpt with every tier on: with unbounded pools the tokens a
request reuses (device + host + storage hits) equal the trace's own bound, computed here
from the JSON lines alone; with small pools they never exceed it.

The bound (for request j): its leading hash ids that appear in an earlier line (skipped
lines included), counted in tokens as far as an earlier prompt held them, capped at
input_length - 1 and cut to whole 64-token pages (the cache holds whole pages). Arrivals
are spread out so that each request is served before the next arrives (two requests in
one prefill would both compute a prefix neither has cached yet).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.run.trace import Histories, classes, read_trace, requests
from hicache.comm.groups import Layout
from hicache.memory.storage import StorageSpec
from hicache.serve.system import System, setup_distributed
from hicache.spec.config import HiCacheConfig

EXCERPT = Path(__file__).resolve().parent.parent / "traces" / "mooncake_conversation_400.jsonl"
PAGE = 64
SKIP, REPLAY = 12, 24
GAP_S = 0.12


def _bound_from_file() -> list[int]:
    lines = [json.loads(x) for x in EXCERPT.read_text().splitlines()[: SKIP + REPLAY]]
    cached: dict[int, int] = {}  # hash id -> tokens of it an earlier prompt kept in pages
    bounds = []
    for row in lines:
        n, ids = row["input_length"], row["hash_ids"]
        reuse = 0
        for i, h in enumerate(ids):
            size = min(512, n - 512 * i)
            reuse += min(size, cached.get(h, 0))
            if cached.get(h, 0) < size:
                break
        bounds.append(min(reuse, n - 1) // PAGE * PAGE)
        kept = n // PAGE * PAGE
        for i, h in enumerate(ids):
            cached[h] = max(cached.get(h, 0), min(512, max(0, kept - 512 * i)))
    return bounds[SKIP:]


def _replay(device_pages: int, host_pages: int, unbounded: bool) -> tuple[list[dict], dict]:
    rows = read_trace(EXCERPT, SKIP, REPLAY)
    reqs = [replace(q, arrival_offset_s=i * GAP_S, output_tokens=2)
            for i, q in enumerate(requests(rows, SKIP, 1.0, classes(rows)))]
    cfg = HiCacheConfig(protocol="pr36425", policy="wait_complete", write_policy="write_through",
                        unbounded_pools=unbounded, prefetch_threshold=PAGE,
                        device_pool_pages=device_pages, host_pool_pages=host_pages,
                        storage=StorageSpec(latency_ms=0.5, exists_latency_ms=0.0))
    layout = Layout(0, 1, 1)
    system = System(cfg, layout, setup_distributed(layout, torch.device("cpu"), 30.0),
                    torch.device("cpu"))
    system.populate(Histories(rows[:SKIP]))
    stats = system.run(reqs)
    system.close()
    assert stats.host_slots_unaccounted == 0
    assert stats.write_path["device_slots_unaccounted"] == 0
    out = sorted(stats.request_rows(), key=lambda r: r["rid"])
    assert all(r["data_errors"] == 0 for r in out)
    return out, stats.write_path


def _reused(row: dict) -> int:
    return row["device_hit_tokens"] + row["host_hit_tokens"] + row["storage_hit_tokens"]


@pytest.mark.timeout(120)
def test_unbounded_pools_reach_the_trace_bound():
    everything = sum(r.input_length // PAGE + 1 for r in read_trace(EXCERPT, SKIP, REPLAY))
    rows, wp = _replay(everything, everything, unbounded=True)
    assert wp["device_evicted_pages"] == 0
    bound = _bound_from_file()
    assert [_reused(r) for r in rows] == bound
    assert sum(bound) > 0 and any(r["storage_hit_tokens"] for r in rows)  # storage served some
    for r in rows:
        assert _reused(r) + r["computed_tokens"] == r["prompt_tokens"]


@pytest.mark.timeout(120)
def test_bounded_pools_never_exceed_it():
    rows, wp = _replay(device_pages=1400, host_pages=2000, unbounded=False)
    for r, b in zip(rows, _bound_from_file(), strict=True):
        assert _reused(r) <= b, r["rid"]
    assert wp["device_evicted_pages"] > 0  # the pools were small enough to matter
