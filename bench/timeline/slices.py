"""A cell's records as what a timeline draws: slices, instants and counters per rank and
thread, on rank 0's clock (bench.timeline.clock), cut to a window of steps. The Perfetto
trace (bench.timeline.perfetto_trace) and the figure (bench.timeline.figure) both draw
these, so what the PNG shows is what the trace holds."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.timeline.clock import Offset, estimate_offsets, waits
from bench.timeline.load import CellRecord
from hicache.memory.events import (
    COLLECTIVE,
    EXISTS,
    FORWARD,
    HOST_COPY,
    LOAD_BACK,
    POLL,
    READ,
    SCHEDULER_THREAD,
    STEP,
    WRITE,
)

REQUESTS_TRACK = "requests"  # per rank: each request's arrival, enqueue, ready, first token
THREAD_ORDER = (SCHEDULER_THREAD, "prefetch", "io", "ack-sync", "backup", "consensus",
                REQUESTS_TRACK)
COUNTERS = ("waiting", "prefetching", "running")
# The slices a request's flow passes through, besides its milestones: the hit query (the
# prefetch thread), its first storage read (IO thread) and its load-back (scheduler).
FLOW_POINTS = {(COLLECTIVE, "hit_query"), (READ, None), (LOAD_BACK, None)}


@dataclass
class Slice:
    rank: int
    thread: str
    start: float  # seconds, rank 0's clock
    end: float
    name: str
    kind: str  # the hicache.memory.events kind, or "wait" (inside a collective)
    args: dict = field(default_factory=dict)
    flows: list[int] = field(default_factory=list)  # request flows passing through it


@dataclass
class Timeline:
    label: str
    protocol: str
    window: tuple[int, int]  # steps A:B
    offsets: list[Offset]
    slices: list[Slice]
    counters: list[tuple[int, str, float, int]]  # (rank, name, time, value)
    t0: float  # the window's start: rank 0's first step of it

    def of_kind(self, kind: str, rank: int | None = None) -> list[Slice]:
        return [s for s in self.slices if s.kind == kind and rank in (None, s.rank)]


def build(record: CellRecord, window: tuple[int, int]) -> Timeline:
    offsets = estimate_offsets(record.ranks)
    waited = waits(record.ranks, offsets)
    slices, counters = [], []
    for r, rank in enumerate(record.ranks):
        lo, hi = _window_times(rank, window)
        flows = _Flows(r)
        for thread, events in rank["threads"].items():
            for e in events:
                if e[2] >= lo and e[1] <= hi:
                    slices += _slices(r, thread, e, offsets[r].seconds, waited[r], rank, flows)
        slices += _milestones(r, rank, offsets[r].seconds, lo, hi, flows)
        counters += _counters(r, rank, offsets[r].seconds, window)
    t0 = _window_times(record.ranks[0], window)[0]  # rank 0's clock is the reference
    return Timeline(record.label, record.cell["protocol"], window, offsets, slices, counters,
                    t0)


def _window_times(rank: dict, window: tuple[int, int]) -> tuple[float, float]:
    """The window on this rank's clock: from step A's start to step B-1's end."""
    steps = {e[3]: e for e in rank["threads"].get(SCHEDULER_THREAD, []) if e[0] == STEP}
    a, b = window
    return steps[a][1], steps[b - 1][2]


class _Flows:
    """One flow per request and rank; a flow passes through the first slice of each kind."""

    def __init__(self, rank: int):
        self.base, self.ids, self.seen = (rank + 1) << 32, {}, set()

    def through(self, rid: str | None, kind: str) -> list[int]:
        if rid is None or (rid, kind) in self.seen:
            return []
        self.seen.add((rid, kind))
        return [self.base + self.ids.setdefault(rid, len(self.ids))]


