"""SGLang's own controller path as the data path of `bench run --cache sglang --sglang SPEC
--sglang-path controller` (docs/sglang.md, "the controller path as the data path").

`ControllerCache` keeps `SGLangCache`'s decisions (SGLang's `check_hicache_events` every
step, its `check_prefetch_progress` for every poll the walk makes) and replaces the
project's data path under them by SGLang's (the controller rig, sglang_adapter.controller.rig):

- **issue**: SGLang's own `prefetch_from_storage`, anchored at the host prefix the
  harness's tree matched (named by its last page's hash);
- **hit query, IO, acks**: the HybridCacheController's own threads, started by its own
  `_start_storage_threads`, with their MINs on the gloo groups SGLang makes itself
  (`_create_sync_groups`), reading the harness's storage tier through SGLang's own
  backend factory (sglang_adapter.controller.storage);
- **drains and end**: SGLang's `check_hicache_events` drains those threads' queues;
  `_handle_prefetch_result` inserts what was fetched.

The hand-off to the harness (sglang_adapter.controller.project_stand_ins): SGLang's host pool is the
harness's host KV pool (`ProjectHostPool`: its token indices onto the pool's page slots,
what the IO thread reads written into them), its tree core inserts into the harness's
radix tree (`ProjectTreeCore`), so the harness's load-back, data checks and host-slot
accounting run on what SGLang loaded. The per-request stats are read from SGLang's
operations and what its tree core was given. The project's own controller threads do not
run; the harness's per-step agreement still runs beside SGLang's (its `busy` flag ends the
serve on every rank alike), with nothing of the project's to drain.

Schedule: pinned (sglang_adapter.controller.pinned gates what SGLang's drains see on the
virtual clock) or free (SGLang's threads on real time, no gate).

Layout: any TP x PP. SGLang's cache and controller get the harness's `tp_cpu` and `pp_cpu`
groups as SGLang's scheduler hands them its TP and PP CPU groups; the controller copies
both for its hit-query and ack MINs (`_create_sync_groups`), the cache all-reduces its
per-step counts and timeout verdict on stage 0 and relays them down the stages
(`_pp_sync`), and the later stages drain stage 0's counts (docs/sglang.md, "Its layouts").
Write path: the harness's device tier copies pages to the host (under write_through a
prefill's as they are cached, under write_back a device leaf's as it is evicted) and
SGLang's own write path takes them from there (its write-through tracking, `writing_check`,
`write_backup_storage`, its backup thread and `_drain_backup`: sglang_adapter.controller.writes).
buffer_only host memory at PP > 1: SGLang's PP-ticket path, its command thread, ticket
group and BufferModePipeline (sglang_adapter.controller.tickets; pinned: its gates in
sglang_adapter.controller.pinned.TicketPin). A side-car pool (free schedule; a pinned one
does not pin side-car reads): SGLang's own sidecar spec and host-pool-group entry over the
harness's side-car pool, read by SGLang's IO thread through the backend's v2 per-pool calls
(sglang_adapter.controller.rig.ControllerRig.register_sidecar). buffer_only at PP 1 is
refused in one line before any rank starts (sglang_adapter.target.run_unfit).
"""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

from hicache.agreement.consensus import rank_consensus
from hicache.comm.comm import TICKET
from sglang_adapter.controller.pinned import ControllerPin, TicketPin, WatchedHits
from sglang_adapter.controller.project_stand_ins import ProjectHostPool, ProjectTreeCore
from sglang_adapter.controller.rig import BASE, TICKET_GROUP, ControllerRig, RigSetup, _module
from sglang_adapter.controller.tickets import Tickets, payload
from sglang_adapter.controller.writes import ControllerWrites
from sglang_adapter.decisions.cache import SGLangCache, SGLangCode, site_of

ACKS = "sglang.srt.managers.cache_controller"  # HiCacheAck, what start_writing posts

