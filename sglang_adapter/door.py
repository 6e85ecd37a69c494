"""The door: every torch.distributed call SGLang's code makes is counted where it is made.

SGLang calls torch.distributed directly (no `Comm` of ours), so the count is taken at that
door: `Door.install()` wraps the torch.distributed functions SGLang uses, and each call
whose immediate caller is a file of the loaded SGLang is recorded under its call site,
`<path under sglang/srt/>:<function>:<line>` (e.g.
`mem_cache/unified_radix_cache.py:_can_terminate_prefetch:2311`), its group's name and the
request the driver says is in hand. Calls from anywhere else (the harness's own `Comm`)
pass through uncounted. An added cost (`delay_s`, HiCacheConfig.collective_delay_ms) is
slept before every counted call, as `Comm` does for the harness's control plane: SGLang's
collectives on this path are all control plane (decisions, hit queries, acks, PP relays);
an async one (isend, async_op) pays it at its issue. The count is held against torch's own
per-group sequence numbers (`crosscheck`): a collective SGLang issued that the door missed
would show there.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

import torch.distributed as dist

# The torch.distributed entry points a gloo rank of SGLang's cache path can reach.
OPS = ("all_reduce", "broadcast", "send", "recv", "isend", "irecv", "all_gather",
       "all_gather_into_tensor", "reduce_scatter_tensor", "reduce", "barrier",
       "broadcast_object_list", "all_gather_object", "gather", "scatter")


SRT = "/sglang/srt/"


def sglang_files() -> dict[str, str]:
    """Every `sglang` module of this process with a file (stubs have none) -> its file."""
    return {name: module.__file__ for name, module in list(sys.modules.items())
            if (name == "sglang" or name.startswith("sglang."))
            and isinstance(getattr(module, "__file__", None), str)}


@dataclass(frozen=True)
class Call:
    site: str  # <path under sglang/srt/>:<function>:<line> of the frame calling torch
    group: str
    op: str
    rid: str | None
    via: str = ""  # the SGLang frames above it, innermost first: "fn:line < fn:line"


class Door:
    """Counts SGLang's torch.distributed calls by calling frame; thread-safe (SGLang's
    background threads call too). One door per process, installed around a run."""

    def __init__(self, root: str):
        self.marker = f"{root}{SRT}"
        self.calls: Counter[Call] = Counter()
        self._local = threading.local()  # the request in hand, per thread (`rid`)
        self._names: dict[int, str] = {}
        self._seq0: dict[str, int] = {}
        self._groups: dict[str, dist.ProcessGroup] = {}
        self._lock = threading.Lock()
        self._real: dict[str, object] = {}
        # Optional: every call in order as [group, "op site < via", rid, step], appended before the
        # call is made (a hazard cell's pairing check; a journal survives a gloo abort).
        self.sequence: list | None = None
        self.step: int | None = None
        # Optional: told of every counted call once it returned, with its seconds and start
        # (sglang_adapter.decisions.cache records it on the harness's counter); and `failure(call,
        # error)`, the exception to raise instead when a counted call fails (one that names
        # SGLang's call site).
        self.listener = None
        self.failure = None
        # The files SGLang's counted calls came from, and any file of another SGLang that
        # called torch.distributed (own_files: a side's call sites are its own SPEC's).
        self.files: set[str] = set()
        self.strays: set[str] = set()
        self.delay_s = 0.0  # the added cost of every counted call (set per serve)

    @property
    def rid(self) -> str | None:
        """The request the calling thread has in hand: the driver's (the scheduler thread
        sets it around a poll), None on any other thread."""
        return getattr(self._local, "rid", None)

    @rid.setter
    def rid(self, value: str | None) -> None:
        self._local.rid = value

    def register(self, name: str, group: dist.ProcessGroup | None) -> None:
        """Names a group for the counts and takes its sequence number as the baseline."""
        if group is None:
            return
        self._names[id(group)] = name
        self._groups[name] = group
        self._seq0[name] = group._get_sequence_number_for_group()

    def own_files(self) -> str | None:
        """Why this process's SGLang calls do not all come from its own SPEC (a module of
        `sglang` loaded from elsewhere, or a collective from another SGLang's file), or
        None when every one does."""
        root = self.marker.removesuffix(SRT)
        strays = sorted(self.strays) + [
            f"module {name} from {path}" for name, path in sorted(sglang_files().items())
            if not path.startswith(root)]
        return (f"SGLang code outside {root} ran here: {'; '.join(strays[:3])}"
                if strays else None)

    def install(self) -> None:
        for op in OPS:
            real = getattr(dist, op)
            self._real[op] = real
            setattr(dist, op, self._wrap(op, real))

    def uninstall(self) -> None:
        for op, real in self._real.items():
            setattr(dist, op, real)
        self._real.clear()

    def _wrap(self, op: str, real):
        sig = inspect.signature(real)

        def counted(*args, **kwargs):
            frame = sys._getframe(1)
            site = self._site(frame)
            if site is None:
                return real(*args, **kwargs)  # not SGLang's call: the harness counts its own
            group = sig.bind_partial(*args, **kwargs).arguments.get("group")
            name = self._names.get(id(group), "default" if group is None else "unnamed")
            rid = self.rid if self.rid is not None else self._request_of(frame)
            call = Call(site, name, op, rid, self._via(frame.f_back))
            with self._lock:
                self.calls[call] += 1
                if self.sequence is not None:  # the chain: SGLang's helpers are shared
                    self.sequence.append([name, f"{op} {site} < {call.via}", call.rid,
                                          self.step])
            t0 = time.monotonic()
            if self.delay_s > 0:
                time.sleep(self.delay_s)  # a slow link: blocks without CPU, in the timed span
            try:
                out = real(*args, **kwargs)
            except Exception as e:  # gloo: a timeout or a mispaired peer
                if self.failure is None:
                    raise
                raise self.failure(call, e) from e
            if self.listener is not None:
                self.listener(call, time.monotonic() - t0, t0)
            return out
        return counted

    def _site(self, frame) -> str | None:
        path = frame.f_code.co_filename
        if not path.startswith(self.marker):
            if SRT in path:  # an SGLang's file, not this side's: the run must fail
                self.strays.add(path)
            return None  # not SGLang's call: the harness counts its own
        self.files.add(path)
        return f"{path[len(self.marker):]}:{frame.f_code.co_name}:{frame.f_lineno}"

    def _request_of(self, frame, depth: int = 6) -> str | None:
        """The request an SGLang background thread's collective is for, read from SGLang's
        own frames: its hit query and ack reduce hold the `operation` (`request_id`) or the
        `ack` (`rid`) they reduce, the PP-ticket broadcast (on stage 0) its ticket. None for
        one of no request (the step's, a group's setup, a ticket a later stage receives)."""
        while frame is not None and depth and frame.f_code.co_filename.startswith(self.marker):
            local = frame.f_locals
            if frame.f_code.co_name == "broadcast_pyobj":  # its payload: a PP ticket, or
                # none (a later stage's, before it arrives; an idle one): its request, if any
                data = local.get("data") or [None]
                return getattr(getattr(data[0], "handle", None), "rid", None)
            for name, attr in (("ack", "rid"), ("operation", "request_id")):
                rid = getattr(local.get(name), attr, None)
                if isinstance(rid, str):
                    return rid
            frame, depth = frame.f_back, depth - 1
        return None

    def _via(self, frame, depth: int = 4) -> str:
        """Up to `depth` SGLang frames above the call (decorator wrappers included)."""
        out = []
        while frame is not None and len(out) < depth:
            if frame.f_code.co_filename.startswith(self.marker):
                out.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        return " < ".join(out)

    def by_site(self, rid: str | None = None) -> Counter[str]:
        """Calls per call site (of one request when `rid` is given)."""
        out: Counter[str] = Counter()
        for call, n in self.calls.items():
            if rid is None or call.rid == rid:
                out[call.site] += n
        return out

    def crosscheck(self) -> dict[str, tuple[int, int]]:
        """Per registered group: (calls the door counted, ops torch's sequence number saw)."""
        counted: Counter[str] = Counter()
        for call, n in self.calls.items():
            counted[call.group] += n
        return {name: (counted[name], g._get_sequence_number_for_group() - self._seq0[name])
                for name, g in self._groups.items()}

