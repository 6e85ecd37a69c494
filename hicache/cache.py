"""Scheduler-thread side of HiCache: prefix match, prefetch issue, per-step events, the
poll (`check_prefetch_progress`) and finalisation; load-back and the prefill's device
pages: `hicache.prefill_pages` (the copy itself: `hicache.loadback`; page sizes and pool
page counts: `hicache.kv_layout`).

Everything here runs on the scheduler thread, in lock-step with the other ranks; the
collectives it issues go through `Comm` on the scheduler's groups (`tp_cpu`, `pp_cpu`).
"""

from __future__ import annotations

import queue
import time

import torch
import torch.distributed as dist

from hicache.comm import COMPLETION, PER_STEP_MIN, Comm, Layout
from hicache.config import HiCacheConfig
from hicache.consensus import rank_consensus
from hicache.controller import KV, SIDECAR, CacheController, PrefetchOp
from hicache.cost_model import IO_BATCH_PAGES, ticket_path
from hicache.kv_layout import kv_layout
from hicache.pinned import Pin
from hicache.pools import PagePool
from hicache.pp_ticket import TICKET_IDLE_S, TicketRelay
from hicache.prefill_pages import PrefillPages
from hicache.protocols import Facts, make_protocol
from hicache.radix_tree import MatchResult, RadixTree
from hicache.records import Stats
from hicache.storage import Storage
from hicache.tiers import Tiers


