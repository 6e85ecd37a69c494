"""The device tier and the write path: a request's pages stay on the device after its
prefill, reach the host (write-through, or write-back on eviction) and then storage.

Read from SGLang 0.5.23 (mem_cache/unified_radix_cache.py, unified_cache/
unified_tree_core.py, managers/cache_controller.py) and followed here:
- After a prefill the prompt's pages are inserted into the tree on the device. Under
  write_through (SGLang's default, `hicache_write_policy`) a new leaf is copied to the host
  at once (hit count 1 >= write_through_threshold 1), its unbacked ancestors first, and
  stays locked until that copy is acked; under write_back a device leaf is copied to the
  host only when it is evicted, and the copy is finished on the spot (`writing_check(
  write_back=True)`, no agreement).
- Device eviction (`evict_device_leaf`): LRU unlocked device leaves, whole nodes; a leaf with
  a host copy is demoted to the host; under write_through one without is dropped.
- Host eviction (`evict_host`): LRU host-only leaves that no storage write reads; gone.
  A copy to the host evicts host pages first when the pool is short, and is skipped when
  it still does not fit (`_execute_kv_backup` returns None).
- A finished host copy is acked in the step where the agreed (MIN) count of finished
  copies covers it (`writing_check` -> `_finish_write_through_ack`); then its pages go to
  storage (`write_backup_storage` -> `write_storage` -> the backup thread), and they stay
  pinned on the host until the backup ack is drained by the agreed count of the ack queue
  (`_drain_backup`, `dec_host_lock_ref`). Neither count costs a collective of its own:
  both ride in check_hicache_events' per-step reduction (hicache.cache.cache).
Copies here are synchronous (on CPU a memcpy, on CUDA a copy that is waited for), so a copy
is finished when it is queued for its ack; the ack still waits for the agreed count.

Only the scheduler thread uses this class; the backup thread is the controller's.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import torch

from hicache.cache.controller import CacheController
from hicache.cache.operations import KV, BackupOp
from hicache.memory.events import HOST_COPY
from hicache.memory.hashing import page_hashes
from hicache.memory.pools import PagePool, expected_rows
from hicache.memory.radix_tree import MatchResult, RadixTree


def token_sources(prompt: int, page: int, base: int, fetched: int, hit: int,
                  usable: int) -> dict[str, int]:
    """Where a prompt's tokens come from when it is scheduled (RequestStats' fields): the
    device (`hit` pages), this request's own prefetch from storage (pages base .. base +
    fetched; base = the prefix matched at arrival), the host (the other usable pages), or
    the prefill. Pages of its prefetch already on the device count as device hits."""
    storage = max(0, min(base + fetched, usable) - max(hit, base))
    return {"prompt_tokens": prompt, "device_hit_tokens": hit * page,
            "storage_hit_tokens": storage * page,
            "host_hit_tokens": (usable - hit - storage) * page,
            "computed_tokens": prompt - usable * page}


@dataclass
class _HostCopy:
    """A device->host copy waiting for its agreed ack (SGLang's ongoing_write_through)."""

    node: object  # the tree node, locked until the ack
    op: BackupOp  # what goes to storage once acked


class Tiers:
    def __init__(self, policy: str, tree: RadixTree, host: PagePool, dev: PagePool,
                 controller: CacheController, page: int, rank: int, unbounded: bool):
        self.policy, self.tree, self.host, self.dev = policy, tree, host, dev
        self.controller, self.page, self.rank, self.unbounded = controller, page, rank, unbounded
        self.copies: list[_HostCopy] = []  # finished host copies, not yet acked
        self.backups_in_flight = 0
        self._pinned: Counter[int] = Counter()  # host slots a storage write reads
        self.host_copied_pages = 0  # device -> host
        self.stored_pages = 0  # host -> storage, acked
        self.dropped_pages = 0  # host pages that went with a device leaf that had no copy
        self.device_evicted_pages = 0
        # Hazard early_return (hicache.cache.cache): this rank's first host copy finds no host
        # memory, as a rank-local alloc failure in SGLang's write_backup does (#27489).
        self.fail_first_copy = False

    # ---- load-back and prefill ---------------------------------------------------------------

    def place(self, tokens: list[int], m: MatchResult) -> tuple[list[int], int, list[int]]:
        """Device slots for every whole page of the prompt before its prefill: the device
        hit's own slots, then new ones for the host pages to load back and the pages to
        compute. Returns (slots, device hit pages, host slots to copy from)."""
        usable = min(m.pages, (len(tokens) - 1) // self.page)
        hit = min(m.device_pages, usable)
        host_src = m.host_tail[: usable - hit]
        new = self.alloc_device(len(tokens) // self.page - hit)
        return m.dev_slots[:hit] + new, hit, host_src

    def pages_needed(self, tokens: list[int], m: MatchResult) -> int:
        """What placing the prompt now takes from device_room(): the new pages, and the
        unlocked device pages of its hit, which its lock makes unevictable."""
        usable = min(m.pages, (len(tokens) - 1) // self.page)
        hit = min(m.device_pages, usable)
        return len(tokens) // self.page - hit + self.tree.unlocked_device_pages_on_path(m.node)

    def device_room(self) -> int:
        """Device pages a placement can have: the free ones and every unlocked cached one
        (unbounded pools evict none: a placement past the free ones fails, as it did)."""
        return self.dev.available + self.tree.evictable_device_pages()

    def alloc_device(self, pages: int) -> list[int]:
        slots = self.dev.alloc(pages)
        if slots is None:
            self._evict_device(pages - self.dev.available)
            slots = self.dev.alloc(pages)
        if slots is None:
            raise RuntimeError(f"device pool exhausted: {pages} pages wanted, "
                               f"{self.dev.available} free of {self.dev.num_pages}, the rest "
                               f"locked by running requests (a larger kv_budget_gib holds more)")
        return slots

    def computed(self, tokens: list[int], m: MatchResult, slots: list[int],
                 first: int) -> list[str]:
        """The prefill's KV: pages `first`.. of the prompt are written into their device
        slots (their content is a function of the page hash, as every page here). Returns
        the hashes of every whole page of the prompt."""
        whole = len(slots)
        known = m.hashes[:whole]
        hashes = known + page_hashes(tokens[len(known) * self.page: whole * self.page],
                                     self.page, known[-1] if known else None)
        if first < whole:
            rows = expected_rows(hashes[first:], self.rank, KV, self.dev.page_elems)
            self.dev.write(slots[first:], rows)
        return hashes

    def cache_prefill(self, tokens: list[int], hashes: list[str], slots: list[int],
                      hit: int) -> None:
        """Inserts the prompt's pages on the device (SGLang cache_unfinished_req); under
        write_through the pages with no host copy are copied to the host."""
        dup, path = self.tree.attach_device(tokens, hashes, slots, hit)
        self.dev.free(dup)
        if self.policy == "write_through":
            self._backup_path([n for n in path if not n.slots], lock=True)

    # ---- device -> host -----------------------------------------------------------------------

    def _backup_path(self, nodes: list, lock: bool) -> None:
        """Copies nodes (top-down) to the host; stops at the first that does not fit."""
        for node in nodes:
            if not self._copy_to_host(node, lock):
                return

    def _copy_to_host(self, node, lock: bool) -> bool:
        slots = None if self.fail_first_copy else self._alloc_host(node.num_pages)
        if slots is None:
            self.fail_first_copy = False
            return False
        t0 = time.monotonic()
        for h, d in zip(self.host.tensors(), self.dev.tensors(), strict=True):
            index = torch.tensor(node.dev, dtype=torch.int64, device=d.device)
            h[slots] = d.index_select(0, index).to(h.device)  # waits for the copy
        if self.controller.events is not None:
            self.controller.events.span(HOST_COPY, t0, time.monotonic(), len(slots),
                                        len(slots) * self.host.page_bytes)
        self.tree.set_host(node, slots)
        self.host_copied_pages += len(slots)
        op = BackupOp(list(node.hashes), list(slots))
        if lock:  # write_through: locked until the agreed ack (SGLang inc_lock_ref)
            self.track_copy(node, op)
        else:  # write_back: finished on the spot, no ack to agree on
            self.write_back_copy(node, op)
        return True

    def track_copy(self, node, op: BackupOp) -> None:
        """A write-through copy made: locked, waiting for its agreed ack (SGLang's
        `_track_write_through_node`). A subclass hands it to another write path."""
        self.tree.lock(node)
        self.copies.append(_HostCopy(node, op))

    def write_back_copy(self, node, op: BackupOp) -> None:
        """A write-back copy made as its device leaf is evicted: no lock, no agreed ack,
        straight to storage (SGLang's `writing_check(write_back=True)`). A subclass hands it
        to another write path."""
        self._write_storage(op)

    def _alloc_host(self, pages: int) -> list[int] | None:
        slots = self.host.alloc(pages)
        if slots is None and not self.unbounded:
            self.host.free(self.tree.evict(pages - self.host.available, self.pinned))
            slots = self.host.alloc(pages)
        return slots

    def pinned(self, node) -> bool:
        return any(s in self._pinned for s in node.slots)

    def _evict_device(self, pages: int) -> None:
        if self.unbounded:
            raise RuntimeError(f"unbounded pools: the device pool of {self.dev.num_pages} "
                               f"pages is full; size it to the workload")
        write_back = (lambda n: self._copy_to_host(n, lock=False)) \
            if self.policy == "write_back" else None
        dev, host = self.tree.evict_device(pages, write_back)
        self.device_evicted_pages += len(dev)
        self.dev.free(dev)
        self.host.free(host)
        self.dropped_pages += len(host)

    # ---- acks (once per step, by agreed counts: hicache.cache.cache.check_hicache_events) --------

    def finished_copies(self) -> int:
        return len(self.copies)

    def drain_copies(self, n: int) -> None:
        """The first n host copies are acked on every rank: unlock, then write to storage.
        A later PP stage takes stage 0's count; it can only have made fewer copies when the
        stages scheduled differently, which only pre27010 lets them (SGLang #22607): SGLang
        0.5.18's writing_check would pop acks that are not there."""
        if n > len(self.copies):
            raise RuntimeError(f"rank {self.rank}: told {n} host copies finished, made "
                               f"{len(self.copies)}: the PP stages scheduled different "
                               f"prefills (pre27010's PP divergence, SGLang #22607)")
        for c in self.copies[:n]:
            self.tree.unlock(c.node)
            self._write_storage(c.op)
        del self.copies[:n]

    def _write_storage(self, op: BackupOp) -> None:
        self._pinned.update(op.slots)
        self.backups_in_flight += 1
        self.controller.backup_queue.put(op)

    def drain_backups(self, n: int, get) -> None:
        """n backup acks agreed: the host pages they read may be evicted again. `get`
        blocks for an ack this rank's backup thread has not put yet (a later PP stage)."""
        for _ in range(n):
            op = get(self.controller.backup_acks)
            self.stored_pages += op.written_pages
            self._pinned.subtract(op.slots)
            self._pinned += Counter()  # drops the slots at zero
            self.backups_in_flight -= 1

    @property
    def busy(self) -> bool:
        """Copies or storage writes still to be acked: the run is not over."""
        return bool(self.copies) or self.backups_in_flight > 0

    def backup_queue_size(self) -> int:
        return self.controller.backup_acks.qsize()

    def summary(self) -> dict[str, int]:
        """Pages the write path moved, for the run's records, and the device pool's
        self-check after the run: slots neither in the tree nor free (0, or leaked)."""
        return {"device_slots_unaccounted": self.dev.used - self.tree.device_pages,
                "host_copy_pages": self.host_copied_pages,
                "storage_write_pages": self.stored_pages,
                "dropped_host_pages": self.dropped_pages,
                "device_evicted_pages": self.device_evicted_pages}

