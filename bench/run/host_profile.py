"""Host work counted, not timed: the scheduler thread's Python work per step and per poll.

Collective counts are exact; host cost is timed, and on a shared machine the time moves with
the load. What the scheduler thread *does* does not: on a pinned schedule (hicache.spec.pinned)
every run takes the same decisions, so it runs the same Python. `HostWork` counts it in a
serve of its own (`bench run --host-work`, after each cell's timed serve, which it leaves
alone; unpadded: it does not sleep out the modelled forward), from the scheduler thread only:

- mode "calls": sys.setprofile's call and c_call events (every Python function and every
  builtin it calls), about 2x the scheduler thread's time;
- mode "opcodes": sys.settrace's opcode events (f_trace_opcodes: every bytecode executed in
  Python frames; builtins count as the one instruction that calls them), about 10x.

Two scopes, both entered through calls the system documents (no private attribute is read):
the serve is `Scheduler.run` (the steps, not the threads' start-up and shut-down), a poll is
the seam's `walk_progress` or `begin_walk` (hicache.serve.seam: one request's
check_prefetch_progress, or pr33029's bulk poll) and everything they call, collectives
included. A planted time (a spin) is seen only through the calls it makes while spinning,
which vary with the CPU: a plant meant for this count is work (--plant PROTOCOL:Ncalls).

`SchedCpu` is the third candidate: the scheduler thread's CPU time (CLOCK_THREAD_CPUTIME_ID)
over the timed serve itself, no profiler.
"""

from __future__ import annotations

import sys
import time
from types import CodeType, FrameType

MODES = ("calls", "opcodes")


class HostWork:
    """Counts the scheduler thread's Python work inside `serve_code`'s frame (the serve)
    and inside any frame of `poll_codes` (a poll). Enter and leave it on that thread."""

    def __init__(self, serve_code: CodeType, poll_codes: frozenset[CodeType],
                 mode: str = "calls"):
        if mode not in MODES:
            raise ValueError(f"host-work mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.serve_code, self.poll_codes, self.mode = serve_code, poll_codes, mode
        self.serve = 0  # events inside the serve (polls included)
        self.poll = 0  # events inside polls
        self._in_serve: FrameType | None = None
        self._in_poll: FrameType | None = None

    def __enter__(self) -> HostWork:
        if self.mode == "calls":
            sys.setprofile(self._profile)
        else:
            sys.settrace(self._call)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        sys.settrace(None)

    def _enter(self, frame: FrameType) -> bool:
        """A Python frame starts: whether it is inside the serve (and notes a poll's)."""
        if self._in_serve is None:
            if frame.f_code is not self.serve_code:
                return False
            self._in_serve = frame
        elif self._in_poll is None and frame.f_code in self.poll_codes:
            self._in_poll = frame
        return True

    def _leave(self, frame: FrameType) -> None:
        if frame is self._in_poll:
            self._in_poll = None
        elif frame is self._in_serve:
            self._in_serve = None

    def _count(self) -> None:
        self.serve += 1
        if self._in_poll is not None:
            self.poll += 1

    def _profile(self, frame: FrameType, event: str, arg) -> None:
        if event == "call":
            if self._enter(frame):
                self._count()
        elif event == "c_call":
            if self._in_serve is not None:
                self._count()
        elif event == "return":
            self._leave(frame)

    def _call(self, frame: FrameType, event: str, arg):
        """settrace's global function: a new Python frame; trace its opcodes if in scope."""
        if not self._enter(frame):
            return None
        frame.f_trace_lines, frame.f_trace_opcodes = False, True
        return self._opcode

    def _opcode(self, frame: FrameType, event: str, arg):
        if event == "opcode":
            self._count()
        elif event == "return":
            self._leave(frame)
        return self._opcode


class SchedCpu:
    """The CPU seconds of the thread that enters and leaves it (the scheduler thread)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> SchedCpu:
        self._t0 = time.thread_time()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds += time.thread_time() - self._t0


def meter_for(system, mode: str) -> HostWork:
    """A HostWork on `system`'s serve: its scheduler's run, its cache's walk polls."""
    kind = type(system.cache)
    polls = frozenset(getattr(kind, name).__code__ for name in ("walk_progress", "begin_walk")
                      if hasattr(getattr(kind, name, None), "__code__"))
    return HostWork(type(system.scheduler).run.__code__, polls, mode)


def polls_of(stats) -> int:
    """Polls of pending prefetches a serve's steps made (the walk's and the extra ones)."""
    return sum(s.polled + s.polled_extra for s in stats.steps)


def columns(meter: HostWork | None, counted_stats, cpu: SchedCpu, timed_stats) -> dict:
    """ranks.csv's host-work columns of one rank and cell (unknown: None)."""
    out = {"sched_steps": len(timed_stats.steps), "sched_polls": polls_of(timed_stats),
           "sched_cpu_s": cpu.seconds, "host_work": None, "host_steps": None,
           "host_polls": None, "host_events": None, "host_poll_events": None,
           "host_same_schedule": None}
    if meter is not None:
        # the count is of this cell's schedule only if the counted serve decided alike
        same = [s.schedule_digest for s in counted_stats.steps[-1:]] == \
            [s.schedule_digest for s in timed_stats.steps[-1:]]
        out.update(host_work=meter.mode, host_steps=len(counted_stats.steps),
                   host_polls=polls_of(counted_stats), host_events=meter.serve,
                   host_poll_events=meter.poll, host_same_schedule=same)
    return out


COLUMNS = ["sched_steps", "sched_polls", "sched_cpu_s", "host_work", "host_steps",
           "host_polls", "host_events", "host_poll_events", "host_same_schedule"]
