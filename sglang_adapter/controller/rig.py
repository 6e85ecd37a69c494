"""SGLang's own controller path on real gloo ranks (0.5.19 on: UnifiedRadixCache with a
HybridCacheController): `prefetch_from_storage`, the controller's prefetch (hit-query), IO,
ack-sync and backup threads with their collectives on the groups SGLang makes itself,
`check_hicache_events`' drains consuming their queues, `check_prefetch_progress`, and the
end of a prefetch (`_handle_prefetch_result`), over the harness's storage tier.

Real (from the wheel, unchanged): everything above, `HybridCacheController.prefetch` /
`submit_prefetch` / `allocate_storage_hit` / `append_host_mem_release`, the base
controller's `prefetch_thread_func`, `_storage_hit_query`, `_sync_prefetch_hit_query`,
`prefetch_io_aux_func`, `_page_transfer`, `_generic_page_get`, `prefetch_sync_thread_func`,
`_reduce_prefetch_ack`, `_create_sync_groups` (SGLang's `create_custom_parallel_group`:
its own gloo groups) and `_start_storage_threads`; the backend is built by SGLang's
`StorageBackendFactory` ("dynamic") from `sglang_adapter.controller.storage.HarnessStorage`, a
subclass of the wheel's `HiCacheStorage`.

Stand-ins, and why (docs/sglang.md, "SGLang's own controller path"):
- the controller object is built without `__init__` (it reads the device KV pool's
  `device`, `layer_num` and layer-transfer counter, and `attach_storage_backend` reads a
  launched server's `get_parallel()` / `get_flags()`): the attributes they set are set here
  as they set them, the storage config from this rank's layout; every step after that is
  SGLang's own (`attach`, below);
- the host pool group and the tree core (sglang_adapter.controller.stand_ins): memory-less;
- the cache object as the poll rig builds it (sglang_adapter.decisions.poll.UnifiedRig), plus what
  `prefetch_from_storage` and the drains read (`__init__` / `_reset_full` / `init_hicache`).
The clock: SGLang's threads run on real time; the rig's virtual clock drives only the
timeout budget (as in the poll rig). How many polls a prefetch takes is therefore the
threads' real timing, not pinned.
Layout: any TP x PP, with the stage's TP group and the TP column's PP group as SGLang's
scheduler hands them to its cache (sglang_adapter.controller.rank.held_against_model
prices each stage; that module drives the rig's own checks, a request at a time).
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections import defaultdict
from queue import Queue

import torch.distributed as dist

from hicache.memory.hashing import page_hashes
from hicache.memory.pools import expected_rows
from sglang_adapter.controller import tickets
from sglang_adapter.controller.stand_ins import (
    TIER,
    HostPool,
    HostPoolGroup,
    Tier,
    TreeCore,
    digest,
)
from sglang_adapter.decisions.poll import CONTROLLER, UnifiedRig
from sglang_adapter.door import Door
from sglang_adapter.loader import UNIFIED, Loaded, LoadError

BASE = "sglang.srt.mem_cache.base_prefix_cache"
STORAGE = "sglang.srt.mem_cache.hicache_storage"
FACTORY = "sglang.srt.mem_cache.storage.backend_factory"
UTILS = "sglang.srt.mem_cache.utils"
GROUP = "sglang.srt.mem_cache.pool_host.group"  # PoolEntry
STEP_WAIT_S = 0.01  # real time between two steps: SGLang's threads run meanwhile
PAGE_ELEMS = 16  # values per stored page (content is synthetic; only its digest is kept)
POOL = "kv"
TICKET_GROUP = "sglang_ticket"  # the PP-ticket path's command group, as the door names it


@dataclasses.dataclass(frozen=True)
class RigSetup:
    """What one rank's controller path is built over: the storage tier's store (read after
    `stall_s`), the host pool's size and the page size. `host` / `tree`: the host pool and
    tree core SGLang's path writes into (default the memory-less stand-ins; `bench run
    --cache sglang --sglang-path controller` passes ones over the harness's own pool and
    tree: sglang_adapter.controller.cache). `threshold`: the prefetch threshold in tokens
    (0: one page). `buffer_only`: host memory is staging only, (device pool tokens, max
    context length) for SGLang's BufferModePipeline; at PP > 1 its PP-ticket path
    (sglang_adapter.controller.tickets). `door`: names the ticket group before its command
    thread's first receive is issued (a later stage's thread waits in one). `sidecar`: a
    side-car pool, (its host pool, its hit policy: all_pages or trailing_pages), registered
    as SGLang registers one (`register_sidecar`)."""

    storage: object
    host_tokens: int
    page_size: int
    stall_s: float = 0.0
    host: object = None
    tree: object = None
    page_elems: int = PAGE_ELEMS
    threshold: int = 0
    buffer_only: tuple[int, int] | None = None
    door: Door | None = None
    sidecar: tuple[object, str] | None = None


class ControllerRig(UnifiedRig):
    """One rank's UnifiedRadixCache with SGLang's own HybridCacheController and threads."""

    def __init__(self, loaded: Loaded, rank: int, tp: int, pp: int, tp_group, pp_group,
                 setup: RigSetup):
        page_size, host_tokens = setup.page_size, setup.host_tokens
        self.sidecar = setup.sidecar
        self.page_size, self.host_tokens = page_size, host_tokens
        self.buffer_only, self.door = setup.buffer_only, setup.door
        self.decision = None  # what SGLang's last prefetch_from_storage returned
        self.threshold = setup.threshold or page_size
        self.tier = Tier(setup.storage, POOL, setup.page_elems, stall_s=setup.stall_s)
        self.host = setup.host or HostPool(host_tokens, page_size, setup.page_elems)
        self.tree = setup.tree
        self.layout = (rank, tp, pp)
        super().__init__(loaded, rank, tp, pp, tp_group, pp_group)

    def _build(self, cache) -> None:
        super()._build(cache)  # the poll rig's cache: groups, policy, per-prefetch state
        base = self.loaded.modules[UNIFIED]
        if self.tree is None:
            self.tree = TreeCore(self.page_size, _module(BASE).IncLockRefResult,
                                 _module(BASE).DecLockRefResult)
        cache.tree_core, cache.disable = self.tree, False
        cache.tree_components, cache.components = (base.BASE_COMPONENT_TYPE,), {}
        cache.sidecar_pool_specs, cache.prefetch_threshold = [], self.threshold
        cache._prefetch_outcome_stats = defaultdict(int)
        cache.prefetch_loaded_storage_start_by_reqid, cache.ongoing_backup = {}, {}
        cache.ongoing_write_through, cache.ongoing_load_back = {}, {}
        cache.hicache_storage_pass_prefix_keys = False  # __init__'s default
        # As __init__ embeds it: 0.5.19's lock calls (the write path's inc_lock_ref) ask it
        # first, and it hands every node that is no session's back to the tree core.
        cache.session = base.StreamingSession(cache)
        if self.buffer_only is not None:
            why = tickets.missing()  # a tree before 0.5.21 (a release is refused earlier)
            if why is not None:
                raise LoadError(f"sglang {self.loaded.source.label}: buffer_only on the "
                                f"controller path needs SGLang's PP-ticket path: {why}")
            tickets.buffer_mode(cache, *self.buffer_only)
        cache.cache_controller = self._controller(cache)
        if self.sidecar is not None:
            self.register_sidecar(cache, *self.sidecar)

    def register_sidecar(self, cache, host, policy: str) -> None:
        """A side-car pool as SGLang registers one once the controller is attached
        (`register_sidecar_pool`): its spec (the indexer's: a KV-derived pool, reusing the
        KV pool's host slots and page names, read with each KV batch; the run's hit
        policy), and a host-pool-group entry over `host`. The entry's steps are
        `register_host_pool_entry`'s, taken here: its first is a type check against
        SGLang's HostPoolGroup, which the stand-in group is not; then the group adds the
        entry, the controller makes the pool's release queue (which SGLang's per-step
        count MIN then carries) and the backend registers the pool
        (`register_mem_host_pool_v2`)."""
        hs = _module(STORAGE)
        name = hs.PoolName.INDEXER
        entry = importlib.import_module(GROUP).PoolEntry(
            name=name, host_pool=host, device_pool=None, layer_mapper=lambda layer: layer)
        ctl = cache.cache_controller
        ctl.mem_pool_host.add_entry(entry)
        ctl.extra_host_mem_release_queues.setdefault(name, Queue())
        ctl.storage_backend.register_mem_host_pool_v2(host, name)
        cache.register_sidecar_pool(hs.SidecarPoolSpec(
            pool_name=name, indices_from_pool=hs.PoolName.KV,
            hit_policy=hs.PoolHitPolicy(policy)))

    def _controller(self, cache):
        """The controller as `__init__` leaves it, then attached as
        `attach_storage_backend` attaches it (module docstring)."""
        kv = _module(STORAGE).PoolName.KV
        ctl = object.__new__(self.loaded.attr(CONTROLLER, "HybridCacheController"))
        ctl.tp_group, ctl.attn_cp_group, ctl.attn_tp_group = cache.tp_group, None, cache.tp_group
        ctl.pp_group, ctl.host_memory_mode, ctl.is_kv_sharded = cache.pp_group, "cache", False
        ctl.prefetch_hits_sync_groups, ctl.prefetch_completion_sync_groups = [], []
        ctl.mem_pool_host = HostPoolGroup(self.host, kv)
        ctl.storage_host_pool, ctl.page_size = self.host, self.page_size
        # the write policy: the run's, once the write path is adopted (controller.writes)
        ctl.write_policy, ctl.io_backend, ctl.enable_storage = "write_through", "", False
        ctl.storage_backend = ctl.storage_backend_type = None
        ctl.enable_storage_metrics, ctl.host_write_staged_tokens_fn = False, None
        ctl.page_get_func, ctl.page_set_func = ctl._generic_page_get, ctl._generic_page_set
        ctl.storage_stop_event = threading.Event()
        ctl.ack_prefetch_queue = Queue()
        ctl.load_queue, ctl.write_queue, ctl.ack_load_queue, ctl.ack_write_queue = [], [], [], []
        ctl.extra_host_mem_release_queues = {}
        ctl.pp_prefetch_command_group = ctl.pp_prefetch_command_thread = None
        ctl.pp_prefetch_command_queue, ctl.pp_prefetch_state_lock = Queue(), threading.Lock()
        ctl.pp_prefetch_states, ctl.pp_prefetch_decisions = {}, {}
        if self.buffer_only is not None:  # as init_hicache and attach_storage_backend set it
            ctl.host_memory_mode = "buffer_only"
            ctl.host_write_staged_tokens_fn = lambda: cache.buffer_pipeline.write_staged_tokens_
            tickets.command_group(ctl)
            if self.door is not None:
                self.door.register(TICKET_GROUP, ctl.pp_prefetch_command_group)
        self._attach(ctl)
        return ctl

    def _attach(self, ctl) -> None:
        """`attach_storage_backend`'s steps as the release takes them, SGLang's own from the
        factory on (0.5.19: `backup_skip` an attribute it sets, no `on_host_pools_registered`;
        0.5.23: a property, and the hook)."""
        ctl.storage_backend_type = "dynamic"
        ctl.get_hash_str = _module(UTILS).get_hash_str
        ctl.storage_config = self._storage_config()
        self._place(ctl)
        if not isinstance(getattr(type(ctl), "backup_skip", None), property):
            ctl.backup_skip = False  # as 0.5.19 sets it: not an MLA model
        TIER["tier"] = self.tier
        ctl.storage_backend = _module(FACTORY).StorageBackendFactory.create_backend(
            "dynamic", ctl.storage_config, ctl.storage_host_pool)
        ctl.storage_backend.register_mem_pool_host(ctl.storage_host_pool)
        if hasattr(ctl.storage_backend, "on_host_pools_registered"):
            ctl.storage_backend.on_host_pools_registered()
        ctl.enable_storage = True
        ctl.prefetch_threshold = self.threshold
        ctl.prefetch_capacity_limit = int(0.5 * self.host.logical_size)
        ctl.prefetch_tokens_occupied = 0
        ctl.prefetch_hits_sync_groups = ctl._create_sync_groups()
        ctl.prefetch_completion_sync_groups = ctl._create_sync_groups()
        ctl.storage_stop_event.clear()
        ctl._start_storage_threads()

    def _place(self, ctl) -> None:
        """The rank's place on the controller where the release's `_generate_storage_config`
        sets it there too (0.5.19-0.5.21: `self.tp_rank` ... `self.pp_size`, which 0.5.21's
        PP-ticket command thread reads; 0.5.22 on reads `storage_config` alone)."""
        import inspect

        try:
            text = inspect.getsource(type(ctl)._generate_storage_config)
        except (AttributeError, OSError, TypeError):
            return
        if "self.pp_rank" in text:
            rank, tp, pp = self.layout
            ctl.tp_rank, ctl.tp_size, ctl.dp_rank = rank % tp, tp, 0
            ctl.pp_rank, ctl.pp_size = rank // tp, pp

    def _storage_config(self):
        """What `_generate_storage_config` builds from a launched server's parallel state,
        from this rank's layout (the fields the release's HiCacheStorageConfig has)."""
        rank, tp, pp = self.layout
        config = _module(STORAGE).HiCacheStorageConfig
        values = dict(
            tp_rank=rank % tp, tp_size=tp, pp_rank=rank // tp, pp_size=pp, attn_cp_rank=0,
            attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
            is_page_first_layout=False, model_name="hicache-bench",
            extra_config={"backend_name": "harness", "class_name": "HarnessStorage",
                          "module_path": "sglang_adapter.controller.storage"})
        names = {f.name for f in dataclasses.fields(config)}
        return config(**{k: v for k, v in values.items() if k in names})

    def sync_groups(self) -> dict[str, object]:
        """SGLang's own groups, by the role it made them for and the base group whose ranks
        each copies (`_create_sync_groups`: the TP group's, then at PP > 1 the PP group's):
        sglang_hit / sglang_ack over the stage's TP ranks, sglang_hit_pp / sglang_ack_pp
        over the TP column's PP ranks."""
        ctl, out = self.cache.cache_controller, {}
        base = {_ranks(ctl.attn_tp_group): "", _ranks(ctl.pp_group): "_pp"}
        for role, groups in (("hit", ctl.prefetch_hits_sync_groups),
                             ("ack", ctl.prefetch_completion_sync_groups)):
            for i, g in enumerate(groups):
                out[f"sglang_{role}{base.get(_ranks(g), i)}"] = g
        if ctl.pp_prefetch_command_group is not None:  # the PP-ticket path's broadcasts
            out[TICKET_GROUP] = ctl.pp_prefetch_command_group
        return out

    def issue(self, rid: str, tokens: list[int], slow: bool = False, *, anchor=None,
              prior: str | None = None, storage_hit_end: int | None = None,
              step: int | None = None):
        """SGLang's own `prefetch_from_storage` for `tokens` after `anchor` (the host node
        the prompt's prefix matched; None: the root), whose last page is named `prior`;
        first the pages' names in both chains, so the backend can translate
        (sglang_adapter.controller.storage). `storage_hit_end`: a retry's known hit end (0.5.23's
        `_retry_storage_prefetch` passes it on); `step`: the scheduler step it is issued at
        (its hit query sees the pages landed by then)."""
        urc = self.loaded.modules[UNIFIED]
        handle = self.handle(rid)
        key = urc.RadixKey(tokens).page_aligned(self.page_size)
        utils = self.loaded.modules[UTILS]  # 0.5.23 names by the namespaced chain
        names = getattr(utils, "get_storage_hash_str", utils.get_hash_str)(
            key, prior, page_size=self.page_size)
        self.tier.learn(names, page_hashes(tokens, self.page_size, prior)[: len(names)], slow,
                        step)
        if storage_hit_end is None:  # a release before the retries has no such parameter
            self.decision = self.cache.prefetch_from_storage(handle, anchor, tokens,
                                                             last_hash=prior)
        else:
            self.decision = self.cache.prefetch_from_storage(
                handle, anchor, tokens, last_hash=prior, storage_hit_end=storage_hit_end)
        return handle

    def loaded_pages(self) -> tuple[int, int]:
        """(pages inserted, of them holding what storage holds under the tier's name)."""
        pages = good = 0
        for tokens, slots, _ in self.tree.inserted:
            names = page_hashes(tokens, self.page_size)
            rows = expected_rows(names, self.tier.storage.rank, POOL, PAGE_ELEMS)
            for i in range(len(names)):
                pages += 1
                good += self.host.pages.get(slots[i * self.page_size]) == digest(rows[i])
        return pages, good

    def stop(self) -> None:
        """SGLang's own teardown, `detach_storage_backend`: its threads stopped and joined,
        the gloo groups `_create_sync_groups` made destroyed, the backend let go. Every serve
        attaches anew, and a group left standing keeps its gloo threads (three a group,
        twelve a cell) in the rank's process, busy even idle: each later serve paid for
        them (docs/results/2026-12-06_controller_teardown_6ba7ee8.md). The groups'
        sequence numbers stay readable for the crosscheck."""
        self.cache.cache_controller.detach_storage_backend()


def _ranks(group) -> tuple[int, ...] | None:
    return None if group is None else tuple(dist.get_process_group_ranks(group))


def _module(name: str):
    import sys
    return sys.modules[name]
