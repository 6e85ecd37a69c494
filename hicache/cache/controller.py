"""The cache controller's background threads (what they share: hicache.cache.operations).

Threads and the groups they own (see hicache.comm.comm):
- prefetch thread (groups `prefetch` + `prefetch_pp`): hashes the pages, asks storage how
  many leading pages exist, then MIN-reduces the hit count: over TP, then over PP for the
  ack protocols (every rank of the grid agrees), over TP only for pre27010;
- IO thread (no collective): reads the agreed pages in 128-page batches into the host pool,
  per page (a batch counts its pages up to the first one storage could not return, and that
  page ends the reads); publishes progress rank-locally (pre27010) or as acks;
- ack sync thread (groups `ack` + `ack_pp`, ack protocols only): MIN-reduces every ack that
  carries a count (per-batch tokens, extra-pool hits), over TP then PP, so completion is
  identical on every rank before the scheduler sees it. The final ack only says the IO
  stopped: it is passed on in order, unreduced.
- backup thread (no collective): writes host pages to storage in 128-page `batch_set`
  calls (SGLang cache_controller.py `backup_thread_func` / `_page_backup`), then puts the
  operation on `backup_acks`, which the scheduler drains by an agreed count. A failed batch
  ends that operation's writes and it is acked all the same (0.5.23 logs it, acks the
  pages written).
On 0.5.23's PP-ticket path (buffer_only, PP > 1) the prefetch thread relays, sizes and
allocates tickets instead (hicache.agreement.pp_ticket) and the ack thread applies their
acks itself.
Any exception in a thread is kept in `error` and re-raised by the scheduler at its next step.

Read order and what a prefetch cut short keeps, by version:
- ack protocols follow the newest source read (sgl-project/sglang, managers/
  cache_controller.py `_page_transfer` / `_page_transfer_kv_batch` at 001067ff and
  mem_cache/hybrid_cache/hybrid_cache_controller.py `_page_transfer_sidecar` /
  `_reduce_prefetch_ack` at 00343773): a KV-derived side-car (the indexer, same slots as
  KV) is read with each batch, right after its KV pages, and the batch counts the leading
  pages both delivered; so every acked page has its side-car, and a prefetch cut short keeps
  its acked pages. After the batches, one extra-pool ack (reduced) for the pools that are
  not KV-derived (none here: it carries 0), then the final ack. A short batch stops the
  reads but does not set the shared `terminated` flag (`all_success = False` there): every
  batch still acks, and the agreed final ack ends the op on all ranks alike.
- pre27010 (PR #27550's era, hiradix_cache.py): KV pages first, batch by batch, progress
  rank-local; a short batch marks the op terminated; the side-car pages only after every
  KV page, with `pool_transfers_done` set when they are written: the race window the
  guard of PR #27550 closes.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from hicache.agreement.hit_query import agree_hit
from hicache.agreement.pp_ticket import STOP, TicketRelay
from hicache.cache.operations import KV, Ack, BackupOp, PrefetchOp
from hicache.comm.comm import ACK, Comm
from hicache.comm.groups import ACK_GROUPS, HIT_GROUPS
from hicache.memory.events import EXISTS, READ, WRITE, EventLog
from hicache.memory.hashing import page_hashes
from hicache.memory.pools import PagePool
from hicache.memory.storage import Storage
from hicache.spec.cost_model import IO_BATCH_PAGES


@dataclass(frozen=True)
class ControllerSettings:
    """How the threads work: the page size; whether the protocol ends a prefetch on reduced
    acks (the ack protocols, PR #27010 on); pinned (results made visible by the scheduler on
    the virtual clock); the hit query's shape (hicache.agreement.hit_query.SHAPES)."""

    page_size: int
    uses_acks: bool
    pinned: bool = False
    hit_shape: str = "min"


