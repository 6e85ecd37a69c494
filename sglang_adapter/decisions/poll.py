"""SGLang's own poll on real gloo ranks: UnifiedRadixCache.check_prefetch_progress, its
`_can_terminate_prefetch`, `_all_reduce` / `_pp_sync` and `@rank_consensus` decorators as
shipped (0.5.18: HiRadixCache.check_prefetch_progress and `can_terminate_prefetch`),
called once per scheduler step on every rank of a TP x PP grid, for one pending
prefetch, until it may end; before each poll the step's check_hicache_events (its packed
per-step reduce and `_pp_sync`), as the scheduler calls it before its walk.

Real (from the source, unchanged): the cache class and every method on this path, the
cache controller class (`terminate_prefetch`, `append_host_mem_release`),
`PrefetchOperation`, `PollTimer`, `StoragePrefetchRetries`, the process groups' collectives.
Stand-ins, and why:
- the cache and controller objects are built without their `__init__` (it wants device and
  host KV pools, a model config and server args): the attributes this path reads are set as
  `__init__` / `_reset_full` / `init_hicache` would set them; no background thread runs;
- the tree core: only its page size is read on this path (no `torch.distributed` call
  under `mem_cache/unified_cache/` or in `radix_cache.py`: it issues no collective);
- the prefetch's IO never lands (no host slots, `host_indices` None): a best_effort or
  timeout end revokes it, as SGLang does for a prefetch whose hit was not yet agreed;
  wait_complete's end is its completion's (UnifiedRadixCache: the ack drain,
  `_drain_ack_prefetch` -> `_handle_prefetch_result`; HiRadixCache: the poll that finds
  every page landed, then the completion MIN and the tree insert), stood in for by removing
  it from `ongoing_prefetch` after the pending polls: the completion's collectives are not
  issued here;
- the clock: SGLang's wall clock (`time.perf_counter` in PollTimer, `time.monotonic` in the
  0.5.19 timeout check) is a virtual one that advances by one step per poll, the same on
  every rank, so a timeout ends after exactly the pending polls asked for (a pinned
  schedule).
"""

from __future__ import annotations

import json
import threading
import time
import types
from queue import Queue

import torch
import torch.distributed as dist

from sglang_adapter.decisions.cases import PAGE, POLICIES, STEP_S, PollCase  # noqa: F401 (re-exported)
from sglang_adapter.door import Door
from sglang_adapter.loader import HIRADIX, UNIFIED, Loaded, LoadError, load
from sglang_adapter.source import Source

CONTROLLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller"


