"""SGLang's PP-ticket path on the controller path: buffer_only host memory at PP > 1
(`bench run --cache sglang --sglang-path controller --host-memory buffer_only --pp N`).

Who does what, as 0.5.21-0.5.23 ship it (read in 0.5.23):
- **the ticket**: PP stage 0's scheduler calls `_prefetch_kvcache` when a request arrives
  (scheduler.py:3321-3325); SGLang's `prefetch_from_storage` asks the controller's
  `get_prefetch_submission`, then `submit_prefetch` queues a `PPPrefetchTicket` (its own
  `PrefetchOperation`, `is_pp_broadcast`) and the scheduler binds the request to it
  (`bind_prefetch_ticket(rid, ticketed)`, the decision a miss records as SKIPPED);
- **the relay**: stage 0's scheduler sends the request, its `pp_prefetch_ticketed` flag set,
  down the stages with its request relay (scheduler_pp_mixin.py `_pp_send_pyobj_to_next_stage`:
  a pyobj P2P on the world group from the stage's TP rank 0, then a broadcast inside the
  stage); a later stage binds the ticket when it handles the request (scheduler.py:3116);
- **the broadcast**: the controller's command thread (`pp_prefetch_command_thread_func`, on
  the gloo copy of the PP group that `attach_storage_backend` makes: hybrid_cache_controller
  .py:327-340) broadcasts each ticket from stage 0 down its TP column (`broadcast_pyobj`: a
  length, then the bytes; an empty one after 60 idle seconds); on every rank it then queries
  storage, allocates the host slots itself and MIN-agrees the hit over every sync group
  (`_sync_prefetch_hit_query`), and hands the operation to the IO thread; the ack thread
  reduces each batch's ack and its final ack sets the ticket's `ready_event`: nothing of a
  ticket goes through the scheduler's hit or ack drains;
- **the poll**: `check_prefetch_progress` of a ticketed request is
  `_check_pp_prefetch_progress`: stage 0's readiness MAX-reduced over its TP group and relayed
  by `_pp_sync`, every poll, whatever the stop policy; once ready every rank waits for its
  own final ack (`take_ready_pp_prefetch`) and `BufferModePipeline.stage_completed_prefetch`
  parks the bounce until prefill admission; the ticket retires when the request finishes
  (`claim_kv_row` -> `release_pp_prefetch`).

All of it runs real from the wheel here, with these stand-ins:
- the request relay is the harness's: its request broadcast already hands every rank each
  arrival in the same step; stage 0's flag follows on the harness's own world group
  (`relay`, uncounted: the scheduler's relay is no HiCache collective and the model prices
  none), from global rank 0 (stage 0's TP rank 0, whose flag SGLang's relay carries);
- `BufferModePipeline` is SGLang's own, built by its FULL component's
  `create_buffer_pipeline` over a device pool of the harness's size (`_DevicePool`); its
  anchor pin finds no device prefix (the harness keeps no device tree at buffer_only: the
  tree core answers an empty match), and the bounce it parks is consumed by the harness's
  load-back (`consumed`), as SGLang's `init_load_back` and H2D ack would consume it.
"""

from __future__ import annotations

import linecache
import sys
import warnings
from queue import Queue

import torch
import torch.distributed as dist

PIPELINE = "sglang.srt.mem_cache.buffer_mode.pipeline"
BELIEFS = "sglang.srt.mem_cache.buffer_mode.storage_existence_cache"
COMPONENTS = "sglang.srt.mem_cache.unified_cache.components"
FULL = "sglang.srt.mem_cache.unified_cache.components.full"
PARALLEL = "sglang.srt.distributed.parallel_state"
CONTROLLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller"
# broadcast_pyobj wraps its pickle's read-only bytes in a tensor (utils/common.py): torch
# warns once per process, mid-progress line; the bytes are only read.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def missing() -> str | None:
    """What this SGLang lacks of the PP-ticket path (None: it has it all)."""
    import importlib
    try:
        ctl = importlib.import_module(CONTROLLER)
        for name in (PIPELINE, BELIEFS, FULL):
            importlib.import_module(name)
    except ImportError as e:
        return f"no buffer-mode pipeline ({e})"
    if not hasattr(ctl, "PPPrefetchState"):
        return "no PP-ticket path (PPPrefetchState)"
    gap = _builder(sys.modules[FULL].FullComponent)[2]
    return None if gap is None else f"a buffer-mode pipeline this adapter cannot build ({gap})"


