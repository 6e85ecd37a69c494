"""A cell whose ranks the launcher killed at its bound (bench.hazards.matrix): a hang is an
outcome, told from a harness that could not run the cell by what each killed rank's
journals (bench.hazards.cell.Journal) held at the kill.

In this order:
- **harness**: a killed rank never began its serve (its start-up ran past its bound) or
  left no journal: the harness could not run the cell;
- **deadlock**: a killed rank wrote nothing for `stall_s` or more before the kill (twice
  the collective timeout: a rank blocked in a collective would have failed it by then), so
  it waited outside any collective; named by its last collectives;
- **livelock**: every killed rank kept stepping to the end, and the tail of its
  rank-consensus log (its collective sequence, where it logged no records) repeats one
  cycle of records, at least MIN_REPEATS times and over at least half the log: the ranks
  stepped without progress. Named by the step the repetition began and the cycle;
- **harness** otherwise: still progressing at the bound (a bound too short for the
  machine), not a finding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.hazards.classify import DEADLOCK, HARNESS, LIVELOCK

MIN_REPEATS = 20  # cycles in the repeating tail
MAX_PERIOD = 512  # records in one cycle
SHOWN = 6  # records of the cycle named in the detail


@dataclass(frozen=True)
class Killed:
    """What one rank killed at the cell's bound left."""

    rank: int
    serving: bool  # it had begun its serve (bench.hazards.cell.mark_serving)
    quiet_s: float | None  # seconds from its last journal line to the kill; None: no journal
    records: list[str]  # its rank-consensus log
    record_steps: list[int]  # the scheduler step of each record
    sequence: list[list]  # its collectives: [group, site, rid, step]


def repeating_tail(items: list) -> tuple[int, int] | None:
    """(start, period) of the log's repeating tail: the smallest period whose tail repeats
    at least MIN_REPEATS times and covers at least half the log, from its earliest start;
    None when there is none."""
    n = len(items)
    for p in range(1, min(MAX_PERIOD, n // MIN_REPEATS) + 1):
        j = n - 1 - p
        while j >= 0 and items[j] == items[j + p]:
            j -= 1
        start = j + 1
        if (n - start) >= MIN_REPEATS * p and 2 * (n - start) >= n:
            return start, p
    return None


def _log(k: Killed) -> tuple[list, list[int]]:
    """The rank's log to read for progress and the step of each item: its records, else its
    collectives without their steps."""
    if k.records:
        return k.records, k.record_steps
    return [tuple(c[:3]) for c in k.sequence], [c[3] for c in k.sequence]


def _last_step(k: Killed) -> int | None:
    steps = [c[3] for c in k.sequence[-1:]] or k.record_steps[-1:]
    return steps[0] if steps else None


def _recent(k: Killed, n: int = 3) -> str:
    calls = [f"{c[1]}@{c[3]}" + (f"({c[2]})" if c[2] else "") for c in k.sequence[-n:]]
    return ", ".join(calls) or "none"


def classify_hang(killed: list[Killed], stall_s: float, bound_s: float) -> dict:
    """The outcome row (outcome, site, step, detail) of a cell whose `killed` ranks were
    still running at its bound (`bound_s`)."""
    ranks = [k.rank for k in killed]
    lost = [k for k in killed if not k.serving or k.quiet_s is None]
    if lost:
        why = "; ".join(f"rank {k.rank}: " + ("never began its serve" if not k.serving
                                              else "no journal") for k in lost)
        return _row(HARNESS, None, None, f"rank(s) {ranks} still running at the cell's "
                                         f"bound ({bound_s:.0f} s), killed ({why})")
    stalled = [k for k in killed if k.quiet_s >= stall_s]
    if stalled:
        return _stalled(stalled)
    return _livelock(killed, bound_s)


def _stalled(stalled: list[Killed]) -> dict:
    first = min(stalled, key=lambda k: (_last_step(k) or 0, k.rank))
    last = first.sequence[-1] if first.sequence else None
    parts = [f"rank {k.rank}: no collective for {k.quiet_s:.1f} s before the cell's bound "
             f"(a wait outside any collective), after {_recent(k)}" for k in stalled]
    return _row(DEADLOCK, last[1] if last else "stalled", _last_step(first),
                "; ".join(parts))


def _livelock(killed: list[Killed], bound_s: float) -> dict:
    found = []
    for k in killed:
        log, steps = _log(k)
        tail = repeating_tail(log)
        if tail is None:
            return _row(HARNESS, None, None, f"rank {k.rank} still progressing at the "
                        f"cell's bound ({bound_s:.0f} s), killed at step {_last_step(k)}")
        found.append((k, log, steps, *tail))
    k, log, steps, start, period = min(found, key=lambda f: (f[2][f[3]], f[0].rank))
    cycle = log[start: start + period]
    shown = "; ".join(str(x) for x in cycle[:SHOWN]) + ("; ..." if period > SHOWN else "")
    began = steps[start]
    return _row(LIVELOCK, _site(cycle[0]), began,
                f"ranks {[f[0].rank for f in found]} kept stepping without progress until "
                f"the cell's bound ({bound_s:.0f} s, rank {k.rank} at step {_last_step(k)}): "
                f"from step {began} rank {k.rank} repeats one cycle of {period} record(s), "
                f"{(len(log) - start) // period} times: {shown}")


def _site(item) -> str:
    """The function a record names (`check_prefetch_progress('r00',)`), or a collective's
    call site."""
    if isinstance(item, tuple):
        return item[1]
    m = re.match(r"\s*\"?(\w+)", str(item))
    return m.group(1) if m else "consensus"


def _row(outcome: str, site: str | None, step: int | None, detail: str) -> dict:
    return {"outcome": outcome, "site": site, "step": step, "detail": detail}
