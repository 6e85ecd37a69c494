"""SGLang's write path (0.5.23's as below; 0.5.19's tracks a node alone: docs/sglang.md) on
the controller path (`bench run --cache sglang --write-policy write_through|write_back`,
sglang_adapter.controller.cache): the harness's device tier copies pages to the host, as the
project's does (hicache.cache.tiers), and hands each copy to SGLang's own write path from
there on.

write_through: a prefill's new pages are copied as they are cached.

- `_track_write_through_node` registers it (`ongoing_write_through`, SGLang's
  `inc_lock_ref` locking the node in the harness's tree) and its ack goes on the
  controller's `ack_write_queue`, as `start_writing` posts it;
- every step SGLang's `check_hicache_events` counts the finished acks in its packed MIN
  (`_sync_hicache_ready_counts`), `writing_check` takes the agreed count,
  `_finish_write_through_ack` unlocks and calls `write_backup_storage` (its host lock,
  `write_storage` onto the backup queue);
- SGLang's backup thread (`backup_thread_func` -> `_page_backup` -> `_generic_page_set`)
  reads the host pages (`ProjectHostPool.get_data_page`) and writes them through the
  backend into the harness's storage tier (sglang_adapter.controller.storage `batch_set`), then
  acks on `ack_backup_queue`; the packed MIN counts those acks and `_drain_backup` takes
  them, releasing the host lock (`dec_host_lock_ref`).

write_back: a device leaf with no host copy is copied as the harness's device eviction
takes it (`Tiers._evict_device` -> `RadixTree.evict_device`), where SGLang's `_evict`
(`_evict_components`) builds its BackupKV (`evict_device_leaf(node, is_write_back=True)`):

- as `_execute_and_commit_kv_backup(..., write_back=True)`: no `inc_lock_ref` (its
  lock_params None), SGLang's own `_track_write_through_node`, and the copy's ack on
  `ack_write_queue`, as `start_writing` posts it;
- SGLang's own `writing_check(write_back=True)` then, before the leaf is demoted, as the
  eviction loop calls it after a backup, and again after the whole eviction pass, as
  `_evict` calls it when the controller's write policy is write_back: `start_writing`
  (nothing queued: the copy was the harness's), every ack's `synchronize`,
  `_finish_write_through_ack` -> `write_backup_storage`, no collective (no MIN: the copy
  is finished on every rank when the leaf goes);
- from there on as write_through: the backup thread, its ack in the packed MIN,
  `_drain_backup`. The packed MIN also carries the tree core's
  `write_back_duplicate_reclaim_digest`
  (sglang_adapter.controller.project_stand_ins.ProjectTreeCore: 0, as the harness's host
  eviction reclaims no device-resident duplicates).

Stand-in, and why: the copy itself. SGLang's `write` / `start_writing` submit it to its L2
transfer engine (CUDA streams and events over a device KV pool), not built here; the
harness's device tier copies synchronously instead (as the project's model says its
copies are), so the ack SGLang receives is finished when posted (`_Done`). Under
write_back also the eviction walk: SGLang's `_evict_components` walks its own tree core's
leaves, the harness's evicts its own tree's (the same order: LRU unlocked device leaves,
whole nodes) and calls SGLang's write path where SGLang's walk would.

Self-check: when SGLang's drain releases a backup's host lock, the pages it wrote are read
back from storage and held against the KV the harness computed for them
(`hicache.memory.pools.expected_rows`); a page absent or different is a data error of the
request whose prefill made it (its row in requests.csv: `data_ok` False, the run FAILED);
under write_back, of the last request whose prompt cached the page on the device.
"""

from __future__ import annotations

import inspect
import itertools
from collections import Counter

import torch

from hicache.cache.operations import KV, BackupOp
from hicache.cache.tiers import Tiers
from hicache.memory.pools import expected_rows