class VirtualTime:
    """Stands in for the `time` module in SGLang's timing modules: perf_counter and
    monotonic read the rig's virtual clock; everything else is the real module."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def grid_groups(rank: int, tp: int, pp: int) -> tuple:
    """(tp group of this rank's stage, pp group of its TP column), gloo; created on every
    rank in one order (new_group is collective). None where the group has one rank."""
    tp_group = pp_group = None
    for s in range(pp):
        g = dist.new_group([s * tp + i for i in range(tp)], backend="gloo")
        tp_group = g if rank // tp == s else tp_group
    for t in range(tp):
        g = dist.new_group([s * tp + t for s in range(pp)], backend="gloo")
        pp_group = g if rank % tp == t else pp_group
    return (tp_group if tp > 1 else None), (pp_group if pp > 1 else None)


class PollRig:
    """One rank's cache and controller, built for the step and poll path (the class the
    release builds: UnifiedRig or HiRadixRig, `make_rig`)."""

    def __init__(self, loaded: Loaded, rank: int, tp: int, pp: int, tp_group, pp_group):
        self.loaded, self.clock = loaded, VirtualTime()
        for module in (*loaded.modules.values(), _poll_timer()):  # SGLang's clock: virtual
            # `time`, or an earlier rig's clock (one rig per serve in `bench run`)
            now = getattr(module, "time", None) if module is not None else None
            if now is time or isinstance(now, VirtualTime):
                module.time = self.clock
        cache = object.__new__(loaded.cache_class)
        cache.tp_group, cache.pp_group = tp_group, pp_group
        # Plain TP (no context parallel, no DP attention): the attention TP group holds the
        # TP ranks (kv_cache_builder.py passes attn_tp_group.cpu_group) and the CP group
        # one rank, which _all_reduce_attn_groups skips as it skips None.
        cache.attn_cp_group, cache.attn_tp_group = None, tp_group
        cache.tp_world_size = tp
        cache.pp_rank, cache.pp_size = rank // tp, pp
        cache.work_list, cache.ongoing_prefetch = [], {}
        cache.enable_storage_metrics, cache.storage_metrics_collector = False, None
        self.cache = cache
        self._build(cache)

    def _build(self, cache) -> None:
        raise NotImplementedError

    def admit(self, case: PollCase, rid: str):
        raise NotImplementedError

    def set_budget(self, seconds: float) -> None:
        raise NotImplementedError

    def pending(self, handle) -> bool:
        """Whether SGLang's cache still holds the prefetch (the walk's poll is one)."""
        return handle in self.cache.ongoing_prefetch

    def configure(self, policy: str, page_size: int, base_s: float,
                  per_ki_token_s: float) -> None:
        """A serve's settings (`bench run --cache sglang`): the stop policy, the page size
        and the timeout budget as SGLang's config carries them."""
        raise NotImplementedError

    def step(self) -> None:
        """The per-step agreement, SGLang's check_hicache_events, as the scheduler calls it
        before its walk: with no thread running every queue it counts is empty, so what it
        drains is nothing; its reductions are issued all the same."""
        self.cache.check_hicache_events()

    def serve(self, case: PollCase, rid: str, door: Door) -> dict:
        """Steps until one prefetch ends, each step SGLang's check_hicache_events (counted
        under `<rid>/step`) then its poll (under `rid`); returns the poll count and how
        it ended."""
        self.cache.prefetch_stop_policy = case.policy
        # The budget runs out between the last pending poll and the next (virtual clock).
        self.set_budget((case.pending_polls - 0.5) * STEP_S)
        handle = self.admit(case, rid)
        polls = 0
        while True:
            polls += 1
            door.rid = f"{rid}/step"
            self.step()
            door.rid = rid
            if self._ready(case, handle, polls):
                return {"polls": polls, "pending_polls": polls - 1,
                        "ended": "completed" if case.policy == "wait_complete" else "poll"}
            self.clock.now += STEP_S
            assert polls <= case.pending_polls + 1, "the poll never ended"

    def _ready(self, case: PollCase, handle, polls: int) -> bool:
        if case.policy == "wait_complete" and polls > case.pending_polls:
            # Its completion ended it between steps (module docstring).
            self.cache.ongoing_prefetch.pop(handle, None)
        return bool(self.cache.check_prefetch_progress(handle))


