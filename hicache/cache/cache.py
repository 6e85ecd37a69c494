"""Scheduler-thread side of HiCache: prefix match, prefetch issue and the queue drains;
the per-step events (check_hicache_events): `hicache.cache.step_events`; the poll
(`check_prefetch_progress`) and finalisation: `hicache.cache.poll`; load-back and the prefill's
device pages: `hicache.cache.prefill_pages` (the copy itself: `hicache.memory.loadback`;
page sizes and pool page counts: `hicache.memory.kv_layout`).

Everything here runs on the scheduler thread, in lock-step with the other ranks; the
collectives it issues go through `Comm` on the scheduler's groups (`tp_cpu`, `pp_cpu`).
"""

from __future__ import annotations

import queue
import time

import torch

from hicache.agreement.pp_ticket import TICKET_IDLE_S, TicketRelay
from hicache.agreement.protocols import make_protocol
from hicache.cache.controller import CacheController, ControllerSettings
from hicache.cache.operations import KV, SIDECAR, PrefetchOp
from hicache.cache.poll import PrefetchPoll
from hicache.cache.prefill_pages import PrefillPages
from hicache.cache.retries import PrefetchRetries
from hicache.cache.step_events import StepEvents
from hicache.cache.tiers import Tiers
from hicache.cache.twin import TwinPolls
from hicache.comm.comm import Comm
from hicache.comm.groups import Layout
from hicache.comm.records import Stats
from hicache.memory.hashing import page_hashes
from hicache.memory.kv_layout import kv_layout
from hicache.memory.pools import PagePool, expected_rows
from hicache.memory.radix_tree import MatchResult, RadixTree
from hicache.memory.storage import Storage
from hicache.spec.config import HiCacheConfig
from hicache.spec.cost_model import IO_BATCH_PAGES, ticket_path
from hicache.spec.pinned import Pin


