"""Test doubles for one-process tests of the scheduler side and the controller threads: a
Comm that records collectives instead of running them, a storage that records its reads,
and a one-rank HiCache built on them.
"""

from __future__ import annotations

import torch

from hicache.cache import HiCache
from hicache.comm import Layout
from hicache.config import HiCacheConfig
from hicache.hashing import page_hashes
from hicache.records import RequestStats, Stats
from hicache.storage import SimStorage, StorageSpec


class RecordingComm:
    """Stands in for hicache.comm.Comm: records (group, site) of every collective a real
    Comm would issue and leaves the tensor as it is (each value reduces with itself)."""

    def __init__(self, layout: Layout | None = None):
        self.layout = layout or Layout(0, 2, 1)
        self.calls: list[tuple[str, str]] = []

    def all_reduce(self, t, op, group, site, rid=None):
        self.calls.append((group, site))

    def all_reduce_groups(self, t, op, groups, site, rid=None):
        for group in groups:
            self.calls.append((group, site))

    def reduce_tp_then_pp(self, t, op, site, rid=None):
        self.calls.append(("tp_cpu+pp_cpu", site))

    def pp_hop(self, t, rid=None):
        self.calls.append(("pp_cpu", "pp_hop"))

    def drain_sends(self):
        pass

    def broadcast_object(self, obj, site, group="sched", rid=None):
        self.calls.append((group, site))
        return obj

    def sites(self) -> list[str]:
        return [site for _, site in self.calls]


class RelayComm(RecordingComm):
    """A RecordingComm on a PP stage > 0 whose stage 0 has counted nothing yet: every
    relayed value arrives as 0 (a later stage takes stage 0's result in place), while a
    stage-local reduction keeps this rank's own values (its TP peers hold the same)."""

    def reduce_tp_then_pp(self, t, op, site, rid=None):
        super().reduce_tp_then_pp(t, op, site, rid)
        t.zero_()


class RecordingStorage(SimStorage):
    """Sim storage with no latency that records (pool, index of the batch's first page in
    `order`) for every batch_get, and runs `on_read(pool, index)` before each read."""

    def __init__(self, order: list[str], on_read=None):
        super().__init__(StorageSpec(latency_ms=0.0, exists_latency_ms=0.0), 0, 0)
        self.index = {h: i for i, h in enumerate(order)}
        self.reads: list[tuple[str, int]] = []
        self.on_read = on_read

    def batch_get(self, hashes, pool, out):
        at = self.index[hashes[0]] if hashes else -1
        self.reads.append((pool, at))
        if self.on_read is not None:
            self.on_read(pool, at)
        return super().batch_get(hashes, pool, out)


def tokens(n_pages: int, page: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n_pages * page)]


def hashes_of(n_pages: int, page: int, base: int = 0) -> list[str]:
    return page_hashes(tokens(n_pages, page, base), page)


def one_rank_cache(cfg: HiCacheConfig, comm: RecordingComm,
                   storage: SimStorage | None = None) -> HiCache:
    """A HiCache whose collectives are recorded, not run (controller threads not started)."""
    storage = storage or SimStorage(StorageSpec(latency_ms=0.0, exists_latency_ms=0.0), 0, 0)
    return HiCache(cfg, comm.layout, comm, storage, torch.device("cpu"), Stats())


def admit(cache: HiCache, rid: str, prompt: list[int]) -> None:
    """What the scheduler does for an arriving request: its stats row, then admit."""
    cache.stats.requests[rid] = RequestStats(rid, 0.0, enqueued=0.0)
    cache.admit(rid, prompt, 0.0)
