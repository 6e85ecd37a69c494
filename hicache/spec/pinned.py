"""Pinned schedules: *when* anything becomes true is a function of the seed alone.

Under `schedule="pinned"` the scheduler reads one virtual clock (rank 0's, broadcast with
the requests as the wall clock is under "free"). It advances per step by the step's
modelled forward time (hicache.spec.step_time; an idle step by `idle_step_ms`). Arrivals are
admitted, timeouts expire, and the background threads' results become visible to the
scheduler at the first step whose virtual time passes their modelled completion. The
threads still do the real work (hashing, reads into host memory, every background
collective); only the visibility of their results is gated, here, on the scheduler thread:

- hit queries (prefetch thread): an op's agreed hit is visible from virtual time
  max(its admission, the previous query's end) + batch_exists latency x calls;
- reads (IO thread): `VirtualIO` replays this rank's serial IO queue on the virtual clock
  from the read plans drawn when the op is handed to the IO thread (latency + bytes /
  bandwidth x the seeded per-rank jitter, `Storage.plan_read`); a batch is read unless a
  poll ended the op at a step no later than the batch's virtual start. Its ack (ack
  protocols) or its rank-local progress (pre27010) is visible once its end has passed.

When a result's virtual time has passed and the real thread has not finished it yet, the
scheduler waits for it (bounded by the collective timeout; the wait is recorded), so a slow
thread delays the step but never changes the schedule. Per-rank jitter stays: ranks see
different progress at the same virtual time, and the agreement collectives are needed as
ever. Only the scheduler thread calls into this module.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from hicache.spec.cost_model import IO_BATCH_PAGES

SCHEDULES = ("free", "pinned")


@dataclass
class _Job:
    """One op in the virtual IO queue: its read plans and where its replay stands."""

    op: object  # hicache.cache.operations.PrefetchOp
    issued: float  # virtual time it was handed to the IO thread
    plans: list
    batch: int = 0
    start: float | None = None  # virtual start of its next batch
    reading: bool = True
    done_tokens: int = 0


@dataclass
class _Event:
    due: float
    kind: str  # ack | pages | end
    op: object
    tokens: int = 0
    short: bool = False


class VirtualIO:
    """This rank's IO thread replayed on the virtual clock (one serial queue)."""

    def __init__(self, page_size: int, uses_acks: bool):
        self.page_size, self.uses_acks = page_size, uses_acks
        self.jobs: deque[_Job] = deque()
        self.events: deque[_Event] = deque()
        self.cursor = 0.0  # virtual end of the last op replayed

    def submit(self, op, issued: float, plans: list) -> None:
        self.jobs.append(_Job(op, issued, plans))

    def advance(self, now: float) -> list[_Event]:
        """Replays every batch that starts before `now`; returns the events whose virtual
        time has passed (in the order the IO thread produced them)."""
        while self.jobs and self._step(self.jobs[0], now):
            pass
        out = []
        while self.events and self.events[0].due < now:
            out.append(self.events.popleft())
        return out

    def _step(self, job: _Job, now: float) -> bool:
        """One batch (or the op's end) of the head job, if it starts before `now`."""
        if job.start is None:
            job.start = max(job.issued, self.cursor)
        if job.start >= now:
            return False
        op, t = job.op, job.start
        if job.batch == len(job.plans) or not (job.reading or self.uses_acks):
            self.events.append(_Event(t, "end", op))  # the final ack rides with it
            self.cursor = t
            self.jobs.popleft()
            return True
        plan = job.plans[job.batch]
        # A poll at a step no later than this batch's start stopped the reads.
        stopped = op.terminated_v is not None and op.terminated_v <= t
        job.reading = job.reading and not stopped
        if job.reading:
            t += plan.seconds
            job.done_tokens += plan.pages * self.page_size
            size = min(IO_BATCH_PAGES, len(op.hash_value) - job.batch * IO_BATCH_PAGES)
            job.reading = plan.pages == size  # a page storage could not return ends them
        kind = "ack" if self.uses_acks else "pages"
        if self.uses_acks or not stopped:
            self.events.append(_Event(t, kind, op, job.done_tokens, not job.reading))
        job.batch, job.start = job.batch + 1, t
        return True


