"""SGLang 0.5.23's storage prefetch retries (PRs #36227, #39283, #40042), line for line:
`mem_cache/storage_prefetch.py` `StoragePrefetchRetries`, the set of requests whose L3
lookup is to be issued again, and the pass that pops the due ones in waiting-queue order
(`managers/scheduler.py` `_process_storage_prefetch_retries`, once per scheduler step right
after `check_hicache_events`). docs/hazards.md, "Retries (0.5.23)".

Pure scheduler-thread state and no collective of its own: every input (which request
missed, the waiting queue's order, the step count) is identical on every rank as long as
the hit counts are the agreed ones and the walks schedule alike, so every rank pops the same
retries in the same step. A retry's cost is the hit query of the prefetch it issues again.

SGLang's defaults (`arg_groups/fields/memory.py`): a miss is re-issued after 8 scheduling
passes (`hicache_storage_prefetch_retry_poll_interval`; 0 disables miss retries), at most 8
re-issues a request (`hicache_storage_prefetch_retry_max_attempts`): HiCacheConfig's
`retry_poll_interval` and `retry_max_attempts`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Retry:
    immediate: bool  # refetch (buffer mode's staging / anchor loss): due on the next pass
    storage_hit_end: int | None = None  # a known hit's end: the re-issue assumes it stored
    due_step: int | None = None  # set at the first pass that sees it


class PrefetchRetries:
    """`StoragePrefetchRetries`: armed by a poll miss, popped when due. Owned by the
    scheduler thread (the cache's)."""

    def __init__(self):
        self._pending: dict[str, _Retry] = {}
        self._step = 0

    def poll_miss(self, rid: str, storage_hit_end: int | None = None) -> None:
        """Paced: due `interval` passes after the first pass that sees it."""
        self._pending[rid] = _Retry(False, storage_hit_end)

    def refetch(self, rid: str, storage_hit_end: int | None = None) -> None:
        """Immediate: due at the next pass."""
        self._pending[rid] = _Retry(True, storage_hit_end)

    def cancel(self, rid: str) -> None:
        self._pending.pop(rid, None)

    def armed(self, rid: str) -> bool:
        return rid in self._pending

    def pop_ready(self, waiting: list[str], attempts: dict[str, int], interval: int,
                  max_attempts: int) -> list[tuple[str, int | None]]:
        """The retries due at this pass, in waiting-queue order, as (rid, storage_hit_end);
        `attempts`: re-issues each request made so far. Counts the pass."""
        self._step += 1
        if not waiting or not self._pending:
            return []
        # A speculative miss must never delay the queue head.
        head = self._pending.get(waiting[0])
        if head is not None and not head.immediate:
            self.cancel(waiting[0])
        if not any(r.due_step is None or r.due_step <= self._step
                   for r in self._pending.values()):
            return []
        ready = []
        for rid in waiting:
            retry = self._pending.get(rid)
            if retry is None:
                continue
            if attempts.get(rid, 0) >= max_attempts:
                self.cancel(rid)
                continue
            if not retry.immediate:
                if interval <= 0:
                    self.cancel(rid)
                    continue
                if retry.due_step is None:
                    retry.due_step = self._step + interval
                if retry.due_step > self._step:
                    continue
            self.cancel(rid)
            ready.append((rid, retry.storage_hit_end))
        return ready