class HiCache:
    def __init__(self, cfg: HiCacheConfig, layout: Layout, comm: Comm, storage: Storage,
                 device: torch.device, stats: Stats, consensus=None):
        self.cfg, self.layout, self.comm, self.stats = cfg, layout, comm, stats
        self.page, self.device, self.consensus = cfg.page_size, device, consensus
        pin = device.type == "cuda"  # pinned host pool: async host->device copies
        kv = self.kv = kv_layout(cfg, device)
        self.host_kv = PagePool("kv", kv.host_pages, cfg.kv_page_elems, "cpu", pin,
                                bulk_bytes=kv.bulk_bytes)
        self.dev_kv = PagePool("kv", kv.device_pages, cfg.kv_page_elems, device,
                               bulk_bytes=kv.bulk_bytes)
        self.host_side = self.dev_side = None
        if cfg.extra_pool:  # side-car pages share the KV page's slot number
            self.host_side = PagePool(SIDECAR, kv.host_pages, cfg.sidecar_page_elems, "cpu", pin)
            self.dev_side = PagePool(SIDECAR, kv.device_pages, cfg.sidecar_page_elems, device)
        self.pairs = [(self.host_kv, self.dev_kv)]  # (host, device) pools a load-back copies
        if self.host_side is not None:
            self.pairs.append((self.host_side, self.dev_side))
        self.tree = RadixTree(cfg.page_size)
        self.protocol = make_protocol(cfg.protocol, cfg.policy, cfg.race_guard)
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
        self.controller = CacheController(comm, storage, self.host_kv, self.host_side,
                                          cfg.page_size, self.protocol.uses_acks, tickets,
                                          stats.events, self.pinned)
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

    # ---- arrival: prefix match and prefetch issue --------------------------------------------

    def admit(self, rid: str, tokens: list[int], stamp: float) -> None:
        self.prompts[rid] = tokens
        m = self._match_and_lock(rid, tokens)
        aligned = len(tokens) // self.page * self.page
        key = tokens[m.pages * self.page: aligned]
        st = self.stats.requests[rid]
        st.requested_tokens = len(key)
        if len(key) < self.cfg.prefetch_threshold:
            return
        if not self.buffer_only and not self.cfg.unbounded_pools and \
                self.tokens_in_flight >= 0.5 * self.host_kv.num_pages * self.page:
            return  # rate-limited: half the host pool already in flight (buffer mode sizes
            # host memory at the hit instead: unified_radix_cache.py:2157)
        op = PrefetchOp(rid, key, m.last_hash, time.monotonic(), stamp, page_size=self.page,
                        ticketed=self.ticketed)
        self.ongoing[rid] = op
        self.tokens_in_flight += len(key)
        st.op_issued = True
        if self.pin is not None:
            self.pin.hits.submitted.append(op)
        self.controller.prefetch_queue.put(op)

    def _match_and_lock(self, rid: str, tokens: list[int]) -> MatchResult:
        m = self.tree.match(tokens)
        self.tree.lock(m.node)  # the matched prefix must survive eviction until load-back
        self.matches.setdefault(rid, []).append(m)
        return m

    def release(self, rid: str) -> None:
        self.prompts.pop(rid, None)
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

    # ---- load-back host->device (hicache.prefill_pages) -------------------------------------

    def load_back(self, rid: str) -> tuple[list[int], float]:
        """Device pages for the prompt before its prefill, and the copy's time."""
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

    # ---- once per step: check_hicache_events -------------------------------------------------

    def check_hicache_events(self, stamp: float, busy: bool) -> bool:
        """Drains hit-query results and acks by counts all ranks agree on; returns whether
        any rank (of PP stage 0) still has work."""
        self.step_stamp, self.extra_polls = stamp, 0
        if self.pin is not None:  # before anything reads the threads' results
            for op in self.pin.advance(stamp, self.ongoing):
                st = self.stats.requests[op.rid]  # the measured clock: when it became true
                st.io_done_vt, st.io_done = op.io_end_v, self.pin.clock()
        self.comm.drain_sends()  # backpressure on the PP hop sends of the last step
        self.free_stopped_tails()
        pending = [op for _, op in sorted(self.ongoing.items())
                   if op.host_slots is not None and not op.decided]
        facts = [self._facts(op) for op in pending]
        votes = [self.protocol.step_vote(f) for f in facts]
        values = self._step_values(busy, votes)
        before_fix = self.cfg.hazard == "early_return" and self.tiers is not None
        copies = values["head"].pop() if before_fix else 0  # its own MIN, below
        agreed = self.agreement.agree(values, self.layout.pp, self._reduce_step)
        if before_fix:
            agreed["head"].append(self._writing_check(copies))
        head, queues = agreed["head"], agreed["queues"]
        flags = head[1: 1 + sum(v is not None for v in votes)]
        for op, f in zip(pending, flags, strict=False):
            if f == -1:
                self._decide(op)
        for op, f in zip(pending, facts, strict=True):
            if not op.decided and self.protocol.step_decide(f):
                self._decide(op)
        if self.tiers is not None:  # writing_check comes before the queue drains
            self.tiers.drain_copies(head[-1])
        self._drain_hits(queues[0])
        self._drain_acks(queues[1])
        if self.tiers is not None:
            self.tiers.drain_backups(queues[2], self._get)
        if self.protocol.sweep:
            self._sweep()
        return head[0] == -1

    def _sweep(self) -> None:
        """pr32725's safe point: every ongoing prefetch holding host slots is polled, in
        request-id order, and finalized when the poll says it may stop (the walk need not
        reach it). The set is the same on every rank only while `ongoing` is (#38273)."""
        for rid in sorted(self.ongoing):
            if self.ongoing[rid].host_slots is not None:
                self.extra_polls += 1
                self.check_prefetch_progress(rid)

    # ---- the walk's polls: per request, or all at once (pr33029) ---------------------------

    def begin_walk(self, waiting: list[str]) -> int:
        """Before the walk: pr33029's bulk_check_prefetch_progress polls every waiting
        request once, in queue order (the queue is broadcast: the same on every rank).
        Returns the pending prefetches it polled."""
        self._bulk = None
        if not self.protocol.bulk:
            return 0
        polled = sum(rid in self.ongoing for rid in waiting)
        self._bulk = {rid: self.check_prefetch_progress(rid) for rid in waiting}
        return polled

    def walk_polls(self, rid: str) -> int:
        """Whether reaching `rid` in the walk polls a pending prefetch."""
        return int(self._bulk is None and rid in self.ongoing)

    def walk_progress(self, rid: str) -> bool:
        """The walk's answer for `rid`: a local lookup after a bulk poll, else the poll."""
        if self._bulk is not None:
            return self._bulk.get(rid, True)  # no collective: the trip count is free
        return self.check_prefetch_progress(rid)

    def _step_values(self, busy: bool, votes: list[int | None]) -> dict[str, list[int]]:
        """This rank's per-step counts, by list (hicache.step_agreement), all MIN-reduced."""
        # Who is busy, and step-batched's timeout flags: a MAX rides in the MIN by negation.
        head = [-int(busy)] + [-v for v in votes if v is not None]
        loads = [0]  # load-back copies inside the step (hicache.loadback): none pending
        queues = [self.controller.hit_queue.qsize(), self.controller.synced_acks.qsize()]
        if self.pin is not None:  # what has completed on the virtual clock
            queues = [self.pin.hits.visible(self.step_stamp, self.pin.wait),
                      self.pin.visible_acks()]
        if self.tiers is not None:
            # The write path's counts ride here, no collective of their own (docs/design.md
            # section 12): finished host copies with the head, backup acks with the queues.
            head.append(self.tiers.finished_copies())
            queues.append(self.tiers.backup_queue_size())
        return {"head": head, "loads": loads, "queues": queues}

    def _writing_check(self, copies: int) -> int:
        """Hazard early_return (SGLang before #27489 / #26923): writing_check's own MIN of
        the finished host copies, skipped by a rank whose ongoing_write_through is empty
        ("all ranks have the same", its comment says), whatever the other ranks hold."""
        if not self.tiers.copies:
            return copies  # the early return: no MIN
        return self._reduce_step([copies], True)[0]

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

    def _reduce_step(self, values: list[int], relay: bool) -> list[int]:
        """One reduction of the step's agreement: relayed (TP MIN on stage 0, then the PP
        hop) or stage-local (this stage's TP group only)."""
        t = torch.tensor(values, dtype=torch.int64)
        # Blocks until every rank of the group (and, relayed, stage 0) reaches this step.
        if relay:
            self.comm.reduce_tp_then_pp(t, dist.ReduceOp.MIN, PER_STEP_MIN)
        else:
            self.comm.all_reduce(t, dist.ReduceOp.MIN, "tp_cpu", PER_STEP_MIN)
        return t.tolist()

    def _decide(self, op: PrefetchOp) -> None:
        op.decided, op.frozen_tokens = True, op.completed_tokens

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
                self._revoke(op)
                continue
            slots = self._alloc_host(len(op.hash_value))
            if slots is None:
                self._revoke(op)
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
        and replayed on the virtual clock from this step on (hicache.pinned)."""
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

    # ---- the poll ---------------------------------------------------------------------------

    @rank_consensus(same_params=True, same_results=True)
    def check_prefetch_progress(self, rid: str) -> bool:
        op = self.ongoing.get(rid)
        if op is None:
            return self._absent_poll(rid)
        self.stats.requests[rid].polls += 1
        if not self.protocol.poll(self._facts(op), self.comm, rid):
            self._blocked(op)
            return False
        if op.ticketed:
            self._take_ticket(op)
            return True
        self._terminate(op)  # the IO thread stops at its next batch boundary
        if op.host_slots is None:
            # Stopped before its hit was agreed: no host slots, nothing usable, and no
            # completion MIN (SGLang revokes it first: hiradix_cache check_prefetch_progress).
            self._revoke(op, via="poll")
        else:
            self._finalize(op, self._usable_after_poll(op), "poll")
        return True

    def _absent_poll(self, rid: str) -> bool:
        """Nothing ongoing on this rank: not a poll, except that pr38284 still enters the
        poll's all-reduce with a contribution that cannot change the MAX."""
        vote = self.protocol.absent_vote()
        if vote is not None:
            self.stats.requests[rid].absent_polls += 1
            self.extra_polls += 1
            self.protocol.reduce(vote, self.comm, rid)
        return True

    def _blocked(self, op: PrefetchOp) -> None:
        # 0.5.23 starts the timeout clock at the first poll that finds it pending
        # (unified_radix_cache.py `_start_storage_prefetch_wait`); a ticket has no clock.
        if self.protocol.clock == "first_blocked_poll" and self.cfg.policy == "timeout" \
                and op.wait_start is None and not op.ticketed:
            op.wait_start = self._now()

    def _take_ticket(self, op: PrefetchOp) -> None:
        """Stage 0 found the ticket ready: wait for this rank's own final ack (a TP peer or a
        later stage may be a moment behind: `take_ready_pp_prefetch`), then end it with
        what the acks agreed; a miss ends with nothing usable."""
        if not op.ready.wait(self.cfg.collective_timeout_s):
            raise RuntimeError(f"rank {self.layout.rank}: ticket of {op.rid} not ready "
                               f"within {self.cfg.collective_timeout_s}s of stage 0's")
        st = self.stats.requests[op.rid]
        st.hit_tokens, st.io_issued = op.hit_tokens, True  # every ticket went to the IO thread
        self._finalize(op, op.completed_tokens, "poll")

    def _facts(self, op: PrefetchOp) -> Facts:
        return Facts(
            completed=bool(op.hash_value) and op.completed_tokens == op.hit_tokens,
            timed_out=self._timed_out(op), terminated=op.terminated.is_set(),
            has_sidecar=self.host_side is not None, sidecar_done=op.pool_transfers_done,
            decided=op.decided, ticketed=op.ticketed, ticket_ready=op.ready.is_set(),
            pp_rank=self.layout.pp_rank)

    def _timed_out(self, op: PrefetchOp) -> bool:
        cfg = self.cfg
        if self.protocol.clock == "first_blocked_poll":
            # 0.5.23 (unified_radix_cache.py:2259-2283): once every KV page landed it never
            # times out; the budget counts the requested pages, from the first blocked poll.
            landed = op.host_slots is not None and op.completed_tokens >= op.hit_tokens
            budget = cfg.timeout_base_s + len(op.tokens) / 1024 * cfg.timeout_per_ki_token_s
            return not landed and op.wait_start is not None and \
                self._now() - op.wait_start > budget
        if self.protocol.clock == "step" or self.pinned:
            # rank 0's clock, identical on all (pinned: the virtual one, for every protocol)
            elapsed = self.step_stamp - op.start_stamp
        else:
            elapsed = time.monotonic() - op.start_time  # this rank's wall clock
        # The budget grows with the hit. The prefetch thread sets it when its query ends
        # (wall time); pinned reads it only once drained, at its step on the virtual clock.
        hit = op.hit_tokens if op.hit_drained or not self.pinned else 0
        return elapsed > cfg.timeout_base_s + hit / 1024 * cfg.timeout_per_ki_token_s

    def _usable_after_poll(self, op: PrefetchOp) -> int:
        if self.protocol.uses_acks:
            return op.frozen_tokens if op.decided else op.completed_tokens
        # pre27010: one MIN over TP of [completed_tokens, *pool_hit_pages] picks the usable
        # length (ops holding host slots only). Side-car hits count as soon as their read
        # was issued: the bug PR #27550's guard works around by not terminating until
        # pool_transfers_done.
        vec = [op.completed_tokens]
        if self.host_side is not None:
            side = op.sidecar_pages if op.pool_transfers_done else len(op.hash_value)
            vec.append(side * self.page if op.sidecar_started else 0)
        t = torch.tensor(vec, dtype=torch.int64)
        self.comm.all_reduce(t, dist.ReduceOp.MIN, "tp_cpu", COMPLETION, op.rid)
        return int(t.min().item())

    # ---- termination ------------------------------------------------------------------------

    def _now(self) -> float:
        """The timeout policy's clock: this rank's wall clock; pinned, the virtual one."""
        return self.step_stamp if self.pinned else time.monotonic()

    def _terminate(self, op: PrefetchOp) -> None:
        op.terminated_v = self.step_stamp  # when, on the virtual clock (pinned)
        op.terminated.set()

    def _revoke(self, op: PrefetchOp, via: str = "revoked") -> None:
        self._terminate(op)
        self._end(op, via, 0)

    def _finalize(self, op: PrefetchOp, usable: int, via: str) -> None:
        """Inserts the fetched prefix into the host tree; frees the rest once IO stopped."""
        pages = usable // self.page
        slots = op.host_slots
        base = self.matches[op.rid][0]
        if self.buffer_only:  # held for this request's load-back only
            self.staged[op.rid] = (slots[:pages], op.hash_value[:pages])
        elif pages:
            tokens = self.prompts[op.rid][: (base.pages + pages) * self.page]
            # Pages already in the tree keep their own slots: the base's are placeholders
            # (with the device tier part of the base may be on the device only).
            overlap = self.tree.insert(tokens, [-1] * base.pages + slots[:pages],
                                       base.hashes + op.hash_value[:pages])
            dup = max(0, overlap - base.pages)  # pages another request inserted meanwhile
            self.host_kv.free(slots[:dup])
        self._tails.append((op, slots[pages:]))
        self._end(op, via, pages * self.page)

    def _end(self, op: PrefetchOp, via: str, usable: int) -> None:
        del self.ongoing[op.rid]
        self.tokens_in_flight -= len(op.tokens)
        st = self.stats.requests[op.rid]
        st.terminated_by, st.prefetched_tokens = via, usable
        st.io_error = op.io_error
        if self.pin is None:
            st.ready, st.io_done = time.monotonic(), op.t_io_done
        else:  # its IO end is stamped when it becomes visible (check_hicache_events)
            st.ready = self.pin.clock()
        st.ready_vt = self.step_stamp
        # The hit is part of the record only once agreed and drained (the same on all ranks).
        hit = op.hit_tokens if op.hit_drained else None
        self.stats.decisions[op.rid] = (via, usable, hit)

    def free_stopped_tails(self, final: bool = False) -> None:
        """Frees the unfetched host slots of ended prefetches whose IO has stopped; called
        every step and once more (`final`) after the IO thread has ended (a read can
        outlive the scheduler's last step). Pinned: stopped on the virtual clock, then
        really (the slots are reused only after the thread's last write)."""
        keep = []
        for op, slots in self._tails:
            if self.pin is not None and op.io_stopped and not final:
                self.pin.wait(op.io_done.is_set, f"IO of {op.rid}")
            if op.io_done.is_set() and (op.io_stopped or final or self.pin is None):
                self.host_kv.free(slots)
                if self.pin is None:
                    self.stats.requests[op.rid].io_done = op.t_io_done
            else:
                keep.append((op, slots))
        self._tails = keep

    def host_slots_unaccounted(self) -> int:
        """Host slots neither in the tree nor free: 0 after a run, or slots leaked."""
        staged = sum(len(slots) for slots, _ in self.staged.values())
        return self.host_kv.num_pages - self.host_kv.available - self.tree.total_pages - staged