SGLANG_QUEUES = ("prefetch_queue", "prefetch_buffer", "prefetch_sync_queue",
                 "prefetch_hit_queue", "ack_prefetch_queue", "host_mem_release_queue")


class _Queued:
    """What SGLang's `pop_ready` reads of a waiting `Req`: its id and its re-issues so far."""

    def __init__(self, rid: str, attempts: int):
        self.rid, self.storage_prefetch_retry_attempts = rid, attempts


class ControllerCache(SGLangCache):
    """One rank's cache with SGLang's controller path as its data path (module doc)."""

    def __init__(self, *args, sglang: SGLangCode, **kwargs):
        self._door = sglang.door  # the rig names SGLang's groups on it as it makes them
        super().__init__(*args, sglang=sglang, **kwargs)

    def _make_rig(self, loaded, tp_group, pp_group, storage):
        cfg, page = self.cfg, self.page
        self.ops: dict[str, object] = {}  # rid -> SGLang's PrefetchOperation, once issued
        self.hit_drained: set[str] = set()
        host = ProjectHostPool(self.host_kv, page)
        tree = ProjectTreeCore(page, _module(BASE).IncLockRefResult,
                               _module(BASE).DecLockRefResult, self.tree)
        self.sgl_tree = tree
        layout = self.layout
        buffer = ((self.dev_kv.num_pages * page, self.max_input_tokens)
                  if cfg.host_memory == "buffer_only" else None)
        # a side-car pool: SGLang's host pool entry over the harness's side-car pool, whose
        # pages share the KV page's slot (hicache.cache.cache), so its load-back copies them
        sidecar = (None if self.host_side is None else
                   (ProjectHostPool(self.host_side, page), cfg.sidecar_hit_policy))
        setup = RigSetup(storage, host_tokens=host.size, page_size=page, host=host, tree=tree,
                         page_elems=cfg.kv_page_elems, threshold=cfg.prefetch_threshold,
                         buffer_only=buffer, door=self._door, sidecar=sidecar)
        rig = ControllerRig(loaded, layout.rank, layout.tp, layout.pp, tp_group, pp_group,
                            setup)
        self._groups = rig.sync_groups()  # on the door in start(): it is not set yet here
        self.gate = None
        if cfg.schedule == "pinned":  # what SGLang's drains see: on the virtual clock
            self.gate = ControllerPin(rig.cache.cache_controller, rig.tier, page,
                                      cfg.kv_page_elems, cfg.storage.exists_latency_ms / 1e3,
                                      cfg.collective_timeout_s, self.layout.rank)
            rig.tier.gate = self.gate
        if self.tiers is not None:  # the write path after the host copy: SGLang's
            ControllerWrites.adopt(self.tiers, rig.cache, rig.tier, _module(ACKS).HiCacheAck,
                                   self.stats)
        hits = rig.cache.cache_controller.prefetch_hit_queue
        if not isinstance(hits, WatchedHits):
            hits.__class__ = WatchedHits  # SGLang's prefetch thread already waits on it
        hits.on_hit = self._hit_drained
        # buffer_only at PP > 1: SGLang's PP-ticket path (sglang_adapter.controller.tickets)
        self.tickets = (Tickets(rig, page) if
                        rig.cache.cache_controller.pp_prefetch_command_group is not None
                        else None)
        self.ticket_pin = None
        if self.tickets is not None and self.gate is not None:  # its queries and reads
            self.ticket_pin = TicketPin(self.gate, self.tickets.stage)
            self.tickets.on_hand = self.ticket_pin.handed
        return rig

    def _hit_drained(self, operation) -> None:
        """SGLang's hit drain took this operation's agreed hit (also one a poll already
        ended: its hit is recorded when drained, as the project's drain records it)."""
        rid = getattr(operation.request_id, "rid", operation.request_id)
        if rid in self.ops and self.ops[rid] is operation:
            self.hit_drained.add(rid)
            self.stats.requests[rid].hit_tokens = len(operation.hash_value) * self.page

    def _record(self, call, seconds: float, start: float) -> None:
        """As SGLangCache's, but a PP ticket's broadcast (`broadcast_pyobj`: its length,
        then its bytes) is one collective of two torch ops, as the harness's
        `broadcast_object` counts the project's."""
        if site_of(call) == TICKET and payload(call, self.door.marker):
            self.stats.counter.add_raw(call.group, 1)
            return
        super()._record(call, seconds, start)

    def _failure(self, call, error: Exception):
        """As SGLangCache's, naming the ranks of SGLang's own groups too. One in a thread of
        SGLang's (its hit query, acks) is also kept where the hazard cell reads a rank's
        background-thread failure (`controller.error`, bench.hazards.cell): the thread dies
        of it as SGLang's does, the serve is not told (`error()` stays None)."""
        failure = super()._failure(call, error)
        group = self._groups.get(call.group)
        if group is not None:
            ranks = list(dist.get_process_group_ranks(group))
            failure = type(failure)(str(failure).replace("(ranks None)", f"(ranks {ranks})", 1))
        if threading.current_thread() is not threading.main_thread() and \
                self.controller.error is None:
            self.controller.error = failure
        return failure

    @property
    def own_groups(self) -> dict:
        """SGLang's hit-query and ack groups (hicache.serve.seam): held against torch's sequence
        numbers beside the harness's."""
        return dict(self._groups)

    # ---- lifecycle: SGLang's threads, not the project's ---------------------------------

    def start(self) -> None:
        for name, group in self._groups.items():  # the door exists by now
            if name != TICKET_GROUP:  # named as it was made: its thread was waiting already
                self.door.register(name, group)
        self._start_checker()  # SGLang's scheduler configures it here too

    def stop(self, grace_s: float) -> None:
        self.rig.stop()
        self._stop_checker(grace_s)

    def error(self) -> BaseException | None:
        return None

    def has_work(self) -> bool:
        """SGLang holds a prefetch, host slots not yet back (an IO in flight, a release not
        yet drained) or work queued for its threads, or writes are pending. Pinned, the
        last is the hit queries not yet drained (the gated count: the same every serve of
        the seed), not the threads' queues on real time."""
        ctl = self.rig.cache.cache_controller
        queued = (bool(self.gate.pin.hits.submitted) if self.gate is not None else
                  any(not getattr(ctl, q).empty() for q in SGLANG_QUEUES))
        tickets = self.tickets is not None and self.tickets.pending() or \
            self.ticket_pin is not None and self.ticket_pin.pending()
        return bool(self.rig.cache.ongoing_prefetch) or queued or tickets or \
            self.host_slots_unaccounted() > 0 or self.writes_pending()

    def prefetching(self, rid: str) -> bool:
        return self.rig.handle(rid) in self.rig.cache.ongoing_prefetch

    # ---- arrival ------------------------------------------------------------------------

    def admit(self, rid: str, tokens: list[int], stamp: float) -> None:
        """SGLang's own prefetch_from_storage after the host prefix the harness's tree
        matched (its own threshold, rate limit and anchor lock)."""
        self._prefetch_kvcache(rid, tokens, stamp)

    def _prefetch_kvcache(self, rid: str, tokens: list[int], stamp: float,
                          storage_hit_end: int | None = None) -> None:
        """As SGLang's scheduler `_prefetch_kvcache`: the prefix matched (afresh, for a
        retry), then SGLang's own prefetch_from_storage."""
        m, key = self._storage_key(rid, tokens)
        matches = self.matches[rid]
        matches.insert(0, matches.pop())  # the base this prefetch follows
        st = self.stats.requests[rid]
        self._tick()
        self.sgl_tree.anchor(rid, tokens[: m.pages * self.page], m.hashes)
        if self.tickets is not None:
            self._ticket(rid, key, m.last_hash, stamp)
            return
        self.door.rid = rid
        try:
            handle = self.rig.issue(rid, key, anchor=rid, prior=m.last_hash,
                                    storage_hit_end=storage_hit_end,
                                    step=self.stats.counter.step)
        finally:
            self.door.rid = None
        info = self.rig.cache.ongoing_prefetch.get(handle)
        if info is not None and self.ops.get(rid) is not info.operation:
            if self.gate is not None:
                self.gate.issued(info.operation, rid, stamp)
            st.op_issued, st.prefetch_ops = True, st.prefetch_ops + 1
            self.ops[rid] = info.operation
            self.handles[rid] = handle
            self.hit_drained.discard(rid)  # this operation's hit is not drained yet

    def _ticket(self, rid: str, key: list[int], prior: str | None, stamp: float) -> None:
        """An arrival on the PP-ticket path: SGLang's schedulers' handling of it
        (sglang_adapter.controller.tickets.Tickets.admit)."""
        def issue():
            self.door.rid = rid
            try:
                self.rig.issue(rid, key, anchor=rid, prior=prior, step=self.stats.counter.step)
            finally:
                self.door.rid = None
            return self.rig.decision

        if self.tickets.admit(rid, issue):
            st = self.stats.requests[rid]
            st.op_issued, st.prefetch_ops = True, st.prefetch_ops + 1
            if self.ticket_pin is not None:
                ctl = self.rig.cache.cache_controller
                self.ticket_pin.admitted(rid, stamp, ctl.pp_prefetch_states.get(rid)
                                         if self.tickets.stage == 0 else None)

    def _ticket_taken(self, rid: str) -> None:
        """SGLang's poll took the ticket: its parked bounce becomes the request's staged
        pages for the harness's load-back (names as the harness's tier knows them); the
        stats as the project's ticket poll records them (every ticket went to IO)."""
        slots, tokens, hit, names = self.tickets.taken(rid)
        if slots:
            self.staged[rid] = (slots, self.rig.tier.translate(names))
        st = self.stats.requests[rid]
        st.io_issued, st.hit_tokens = True, hit * self.page
        st.terminated_by, st.prefetched_tokens = "poll", tokens
        st.ready, st.ready_vt = time.monotonic(), self.step_stamp
        self.stats.decisions[rid] = ("poll", tokens, st.hit_tokens)

    def retry_prefetches(self, waiting: list[str], stamp: float) -> None:
        """SGLang's scheduler step `_process_storage_prefetch_retries`, as its scheduler
        calls it right after `check_hicache_events`: SGLang's own
        `StoragePrefetchRetries.pop_ready` over the waiting queue (armed by SGLang's own
        drains and polls), then per due request `_retry_storage_prefetch`: its attempt
        counted, its prefix matched afresh and SGLang's `prefetch_from_storage` called with
        the known hit end. A release without retries has no such set: nothing."""
        retries = getattr(self.rig.cache, "storage_prefetch_retries", None)
        if retries is None:
            return
        queue = [_Queued(rid, self.retry_attempts.get(rid, 0)) for rid in waiting]
        cfg = self.cfg
        for req, hit_end in retries.pop_ready(queue, cfg.retry_poll_interval,
                                              cfg.retry_max_attempts):
            self.retry_attempts[req.rid] = req.storage_prefetch_retry_attempts + 1
            self.stats.requests[req.rid].retries += 1
            self._prefetch_kvcache(req.rid, self.prompts[req.rid], stamp, hit_end)

    def cache_prefill(self, rid: str, dev: list[int]) -> None:
        """The prefill's pages cached; under write_through their host copies go to
        SGLang's write path, each for this request (its storage check's data errors);
        under write_back the request is recorded as its pages' last maker."""
        if self.tiers is not None:
            self.tiers.writer = rid
        try:
            super().cache_prefill(rid, dev)
        finally:
            if self.tiers is not None:
                self.tiers.writer = None

    def load_back(self, rid: str):
        """Scheduled: SGLang's scheduler cancels its retry (scheduler.py:4315-4318)."""
        retries = getattr(self.rig.cache, "storage_prefetch_retries", None)
        if retries is not None:
            retries.cancel(rid)
        if self.tickets is not None:  # the bounce SGLang parked: the harness loads it
            self.tickets.consumed(rid)
        return super().load_back(rid)

    def release(self, rid: str) -> None:
        """The request finished: on the PP-ticket path its ticket retires
        (`claim_kv_row`), on every rank."""
        if self.tickets is not None:
            self.tickets.release(rid)
        super().release(rid)

    # ---- per step -------------------------------------------------------------------------

    def check_hicache_events(self, stamp: float, busy: bool) -> bool:
        self.step_stamp, self._poll_s = stamp, 0.0
        self._tick()
        self.door.rid = None
        if self.gate is not None:  # before SGLang's step reads its queues
            for shadow in self.gate.advance(stamp):
                self.stats.requests[shadow.rid].io_done_vt = shadow.io_end_v
            if self.ticket_pin is not None:
                self.ticket_pin.advance(stamp)
        self.rig.step()  # SGLang's check_hicache_events: its drains of its threads' queues
        if self.gate is not None:  # the gates' waits leave the measured clock (hicache.spec.pinned)
            waited = self.gate.pin.take_waited()
            self.pin.waited_s += waited
            self.pin.waited_total_s += waited
        self._observe()
        # The harness's per-step agreement: who is busy (nothing of the project's to drain)
        return super(SGLangCache, self).check_hicache_events(stamp, busy or self.has_work())

    def _observe(self) -> None:
        """What SGLang's drains did: a hit it handed to IO, a prefetch it ended."""
        ongoing = self.rig.cache.ongoing_prefetch
        for rid, handle in list(self.handles.items()):
            op, st = self.ops[rid], self.stats.requests[rid]
            if op.host_indices is not None and not st.io_issued:
                st.io_issued, st.hit_tokens = True, len(op.hash_value) * self.page
            if handle not in ongoing:  # the hit drain revoked it, or the ack drain ended it
                self._ended(rid, "ack" if op.host_indices is not None else "revoked")

    def _ended(self, rid: str, via: str) -> None:
        """The stats of a prefetch SGLang ended (hicache.cache.poll._end's, from SGLang's op)."""
        self.handles.pop(rid)
        st = self.stats.requests[rid]
        drained = rid in self.hit_drained
        usable = self.sgl_tree.fetched.get(rid, 0)
        st.terminated_by, st.prefetched_tokens = via, usable
        st.ready, st.ready_vt = time.monotonic(), self.step_stamp
        self.stats.decisions[rid] = (via, usable, st.hit_tokens if drained else None)

    # ---- the walk's poll ------------------------------------------------------------------

    def walk_polls(self, rid: str) -> int:
        return int(rid in self.handles or self.tickets is not None and rid in self.tickets.held)

    @rank_consensus(same_params=True, same_results=True)
    def check_prefetch_progress(self, rid: str) -> bool:
        """SGLang's own check_prefetch_progress; when it lets an ongoing prefetch go, its
        own end path (`_handle_prefetch_result`) has inserted what was fetched."""
        handle = self.handles.get(rid)
        ticket = None if self.tickets is None else self.tickets.held.get(rid)
        if handle is not None or ticket is not None:
            self.stats.requests[rid].polls += 1
        handle = handle or ticket
        self._tick()
        self.door.rid = rid
        t0 = time.perf_counter()
        try:
            ready = bool(self.rig.cache.check_prefetch_progress(
                self.rig.handle(rid) if handle is None else handle))
        finally:
            self.door.rid = None
            self._poll_s += time.perf_counter() - t0
        if ready and ticket is not None:
            self._ticket_taken(rid)
        elif ready and handle is not None:
            if self.gate is not None:  # its reads stop at this step (the replay's answer)
                self.ops[rid].pin_shadow.terminated_v = self.step_stamp
            self._ended(rid, "poll")
        return ready

    def close(self) -> None:
        self.rig.stop()
        super().close()


__all__ = ["ControllerCache"]
