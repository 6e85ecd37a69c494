"""Test doubles for one-process tests of the scheduler side and the controller threads: a
Comm that records collectives instead of running them, a storage that records its reads,
a one-rank HiCache built on them, and a torch.distributed stand-in whose ranks are threads
(for the real Comm at any layout).
"""

from __future__ import annotations

import queue
import threading

import torch
import torch.distributed

from hicache.cache.cache import HiCache
from hicache.comm.groups import Layout
from hicache.comm.records import RequestStats, Stats
from hicache.memory.hashing import page_hashes
from hicache.memory.storage import SimStorage, StorageSpec
from hicache.spec.config import HiCacheConfig


class RecordingComm:
    """Stands in for hicache.comm.comm.Comm: records (group, site) of every collective a real
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

    def batch_get(self, hashes, pool, out, plan=None):
        at = self.index[hashes[0]] if hashes else -1
        self.reads.append((pool, at))
        if self.on_read is not None:
            self.on_read(pool, at)
        return super().batch_get(hashes, pool, out, plan)


def tokens(n_pages: int, page: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n_pages * page)]


def hashes_of(n_pages: int, page: int, base: int = 0) -> list[str]:
    return page_hashes(tokens(n_pages, page, base), page)


def one_rank_cache(cfg: HiCacheConfig, comm: RecordingComm,
                   storage: SimStorage | None = None) -> HiCache:
    """A HiCache whose collectives are recorded, not run (controller threads not started)."""
    storage = storage or SimStorage(StorageSpec(latency_ms=0.0, exists_latency_ms=0.0), 0, 0)
    return HiCache(cfg, comm.layout, comm, storage, torch.device("cpu"), Stats())


def admit(cache: HiCache, rid: str, prompt: list[int], stamp: float = 0.0) -> None:
    """What the scheduler does for an arriving request: its stats row, then admit (with
    rank 0's step stamp `stamp`)."""
    cache.stats.requests[rid] = RequestStats(rid, 0.0, enqueued=0.0)
    cache.admit(rid, prompt, stamp)


class _Group:
    """A process group of ThreadWorld: its global ranks and its creation index (torch names
    groups by creation order, the same on every rank)."""

    def __init__(self, ranks: tuple[int, ...], index: int):
        self.ranks, self.index, self.ops = ranks, index, 0

    def _get_sequence_number_for_group(self) -> int:
        return self.ops


class _Sent:
    def __init__(self):
        self.waited = False

    def wait(self) -> None:
        self.waited = True


class ThreadWorld:
    """Stands in for `torch.distributed` as hicache.comm.comm uses it, inside one process: each
    rank is a thread, a collective is a rendezvous of its group's threads, a point-to-point
    op a mailbox. Values really reduce and travel, so the real `Comm` and `Groups` run
    unchanged at any TP x PP layout in milliseconds. `ops[rank]` records (kind, group ranks,
    peer). A peer that never joins fails the op after `timeout_s`, as gloo's timeout does."""

    ReduceOp = torch.distributed.ReduceOp

    def __init__(self, world_size: int, timeout_s: float = 10.0):
        self.world_size, self.timeout_s = world_size, timeout_s
        self.ops: dict[int, list[tuple]] = {r: [] for r in range(world_size)}
        self._me = threading.local()
        self._lock = threading.Lock()
        self._barriers: dict[int, threading.Barrier] = {}
        self._slots: dict[int, dict[int, torch.Tensor]] = {}
        self._mail: dict[tuple, queue.Queue] = {}

    def run(self, fn) -> list:
        """fn(rank) on one thread per rank; returns the results (or exceptions) by rank."""
        out: list = [None] * self.world_size

        def body(rank):
            self._me.rank = rank
            try:
                out[rank] = fn(rank)
            except Exception as e:  # returned, so a test can look at every rank's side
                out[rank] = e
        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout_s * 10)
        return out

    # ---- the torch.distributed calls hicache.comm.comm makes ------------------------------------

    def new_group(self, ranks, backend=None, timeout=None) -> _Group:
        self._me.groups = getattr(self._me, "groups", 0) + 1
        group = _Group(tuple(ranks), self._me.groups)
        group.backend, group.timeout = backend, timeout
        return group

    def all_reduce(self, t: torch.Tensor, op, group: _Group | None = None) -> None:
        group = group or self._world_group()  # None: the default (harness) group
        slots = self._rendezvous(group, "all_reduce", None, t)
        stacked = torch.stack([slots[r] for r in group.ranks])
        reduce = {self.ReduceOp.MIN: torch.amin, self.ReduceOp.MAX: torch.amax}
        t.copy_(reduce[op](stacked, dim=0) if op in reduce else stacked.sum(dim=0))

    def broadcast(self, t: torch.Tensor, group_src: int, group: _Group) -> None:
        slots = self._rendezvous(group, "broadcast", group.ranks[group_src], t)
        t.copy_(slots[group.ranks[group_src]])

    def isend(self, t: torch.Tensor, group_dst: int, group: _Group) -> _Sent:
        """Like gloo's, the send reads `t` when the peer receives, not now."""
        dst = group.ranks[group_dst]
        self._record(group, "isend", dst)
        self._box(group, self._me.rank, dst).put(t)
        return _Sent()

    def recv(self, t: torch.Tensor, group_src: int, group: _Group) -> None:
        src = group.ranks[group_src]
        self._record(group, "recv", src)
        try:
            t.copy_(self._box(group, src, self._me.rank).get(timeout=self.timeout_s))
        except queue.Empty:
            raise RuntimeError(f"Timed out waiting {self.timeout_s}s for recv") from None

    # ---- plumbing ---------------------------------------------------------------------------

    def _world_group(self) -> _Group:
        with self._lock:
            if not hasattr(self, "_world"):
                self._world = _Group(tuple(range(self.world_size)), 0)  # index 0: default
            return self._world

    def _record(self, group: _Group, kind: str, peer) -> None:
        group.ops += 1
        self.ops[self._me.rank].append((kind, group.ranks, peer))

    def _box(self, group: _Group, src: int, dst: int) -> queue.Queue:
        with self._lock:
            return self._mail.setdefault((group.index, src, dst), queue.Queue())

    def _rendezvous(self, group: _Group, kind: str, peer, t: torch.Tensor) -> dict:
        """Every rank of the group deposits its tensor; returns them all once all have."""
        self._record(group, kind, peer)
        with self._lock:
            barrier = self._barriers.setdefault(group.index, threading.Barrier(len(group.ranks)))
            slots = self._slots.setdefault(group.index, {})
        slots[self._me.rank] = t.clone()
        try:
            barrier.wait(self.timeout_s)  # all deposited
            got = dict(slots)
            barrier.wait(self.timeout_s)  # all read: the next round may overwrite
        except threading.BrokenBarrierError:
            raise RuntimeError(f"Timed out waiting {self.timeout_s}s for {kind}") from None
        return got


def patch_dist(monkeypatch, world) -> None:
    """`world` (a ThreadWorld, or None where nothing may touch torch.distributed) in place of
    torch.distributed for the groups (hicache.comm.groups) and the wrapper (hicache.comm.comm)."""
    import hicache.comm.comm
    import hicache.comm.groups

    monkeypatch.setattr(hicache.comm.groups, "dist", world)
    monkeypatch.setattr(hicache.comm.comm, "dist", world)
