"""A Timeline (bench.timeline.slices) as a Perfetto trace: protobuf TracePackets of
TrackEvents, built with the `perfetto` package's trace builder; open it in ui.perfetto.dev.

One process track per rank, a thread track per thread (scheduler, prefetch, IO, ack sync,
backup, consensus) and one for the requests' milestones, counter tracks for the waiting,
prefetching and running requests; a slice's arguments are debug annotations, a request's
path is one flow per rank. Timestamps are nanoseconds on rank 0's clock, from 1 ms before
the window's earliest slice (a background thread's event may begin before its first step).
"""

from __future__ import annotations

from bench.timeline.slices import COUNTERS, THREAD_ORDER, Slice, Timeline

PID_BASE = 1000  # rank r is pid 1000 + r
LEAD_NS = 1_000_000  # the window starts 1 ms into the trace


def require_perfetto() -> None:
    """ImportError with the one line to show when the package is missing."""
    try:
        import perfetto.trace_builder.proto_builder  # noqa: F401
    except ImportError:
        raise ImportError("the perfetto package is not installed (pip install perfetto): "
                          "no trace can be written") from None


def trace_bytes(tl: Timeline) -> bytes:
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    builder = TraceProtoBuilder()
    _Writer(builder, tl).write()
    return builder.serialize()


class _Writer:
    def __init__(self, builder, tl: Timeline):
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

        self.b, self.tl, self.TE = builder, tl, TrackEvent
        self.base = min([tl.t0, *(s.start for s in tl.slices)])

    def ns(self, t: float) -> int:
        return LEAD_NS + round((t - self.base) * 1e9)

    def write(self) -> None:
        ranks = sorted({s.rank for s in self.tl.slices})
        for r in ranks:
            self._describe_rank(r)
        events = []  # (timestamp, order, fill): one packet each, stable in time order
        for (r, thread), slices in self._by_track().items():
            events += self._track_events(_thread_uuid(r, thread), slices)
        for r, name, t, value in self.tl.counters:
            events.append((self.ns(t), len(events), self._counter(r, name, value)))
        events.sort(key=lambda e: (e[0], e[1]))
        for ts, _, fill in events:
            p = self.b.add_packet()
            p.timestamp, p.trusted_packet_sequence_id = ts, 1
            fill(p.track_event)

    def _describe_rank(self, r: int) -> None:
        p = self.b.add_packet()
        p.track_descriptor.uuid = _process_uuid(r)
        p.track_descriptor.process.pid = PID_BASE + r
        p.track_descriptor.process.process_name = f"rank {r}"
        present = {s.thread for s in self.tl.slices if s.rank == r}
        for i, thread in enumerate(THREAD_ORDER):
            if thread not in present:
                continue
            p = self.b.add_packet()
            d = p.track_descriptor
            d.uuid, d.parent_uuid = _thread_uuid(r, thread), _process_uuid(r)
            d.thread.pid, d.thread.tid = PID_BASE + r, (PID_BASE + r) * 100 + i + 1
            d.thread.thread_name = thread
        for name in COUNTERS:
            p = self.b.add_packet()
            d = p.track_descriptor
            d.uuid, d.parent_uuid, d.name = _counter_uuid(r, name), _process_uuid(r), name
            d.counter.SetInParent()

    def _by_track(self) -> dict[tuple[int, str], list[Slice]]:
        out: dict[tuple[int, str], list[Slice]] = {}
        for s in self.tl.slices:
            out.setdefault((s.rank, s.thread), []).append(s)
        return out

    def _track_events(self, uuid: int, slices: list[Slice]) -> list[tuple]:
        """Begin/end events of one thread's slices, properly nested: a slice ends before
        the next one that starts after it (a child is clipped to its parent)."""
        out, stack = [], []
        for s in sorted(slices, key=lambda s: (s.start, -s.end, s.kind == "wait")):
            while stack and stack[-1] <= s.start:
                out.append((self.ns(stack.pop()), len(out), self._end(uuid)))
            if s.start == s.end:
                out.append((self.ns(s.start), len(out), self._begin(uuid, s, instant=True)))
                continue
            end = min(s.end, stack[-1]) if stack else s.end
            out.append((self.ns(s.start), len(out), self._begin(uuid, s)))
            stack.append(end)
        while stack:
            out.append((self.ns(stack.pop()), len(out), self._end(uuid)))
        return out

    def _begin(self, uuid: int, s: Slice, instant: bool = False):
        kind = self.TE.TYPE_INSTANT if instant else self.TE.TYPE_SLICE_BEGIN

        def fill(ev) -> None:
            ev.type, ev.track_uuid, ev.name = kind, uuid, s.name
            ev.categories.append(s.kind)
            ev.flow_ids.extend(s.flows)
            for key, value in s.args.items():
                _annotate(ev.debug_annotations.add(), key, value)
        return fill

    def _end(self, uuid: int):
        def fill(ev) -> None:
            ev.type, ev.track_uuid = self.TE.TYPE_SLICE_END, uuid
        return fill

    def _counter(self, r: int, name: str, value: int):
        def fill(ev) -> None:
            ev.type, ev.track_uuid = self.TE.TYPE_COUNTER, _counter_uuid(r, name)
            ev.counter_value = value
        return fill


def _annotate(a, key: str, value) -> None:
    a.name = key
    if isinstance(value, bool) or isinstance(value, str) or value is None:
        a.string_value = "" if value is None else str(value)
    elif isinstance(value, int):
        a.int_value = value
    else:
        a.double_value = float(value)


def _process_uuid(r: int) -> int:
    return (r + 1) << 20


def _thread_uuid(r: int, thread: str) -> int:
    index = THREAD_ORDER.index(thread) if thread in THREAD_ORDER else len(THREAD_ORDER)
    return _process_uuid(r) + 1 + index


def _counter_uuid(r: int, name: str) -> int:
    return _process_uuid(r) + 64 + COUNTERS.index(name)