@dataclass
class HitTimeline:
    """The prefetch thread's hit queries on the virtual clock, in admission order."""

    exists_s: float  # modelled seconds of one batch_exists call
    submitted: deque = field(default_factory=deque)  # ops admitted, hit not yet drained
    last_due: float = 0.0

    def visible(self, now: float, wait) -> int:
        """Hits whose virtual time has passed (waiting for the real query when needed)."""
        count, prev = 0, self.last_due
        for op in self.submitted:
            if max(op.start_stamp, prev) >= now:
                break  # it cannot have ended before now
            wait(lambda op=op: op.hit_due is not None, f"hit query of {op.rid}")
            if op.hit_due >= now:
                break
            count, prev = count + 1, op.hit_due
        return count

    def drained(self, n: int) -> None:
        for _ in range(n):
            self.last_due = self.submitted.popleft().hit_due


class Pin:
    """The scheduler thread's side of a pinned schedule for one rank."""

    def __init__(self, page_size: int, uses_acks: bool, exists_s: float,
                 progress: threading.Condition, synced_acks, timeout_s: float, rank: int):
        self.io = VirtualIO(page_size, uses_acks)
        self.hits = HitTimeline(exists_s)
        self.progress, self.synced_acks = progress, synced_acks
        self.timeout_s, self.rank = timeout_s, rank
        self.acks_due = 0  # acks (batch and final) whose virtual time has passed
        self.acks_drained = 0
        self.waited_s = 0.0  # scheduler time spent waiting for real work (reset per step)
        self.waited_total_s = 0.0  # ...over the serve: the measured clock leaves it out

    def wait(self, ready, what: str) -> None:
        """Blocks until `ready()` (real work whose virtual time has come), bounded."""
        if ready():
            return
        t0 = time.monotonic()
        with self.progress:
            ok = self.progress.wait_for(ready, self.timeout_s)
        waited = time.monotonic() - t0
        self.waited_s, self.waited_total_s = self.waited_s + waited, \
            self.waited_total_s + waited
        if not ok:
            raise RuntimeError(f"rank {self.rank}: {what} not done within {self.timeout_s}s "
                               f"of its virtual completion (pinned schedule)")

    def advance(self, now: float, ongoing: dict) -> list:
        """Makes visible what completed before `now` on the virtual clock; returns the ops
        whose reads ended (their `io_end_v` set)."""
        ended = []
        for ev in self.io.advance(now):
            if ev.kind == "ack" or (ev.kind == "end" and self.io.uses_acks):
                self.acks_due += 1
            op = ev.op
            if ev.kind == "end":
                op.io_stopped, op.io_end_v = True, ev.due
                ended.append(op)
            elif ev.kind == "pages" and ongoing.get(op.rid) is op:
                self._land(op, ev)
        return ended

    def _land(self, op, ev: _Event) -> None:
        """pre27010: this rank's progress, once the IO thread really wrote the pages."""
        self.wait(lambda: op.real_tokens >= ev.tokens or op.io_done.is_set(),
                  f"read of {op.rid}")
        op.completed_tokens = ev.tokens
        if ev.short:  # SGLang's mark_terminate on a short batch
            op.terminated_v = ev.due
            op.terminated.set()

    def visible_acks(self) -> int:
        """Acks due and not yet drained; waits until the ack thread has synced them."""
        need = self.acks_due - self.acks_drained
        self.wait(lambda: self.synced_acks.qsize() >= need, f"{need} acks")
        return need

    def clock(self) -> float:
        """The measured clock under pinned: this rank's wall clock less the waits for real
        work (the free system never makes them: it would see the result a step later) and
        less the forward sleep's lateness (`leave_out`)."""
        return time.monotonic() - self.waited_total_s

    def leave_out(self, seconds: float) -> float:
        """Leaves `seconds` (if > 0) out of the measured clock; returns what it left out."""
        seconds = max(0.0, seconds)
        self.waited_total_s += seconds
        return seconds

    def take_waited(self) -> float:
        waited, self.waited_s = self.waited_s, 0.0
        return waited