class UnifiedRig(PollRig):
    """UnifiedRadixCache with a HybridCacheController (0.5.19 on)."""

    def _build(self, cache) -> None:
        # Read on this path: the page size, whether storage is on, and the write-back
        # reclaim digest the per-step reduce carries (0: no write-back reclaim here).
        cache.tree_core = types.SimpleNamespace(page_size=PAGE, enable_storage=True,
                                                write_back_duplicate_reclaim_digest=0)
        cache.linker = None
        cache.host_memory_mode, cache.buffer_pipeline = "cache", None
        cache.prefetch_timeout_per_page = 0.0
        _reset_prefetch_state(cache, self.loaded.modules[UNIFIED])
        ctl = object.__new__(self.loaded.attr(CONTROLLER, "HybridCacheController"))
        ctl.pp_prefetch_decisions, ctl.prefetch_tokens_occupied = {}, 0
        # The PP-ticket path's state as __init__ makes it; its command thread does not run.
        ctl.pp_prefetch_states, ctl.pp_prefetch_state_lock = {}, threading.Lock()
        ctl.pp_prefetch_command_thread = None
        _empty_queues(ctl)
        cache.cache_controller = ctl

    def set_budget(self, seconds: float) -> None:
        self.cache.prefetch_timeout_base = seconds

    def configure(self, policy: str, page_size: int, base_s: float,
                  per_ki_token_s: float) -> None:
        self.cache.prefetch_stop_policy = policy
        self.cache.tree_core.page_size = page_size
        # The budget per page as unified_cache/storage_attachment.py apply_runtime_config
        # derives it from the per-1024-token figure.
        self.cache.prefetch_timeout_base = base_s
        self.cache.prefetch_timeout_per_page = per_ki_token_s * page_size / 1024

    def admit(self, case: PollCase, rid: str):
        return self.register(rid, list(range(case.prompt_tokens)))

    def handle(self, rid: str):
        """The key SGLang's cache keeps a request's prefetch under (0.5.23: a handle)."""
        handle_cls = getattr(self.loaded.modules[UNIFIED], "CacheRequestHandle", None)
        return rid if handle_cls is None else handle_cls(rid, 0)

    def register(self, rid: str, tokens: list[int]):
        """The ongoing prefetch prefetch_from_storage would have registered (no host
        slots yet: its hit was not agreed); returns its handle."""
        urc = self.loaded.modules[UNIFIED]
        handle = self.handle(rid)
        op = self.loaded.attr(CONTROLLER, "PrefetchOperation")(handle, tokens)
        op.stats_requested_tokens = len(tokens)
        self.cache.ongoing_prefetch[handle] = urc._OngoingPrefetch(
            None, tokens, None, op, None, {})
        return handle

    def register_ticket(self, rid: str, tokens: list[int], ready: threading.Event):
        """A prefetch on the PP-ticket path (buffer_only, PP > 1), held as SGLang holds one:
        the request bound to its ticket (`bind_prefetch_ticket`, as the scheduler binds it:
        scheduler.py:3117, 3325) and the ticket's state in the controller, as
        `submit_prefetch` (stage 0) or the command thread (later stages) registers it.
        `ready` is set by the data path's ack thread at the ticket's final ack, where
        SGLang's `prefetch_sync_thread_func` sets the state's ready_event. Stand-ins: the
        ticket itself (None: with no host slots SGLang's poll never reads it) and the host
        slots (None: the poll takes its no-buffer branch; the data path stages the pages)."""
        state_cls = getattr(self.loaded.modules[CONTROLLER], "PPPrefetchState", None)
        if state_cls is None:  # 0.5.20 and before: the run asks what this SGLang lacks
            raise LoadError(f"sglang {self.loaded.source.label}: cannot drive a buffer_only "
                            "prefetch at PP > 1: no PP-ticket path (PPPrefetchState)")
        handle = self.handle(rid)
        op = self.loaded.attr(CONTROLLER, "PrefetchOperation")(handle, tokens)
        op.is_pp_broadcast, op.stats_requested_tokens = True, len(tokens)
        ctl = self.cache.cache_controller
        with ctl.pp_prefetch_state_lock:
            ctl.pp_prefetch_states[rid] = state_cls(ticket=None, operation=op,
                                                    ready_event=ready)
        self.cache.bind_prefetch_ticket(rid)
        return handle

    def _ticket(self, handle):
        """The PP-ticket state SGLang's controller holds for the handle's request, if any
        (0.5.19 keys by the request id itself)."""
        return self.cache.cache_controller.pp_prefetch_states.get(getattr(handle, "rid", handle))

    def pending(self, handle) -> bool:
        """Whether SGLang still holds the prefetch: ongoing, or a ticket not yet taken."""
        state = self._ticket(handle)
        return super().pending(handle) or (state is not None and not state.consumed)

    def operation(self, handle):
        info = self.cache.ongoing_prefetch.get(handle)
        return info.operation if info is not None else self._ticket(handle).operation

    def forget(self, handle) -> None:
        if self._ticket(handle) is not None:
            # a ticket retires as at the request's end (claim_kv_row -> release_pp_prefetch)
            self.cache.cache_controller.release_pp_prefetch(handle.rid)
            return
        self.cache.revoke_pending_prefetch(handle)


