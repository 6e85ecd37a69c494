"""The timeline's record: what each thread did when, as plain tuples (hicache.comm.records' Stats
carries one when a run asks for a timeline; `bench timeline` draws it).

Each thread appends to a list of its own (no lock on the hot path: one `list.append` of a
tuple, about a tenth of a microsecond); the lists are read only after the threads stopped.
Times are this rank's `time.monotonic()` seconds, as every other record of the system.

Event tuples, by kind (the first field), then (start, end) and the kind's own fields:
- STEP (step number): the scheduler's step, from its local stamp before the request
  broadcast to the end of the forward; what it did is in the step's StepStats;
- COLLECTIVE (op, site, group, request id or None, step): one call through hicache.comm.comm;
- POLL (request id, outcome): one `check_prefetch_progress` of an ongoing prefetch;
- FORWARD (new tokens, decode requests): the step's forward;
- LOAD_BACK (request id, bytes): host->device copy before a prefill;
- HOST_COPY (pages, bytes): a device->host copy of the write path;
- READ (request id, pool, pages asked, pages read, bytes): one storage batch_get;
- WRITE (pages asked, pages written, bytes): one storage batch_set (the backup thread);
- EXISTS (request id, pages asked, pages present): one storage batch_exists (hit query).
"""

from __future__ import annotations

import threading

STEP, COLLECTIVE, POLL, FORWARD = "step", "collective", "poll", "forward"
LOAD_BACK, HOST_COPY, READ, WRITE, EXISTS = "load_back", "host_copy", "read", "write", "exists"
# Thread names as the timeline shows them; the scheduler thread is the process's main one.
SCHEDULER_THREAD = "scheduler"


class EventLog:
    """Per-thread lists of event tuples; `span` is the only call on the recording path."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()  # taken once per thread, when its list is made
        self.threads: dict[str, list[tuple]] = {}

    def span(self, kind: str, start: float, end: float, *fields) -> None:
        """Records one event of this thread (`fields` as the module docstring lists)."""
        try:
            events = self._local.events
        except AttributeError:
            events = self._local.events = self._register()
        events.append((kind, start, end, *fields))

    def _register(self) -> list[tuple]:
        t = threading.current_thread()
        name = SCHEDULER_THREAD if t is threading.main_thread() else t.name
        with self._lock:
            return self.threads.setdefault(name, [])

    def dump(self) -> dict[str, list[list]]:
        """thread name -> its events as lists (picklable, JSON-ready); after the run."""
        with self._lock:
            return {name: [list(e) for e in events] for name, events in self.threads.items()}