class _DevicePool:
    """What BufferModePipeline's `__init__` reads of the device KV allocator: its size."""

    def __init__(self, tokens: int):
        self.size = self.size_full = tokens

    def get_kvcache(self):
        return self


def buffer_mode(cache, device_tokens: int, max_context_len: int) -> None:
    """What `init_hicache` builds for buffer_only host memory on a FULL-only tree
    (unified_radix_cache.py:455-560): the mode, the existence beliefs `__init__` makes, the
    FULL component (its `build_hicache_transfers` answers a buffer-mode prefetch) and the
    pipeline that component creates."""
    ct = sys.modules[COMPONENTS].ComponentType
    full = object.__new__(sys.modules[FULL].FullComponent)
    full.component_type, full.cache = ct.FULL, cache
    cache.host_memory_mode = "buffer_only"
    cache.components = {ct.FULL: full}
    cache.storage_existence_cache = sys.modules[BELIEFS].StorageExistenceCache()
    cache.token_to_kv_pool_allocator = _DevicePool(device_tokens)
    cache.buffer_pipeline = _pipeline(full, cache)(
        write_backlog_cap=2 * device_tokens, max_context_len=max_context_len)


# What a FULL-only tree passes for the SWA window, by the name each release's builder takes:
# 0.5.23 `swa_component` (and `auxiliary_swa_component`), 0.5.21-0.5.22 `swa_window_pages`
# (0 = KV-only: unified_radix_cache.py's `init_hicache`).
NO_SWA = {"swa_component": None, "auxiliary_swa_component": None, "swa_window_pages": 0}


def _builder(full_class) -> tuple[object, dict, str | None]:
    """The release's pipeline builder (the FULL component's `create_buffer_pipeline`, 0.5.22
    on; else `BufferModePipeline` itself, as 0.5.21's `init_hicache` builds it), the SWA
    arguments it takes, and the parameter it wants that the harness has no value for
    (None: it can be built)."""
    import inspect

    build = getattr(full_class, "create_buffer_pipeline", None)
    if build is None:
        build = sys.modules[PIPELINE].BufferModePipeline
    known = {"self", "cache", "write_backlog_cap", "max_context_len"}
    swa, gap = {}, None
    for name, p in inspect.signature(build).parameters.items():
        if name in NO_SWA:
            swa[name] = NO_SWA[name]
        elif name not in known and p.default is p.empty and gap is None and \
                p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            gap = f"{build.__qualname__} takes {name!r}, which the harness has no value for"
    return build, swa, gap


def _pipeline(full, cache):
    """`_builder`'s builder with the SWA arguments (and 0.5.21's cache) bound."""
    import functools

    build, swa, gap = _builder(type(full))
    if gap is not None:
        raise TypeError(gap)  # missing() refused it before any rank served
    if getattr(type(full), "create_buffer_pipeline", None) is not None:
        return functools.partial(full.create_buffer_pipeline, **swa)
    return functools.partial(build, cache=cache, **swa)


def command_group(ctl) -> None:
    """`attach_storage_backend`'s PP-ticket group (hybrid_cache_controller.py:327-340): a
    gloo copy of the PP group, made before the sync groups; `_start_storage_threads` then
    starts the command thread on it."""
    if ctl.pp_group is None or dist.get_world_size(group=ctl.pp_group) <= 1:
        return
    ctl.pp_prefetch_command_group = sys.modules[PARALLEL].create_custom_parallel_group(
        group_ranks=dist.get_process_group_ranks(ctl.pp_group), backend="gloo")


def relay(ticketed: bool | None) -> bool:
    """Stage 0's `pp_prefetch_ticketed` flag for one arrival, from global rank 0 to every
    rank (module docstring: the request relay's stand-in, on the harness's world group)."""
    flag = torch.tensor([int(bool(ticketed))])
    dist.broadcast(flag, src=0)  # the harness's, uncounted: not SGLang's, not the model's
    return bool(flag.item())


def payload(call, marker: str) -> bool:
    """Whether this call of SGLang's is `broadcast_pyobj`'s second broadcast, the object's
    bytes (read from SGLang's own line: it broadcasts `tensor_data`), not its length."""
    path, _, line = call.site.rpartition(":")
    return "tensor_data" in linecache.getline(marker + path.rpartition(":")[0], int(line))