class HiRadixRig(PollRig):
    """HiRadixCache with a HiCacheController (0.5.18): pre27010's poll, one MAX over the
    attention TP group in can_terminate_prefetch, no PP agreement."""

    def _build(self, cache) -> None:
        cache.page_size, cache.enable_storage = PAGE, True
        cache.ongoing_write_through, cache.ongoing_load_back = {}, {}
        cache.metrics_collector = None
        cache.prefetch_loaded_tokens_by_reqid = {}
        cache.is_prefetch_timeout = cache._prefetch_timeout_check_linear_func  # as __init__
        ctl = object.__new__(self.loaded.attr(HIRADIX, "HiCacheController"))
        ctl.prefetch_tokens_occupied = 0
        _empty_queues(ctl)
        cache.cache_controller = ctl

    def configure(self, policy: str, page_size: int, base_s: float,
                  per_ki_token_s: float) -> None:
        self.cache.prefetch_stop_policy, self.cache.page_size = policy, page_size
        self.set_budget(base_s, per_ki_token_s)

    def set_budget(self, seconds: float, per_ki_token_s: float = 0.0) -> None:
        # SGLang's own parse of --hicache-storage-backend-extra-config builds the config.
        extra = json.dumps({"prefetch_timeout_base": seconds,
                            "prefetch_timeout_per_ki_token": per_ki_token_s})
        self.cache.prefetch_timeout_config = \
            self.cache._parse_storage_backend_extra_config(extra)[2]

    def admit(self, case: PollCase, rid: str):
        return self.register(rid, list(range(case.prompt_tokens)))

    def handle(self, rid: str):
        return rid

    def register(self, rid: str, tokens: list[int]):
        """The ongoing prefetch prefetch_from_storage would have registered: its anchor
        protected on the host (a root-level node), no host slots yet."""
        node = self.loaded.attr("sglang.srt.mem_cache.radix_cache", "TreeNode")()
        node.protect_host()
        op = self.loaded.attr(HIRADIX, "PrefetchOperation")(rid, tokens)
        self.cache.ongoing_prefetch[rid] = (node, tokens, op)
        return rid

    def operation(self, handle):
        return self.cache.ongoing_prefetch[handle][2]

    def forget(self, handle) -> None:
        self.cache._revoke_pending_prefetch(handle)


def make_rig(loaded: Loaded, rank: int, tp: int, pp: int, tp_group, pp_group) -> PollRig:
    rig = HiRadixRig if loaded.family == "hiradix" else UnifiedRig
    return rig(loaded, rank, tp, pp, tp_group, pp_group)


def _empty_queues(ctl) -> None:
    """The controller's queues as __init__ makes them; no thread fills them here."""
    ctl.ack_write_queue, ctl.ack_load_queue, ctl.write_queue = [], [], []
    for name in ("prefetch_hit_queue", "ack_prefetch_queue", "ack_backup_queue",
                 "host_mem_release_queue"):
        setattr(ctl, name, Queue())
    ctl.extra_host_mem_release_queues = {}


def _poll_timer():
    import sys
    return sys.modules.get("sglang.srt.utils.poll_timer")


def _reset_prefetch_state(cache, urc) -> None:
    """The per-prefetch bookkeeping `_reset_full` creates (the names this release has)."""
    cache._storage_prefetch_wait = {}
    cache._storage_prefetch_hit_remaining_by_reqid = {}
    cache._storage_prefetch_missed_rids = set()
    cache.prefetch_loaded_tokens_by_reqid = {}
    retries = getattr(urc, "StoragePrefetchRetries", None)
    if retries is not None:
        cache.storage_prefetch_retries = retries()
    cache.storage_existence_cache = None


def poll_rank(rank: int, world: int, source: Source, tp: int, pp: int,
              cases: list[PollCase]) -> dict:
    """A spawned rank (bench.run.launch): loads SGLang, polls each case, returns the
    door's calls per request and the crosscheck against torch's sequence numbers."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    loaded = load(source)
    tp_group, pp_group = grid_groups(rank, tp, pp)
    door = Door(source.root)
    door.register("tp", tp_group)
    door.register("pp", pp_group)
    rig = make_rig(loaded, rank, tp, pp, tp_group, pp_group)
    door.install()
    try:
        outcomes = {}
        for i, case in enumerate(cases):
            rid = f"{case.policy}-{i}"
            outcomes[rid] = rig.serve(case, rid, door)
        for work in rig.cache.work_list:  # the PP hop's sends, paired by the recvs
            work.wait()
    finally:
        door.uninstall()
    dist.barrier()
    return {"outcomes": outcomes, "crosscheck": door.crosscheck(),
            "calls": [(c.site, c.group, c.op, c.rid, c.via, n) for c, n in door.calls.items()]}