class CacheController:
    def __init__(self, comm: Comm, storage: Storage, host_kv: PagePool,
                 host_sidecar: PagePool | None, settings: ControllerSettings,
                 tickets: TicketRelay | None = None, events: EventLog | None = None):
        page_size, uses_acks = settings.page_size, settings.uses_acks
        pinned, hit_shape = settings.pinned, settings.hit_shape
        self.comm, self.storage, self.page_size = comm, storage, page_size
        self.host_kv, self.host_sidecar, self.uses_acks = host_kv, host_sidecar, uses_acks
        self.tickets = tickets  # 0.5.23's PP-ticket path, else None
        self.events = events  # the timeline (hicache.memory.events), or None: nothing recorded
        # Pinned: results are made visible by the scheduler (hicache.spec.pinned), which waits on
        # `progress` for real work whose virtual time has come.
        self.pinned, self.progress = pinned, threading.Condition()
        self._hit_cursor = 0.0  # virtual end of the last hit query (pinned)
        # Background groups: TP then PP after PR #27010 (the ack protocols), TP before.
        self.hit_groups = HIT_GROUPS if uses_acks else HIT_GROUPS[:1]
        self.hit_shape = hit_shape  # hicache.agreement.hit_query.SHAPES
        self.prefetch_queue: queue.Queue = queue.Queue()
        self.hit_queue: queue.Queue = queue.Queue()  # drained by the scheduler, agreed count
        self.io_queue: queue.Queue = queue.Queue()
        self.ack_queue: queue.Queue = queue.Queue()
        self.synced_acks: queue.Queue = queue.Queue()  # drained by the scheduler, agreed count
        self.backup_queue: queue.Queue = queue.Queue()
        self.backup_acks: queue.Queue = queue.Queue()  # drained by the scheduler, agreed count
        self.error: BaseException | None = None
        self._threads = [threading.Thread(target=self._guard, args=(f,), daemon=True, name=n)
                         for n, f in (("prefetch", self._prefetch_loop), ("io", self._io_loop),
                                      ("ack-sync", self._ack_loop),
                                      ("backup", self._backup_loop))]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        # In pipeline order: an op cut short by a poll may still be reading when the
        # scheduler stops, and every ack its IO thread emits must still be synced, or one
        # rank's ack thread leaves an all-reduce that no other rank joins.
        queues = (self.prefetch_queue, self.io_queue, self.ack_queue, self.backup_queue)
        for q, t in zip(queues, self._threads, strict=True):
            q.put(None)
            t.join(timeout_s)

    def _guard(self, loop) -> None:
        try:
            loop()
        except BaseException as e:  # surfaced by the scheduler thread
            self.error = e

    # ---- prefetch thread --------------------------------------------------------------------

    def _prefetch_loop(self) -> None:
        if self.tickets is not None:
            self._ticket_loop()
            return
        while (op := self.prefetch_queue.get()) is not None:
            local, calls = self._local_hit(op)
            agreed = self._agreed_hit(op, local)
            op.hash_value = op.hashes[:agreed]
            if self.pinned:  # visible once its modelled queries have passed (virtual)
                start = max(op.start_stamp, self._hit_cursor)
                self._hit_cursor = start + calls * self.storage.spec.exists_latency_ms / 1e3
                op.hit_due = self._hit_cursor
            self.hit_queue.put(op)
            self._notify()

    def _notify(self) -> None:
        if self.pinned:
            with self.progress:
                self.progress.notify_all()

    def _local_hit(self, op: PrefetchOp) -> tuple[int, int]:
        """(this rank's hit pages, batch_exists calls)."""
        op.hashes = page_hashes(op.tokens, self.page_size, op.prior_hash)
        # An op a poll already ended is not queried, but still reduced (its peers are).
        # Pinned: always queried, so its modelled time does not hang on a race with a poll.
        if op.terminated.is_set() and not self.pinned:
            return 0, 0
        if op.assume_stored:
            # 0.5.23 `_storage_hit_query`: a prior hit on this span proved it stored; no
            # batch_exists, but the hit query's MIN still runs.
            return len(op.hashes), 0
        return self._storage_hit(op.hashes, op.rid, op.issue_step)

    def _agreed_hit(self, op: PrefetchOp, local: int) -> int:
        # Its shape (hicache.agreement.hit_query): a MIN of the hit, or 0.5.23's restorable
        # mask over this rank's request span, or PR #39267's bounded one.
        return agree_hit(self.hit_shape, self.comm, self.hit_groups, op.rid, local,
                         len(op.tokens) // self.page_size)

    def _ticket_loop(self) -> None:
        """Tickets in stage 0's order: this rank's host slots for its own hit, the agreed
        hit (MIN), the slots past it freed, then the IO (hicache.agreement.pp_ticket)."""
        while (op := self.tickets.next(self.prefetch_queue)) != STOP:
            if op is None:
                continue  # an idle broadcast
            slots = self.tickets.reserve(self._local_hit(op)[0])
            agreed = self._agreed_hit(op, len(slots))
            self.host_kv.free(slots[agreed:])
            op.host_slots, op.hash_value = slots[:agreed], op.hashes[:agreed]
            op.hit_drained = True
            if agreed == 0:
                op.terminated.set()  # read nothing; its final ack still makes it ready
            self.io_queue.put(op)

    def _storage_hit(self, hashes: list[str], rid: str, step: int) -> tuple[int, int]:
        hit, calls = 0, 0
        for i in range(0, len(hashes), IO_BATCH_PAGES):
            batch = hashes[i: i + IO_BATCH_PAGES]
            t0 = time.monotonic()
            n = self.storage.batch_exists(batch, step)
            if self.events is not None:
                self.events.span(EXISTS, t0, time.monotonic(), rid, len(batch), n)
            hit, calls = hit + n, calls + 1
            if n < len(batch):
                break  # stop at the first miss
        return hit, calls

    # ---- IO thread --------------------------------------------------------------------------

    def _io_loop(self) -> None:
        while (op := self.io_queue.get()) is not None:
            if self.uses_acks:
                self._transfer_with_acks(op)
            else:
                self._transfer_rank_local(op)
            op.io_done.set()
            self._notify()

    def _transfer_with_acks(self, op: PrefetchOp) -> None:
        """Batches of KV + side-car pages, one ack per batch; the extra-pool ack; the final."""
        done, reading = 0, True
        for i in range(0, len(op.hash_value), IO_BATCH_PAGES):
            n = len(op.hash_value[i: i + IO_BATCH_PAGES])
            reading = reading and not op.terminated.is_set()
            if reading:
                got = self._read_batch(op, i, n)
                done += got
                reading = got == n  # a page storage could not return ends the reads
            # One ack per batch on every rank, read or not, so the ack sync thread pairs
            # the same acks on all ranks.
            self.ack_queue.put(Ack(op, tokens=done * self.page_size))
        if self.host_sidecar is not None:
            # Pools not derived from KV would be read here, only if every KV page landed;
            # this model has none, but their (reduced) ack is emitted all the same.
            self.ack_queue.put(Ack(op, pool_pages=0))
        op.t_io_done = time.monotonic()
        self.ack_queue.put(Ack(op, final=True))

    def _read_batch(self, op: PrefetchOp, i: int, n: int) -> int:
        """KV pages of one batch, then the side-car pages of those that landed; returns the
        leading pages both delivered (SGLang: min over the KV and KV-derived pools)."""
        kv = self._read(op, i, n, self.host_kv)
        if self.host_sidecar is None or kv == 0:
            return kv
        return min(kv, self._read(op, i, kv, self.host_sidecar))

    def _transfer_rank_local(self, op: PrefetchOp) -> None:
        """pre27010: KV batch by batch with rank-local progress, then the side-car pages."""
        done = 0
        for i in range(0, len(op.hash_value), IO_BATCH_PAGES):
            if op.terminated.is_set():
                break
            n = len(op.hash_value[i: i + IO_BATCH_PAGES])
            got = self._read(op, i, n, self.host_kv)
            done += got
            self._progress(op, done * self.page_size, short=got < n)
            if got < n:
                break
        self._read_sidecar(op, done)
        op.t_io_done = time.monotonic()

    def _progress(self, op: PrefetchOp, tokens: int, short: bool) -> None:
        """pre27010's rank-local progress, only after the pages landed. Pinned: the real
        count only; the scheduler publishes it (and a short batch's stop) at its virtual
        time (hicache.spec.pinned)."""
        if self.pinned:
            op.real_tokens = tokens
            self._notify()
            return
        op.completed_tokens = tokens
        if short:
            # SGLang's mark_terminate on a short batch: the poll's MAX sees it, so
            # wait_complete does not wait forever for pages that will never land.
            op.terminated.set()

    def _read_sidecar(self, op: PrefetchOp, kv_pages: int) -> None:
        if self.host_sidecar is None:
            op.pool_transfers_done = True
            return
        done = 0
        op.sidecar_started = True
        for i in range(0, kv_pages, IO_BATCH_PAGES):
            if op.terminated.is_set():
                break
            n = min(kv_pages, i + IO_BATCH_PAGES) - i
            got = self._read(op, i, n, self.host_sidecar)
            done += got
            if got < n:
                break
        op.sidecar_pages = done
        # Only now has the side-car read stopped writing host memory (PR #27550).
        op.pool_transfers_done = True

    def _read(self, op: PrefetchOp, i: int, n: int, pool: PagePool) -> int:
        """Reads pages i..i+n of the op into their host slots; returns how many leading
        pages landed (the rest of the batch is not written)."""
        staging = torch.empty((n, pool.page_elems), dtype=pool.data.dtype)
        plan = op.plans[i // IO_BATCH_PAGES] if self.pinned and pool is self.host_kv else None
        t0 = time.monotonic()
        got = self.storage.batch_get(op.hash_value[i: i + n], pool.name, staging, plan)
        if self.events is not None:
            self.events.span(READ, t0, time.monotonic(), op.rid, pool.name, n, got.pages,
                             got.pages * pool.page_bytes)
        if got.error is not None:
            op.io_error = got.error
        if got.pages:
            # bulk bytes too, when pages carry a model's KV bytes
            pool.write(op.host_slots[i: i + got.pages], staging[: got.pages])
        return got.pages

    # ---- ack sync thread --------------------------------------------------------------------

    def _ack_loop(self) -> None:
        while (ack := self.ack_queue.get()) is not None:
            synced = ack if ack.final else self._reduce(ack)
            if ack.op.ticketed:
                self._apply_ticket_ack(synced)
            else:
                self.synced_acks.put(synced)
                self._notify()

    @staticmethod
    def _apply_ticket_ack(ack: Ack) -> None:
        """A ticket's acks skip the scheduler's drain; its final ack makes it ready."""
        op = ack.op
        if ack.tokens is not None:
            op.completed_tokens = ack.tokens
        if ack.pool_pages is not None:
            op.pool_transfers_done = True
        if ack.final:
            op.ready.set()

    def _reduce(self, ack: Ack) -> Ack:
        count = ack.tokens if ack.tokens is not None else ack.pool_pages
        t = torch.tensor([count], dtype=torch.int64)
        # Every rank emits the same acks in the same order, so MIN pairs them up.
        self.comm.all_reduce_groups(t, dist.ReduceOp.MIN, ACK_GROUPS, ACK, ack.op.rid)
        if ack.tokens is not None:
            return replace(ack, tokens=int(t.item()))
        return replace(ack, pool_pages=int(t.item()))

    # ---- backup thread ----------------------------------------------------------------------

    def _backup_loop(self) -> None:
        while (op := self.backup_queue.get()) is not None:
            self._page_backup(op)
            self.backup_acks.put(op)

    def _page_backup(self, op: BackupOp) -> None:
        for i in range(0, len(op.hashes), IO_BATCH_PAGES):
            slots = op.slots[i: i + IO_BATCH_PAGES]
            # The slots are pinned until this op's ack is drained: no writer touches them.
            rows = self.host_kv.data.index_select(0, torch.tensor(slots, dtype=torch.int64))
            t0 = time.monotonic()
            written = self.storage.batch_set(op.hashes[i: i + IO_BATCH_PAGES], KV, rows)
            if self.events is not None:
                self.events.span(WRITE, t0, time.monotonic(), len(slots), written,
                                 written * self.host_kv.page_bytes)
            op.written_pages += written
            if written < len(slots):
                break
