"""The walk's polls, timed, with an optional twin: the step-paired design (docs/usage.md,
"Pairing").

Whole serves of two protocols run at different moments, and a burst of load lands on one
and not the other. Here one scheduler serves one schedule, and every poll of a pending
prefetch asks two protocols back to back on the same facts (the same op, the same clock
reading): the cell's own protocol (`primary`, whose answer drives the schedule) and
`twin_protocol`. Which goes first is drawn per step from (seed, step), the same on every
rank, so the ranks' collectives still pair up. Each side's poll is timed; a step's host
cost of a side is the sum over its polls, and the per-step difference is the pair's cost,
measured within microseconds of each other: a burst lands on both. Their answers must be
equal (both protocols decide alike on one schedule); a difference raises, failing the run.

The twin's collectives go through a `Comm` of its own on the same groups (same thread,
so they never interleave with another thread's on a group), counted on its own counter:
the system's counts stay exact, and System.crosscheck adds the twin's to hold them against
torch's sequence numbers. Only protocols that decide in the poll from the same facts pair
(hicache.spec.cost_model.TWINS: pr27010 and pr36425, the headline pair); a protocol paired with
itself is the design's A/A.

Fault injection (HiCacheConfig.planted_step_ms): the first poll of `planted_protocol` in
every step spins that long more, timed with its side: a known cost to recover. With
planted_step_calls it makes that many extra Python calls instead: known host work, the same
count on every machine (a spin's count of calls varies with the CPU's speed and load).
"""

from __future__ import annotations

import random
import time

from hicache.agreement.protocols import Facts, Protocol, make_protocol
from hicache.comm.comm import CollectiveCounter, Comm


class PollDisagreement(RuntimeError):
    """The paired protocols answered one poll differently: they do not decide alike."""


class TwinPolls:
    """The scheduler thread's polls of one cache (owned by HiCache)."""

    def __init__(self, cfg, primary: Protocol, comm: Comm):
        self.primary, self.cfg = primary, cfg
        self.twin = make_protocol(cfg.twin_protocol, cfg.policy, cfg.race_guard) \
            if cfg.twin_protocol else None
        self.twin_comm = Comm(comm.layout, comm.groups, CollectiveCounter(), comm.delay_s * 1e3) \
            if self.twin else None
        self.seed = cfg.storage.seed
        self.step = -1
        self.twin_first = False
        self.seconds = [0.0, 0.0]  # this step's polls: primary, twin
        self._planted: dict[int, int] = {}  # side -> the step its plant last ran

    @property
    def twin_counter(self) -> CollectiveCounter | None:
        return None if self.twin_comm is None else self.twin_comm.counter

    def begin_step(self, step: int) -> None:
        self.step, self.seconds = step, [0.0, 0.0]
        # Drawn only when there is a twin: no per-step RNG on the scheduler's hot path.
        self.twin_first = self.twin is not None and \
            random.Random(self.seed * 1_000_003 + step).random() < 0.5

    def poll(self, facts: Facts, comm: Comm, rid: str) -> bool:
        if self.twin is None:
            return self._timed(0, self.primary, facts, comm, rid)
        sides = [(0, self.primary, comm), (1, self.twin, self.twin_comm)]
        if self.twin_first:
            sides.reverse()
        answers = {side: self._timed(side, p, facts, c, rid) for side, p, c in sides}
        if 0 <= self.cfg.planted_disagreement_from_step <= self.step:
            answers[1] = not answers[1]  # fault injection (HiCacheConfig)
        if answers[0] != answers[1]:
            raise PollDisagreement(
                f"step-paired: at step {self.step} {self.primary.name} answered "
                f"{answers[0]} and its twin {self.twin.name} {answers[1]} for {rid}; the "
                f"pair does not decide alike, so its steps cannot be paired")
        return answers[0]

    def _timed(self, side: int, protocol: Protocol, facts: Facts, comm: Comm,
               rid: str) -> bool:
        t0 = time.perf_counter()
        if protocol.name == self.cfg.planted_protocol and self._planted.get(side) != self.step \
                and (self.cfg.planted_step_ms or self.cfg.planted_step_calls):
            self._planted[side] = self.step
            if self.cfg.planted_step_ms:
                _spin(self.cfg.planted_step_ms / 1e3)
            _work(self.cfg.planted_step_calls)
        answer = protocol.poll(facts, comm, rid)
        self.seconds[side] += time.perf_counter() - t0
        return answer


def _work(calls: int) -> None:
    """Host work of a known size: `calls` calls of a small Python function (a count, not a
    time: the same on every machine, however loaded)."""
    for i in range(calls):
        _one(i)


def _one(i: int) -> int:
    return i + 1


def _spin(seconds: float) -> None:
    """Host work of a known length (a spin, not a sleep: it holds the CPU and the GIL)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