class WatchedBuffer(Queue):
    """SGLang's prefetch_buffer, telling `on_put` of each operation handed to the IO thread
    (a ticket's agreed hit is set just before: `pp_prefetch_command_thread_func`)."""

    on_put = None

    def put(self, item, block=True, timeout=None) -> None:
        if item is not None and self.on_put is not None:
            self.on_put(item)
        super().put(item, block, timeout)


class Tickets:
    """One rank's tickets on the controller path (module docstring), for ControllerCache."""

    def __init__(self, rig, page: int):
        self.rig, self.page = rig, page
        self.stage = rig.layout[0] // rig.layout[1]
        self.held: dict[str, object] = {}  # rid -> handle, bound and not yet taken
        self.hit: dict[str, int] = {}  # rid -> the agreed hit's pages, at the IO hand-off
        self.on_hand = None  # pinned: sglang_adapter.controller.pinned.TicketPin.handed
        buffer = rig.cache.cache_controller.prefetch_buffer
        if not isinstance(buffer, WatchedBuffer):
            buffer.__class__ = WatchedBuffer  # SGLang's IO thread already waits on it
        buffer.on_put = self._handed

    def _handed(self, operation) -> None:
        if getattr(operation, "is_pp_broadcast", False):
            self.hit[operation.request_id] = len(operation.hash_value)
            if self.on_hand is not None:
                self.on_hand(operation)

    def admit(self, rid: str, issue) -> bool:
        """An arrival as SGLang's schedulers handle it: stage 0 prefetches (`issue`, SGLang's
        prefetch_from_storage: its decision) and binds; its flag is relayed; a later stage
        binds when the flag says ticketed, then prefetches (a no-op there:
        `get_prefetch_submission`). Returns whether the request holds a ticket here."""
        cache = self.rig.cache
        decision = issue() if self.stage == 0 else None
        if self.stage == 0:
            cache.bind_prefetch_ticket(rid, bool(decision))  # scheduler.py:3325
        ticketed = relay(decision)
        if self.stage > 0:
            if ticketed:
                cache.bind_prefetch_ticket(rid)  # scheduler.py:3116-3117
            issue()  # _add_request_to_queue's _prefetch_kvcache (scheduler.py:3492)
        mine = cache.cache_controller.pp_prefetch_decisions.get(rid)
        if mine is not None and mine.name == "TICKETED":
            self.held[rid] = self.rig.handle(rid)
        return rid in self.held

    def pending(self) -> bool:
        """A ticket bound here and not yet taken by a poll, or one SGLang's threads hold."""
        ctl = self.rig.cache.cache_controller
        with ctl.pp_prefetch_state_lock:
            flying = any(not s.consumed for s in ctl.pp_prefetch_states.values())
        return bool(self.held) or flying

    def taken(self, rid: str) -> tuple[list[int], int, int, list[str]]:
        """SGLang's poll took the ticket (`_check_pp_prefetch_progress`): the host slots of
        the bounce it parked (none for a miss or nothing completed), the tokens in them, the
        agreed hit's pages and SGLang's names of the parked pages."""
        handle = self.held.pop(rid)
        staged = self.rig.cache.buffer_pipeline.staged_prefetches.get(handle)
        hit = self.hit.pop(rid, 0)
        if staged is None:
            return [], 0, hit, []
        index = staged.host_indices.tolist()[:: self.page]
        return ([i // self.page for i in index], staged.num_tokens, hit,
                list(staged.hash_values))

    def consumed(self, rid: str) -> None:
        """The harness's load-back took the bounce (and frees its slots): SGLang's staged
        hold leaves as its H2D ack would retire it (`try_finish_load_back`)."""
        cache = self.rig.cache
        handle = self.rig.handle(rid)
        staged = cache.buffer_pipeline.staged_prefetches.pop(handle, None)
        if staged is None:
            return
        cache.buffer_pipeline.release_anchor_lock(handle)
        cache.cache_controller.prefetch_tokens_occupied -= staged.occupied_tokens
        cache._finish_storage_prefetch(handle, fulfilled_tokens=staged.num_tokens, reason=None)

    def release(self, rid: str) -> None:
        """The request finished: its ticket retires (`claim_kv_row` -> release_pp_prefetch)."""
        self.held.pop(rid, None)
        self.rig.cache.cache_controller.release_pp_prefetch(rid)


__all__ = ["Tickets", "buffer_mode", "command_group", "missing", "relay"]