class _Done:
    """A device event that has fired: the harness's copy is synchronous."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class ControllerWrites(Tiers):
    """The harness's device tier with SGLang's write path after the host copy (module
    docstring). Scheduler thread only, as SGLang's cache; the backup thread is SGLang's."""

    @classmethod
    def adopt(cls, tiers: Tiers, cache, tier, ack_class, stats) -> ControllerWrites:
        """`tiers` (the cache's own, already built) with the write path handed to SGLang's `cache`
        (a UnifiedRadixCache whose tree core is sglang_adapter.controller.project_stand_ins'),
        writing through `tier` (sglang_adapter.controller.stand_ins.Tier)."""
        tiers.__class__ = cls
        tiers.sgl, tiers.tier, tiers.ack_class, tiers.stats = cache, tier, ack_class, stats
        tiers.writer = None  # the request whose prefill is being cached
        tiers.backups: dict[int, tuple[object, BackupOp, str | None]] = {}
        tiers._ids = itertools.count(1)
        tiers.data_errors = 0
        tiers.makers: dict[str, str | None] = {}  # write_back: page -> who cached it last
        # 0.5.19 tracks a node alone; 0.5.23 also names the nodes its ack publishes
        tiers.publishes = "publish_node_ids" in inspect.signature(
            cache._track_write_through_node).parameters
        cache.tree_core.writes = tiers
        # As SGLang's __init__ reads the policy off its controller (is_write_back: its tree
        # core's) and `_evict` checks it there.
        cache.cache_controller.write_policy = tiers.policy
        cache.is_write_back = tiers.policy == "write_back"
        return tiers

    def cache_prefill(self, tokens, hashes, slots, hit) -> None:
        super().cache_prefill(tokens, hashes, slots, hit)
        if self.policy == "write_back":  # whose data error a wrong write-back page is
            self.makers.update(dict.fromkeys(hashes, self.writer))

    def track_copy(self, node, op: BackupOp) -> None:
        """write_through: SGLang's `_execute_and_commit_kv_backup` after the copy: its
        lock, its tracking, and the ack `start_writing` posts."""
        node_id = next(self._ids)
        self.backups[node_id] = (node, op, self.writer)
        lock = self.sgl.inc_lock_ref(node_id).to_dec_params()
        self._track(node_id, lock, op)

    def write_back_copy(self, node, op: BackupOp) -> None:
        """write_back: `_execute_and_commit_kv_backup(..., write_back=True)` after the copy
        (no lock), then SGLang's `writing_check(write_back=True)` before the leaf is
        demoted, as its eviction loop calls it (module docstring)."""
        node_id = next(self._ids)
        rid = self.makers.get(op.hashes[-1])  # its prompt held every page of the node
        for name in op.hashes:
            self.makers.pop(name, None)
        self.backups[node_id] = (node, op, rid)
        self._track(node_id, None, op)
        self.sgl.writing_check(write_back=True)  # no collective: every ack is waited for

    def _evict_device(self, pages: int) -> None:
        """The harness's eviction pass, then SGLang's `_evict`'s own closing
        `writing_check(write_back=True)` under write_back (nothing left by then: each
        leaf's was finished before it was demoted)."""
        super()._evict_device(pages)
        if self.sgl.cache_controller.write_policy == "write_back":
            self.sgl.writing_check(write_back=True)

    def _track(self, node_id: int, lock, op: BackupOp) -> None:
        """SGLang's `_track_write_through_node`, and the copy's ack as `start_writing`
        posts it (finished: the harness's copy is synchronous)."""
        published = {"publish_node_ids": [node_id]} if self.publishes else {}
        self.sgl._track_write_through_node(node_id, lock, **published)
        done = _Done()
        self.sgl.cache_controller.ack_write_queue.append(self.ack_class(
            start_event=done, finish_event=done, node_ids=[node_id],
            num_tokens=len(op.slots) * self.page))

    # ---- what SGLang's tree core is asked (controller.project_stand_ins.ProjectTreeCore) ----

    def node(self, node_id: int):
        return self.backups[node_id][0]

    def storage_spec(self, node_id: int):
        """`build_storage_backup_spec`: the copy's host slots as SGLang's token indices and
        its pages' names (for a prompt with no namespace SGLang's chain and the tier's
        agree name for name: docs/sglang.md, "SGLang's own controller path")."""
        node, op, _ = self.backups[node_id]
        offsets = torch.arange(self.page)
        host = torch.cat([s * self.page + offsets for s in op.slots])
        return host, list(node.tokens[: len(op.slots) * self.page]), list(op.hashes)

    def pin(self, node_id: int) -> None:
        """`write_backup_storage`'s host lock: the backup thread reads these slots."""
        self._pinned.update(self.backups[node_id][1].slots)
        self.backups_in_flight += 1

    def stored(self, node_id: int) -> None:
        """`_drain_backup` released the host lock: the backup is acked. Its pages are
        held against the KV the harness computed for them."""
        _, op, rid = self.backups.pop(node_id)
        self._pinned.subtract(op.slots)
        self._pinned += Counter()  # drops the slots at zero
        self.backups_in_flight -= 1
        written, bad = self._check(op.hashes)
        self.stored_pages += written
        self.data_errors += bad
        if rid is not None and bad:
            self.stats.requests[rid].data_errors += bad

    def _check(self, names: list[str]) -> tuple[int, int]:
        """(pages storage holds, pages wrong): a page is wrong when SGLang's backup thread
        did not hand it to the backend as the harness computed it (Tier.record_write), or
        storage does not hold it, or holds other content (a tier that keeps bytes: file;
        sim regenerates a page's content from its name)."""
        storage = self.controller.storage
        names = self.tier.translate(names)
        rows = storage.stored(names, KV, self.host.page_elems)
        want = expected_rows(names[: rows.shape[0]], storage.rank, KV, self.host.page_elems)
        same = (rows == want.to(self.host.data.dtype).to(rows.dtype)).all(dim=1).tolist()
        handed = self.tier.written_right(names)
        held = same + [False] * (len(names) - rows.shape[0])
        return rows.shape[0], sum(not (h and k) for h, k in zip(handed, held, strict=True))

    # ---- the project's own agreement has nothing of this path to drain ----------------------

    @property
    def busy(self) -> bool:
        return bool(self.sgl.ongoing_write_through) or self.backups_in_flight > 0

    def backup_queue_size(self) -> int:
        return 0  # SGLang's ack_backup_queue is counted in SGLang's own packed MIN


__all__ = ["ControllerWrites"]