def _slices(r: int, thread: str, e: list, off: float, waited: dict, rank: dict,
            flows: _Flows) -> list[Slice]:
    kind, start, end = e[0], e[1] - off, e[2] - off
    name, args, rid = _describe(e, rank)
    s = Slice(r, thread, start, end, name, kind, args)
    if (kind, e[4] if kind == COLLECTIVE else None) in FLOW_POINTS:
        s.flows = flows.through(rid, kind)
    out = [s]
    if kind == COLLECTIVE and id(e) in waited:
        wait, peer = waited[id(e)]
        args.update(wait_ms=wait * 1e3, waited_for_rank=peer)
        if wait > 0 and peer != r:
            out.append(Slice(r, thread, start, start + wait, f"wait for rank {peer}", "wait",
                             {"site": e[4], "rid": e[6] or "", "wait_ms": wait * 1e3}))
    return out


def _describe(e: list, rank: dict) -> tuple[str, dict, str | None]:
    """The slice's name, its arguments and the request it belongs to (or None)."""
    describe = _DESCRIBE.get(e[0])
    return describe(e, rank) if describe else (e[0], {}, None)


def _step(e: list, rank: dict) -> tuple[str, dict, None]:
    s = rank["steps"][e[3]] if e[3] < len(rank["steps"]) else {}
    kind = s.get("kind", "")
    batch = s.get("scheduled", 0) if kind == "prefill" else s.get("running", 0)
    return (f"step {e[3]} {kind}", {"step": e[3], "kind": kind, "batch": batch,
                                    "polled": s.get("polled", 0),
                                    "duration_ms": (e[2] - e[1]) * 1e3}, None)


def _collective(e: list, rank: dict) -> tuple[str, dict, str | None]:
    op, site, group, rid, step = e[3:8]
    return site, {"op": op, "site": site, "group": group, "rid": rid or "", "step": step,
                  "duration_ms": (e[2] - e[1]) * 1e3}, rid


_DESCRIBE = {
    STEP: _step,
    COLLECTIVE: _collective,
    POLL: lambda e, rank: (f"poll {e[3]}", {"rid": e[3], "outcome": e[4],
                                            "protocol": rank["cell"]["protocol"]}, e[3]),
    FORWARD: lambda e, _: ("forward", {"new_tokens": e[3], "decode_requests": e[4]}, None),
    LOAD_BACK: lambda e, _: (f"load_back {e[3]}", {"rid": e[3], "bytes": e[4]}, e[3]),
    HOST_COPY: lambda e, _: ("host copy", {"pages": e[3], "bytes": e[4]}, None),
    READ: lambda e, _: (f"read {e[4]} {e[6]}/{e[5]}p", {"rid": e[3], "pool": e[4],
                                                         "pages": e[5], "pages_read": e[6],
                                                         "bytes": e[7]}, e[3]),
    WRITE: lambda e, _: (f"write {e[4]}/{e[3]}p", {"pages": e[3], "pages_written": e[4],
                                                    "bytes": e[5]}, None),
    EXISTS: lambda e, _: (f"exists {e[5]}/{e[4]}p", {"rid": e[3], "pages": e[4],
                                                      "present": e[5]}, e[3]),
}


def _milestones(r: int, rank: dict, off: float, lo: float, hi: float,
                flows: _Flows) -> list[Slice]:
    """Zero-length slices on the requests track: arrival (rank 0's stamp), enqueued, ready
    and first token, each carrying the request's flow."""
    out = []
    for q in rank["requests"]:
        points = [("arrival", q["arrival"] + off), ("enqueued", q["enqueued"]),
                  ("ready", q["ready"]), ("first token", q["first_token"])]
        for what, t in points:
            # An arrival shows with its enqueue: a burst arrives before the first step starts.
            seen = q["enqueued"] if what == "arrival" else t
            if t is not None and seen is not None and lo <= seen <= hi:
                out.append(Slice(r, REQUESTS_TRACK, t - off, t - off, f"{what} {q['rid']}",
                                 "milestone", {"rid": q["rid"], "milestone": what},
                                 flows.through(q["rid"], what)))
    return out


def _counters(r: int, rank: dict, off: float, window: tuple[int, int]) -> list[tuple]:
    starts = {e[3]: e[1] for e in rank["threads"].get(SCHEDULER_THREAD, []) if e[0] == STEP}
    out = []
    for s in rank["steps"][window[0]: window[1]]:
        out += [(r, name, starts[s["step"]] - off, s[name]) for name in COUNTERS]
    return out
