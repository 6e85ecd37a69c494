"""A pinned schedule for SGLang's controller threads (`bench run --cache sglang
--sglang-path controller --schedule pinned`): what SGLang's drains see each step is a function of
the seed, as the project's is (hicache.spec.pinned).

SGLang's threads still do the real work (its hit queries with their MIN, its reads into the
harness's host pool, its acks with their MIN); only what becomes visible when is gated, with
the project's own machinery (`hicache.spec.pinned.Pin`: `HitTimeline`, `VirtualIO`):

- **hits**: `prefetch_hit_queue.qsize()`, which `_sync_hicache_ready_counts` reduces, is the
  count of hit queries whose modelled end (admission, the previous query's end, the
  `batch_exists` calls SGLang's thread really made x their modelled latency) has passed on
  the virtual clock, waiting for the real thread when it is behind;
- **reads**: when SGLang's hit drain hands an operation to its IO thread
  (`prefetch_buffer.put`), its batch reads are drawn (`Storage.plan_read`, in drain order)
  and replayed on the virtual clock (`VirtualIO`); the backend's `batch_get` reads with
  that batch's plan (sglang_adapter.controller.storage);
- **the IO thread's termination check** before each batch (`_page_transfer`'s
  `operation.is_terminated()`) answers whether a poll at a step no later than the batch's
  virtual start ended the prefetch, once the replay has reached it (the IO thread waits);
  the prefetch thread's check before its query answers False (queried always, as the
  project's pinned hit query is, so its modelled time does not hang on a race with a poll);
  every other caller gets SGLang's own flag;
- **acks**: `ack_prefetch_queue.qsize()` is the count of acks (one per batch, then the
  final one) whose virtual time has passed, waiting for SGLang's ack thread.

On the PP-ticket path (buffer_only at PP > 1, sglang_adapter.controller.tickets) the
ticket's query and reads run on SGLang's command and IO threads and never pass the drains
(`TicketPin`): a ticket's modelled query end follows its admission and the previous
query's, as a hit's does; its reads are drawn when the command thread hands it to the IO
thread and replayed on a virtual queue of their own (their acks never reach the
scheduler's ack drain); stage 0's `is_pp_prefetch_ready` reads the ticket ready once the
replay ended it, waiting for SGLang's real final ack (the ticket's `ready_event`).

The gates are installed by changing the class of SGLang's own queue objects (the threads
already block on them) and an instance attribute `is_terminated` on each operation.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from queue import Queue

from hicache.spec.pinned import Pin, VirtualIO

BATCH_PAGES = 128  # SGLang's STORAGE_BATCH_SIZE (hicache.spec.cost_model.IO_BATCH_PAGES)


@dataclass(eq=False)
class Shadow:
    """An SGLang PrefetchOperation as the pinned schedule's replay sees it."""

    rid: str
    start_stamp: float
    hit_due: float | None = None
    hash_value: list = field(default_factory=list)
    terminated_v: float | None = None
    io_stopped: bool = False
    io_end_v: float | None = None
    plans: list = field(default_factory=list)
    stopped: dict = field(default_factory=dict)  # batch -> whether the replay skipped it
    calls: int | None = None  # a ticket's: batch_exists calls of its query, once handed


class _ReplayIO(VirtualIO):
    """VirtualIO that records, per batch, whether the replay stopped it (what the IO
    thread's check before that batch answers)."""

    def _step(self, job, now: float) -> bool:
        start = max(job.issued, self.cursor) if job.start is None else job.start
        op = job.op
        if start < now and job.batch < len(job.plans):
            op.stopped[job.batch] = op.terminated_v is not None and op.terminated_v <= start
        return super()._step(job, now)


class WatchedHits(Queue):
    """SGLang's prefetch_hit_queue, telling `on_hit` of each hit its drain takes (the
    harness records a request's agreed hit when it is drained, as the project does)."""

    on_hit = None

    def get(self, block=True, timeout=None):
        item = super().get(block, timeout)
        if item is not None and self.on_hit is not None:
            self.on_hit(item)
        return item


class GatedHits(WatchedHits):
    """SGLang's prefetch_hit_queue with its size on the virtual clock (module doc)."""

    gate: ControllerPin

    def qsize(self) -> int:
        return self.gate.visible_hits()

    def put(self, item, block=True, timeout=None) -> None:
        if item is not None:
            self.gate.hit_done(item)
        super().put(item, block, timeout)
        self.gate.notify()

    def get(self, block=True, timeout=None):
        item = super().get(block, timeout)
        self.gate.pin.hits.drained(1)
        return item


