"""The one counting wrapper every collective of the system goes through, and its call sites.

The groups they run on, and which thread owns each: hicache.comm.groups.
After SGLang PR #27010 a background reduction runs on the TP group, then on the PP group
(cache_controller.py `_create_sync_groups` / `_all_reduce`), so every rank of the TP x PP
grid ends with the same global MIN: rank 0 pays T + (1 if PP > 1). pre27010 used the TP
groups only.
The default group belongs to the harness (barriers, result gathering) and is not counted.
At world size 1 there are no groups and every collective is a no-op.

An added cost (HiCacheConfig.collective_delay_ms): every blocking control-plane collective
of the system (DELAYED_SITES: the scheduler's and the background threads' alike, not the
model's data-plane all-reduce, not the harness's own) first sleeps that long on every rank,
as a rank would wait on a slow interconnect or a busy host without spending CPU; the wait is
inside the collective's timed span. A collective issued now and waited on later pays it at
its wait (what is left of it since the issue); a PP hop's send does not (its receive does).
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import Counter, defaultdict, deque

import torch
import torch.distributed as dist

from hicache.comm.groups import Groups, Layout
from hicache.memory.events import COLLECTIVE, EventLog

DECISION = "decision"
COMPLETION = "completion"
HIT_QUERY = "hit_query"
ACK = "ack"
PP_HOP = "pp_hop"
REQUEST_BROADCAST = "request_broadcast"
PER_STEP_MIN = "per_step_min"
MODEL_ALLREDUCE = "model_allreduce"
CONSENSUS = "consensus"
TICKET = "ticket"
CALIBRATION = "calibration"  # the harness's latency probe (bench.run.calibrate); not a system site
HARNESS_STOP = "harness_stop"  # the harness's end-of-serve agreement; not a system site
# PD prefill's bootstrap RID ring at PP > 1 (hicache.agreement.pd_admission, off by default):
# a system site, kept out of SITES because SITES are the fixed per-rank columns of every
# run's ranks.csv, and only a run with the admission stage on ever issues it.
BOOTSTRAP_RING = "bootstrap_ring"
# With it on, the PP forward's hand-over of each prefill batch to the next stage (SGLang's
# proxy tensors, a data-plane P2P: no added cost), on its own tag of `pp_cpu`.
PP_PROXY, PROXY_TAG = "pp_proxy", 1
SITES = (DECISION, COMPLETION, HIT_QUERY, ACK, PP_HOP, REQUEST_BROADCAST, PER_STEP_MIN,
         MODEL_ALLREDUCE, CONSENSUS, TICKET)
# Control-plane sites that pay an added cost (Comm's delay): every system site but the model's
# data plane, and the harness's calibration, which measures c and so must include it.
DELAYED_SITES = frozenset(set(SITES) - {MODEL_ALLREDUCE} | {CALIBRATION, BOOTSTRAP_RING})
SCHEDULER_SITES = frozenset({DECISION, COMPLETION, PP_HOP, REQUEST_BROADCAST, PER_STEP_MIN,
                             BOOTSTRAP_RING, PP_PROXY})
RECENT = 8  # collectives each rank remembers for a deadlock report


class CollectiveError(RuntimeError):
    """A collective failed or timed out: names the call site, step, request and ranks."""


class CollectiveCounter:
    """Counts every collective at its call site; thread-safe (four threads record). With a
    timeline (`events`, a hicache.memory.events.EventLog) each call is also one event of its
    thread."""

    def __init__(self, events: EventLog | None = None) -> None:
        self._lock = threading.Lock()
        self.events = events
        self.step = -1  # set by the scheduler at the top of each step
        self.by_site: Counter[str] = Counter()
        self.by_rid: dict[str, Counter[str]] = defaultdict(Counter)
        self.by_step: dict[int, Counter[str]] = defaultdict(Counter)
        self.raw_by_group: Counter[str] = Counter()
        self.sched_seconds_by_step: dict[int, float] = defaultdict(float)
        self.sched_seconds_by_rid: dict[str, float] = defaultdict(float)
        self.sched_seconds_by_step_site: dict[int, Counter[str]] = defaultdict(Counter)
        # The scheduler thread's last collectives, oldest first, with their step, site,
        # group, request and end time: what a deadlock report shows as each rank's path
        # into the first unpaired collective.
        self.recent: deque[tuple[int, str, str, str | None, float]] = deque(maxlen=RECENT)
        # Every collective in order, (group, site, request, step), when a harness asks for it
        # (None: off): comparing two ranks' sequences on a group finds the first pair of
        # collectives that did not match, even where gloo paired them without an error.
        self.sequence: list[tuple[str, str, str | None, int]] | None = None
        # Per request, where its collectives were issued: "op@group site" (ours), or for
        # code that is not ours (SGLang's, counted at sglang_adapter.door) its
        # "op@group file:function:line < the frames above".
        self.where_by_rid: dict[str, Counter[str]] = defaultdict(Counter)

    def record(self, site: str, group: str, raw_ops: int, rid: str | None, seconds: float,
               start: float | None = None, op: str = "all_reduce", where: str | None = None):
        if self.events is not None and start is not None:
            self.events.span(COLLECTIVE, start, start + seconds, op, site, group, rid, self.step)
        with self._lock:
            self.by_site[site] += 1
            self.raw_by_group[group] += raw_ops
            if site in SCHEDULER_SITES or site == MODEL_ALLREDUCE:  # the thread that blocks
                self.recent.append((self.step, site, group, rid, time.monotonic()))
            if self.sequence is not None:
                self.sequence.append((group, site, rid, self.step))
            if rid is not None:
                self.by_rid[rid][site] += 1
                if where is not None:
                    self.where_by_rid[rid][where] += 1
            if site in SCHEDULER_SITES or site == MODEL_ALLREDUCE:
                self.by_step[self.step][site] += 1
            if site in SCHEDULER_SITES:
                self.sched_seconds_by_step[self.step] += seconds
                self.sched_seconds_by_step_site[self.step][site] += seconds
                if rid is not None:
                    self.sched_seconds_by_rid[rid] += seconds

    def add_raw(self, group: str, raw_ops: int) -> None:
        """Torch ops of a collective already recorded (the second broadcast of an object
        whose first was counted: SGLang's broadcast_pyobj as the door sees it)."""
        with self._lock:
            self.raw_by_group[group] += raw_ops

    def add_wait(self, site: str, seconds: float, start: float) -> None:
        """The scheduler thread's wait for a collective it issued earlier without waiting
        (PR #39903's pipelined per-step MIN): its time, charged to the step that waits;
        the collective itself was counted when issued."""
        if self.events is not None:
            self.events.span(COLLECTIVE, start, start + seconds, "wait", site, None, None,
                             self.step)
        with self._lock:
            self.sched_seconds_by_step[self.step] += seconds
            self.sched_seconds_by_step_site[self.step][site] += seconds


class Comm:
    """The system's only door to torch.distributed. Every call names its site. `delay_ms`:
    the added cost every blocking collective at a DELAYED_SITES site waits first."""

    def __init__(self, layout: Layout, groups: Groups, counter: CollectiveCounter,
                 delay_ms: float = 0.0):
        self.layout, self.groups, self.counter = layout, groups, counter
        self.delay_s = delay_ms / 1e3
        self._sends: list[dist.Work] = []

    def all_reduce(self, t: torch.Tensor, op, group: str, site: str, rid: str | None = None):
        """In-place all-reduce; a no-op on a one-rank group (as SGLang skips TP=1)."""
        if self.groups.size(group) == 1:
            return
        if t.is_cuda and self.groups.backend(group) == "gloo":
            self._host_all_reduce(t, op, group, site, rid)
            return
        self._run(lambda: dist.all_reduce(t, op=op, group=self.groups.pg[group]),
                  site, group, 1, rid)

    def start_all_reduce(self, t: torch.Tensor, op, group: str, site: str):
        """An all-reduce issued now and waited on later (`async_op=True`): counted when
        issued, in issue order (as torch's sequence number counts it); returns the wait,
        which raises a CollectiveError naming the site. A no-op on a one-rank group."""
        if self.groups.size(group) == 1:
            return lambda: None
        issued = time.monotonic()
        work = self._run(lambda: dist.all_reduce(t, op=op, group=self.groups.pg[group],
                                                 async_op=True),
                         site, group, 1, None, "all_reduce_async", delay=False)

        def wait() -> None:
            t0 = time.monotonic()
            # The added cost runs from the issue: a forward that outlasts it hides it.
            self._delay(site, issued + self.delay_s - t0)
            try:
                work.wait()
            except Exception as e:  # gloo raises RuntimeError on timeout or a mispaired peer
                raise self._error(site, group, None, e) from e
            self.counter.add_wait(site, time.monotonic() - t0, t0)

        return wait

    def all_reduce_groups(self, t: torch.Tensor, op, groups: tuple[str, ...], site: str,
                          rid: str | None = None) -> None:
        """A background thread's reduction (SGLang's controller `_all_reduce`): one
        all-reduce per group in turn, TP then PP, so every rank of the grid ends with the
        global result. Each is counted at `site`; one-rank groups are skipped."""
        for group in groups:
            self.all_reduce(t, op, group, site, rid)

    def _host_all_reduce(self, t: torch.Tensor, op, group: str, site: str,
                         rid: str | None = None):
        """A gloo data plane on GPUs (ranks sharing a GPU): reduce a host copy, copy back.
        Still one collective at `site`; slower than NCCL, and recorded as not NCCL."""
        host = t.cpu()  # blocks until the forward's kernels that produced `t` are done
        self._run(lambda: dist.all_reduce(host, op=op, group=self.groups.pg[group]),
                  site, group, 1, rid)
        t.copy_(host)

    def reduce_tp_then_pp(self, t: torch.Tensor, op, site: str, rid: str | None = None):
        """SGLang's `_all_reduce`: PP stage 0 reduces over its TP group, later stages take
        stage 0's result point to point. Stages > 0 do no TP all-reduce for this value."""
        if self.layout.pp_rank == 0:
            self.all_reduce(t, op, "tp_cpu", site, rid)
        self.pp_hop(t, rid)

    def pp_hop(self, t: torch.Tensor, rid: str | None = None) -> None:
        """Stage i receives from i-1 (blocking), then sends to i+1 without waiting."""
        if self.layout.pp == 1:
            return
        pg, stage = self.groups.pg["pp_cpu"], self.layout.pp_rank
        if stage > 0:
            self._run(lambda: dist.recv(t, group_src=stage - 1, group=pg), PP_HOP, "pp_cpu",
                      1, rid, "recv")
        if stage + 1 < self.layout.pp:
            # Send a copy: the caller may reuse `t` before the send completes.
            buf = t.clone()
            self._run(lambda: self._sends.append(dist.isend(buf, group_dst=stage + 1, group=pg)),
                      PP_HOP, "pp_cpu", 1, rid, "isend", delay=False)

    def send_object(self, obj, stage: int, site: str, tag: int = 0):
        """A python object to PP stage `stage` of this rank's column (`pp_cpu`), issued
        without waiting: its length, then its bytes (SGLang's point_to_point_pyobj, async).
        Returns the wait, which raises a CollectiveError naming the site."""
        pg = self.groups.pg["pp_cpu"]
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        n = torch.tensor([payload.numel()], dtype=torch.int64)
        works = self._run(lambda: [dist.isend(n, group_dst=stage, group=pg, tag=tag),
                                   dist.isend(payload, group_dst=stage, group=pg, tag=tag)],
                          site, "pp_cpu", 2, None, "isend", delay=False)

        def wait() -> None:
            try:
                for w in works:  # the works hold the buffers until the peer took them
                    w.wait()
            except Exception as e:  # gloo raises RuntimeError on timeout or a lost peer
                raise self._error(site, "pp_cpu", None, e) from e

        return wait

    def recv_object(self, stage: int, site: str, tag: int = 0):
        """The python object PP stage `stage` of this rank's column sent (blocking)."""
        pg = self.groups.pg["pp_cpu"]

        def recv() -> torch.Tensor:
            n = torch.zeros(1, dtype=torch.int64)
            dist.recv(n, group_src=stage, group=pg, tag=tag)  # blocks until the length
            buf = torch.empty(int(n.item()), dtype=torch.uint8)
            dist.recv(buf, group_src=stage, group=pg, tag=tag)
            return buf

        buf = self._run(recv, site, "pp_cpu", 2, None, "recv")
        return pickle.loads(buf.numpy().tobytes())

    def drain_sends(self) -> None:
        """Wait for the PP hop sends of the last step (backpressure on a lagging stage)."""
        for w in self._sends:
            w.wait()
        self._sends.clear()

    def all_idle(self, busy: bool) -> bool:
        """Whether no rank of the world is busy: the harness's own agreement to end a serve,
        on the default (harness) group, so no system group's count or sequence number moves.
        SGLang's scheduler never stops; this decides when the benchmark may. Called only at
        a step that agreed inputs already call the last, so every rank calls it together."""
        if self.layout.world_size == 1:
            return not busy
        flag = torch.tensor([int(busy)], dtype=torch.int32)
        self._run(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX), HARNESS_STOP,
                  "default", 1, None)
        return flag.item() == 0

    def broadcast_object(self, obj, site: str, group: str = "sched", rid: str | None = None):
        """The object of `group`'s first rank (rank 0 of `sched`, PP stage 0 of a column) to
        every rank of the group, as SGLang's broadcast_pyobj: a length broadcast, then the
        bytes unless there are none (obj None)."""
        if self.groups.size(group) == 1:
            return obj
        pg = self.groups.pg[group]
        source = self.groups.ranks[group][0] == self.layout.rank
        payload = pickle.dumps(obj) if source and obj is not None else b""
        n = torch.tensor([len(payload)], dtype=torch.int64)

        def bcast():
            dist.broadcast(n, group_src=0, group=pg)
            if n.item() == 0:
                return None
            buf = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if source
                   else torch.empty(int(n.item()), dtype=torch.uint8))
            dist.broadcast(buf, group_src=0, group=pg)
            return buf

        buf = self._run(bcast, site, group, lambda out: 1 if out is None else 2, rid,
                        "broadcast")
        if source:
            return obj
        return None if buf is None else pickle.loads(buf.numpy().tobytes())

    def _run(self, fn, site: str, group: str, raw_ops, rid: str | None, op: str = "all_reduce",
             delay: bool = True):
        """Runs one collective (`raw_ops` torch ops, or a function of fn's result); `op`
        names it on the timeline; `delay`: a blocking one, which pays the added cost."""
        t0 = time.monotonic()
        if delay:
            self._delay(site, self.delay_s)
        try:
            out = fn()
        except Exception as e:  # gloo raises RuntimeError on timeout or a mispaired peer
            raise self._error(site, group, rid, e) from e
        raw = raw_ops(out) if callable(raw_ops) else raw_ops
        self.counter.record(site, group, raw, rid, time.monotonic() - t0, t0, op,
                            f"{op}@{group} {site}")
        return out

    def _delay(self, site: str, seconds: float) -> None:
        """The added cost: a sleep, the same on every rank (the harness's sites excepted)."""
        if seconds > 0 and site in DELAYED_SITES:
            time.sleep(seconds)  # blocks this thread without CPU: a slow link, not work

    def _error(self, site: str, group: str, rid: str | None, e: Exception) -> CollectiveError:
        ranks = self.groups.ranks.get(group)
        return CollectiveError(
            f"collective at call site '{site}' on group '{group}' (ranks {ranks}) failed "
            f"on rank {self.layout.rank} at step {self.counter.step}"
            f"{f' for request {rid}' if rid else ''}: {str(e).splitlines()[0][:300]}")
