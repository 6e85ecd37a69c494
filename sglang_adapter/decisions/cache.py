"""SGLang's own decisions behind the harness's seam (hicache.serve.seam.CacheUnderTest):
`bench run --cache sglang --sglang SPEC --sglang-path decisions`, and where SGLang's
controller path cannot serve the run (docs/sglang.md, "bench run --cache sglang"); where it
can, `sglang_adapter.controller.cache.ControllerCache` (a subclass) runs it as the data path.

`SGLangCache` is the project's `HiCache` for the data path (prefix tree, host and device
pools, the storage tier's hit query, IO and acks on the project's controller threads,
load-back) with SGLang's code making the decisions, on the same scheduler thread and groups:

- every step, SGLang's own `check_hicache_events` (UnifiedRadixCache, or HiRadixCache for
  0.5.18) runs before the harness's own step agreement and drains;
- every poll the walk makes is SGLang's own `check_prefetch_progress` of that request,
  with its `_can_terminate_prefetch` / `can_terminate_prefetch`, `_all_reduce*`, `_pp_sync`
  and `@rank_consensus` decorators as shipped; the project's own poll is not run. When
  SGLang says the prefetch may end, the data path ends it as SGLang's end path would
  (revoked without host slots, else inserted with the acks' agreed tokens).

Stand-ins, each made here or in sglang_adapter.decisions.poll: SGLang's cache and controller objects
are built without `__init__` (the rig of sglang_adapter.decisions.poll); each prefetch the data path
issues is registered in SGLang's `ongoing_prefetch` as `prefetch_from_storage` would
(a `PrefetchOperation` of the same tokens, no host slots: `host_indices` stays None, so
SGLang's poll never takes its "KV landed" exemption from the deadline); one that the data path ends
in its drains (final ack, a hit below the threshold, no host memory) leaves SGLang's
`ongoing_prefetch` through SGLang's own `revoke_pending_prefetch` (its end path
`_handle_prefetch_result` inserts into a tree core this rig does not build). On 0.5.21 on's
PP-ticket path (buffer_only, PP > 1) a ticketed prefetch is bound to SGLang's ticket instead
(`bind_prefetch_ticket`, a `PPPrefetchState` made ready by the data path's final ack:
sglang_adapter.decisions.poll `register_ticket`), so SGLang's poll takes
`_check_pp_prefetch_progress`; once it says ready the data path ends it as its own ticket poll does.
SGLang's clock (`time` in its modules) reads the step's stamp (pinned: virtual) or this rank's
monotonic clock. SGLang's controller threads do not run: the hit-query MIN and the ack MINs are the
project's, counted by its `Comm` as in a `--cache project` run.

Every collective SGLang issues is counted at the door (sglang_adapter.door) and recorded
on the harness's counter under the site it plays (decision, per-step MIN, PP hop), on the
harness's group it ran on, with its file:function:line per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hicache.agreement.consensus import rank_consensus
from hicache.cache.cache import HiCache
from hicache.comm.comm import (
    ACK,
    COMPLETION,
    DECISION,
    HIT_QUERY,
    PER_STEP_MIN,
    PP_HOP,
    TICKET,
    CollectiveError,
)
from sglang_adapter.decisions.poll import make_rig
from sglang_adapter.door import Call, Door
from sglang_adapter.judge import consensus
from sglang_adapter.loader import Loaded, LoadError
from sglang_adapter.target import Target

P2P_OPS = ("isend", "irecv", "send", "recv")
# SGLang's functions (anywhere in a call's frames) -> the harness's site for it.
# The hit query's MIN (inline in prefetch_thread_func in 0.5.19, in its
# _sync_prefetch_hit_query in 0.5.23) and the acks' (under prefetch_sync_thread_func) are
# issued only when SGLang's controller threads run (sglang_adapter.controller.cache).
# On the PP-ticket path the command thread issues the hit query (its
# _sync_prefetch_hit_query) and, before it, the ticket's broadcast.
ROLES = (("can_terminate_prefetch", DECISION), ("_check_pp_prefetch_progress", DECISION),
         ("_sync_and_clamp_prefetch_result", COMPLETION),
         ("check_hicache_events", PER_STEP_MIN), ("prefetch_thread_func", HIT_QUERY),
         ("_sync_prefetch_hit_query", HIT_QUERY), ("prefetch_sync_thread_func", ACK),
         ("pp_prefetch_command_thread_func", TICKET))


def site_of(call: Call) -> str:
    """The harness's site for one of SGLang's collectives; its own call site when it plays
    none of them (still counted, and held against torch's sequence numbers)."""
    if call.op in P2P_OPS:
        return PP_HOP
    frames = f"{call.site} < {call.via}"
    for function, site in ROLES:
        if function in frames:
            return site
    return f"sglang:{call.site}"


@dataclass(frozen=True)
class SGLangCode:
    """SGLang's code behind the seam for one serve: what the run asked for, the release
    loaded in this process (once: sglang_adapter.serving), and the door its collectives
    pass through."""

    target: Target
    door: Door
    loaded: Loaded


class SGLangCache(HiCache):
    """One rank's cache for `--cache sglang` (module docstring). Built by `factory`."""

    def __init__(self, cfg, layout, comm, storage, device, stats, consensus=None, *,
                 sglang: SGLangCode):
        super().__init__(cfg, layout, comm, storage, device, stats, consensus)
        target, door, loaded = sglang.target, sglang.door, sglang.loaded
        groups = comm.groups.pg
        tp_group = groups["tp_cpu"] if layout.tp > 1 else None
        pp_group = groups["pp_cpu"] if layout.pp > 1 else None
        self.rig = self._make_rig(loaded, tp_group, pp_group, storage)
        self.rig.configure(cfg.policy, cfg.page_size, cfg.timeout_base_s,
                           cfg.timeout_per_ki_token_s)
        self.target, self.door = target, door
        door.register("tp_cpu", tp_group)  # SGLang's collectives on the harness's groups
        door.register("pp_cpu", pp_group)
        door.listener, door.failure = self._record, self._failure
        door.delay_s = cfg.collective_delay_ms / 1e3  # SGLang's collectives pay it too
        self.handles: dict[str, object] = {}  # rid -> SGLang's key of its prefetch
        self._poll_s = 0.0
        self.checker: consensus.Checker | None = None
        self.checker_calls = 0  # the checker's collectives, on its own groups: counted apart

    def start(self) -> None:
        super().start()
        self._start_checker()

    def _start_checker(self) -> None:
        """SGLang's own rank-consensus checker, where the run asks for it."""
        if self.target.consensus_dir is None:
            return
        # SGLang's scheduler configures it on its scheduler thread, this one (System.run).
        self.checker = consensus.Checker(self.target.consensus_dir, self.layout.rank,
                                         lambda: (self.stats.counter.step, self.door.rid))
        self.checker.start([self.rig.cache.tp_group, self.rig.cache.pp_group])
        for i, group in enumerate(self.checker.groups):
            self.door.register(f"{consensus.GROUP}{i}", group)

    def stop(self, grace_s: float) -> None:
        super().stop(grace_s)
        self._stop_checker(grace_s)

    def _stop_checker(self, grace_s: float) -> None:
        """SGLang's checker stopped (after a failure, nothing is waited on) and how many
        collectives it issued on its own groups written beside its journal."""
        if self.checker is not None:
            self.checker.stop(wait=grace_s > 0)
            consensus.write_count(self.target.consensus_dir, self.layout.rank,
                                  self.checker_calls)

    def _make_rig(self, loaded, tp_group, pp_group, storage):
        """SGLang's cache and controller objects (the poll rig: sglang_adapter.decisions.poll)."""
        layout = self.layout
        return make_rig(loaded, layout.rank, layout.tp, layout.pp, tp_group, pp_group)

    def _record(self, call: Call, seconds: float, start: float) -> None:
        """One collective SGLang issued, on the harness's counter (the door's listener);
        the consensus checker's, on its own groups, apart from every site of the serve."""
        if call.group.startswith(consensus.GROUP):
            self.checker_calls += 1
            return
        where = f"{call.op}@{call.group} {call.site}" + (f" < {call.via}" if call.via else "")
        self.stats.counter.record(site_of(call), call.group, 1, call.rid, seconds, start,
                                  call.op, where=where)

    def _failure(self, call: Call, error: Exception) -> CollectiveError:
        """A collective SGLang issued failed: the error names its line, the harness's call
        site it plays (which bench.hazards.classify reads, as of the project's), step, request."""
        ranks = self.comm.groups.ranks.get(call.group)
        return CollectiveError(
            f"SGLang's collective {call.op} at {call.site} < {call.via}, call site "
            f"'{site_of(call)}' on group "
            f"'{call.group}' (ranks {ranks}) failed on rank {self.layout.rank} at step "
            f"{self.stats.counter.step}{f' for request {call.rid}' if call.rid else ''}: "
            f"{str(error).splitlines()[0][:300]}")

    def _tick(self) -> None:
        """SGLang's clock now: the step's stamp when pinned, else this rank's own."""
        self.rig.clock.now = self.step_stamp if self.pinned else time.monotonic()

    # ---- the seam ------------------------------------------------------------------------

    def admit(self, rid: str, tokens: list[int], stamp: float) -> None:
        super().admit(rid, tokens, stamp)
        self._register(rid, stamp)

    def retry_prefetches(self, waiting: list[str], stamp: float) -> None:
        """The data path's retries (the model's, hicache.cache.retries: on this path the
        project's drains see the misses); each prefetch one issues again is registered in
        SGLang's cache as an arrival's is, so SGLang's poll decides it."""
        super().retry_prefetches(waiting, stamp)
        for rid in waiting:
            if rid not in self.handles:
                self._register(rid, stamp)

    def _register(self, rid: str, stamp: float) -> None:
        op = self.ongoing.get(rid)
        if op is None:
            return
        # the data path issued it: SGLang's cache holds it too, its start time (0.5.18
        # times out from it) on the clock of this step's stamp
        self.rig.clock.now = stamp if self.pinned else time.monotonic()
        if op.ticketed:  # 0.5.23's PP-ticket path: SGLang's poll asks for the ticket
            self.handles[rid] = self.rig.register_ticket(rid, list(op.tokens), op.ready)
        else:
            self.handles[rid] = self.rig.register(rid, list(op.tokens))

    def check_hicache_events(self, stamp: float, busy: bool) -> bool:
        self.step_stamp, self._poll_s = stamp, 0.0
        self._tick()
        self.door.rid = None
        self.rig.step()  # SGLang's own check_hicache_events: its per-step reductions
        any_busy = super().check_hicache_events(stamp, busy)  # the data path's drains
        self._forget_ended()
        return any_busy

    def _forget_ended(self) -> None:
        """Prefetches the data path ended in its drains leave SGLang's ongoing_prefetch."""
        for rid in [r for r in self.handles if r not in self.ongoing]:
            self.rig.forget(self.handles.pop(rid))

    def begin_walk(self, waiting: list[str]) -> int:
        self._bulk = None
        return 0

    def walk_polls(self, rid: str) -> int:
        handle = self.handles.get(rid)
        return int(handle is not None and self.rig.pending(handle))

    @rank_consensus(same_params=True, same_results=True)
    def check_prefetch_progress(self, rid: str) -> bool:
        """The walk's poll (PrefetchPoll.walk_progress calls it): SGLang's
        check_prefetch_progress; when it says ready, the data path ends the prefetch as
        SGLang's end path would. With the harness's consensus checker on, its parameters
        and result are logged as SGLang's own @rank_consensus would log them."""
        op = self.ongoing.get(rid)
        if op is not None:
            self.stats.requests[rid].polls += 1
            self._mirror(op)
        self._tick()
        self.door.rid = rid
        t0 = time.perf_counter()
        try:
            handle = self.handles.get(rid)
            ready = bool(self.rig.cache.check_prefetch_progress(
                self.rig.handle(rid) if handle is None else handle))
        finally:
            self.door.rid = None
            self._poll_s += time.perf_counter() - t0
        if op is None:
            return ready
        if not ready:
            return False
        handle = self.handles.pop(rid, None)
        if op.ticketed:  # SGLang took the ticket; the data path stages what the acks agreed
            self._take_ticket(op)
            self.rig.forget(handle)
        else:  # as the project's poll ends it (SGLang's end path: module doc)
            self._end_at_poll(op)
        return True

    def _mirror(self, op) -> None:
        """What the data path's IO has done, in SGLang's operation before its poll reads
        it: the agreed hit's pages and the tokens completed (0.5.18's wait_complete and
        timeout compare them; 0.5.19 on read them only with host slots, never here)."""
        handle = self.handles.get(op.rid)
        if handle is not None:
            mirror = self.rig.operation(handle)
            mirror.hash_value = list(op.hash_value) if op.host_slots is not None else []
            mirror.completed_tokens = op.completed_tokens

    @property
    def poll_timing(self) -> tuple[float, float, bool]:
        """SGLang's polls' host seconds this step (no twin)."""
        return self._poll_s, 0.0, False

    def close(self) -> None:
        self.door.listener = self.door.failure = None
        self.door.delay_s = 0.0
        super().close()
        # Every run: each collective SGLang issued here came from this SPEC's own files
        # (several SGLangs in one run: each side's from its own, never another's).
        stray = self.door.own_files()
        if stray:
            raise LoadError(f"sglang {self.target.label}: {stray}")