class GatedAcks(Queue):
    """SGLang's ack_prefetch_queue with its size on the virtual clock (module doc)."""

    gate: ControllerPin

    def qsize(self) -> int:
        return self.gate.pin.visible_acks()

    def real_size(self) -> int:
        return super().qsize()

    def put(self, item, block=True, timeout=None) -> None:
        super().put(item, block, timeout)
        self.gate.notify()

    def get(self, block=True, timeout=None):
        item = super().get(block, timeout)
        self.gate.pin.acks_drained += 1
        return item


class HandOff(Queue):
    """SGLang's prefetch_buffer: an operation handed to the IO thread gets its read plans."""

    gate: ControllerPin

    def put(self, item, block=True, timeout=None) -> None:
        if item is not None:
            self.gate.plan(item)
        super().put(item, block, timeout)


class _RealSize:
    def __init__(self, q: GatedAcks):
        self.q = q

    def qsize(self) -> int:
        return self.q.real_size()


class ControllerPin:
    """The scheduler thread's side of the pinned schedule over SGLang's controller, plus
    the gates its threads pass (module docstring)."""

    def __init__(self, ctl, tier, page_size: int, elems: int, exists_s: float,
                 timeout_s: float, rank: int):
        self.ctl, self.tier, self.elems, self.exists_s = ctl, tier, elems, exists_s
        self.progress = threading.Condition()
        for q, cls in ((ctl.prefetch_hit_queue, GatedHits), (ctl.ack_prefetch_queue, GatedAcks),
                       (ctl.prefetch_buffer, HandOff)):
            assert q.empty(), "the gates go on before any prefetch"
            q.__class__, q.gate = cls, self  # the threads already wait on these objects
        self.pin = Pin(page_size, True, exists_s, self.progress, _RealSize(ctl.ack_prefetch_queue),
                       timeout_s, rank)
        self.pin.io = _ReplayIO(page_size, True)
        self.now = 0.0
        self.exists_calls = 0  # SGLang's batch_exists calls so far (its prefetch thread's)
        self._calls_seen = 0
        self._hit_cursor = 0.0

    # ---- the scheduler thread -------------------------------------------------------------

    def issued(self, operation, rid: str, stamp: float) -> Shadow:
        shadow = Shadow(rid, stamp)
        operation.pin_shadow = shadow
        real = type(operation).is_terminated
        operation.is_terminated = lambda: self.is_terminated(operation, real)
        self.pin.hits.submitted.append(shadow)
        return shadow

    def advance(self, now: float) -> list[Shadow]:
        """Before SGLang's step reads its queues: what completed before `now`."""
        self.now = now
        ended = self.pin.advance(now, {})
        self.notify()
        return ended

    def visible_hits(self) -> int:
        return self.pin.hits.visible(self.now, self.pin.wait)

    def plan(self, operation) -> None:
        """Its batch reads drawn now, in hand-off order, replayed from this step on."""
        shadow = operation.pin_shadow
        names = self.tier.translate(list(operation.hash_value))
        storage = self.tier.storage
        shadow.hash_value = list(operation.hash_value)
        shadow.plans = [storage.plan_read(names[i: i + BATCH_PAGES], self.tier.pool, self.elems)
                        for i in range(0, len(names), BATCH_PAGES)]
        self.pin.io.submit(shadow, self.now, shadow.plans)

    def notify(self) -> None:
        with self.progress:
            self.progress.notify_all()

    # ---- SGLang's threads ------------------------------------------------------------------

    def hit_done(self, operation) -> None:
        """SGLang's prefetch thread put its agreed hit: its modelled end."""
        shadow = operation.pin_shadow
        calls, self._calls_seen = self.exists_calls - self._calls_seen, self.exists_calls
        start = max(shadow.start_stamp, self._hit_cursor)
        self._hit_cursor = start + calls * self.exists_s
        shadow.hit_due = self._hit_cursor

    def is_terminated(self, operation, real) -> bool:
        caller = sys._getframe(2)
        name = caller.f_code.co_name
        if name == "prefetch_thread_func":
            return False
        if name == "_page_transfer" and "i" in caller.f_locals:
            batch, shadow = caller.f_locals["i"] // BATCH_PAGES, operation.pin_shadow
            with self.progress:
                ok = self.progress.wait_for(lambda: batch in shadow.stopped,
                                            self.pin.timeout_s)
            if not ok:
                raise RuntimeError(f"{shadow.rid}: batch {batch} never replayed (pinned)")
            return shadow.stopped[batch]
        return real(operation)


