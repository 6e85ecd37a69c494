"""The cache controller's background threads and the prefetch operation they share.

Threads and the groups they own (see hicache.comm):
- prefetch thread (group `prefetch`): hashes the pages, asks storage how many leading pages
  exist, then MIN-all-reduces the hit count so every TP rank agrees;
- IO thread (no collective): reads the agreed pages in 128-page batches into the host pool,
  then the side-car pages; publishes progress rank-locally (pre27010) or as acks;
- ack sync thread (group `ack`, ack protocols only): MIN-all-reduces every ack so
  completion is identical on all ranks before the scheduler sees it.
Any exception in a thread is kept in `error` and re-raised by the scheduler at its next step.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hicache.comm import ACK, HIT_QUERY, Comm
from hicache.cost_model import IO_BATCH_PAGES
from hicache.hashing import page_hashes
from hicache.pools import PagePool
from hicache.storage import Storage, StorageError

KV, SIDECAR = "kv", "indexer"


@dataclass(eq=False)
class PrefetchOp:
    """One storage->host prefetch (SGLang's PrefetchOperation)."""

    rid: str
    tokens: list[int]  # the page-aligned unmatched part of the prompt
    prior_hash: str | None  # hash of the last page matched in the host tree
    start_time: float  # this rank's clock at enqueue (timeout input in most protocols)
    start_stamp: float  # rank 0's step clock at enqueue (step-clock's timeout input)
    hashes: list[str] = field(default_factory=list)
    hash_value: list[str] = field(default_factory=list)  # truncated to the agreed hit pages
    hit_drained: bool = False  # the scheduler took the agreed hit (same step on all ranks)
    host_slots: list[int] | None = None
    completed_tokens: int = 0  # pre27010: this rank's IO progress; else the agreed acks
    sidecar_started: bool = False
    sidecar_pages: int = 0  # side-car pages written to host memory
    pool_transfers_done: bool = False
    decided: bool = False  # step-level "stop" (step-batched, step-clock)
    frozen_tokens: int = 0  # completed_tokens when the step-level decision was taken
    io_error: str | None = None
    t_io_done: float | None = None
    terminated: threading.Event = field(default_factory=threading.Event)
    io_done: threading.Event = field(default_factory=threading.Event)

    page_size: int = 64

    @property
    def hit_tokens(self) -> int:
        return len(self.hash_value) * self.page_size


@dataclass(frozen=True)
class Ack:
    op: PrefetchOp
    tokens: int  # usable tokens so far on this rank (agreed by MIN before use)
    final: bool


class CacheController:
    def __init__(self, comm: Comm, storage: Storage, host_kv: PagePool,
                 host_sidecar: PagePool | None, page_size: int, uses_acks: bool):
        self.comm, self.storage, self.page_size = comm, storage, page_size
        self.host_kv, self.host_sidecar, self.uses_acks = host_kv, host_sidecar, uses_acks
        self.prefetch_queue: queue.Queue = queue.Queue()
        self.hit_queue: queue.Queue = queue.Queue()  # drained by the scheduler, agreed count
        self.io_queue: queue.Queue = queue.Queue()
        self.ack_queue: queue.Queue = queue.Queue()
        self.synced_acks: queue.Queue = queue.Queue()  # drained by the scheduler, agreed count
        self.error: BaseException | None = None
        self._threads = [threading.Thread(target=self._guard, args=(f,), daemon=True, name=n)
                         for n, f in (("prefetch", self._prefetch_loop), ("io", self._io_loop),
                                      ("ack-sync", self._ack_loop))]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        # In pipeline order: an op cut short by a poll may still be reading when the
        # scheduler stops, and every ack its IO thread emits must still be synced, or one
        # rank's ack thread leaves an all-reduce that no other rank joins.
        for q, t in zip((self.prefetch_queue, self.io_queue, self.ack_queue), self._threads,
                        strict=True):
            q.put(None)
            t.join(timeout_s)

    def _guard(self, loop) -> None:
        try:
            loop()
        except BaseException as e:  # surfaced by the scheduler thread
            self.error = e

    # ---- prefetch thread --------------------------------------------------------------------

    def _prefetch_loop(self) -> None:
        while (op := self.prefetch_queue.get()) is not None:
            op.hashes = page_hashes(op.tokens, self.page_size, op.prior_hash)
            hit = torch.tensor([self._storage_hit(op.hashes)], dtype=torch.int64)
            # Blocks until every TP rank has queried this op: ops arrive in one order on all.
            self.comm.all_reduce(hit, dist.ReduceOp.MIN, "prefetch", HIT_QUERY, op.rid)
            op.hash_value = op.hashes[: int(hit.item())]
            self.hit_queue.put(op)

    def _storage_hit(self, hashes: list[str]) -> int:
        hit = 0
        for i in range(0, len(hashes), IO_BATCH_PAGES):
            batch = hashes[i: i + IO_BATCH_PAGES]
            n = self.storage.batch_exists(batch)
            hit += n
            if n < len(batch):
                break  # stop at the first miss
        return hit

    # ---- IO thread --------------------------------------------------------------------------

    def _io_loop(self) -> None:
        while (op := self.io_queue.get()) is not None:
            kv_pages = self._read_kv(op)
            side_pages = self._read_sidecar(op, kv_pages)
            usable = kv_pages if self.host_sidecar is None else min(kv_pages, side_pages)
            op.t_io_done = time.monotonic()
            if self.uses_acks:
                self.ack_queue.put(Ack(op, usable * self.page_size, final=True))
            op.io_done.set()

    def _read_kv(self, op: PrefetchOp) -> int:
        """Reads KV pages batch by batch; returns how many leading pages landed."""
        done, failed = 0, False
        for i in range(0, len(op.hash_value), IO_BATCH_PAGES):
            batch = op.hash_value[i: i + IO_BATCH_PAGES]
            if not failed and not op.terminated.is_set():
                failed = not self._read(op, batch, op.host_slots[i: i + len(batch)], self.host_kv)
                done += 0 if failed else len(batch)
                if failed and not self.uses_acks:
                    # SGLang's mark_terminate on a failed batch: the poll's MAX sees it, so
                    # wait_complete does not wait forever for pages that will never land.
                    op.terminated.set()
            if self.uses_acks:
                # One ack per batch on every rank, even for skipped batches, so the ack sync
                # thread pairs the same acks on all ranks. Side-car pages are not there yet.
                tokens = done * self.page_size if self.host_sidecar is None else 0
                self.ack_queue.put(Ack(op, tokens, final=False))
            elif not failed:
                op.completed_tokens = done * self.page_size  # rank-local progress (pre27010)
        return done

    def _read_sidecar(self, op: PrefetchOp, kv_pages: int) -> int:
        if self.host_sidecar is None:
            op.pool_transfers_done = True
            return 0
        done = 0
        op.sidecar_started = True
        for i in range(0, kv_pages, IO_BATCH_PAGES):
            if op.terminated.is_set():
                break
            batch = op.hash_value[i: min(kv_pages, i + IO_BATCH_PAGES)]
            if not self._read(op, batch, op.host_slots[i: i + len(batch)], self.host_sidecar):
                break
            done += len(batch)
        op.sidecar_pages = done
        # Only now has the side-car read stopped writing host memory (PR #27550).
        op.pool_transfers_done = True
        return done

    def _read(self, op: PrefetchOp, hashes: list[str], slots: list[int], pool: PagePool) -> bool:
        staging = torch.empty((len(hashes), pool.page_elems), dtype=pool.data.dtype)
        try:
            self.storage.batch_get(hashes, pool.name, staging)
        except StorageError as e:
            op.io_error = str(e)
            return False
        pool.write(slots, staging)  # bulk bytes too, when pages carry a model's KV bytes
        return True

    # ---- ack sync thread --------------------------------------------------------------------

    def _ack_loop(self) -> None:
        while (ack := self.ack_queue.get()) is not None:
            t = torch.tensor([ack.tokens], dtype=torch.int64)
            # Every rank emits the same acks in the same order, so MIN pairs them up.
            self.comm.all_reduce(t, dist.ReduceOp.MIN, "ack", ACK, ack.op.rid)
            self.synced_acks.put(Ack(ack.op, int(t.item()), ack.final))