class HiCache(StepEvents, PrefetchPoll):
    """The scheduler thread's cache: arrival, per-step events, load-back (the poll and
    termination: hicache.cache.poll.PrefetchPoll). The harness calls it only through
    hicache.serve.seam.CacheUnderTest."""

    def __init__(self, cfg: HiCacheConfig, layout: Layout, comm: Comm, storage: Storage,
                 device: torch.device, stats: Stats, consensus=None):
        self.cfg, self.layout, self.comm, self.stats = cfg, layout, comm, stats
        self.page, self.device, self.consensus = cfg.page_size, device, consensus
        # Page-locked host memory on CUDA, so load-back copies run async (not the schedule)
        page_locked = device.type == "cuda"
        kv = self.kv = kv_layout(cfg, device)
        self.host_kv = PagePool("kv", kv.host_pages, cfg.kv_page_elems, "cpu", page_locked,
                                bulk_bytes=kv.bulk_bytes)
        self.dev_kv = PagePool("kv", kv.device_pages, cfg.kv_page_elems, device,
                               bulk_bytes=kv.bulk_bytes)
        self.host_side = self.dev_side = None
        if cfg.extra_pool:  # side-car pages share the KV page's slot number
            self.host_side = PagePool(SIDECAR, kv.host_pages, cfg.sidecar_page_elems, "cpu",
                                      page_locked)
            self.dev_side = PagePool(SIDECAR, kv.device_pages, cfg.sidecar_page_elems, device)
        self.pairs = [(self.host_kv, self.dev_kv)]  # (host, device) pools a load-back copies
        if self.host_side is not None:
            self.pairs.append((self.host_side, self.dev_side))
        self.tree = RadixTree(cfg.page_size)
        self.protocol = make_protocol(cfg.protocol, cfg.policy, cfg.race_guard)
        # the polls, timed, and a twin protocol's beside them (hicache.cache.twin)
        self.twin_polls = TwinPolls(cfg, self.protocol, comm)
        self.agreement = self.protocol.agreement(cfg.host_memory)
        # buffer_only: host pages are staging for one load-back, not a cache tier.
        self.buffer_only = cfg.host_memory == "buffer_only"
        self.ticketed = ticket_path(cfg.protocol, cfg.pp, cfg.host_memory)
        # SGLang's idle ticket every 60 s (hybrid_cache_controller.py:1307), sooner when this
        # run's groups time out sooner: a later stage's wait for it must never time out.
        idle_s = min(TICKET_IDLE_S, cfg.collective_timeout_s / 2)
        tickets = (TicketRelay(comm, self.host_kv, cfg.page_size, cfg.prefetch_threshold,
                               idle_s) if self.ticketed else None)
        self.pinned = cfg.schedule == "pinned"
        settings = ControllerSettings(cfg.page_size, self.protocol.uses_acks, self.pinned,
                                      self.protocol.hit_shape(cfg.sidecar_hit_policy))
        self.controller = CacheController(comm, storage, self.host_kv, self.host_side,
                                          settings, tickets, stats.events)
        # Pinned: what the threads finished becomes visible on the virtual clock.
        self.pin = (Pin(cfg.page_size, self.protocol.uses_acks,
                        cfg.storage.exists_latency_ms / 1e3, self.controller.progress,
                        self.controller.synced_acks, cfg.collective_timeout_s, layout.rank)
                    if self.pinned else None)
        self.tiers = (Tiers(cfg.write_policy, self.tree, self.host_kv, self.dev_kv,
                            self.controller, cfg.page_size, layout.rank, cfg.unbounded_pools)
                      if cfg.tiers else None)
        if self.tiers is not None and cfg.hazard == "early_return":
            self.tiers.fail_first_copy = layout.tp_rank == layout.tp - 1
        self.staged: dict[str, tuple[list[int], list[str]]] = {}  # rid -> (slots, hashes)
        self.ongoing: dict[str, PrefetchOp] = {}
        self.expired: set[str] = set()  # 0.5.23: requests whose deadline expired (agreed)
        # 0.5.23: misses whose lookup is issued again, and each request's re-issues so far
        self.retries = PrefetchRetries() if self.protocol.retries else None
        self.retry_attempts: dict[str, int] = {}
        # 0.5.23, timeout: the prefetch whose first blocked poll started each request's
        # wait; a retry's prefetch takes its clock and budget
        self.waits: dict[str, PrefetchOp] = {}
        self.matches: dict[str, list[MatchResult]] = {}  # locked tree nodes per request
        self.prompts: dict[str, list[int]] = {}
        self.tokens_in_flight = 0
        self._tails: list[tuple[PrefetchOp, list[int]]] = []  # freed once their IO stopped
        self.step_stamp = 0.0
        self.prefill = PrefillPages(cfg.page_size, layout.rank, stats, kv, self.pairs,
                                    self.tiers, device)
        self._bulk: dict[str, bool] | None = None  # pr33029: this step's bulk poll results
        self._skewed = False  # hazard ongoing_skew: its one rank-local revocation done
        self.extra_polls = 0  # this step's polls outside the walk's reach (records.StepStats)
        self._in_flight = None  # pr39903: the agreement issued last step, waited on next

    # ---- lifecycle (hicache.serve.seam) ----------------------------------------------------------

    def start(self) -> None:
        self.controller.start()

    def stop(self, grace_s: float) -> None:
        self.controller.stop(grace_s)

    def settle(self) -> None:
        """A read can outlive the last step (a timeout cut its prefetch short): its tail
        slots are freed now that the IO thread has ended; then the self-checks."""
        self.free_stopped_tails(final=True)
        self.stats.host_slots_unaccounted = self.host_slots_unaccounted()
        if self.tiers is not None:
            self.stats.write_path = self.tiers.summary()

    def error(self) -> BaseException | None:
        return self.controller.error

    @property
    def own_groups(self) -> dict:
        return {}  # every group it uses is Comm's

    def has_work(self) -> bool:
        return bool(self.ongoing) or self.writes_pending()

    def prefetching(self, rid: str) -> bool:
        return rid in self.ongoing

    def landed(self, rid: str) -> bool:
        """This rank's own prefetch of `rid` has ended: it is not in `ongoing` (its pages
        landed, as the agreed final ack says, or a poll ended it, or none was issued) or it
        is terminated. Read on the scheduler thread, no collective; `ongoing` changes only
        at the agreed drains, so the TP ranks of a stage answer alike (as SGLang's
        stage-local `check_prefetch_progress` does), never by the IO thread's timing."""
        op = self.ongoing.get(rid)
        return op is None or op.terminated.is_set()

    def prompt_length(self, rid: str) -> int:
        return len(self.prompts[rid])

    # ---- arrival: prefix match and prefetch issue --------------------------------------------

    def _storage_key(self, rid: str, tokens: list[int]):
        """The request's match in the host tree (locked) and the whole pages after it: what
        a prefetch would ask storage for (its length is the request's requested_tokens)."""
        self.prompts[rid] = tokens
        m = self._match_and_lock(rid, tokens)
        aligned = len(tokens) // self.page * self.page
        key = tokens[m.pages * self.page: aligned]
        self.stats.requests[rid].requested_tokens = len(key)
        return m, key

    def admit(self, rid: str, tokens: list[int], stamp: float) -> None:
        m, key = self._storage_key(rid, tokens)
        self._prefetch_from_storage(rid, m, key, stamp)

    def _prefetch_from_storage(self, rid: str, m: MatchResult, key: list[int], stamp: float,
                               storage_hit_end: int | None = None) -> None:
        """Issues the prefetch of `key` (the pages after the match `m`), or not
        (unified_radix_cache.py `prefetch_from_storage`); `storage_hit_end`: a retry's known
        hit end, up to which the span is taken as stored (no batch_exists)."""
        if self.retries is not None:
            self.retries.cancel(rid)
        if rid in self.expired or rid in self.ongoing:
            return  # 0.5.23: an agreed deadline is final; one prefetch at a time
        start = m.pages * self.page
        assume = storage_hit_end is not None and start < storage_hit_end <= start + len(key)
        if assume:
            key = key[: storage_hit_end - start]
        if len(key) < self.cfg.prefetch_threshold:
            return  # no lookup, so no retry armed
        if not self.buffer_only and not self.cfg.unbounded_pools and \
                self.tokens_in_flight >= 0.5 * self.host_kv.num_pages * self.page:
            # rate-limited: half the host pool already in flight (buffer mode sizes host
            # memory at the hit instead: unified_radix_cache.py:2157); 0.5.23 retries it,
            # paced: the limiter clears as transfers finish
            self._arm_retry(rid, storage_hit_end)
            return
        op = PrefetchOp(rid, key, m.last_hash, time.monotonic(), stamp, page_size=self.page,
                        ticketed=self.ticketed, issue_step=self.stats.counter.step,
                        storage_start=start, assume_stored=assume)
        first = self.waits.get(rid)
        if first is not None:  # the request's wait goes on (unified_radix_cache.py:2260-2263)
            op.wait_start, op.wait_tokens = first.wait_start, first.wait_tokens
        self.ongoing[rid] = op
        self.tokens_in_flight += len(key)
        st = self.stats.requests[rid]
        st.op_issued, st.prefetch_ops = True, st.prefetch_ops + 1
        if self.pin is not None:
            self.pin.hits.submitted.append(op)
        self.controller.prefetch_queue.put(op)

    # ---- 0.5.23's storage prefetch retries (hicache.cache.retries) ------------------------------

    def _arm_retry(self, rid: str, storage_hit_end: int | None = None) -> None:
        """A miss: its lookup is issued again after the retry interval (0.5.23's
        `storage_prefetch_retries.poll_miss`); a protocol without retries: nothing."""
        if self.retries is not None:
            self.retries.poll_miss(rid, storage_hit_end)

    def retry_prefetches(self, waiting: list[str], stamp: float) -> None:
        """Once per step, after check_hicache_events and before the walk: the due retries,
        in waiting-queue order, issued again (scheduler.py
        `_process_storage_prefetch_retries` -> `_retry_storage_prefetch` ->
        `_prefetch_kvcache`: the prefix matched afresh, then `prefetch_from_storage`)."""
        if self.retries is None:
            return
        cfg = self.cfg
        for rid, hit_end in self.retries.pop_ready(waiting, self.retry_attempts,
                                                    cfg.retry_poll_interval,
                                                    cfg.retry_max_attempts):
            self.retry_attempts[rid] = self.retry_attempts.get(rid, 0) + 1
            self.stats.requests[rid].retries += 1
            m, key = self._storage_key(rid, self.prompts[rid])
            matches = self.matches[rid]
            matches.insert(0, matches.pop())  # the base its prefetch now follows
            self._prefetch_from_storage(rid, m, key, stamp, hit_end)

    def _match_and_lock(self, rid: str, tokens: list[int]) -> MatchResult:
        m = self.tree.match(tokens)
        self.tree.lock(m.node)  # the matched prefix must survive eviction until load-back
        self.matches.setdefault(rid, []).append(m)
        return m

    def warm_host(self, prefixes: list[list[int]]) -> None:
        """These prefixes' pages, with their storage content, already in this rank's host
        tree (hazard span_skew: hicache.spec.config)."""
        for tokens in prefixes:
            hashes = page_hashes(tokens, self.page)
            slots = self.host_kv.alloc(len(hashes))
            assert slots is not None, "the host pool holds the warmed prefixes"
            for host, _ in self.pairs:
                host.write(slots, expected_rows(hashes, self.layout.rank, host.name,
                                                host.page_elems))
            self.host_kv.free(slots[: self.tree.insert(tokens, slots, hashes)])

    def release(self, rid: str) -> None:
        self.prompts.pop(rid, None)
        self.waits.pop(rid, None)
        self.host_kv.free(self.staged.pop(rid, ([], []))[0])
        for m in self.matches.pop(rid, []):
            self.tree.unlock(m.node)

    def cached_tokens(self, rid: str) -> int:
        """Host-resident prefix usable for this request's prompt (tree, then its staged
        pages; at least one token left to compute)."""
        tokens = self.prompts[rid]
        held = self.tree.match(tokens).pages + len(self.staged.get(rid, ([], []))[0])
        return min(held, (len(tokens) - 1) // self.page) * self.page

    # ---- device room: what the walk checks before it schedules a request --------------------

    @property
    def max_input_tokens(self) -> int:
        """SGLang's max_req_input_len: a prompt this long or longer is refused (or cut to it)."""
        return self.prefill.max_input_tokens

    def device_free_pages(self) -> int:
        return self.dev_kv.available

    def device_room(self) -> int:
        """Device pages a prefill can take now: free ones, and unlocked cached ones."""
        return self.dev_kv.available if self.tiers is None else self.tiers.device_room()

    def device_pages_needed(self, rid: str, cached: int) -> int:
        """Device pages its load-back would take of device_room() if scheduled now
        (`cached`: cached_tokens(rid)); without the device tier only the loaded prefix."""
        if self.tiers is None:
            return cached // self.page
        tokens = self.prompts[rid]
        return self.tiers.pages_needed(tokens, self.tree.match(tokens))

    # ---- load-back host->device (hicache.cache.prefill_pages) ------------------------------------

    def load_back(self, rid: str) -> tuple[list[int], float]:
        """Device pages for the prompt before its prefill, and the copy's time."""
        if self.retries is not None:  # scheduled: no lookup left to retry (scheduler.py:4315)
            self.retries.cancel(rid)
        tokens = self.prompts[rid]
        m = self._match_and_lock(rid, tokens)
        staged = self.staged.pop(rid, ([], []))
        return self.prefill.load_back(rid, tokens, m, self.matches[rid][0].pages, staged)

    def cache_prefill(self, rid: str, dev: list[int]) -> None:
        """After the prefill: the device pages are cached (device tier) or go back."""
        self.prefill.cache_prefill(rid, self.prompts[rid], dev)

    def writes_pending(self) -> bool:
        """Host copies or storage writes not yet acked (the run goes on until they are)."""
        return self.tiers is not None and self.tiers.busy

    def close(self) -> None:
        """Frees the pools' memory (gigabytes of pinned host memory with real KV pages)."""
        for pool in (self.host_kv, self.dev_kv, self.host_side, self.dev_side):
            if pool is not None:
                pool.release()

    # ---- the per-step events (check_hicache_events): hicache.cache.step_events ---------------

    def _local_miss(self, op: PrefetchOp) -> bool:
        """Hazard ongoing_skew (SGLang #38273): the last TP rank of each stage drops the
        first prefetch that went to IO from its `ongoing_prefetch` (as a rank-local check
        of its hit against the threshold would), while the other ranks keep it. Its IO and
        acks run on as everywhere else, so the background reductions still pair: only the
        scheduler's view differs."""
        if self.cfg.hazard != "ongoing_skew" or self._skewed or \
                self.layout.tp_rank != self.layout.tp - 1:
            return False
        self._skewed = True
        return True

    def _get(self, q: queue.Queue):
        # A later PP stage may be behind stage 0's count: wait, but never forever.
        try:
            return q.get(timeout=self.cfg.collective_timeout_s)
        except queue.Empty:
            raise RuntimeError(f"rank {self.layout.rank}: agreed queue count not reached "
                               f"within {self.cfg.collective_timeout_s}s") from None

    def _drain_hits(self, n: int) -> None:
        if self.pin is not None:
            self.pin.hits.drained(n)
        for _ in range(n):
            op = self._get(self.controller.hit_queue)
            op.hit_drained = True
            st = self.stats.requests[op.rid]
            st.hit_tokens = op.hit_tokens
            if op.terminated.is_set():
                continue  # revoked by a poll while its hit query was in flight
            if op.hit_tokens < self.cfg.prefetch_threshold:
                self._revoke(op)  # a miss (or too short): 0.5.23 looks it up again later
                self._arm_retry(op.rid)
                continue
            slots = self._alloc_host(len(op.hash_value))
            if slots is None:
                self._revoke(op)  # no host memory: 0.5.23 retries, assuming the hit stored
                self._arm_retry(op.rid, op.storage_start + op.hit_tokens)
                continue
            op.host_slots, op.hash_value = slots, op.hash_value[: len(slots)]
            st.hit_tokens, st.io_issued = op.hit_tokens, True  # the hit it will fetch
            if self.pin is not None:
                self._plan_reads(op)
            self.controller.io_queue.put(op)
            if self._local_miss(op):
                del self.ongoing[op.rid]  # its IO and acks run on; the scheduler forgot it

    def _plan_reads(self, op: PrefetchOp) -> None:
        """Pinned: the op's batch reads drawn now, in the order the IO thread runs them,
        and replayed on the virtual clock from this step on (hicache.spec.pinned)."""
        storage, n = self.controller.storage, IO_BATCH_PAGES
        op.plans = [storage.plan_read(op.hash_value[i: i + n], KV, self.cfg.kv_page_elems)
                    for i in range(0, len(op.hash_value), n)]
        self.pin.io.submit(op, self.step_stamp, op.plans)

    def _alloc_host(self, pages: int) -> list[int] | None:
        """Host slots for the hit; under pressure (after eviction) the longest prefix that
        fits if it reaches the threshold (unified_radix_cache `_try_alloc_storage_hit`)."""
        slots = self.host_kv.alloc(pages)
        if slots is None:
            pinned = self.tiers.pinned if self.tiers is not None else None
            self.host_kv.free(self.tree.evict(pages - self.host_kv.available, pinned))
            slots = self.host_kv.alloc(pages)
        fit = min(pages, self.host_kv.available)
        if slots is None and fit * self.page >= self.cfg.prefetch_threshold:
            slots = self.host_kv.alloc(fit)
        return slots

    def _drain_acks(self, n: int) -> None:
        if self.pin is not None:
            self.pin.acks_drained += n
        for _ in range(n):
            ack = self._get(self.controller.synced_acks)
            op = ack.op
            if self.ongoing.get(op.rid) is not op:
                continue  # already terminated by a poll; the ack only paired the IO thread
            if ack.tokens is not None:
                op.completed_tokens = ack.tokens
            if ack.pool_pages is not None:
                op.pool_transfers_done = True
            if ack.final:
                self._finalize(op, op.completed_tokens, "ack")