class _GatedReady(threading.Event):
    """A ticket's `ready_event` on stage 0 (SGLang's own Event object, its class changed):
    set by SGLang's ack thread as ever; read ready only once the replay ended the ticket's
    reads on the virtual clock (TicketPin.advance waited for the real set then)."""

    shadow: Shadow
    notify = None

    def is_set(self) -> bool:
        return self.shadow.io_end_v is not None and super().is_set()

    def set(self) -> None:
        super().set()
        self.notify()  # the scheduler may be waiting for it (TicketPin.advance)


class TicketPin:
    """The PP-ticket path's part of the pinned schedule (module docstring); the scheduler
    thread calls `admitted` and `advance`, SGLang's command thread `handed`."""

    def __init__(self, gate: ControllerPin, stage: int):
        self.gate, self.stage = gate, stage
        self.io = _ReplayIO(gate.pin.io.page_size, True)  # its own queue: no scheduler acks
        self.shadows: dict[str, Shadow] = {}
        self.queued: list[Shadow] = []  # admitted, not yet in the replay (admission order)
        self.events: dict[str, object] = {}  # rid -> stage 0's ticket ready_event

    def _shadow(self, rid: str) -> Shadow:
        # made by whichever comes first: the admission or the command thread's hand-off
        return self.shadows.setdefault(rid, Shadow(rid, None))

    def admitted(self, rid: str, stamp: float, state=None) -> None:
        """A ticket bound on this rank; `state`: stage 0's PPPrefetchState (its readiness
        is what the poll reads)."""
        shadow = self._shadow(rid)
        shadow.start_stamp = stamp
        self.queued.append(shadow)
        if state is not None:
            event = state.ready_event  # its attributes first: the ack thread may set it
            event.shadow, event.notify = shadow, self.gate.notify
            event.__class__ = _GatedReady
            self.events[rid] = event
            state.operation.pin_shadow = shadow

    def handed(self, operation) -> None:
        """SGLang's command thread hands the ticket to its IO thread: the batch_exists calls
        its query made and its batch reads, drawn now, in ticket order."""
        gate, shadow = self.gate, self._shadow(operation.request_id)
        operation.pin_shadow = shadow
        names = gate.tier.translate(list(operation.hash_value))
        storage, elems = gate.tier.storage, gate.elems
        shadow.hash_value = list(operation.hash_value)
        shadow.plans = [storage.plan_read(names[i: i + BATCH_PAGES], gate.tier.pool, elems)
                        for i in range(0, len(names), BATCH_PAGES)]
        calls, gate._calls_seen = gate.exists_calls - gate._calls_seen, gate.exists_calls
        shadow.calls = calls  # last: the scheduler reads the rest once it is set
        gate.notify()

    def advance(self, now: float) -> None:
        """Before SGLang's step: every ticket whose query ended before `now` joins the
        replay (waiting for the command thread when it is behind), then the replay runs to
        `now`; on stage 0 a ticket it ended is waited for until SGLang's ack thread set it."""
        gate = self.gate
        while self.queued and self.queued[0].start_stamp < now:
            shadow = self.queued[0]
            if shadow.hit_due is None:  # ControllerPin.hit_done's rule, on this thread
                gate.pin.wait(lambda s=shadow: s.calls is not None,
                              f"ticket query of {shadow.rid}")
                start = max(shadow.start_stamp, gate._hit_cursor)
                gate._hit_cursor = shadow.hit_due = start + shadow.calls * gate.exists_s
            if shadow.hit_due >= now:
                break
            self.io.submit(self.queued.pop(0), shadow.hit_due, shadow.plans)
        for ev in self.io.advance(now):
            if ev.kind != "end":
                continue
            ev.op.io_stopped, ev.op.io_end_v = True, ev.due
            event = self.events.pop(ev.op.rid, None)
            if event is not None:
                gate.pin.wait(lambda e=event: threading.Event.is_set(e),
                              f"final ack of {ev.op.rid}'s ticket")

    def pending(self) -> bool:
        return bool(self.queued or self.io.jobs or self.events)


def plan_of(operation, batch_start: int):
    """The read plan of the batch SGLang's IO thread is reading (None: unpinned)."""
    shadow = getattr(operation, "pin_shadow", None)
    if shadow is None or not shadow.plans:
        return None
    return shadow.plans[batch_start // BATCH_PAGES]
