"""Memory-less stand-ins for what SGLang's controller path needs a GPU or a model for:
its host KV pool group (`HostPoolGroup`, built by `attach_hybrid_pool_to_unified_cache`
from device KV pools and a model config) and its tree core (`UnifiedTreeCore`, built by
`UnifiedRadixCache.__init__` from tree components over device pools).

Each has only what SGLang's prefetch path calls on it (docs/sglang.md, "SGLang's own
controller path"): the host pool hands out real slot indices, page-aligned, and keeps, for
a page SGLang's IO thread writes into a slot, only its digest (no KV-sized memory), so the
rig can hold what was loaded against what storage holds. The tree core records what SGLang
inserts and issues no collective (SGLang's tree core issues none either: no
`torch.distributed` call under `mem_cache/unified_cache/`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
import time
import types
from dataclasses import dataclass, field

import torch

from hicache.memory.pools import expected_rows
from hicache.memory.storage import Storage


def digest(page: torch.Tensor) -> str:
    return hashlib.blake2b(page.contiguous().numpy().tobytes(), digest_size=16).hexdigest()


class HostPool:
    """One host KV pool without its memory: `size` token slots in pages of `page_size`."""

    layout = "layer_first"
    shared_allocation_domain = None  # not a shared host layout (pool_host/base.py)

    def __init__(self, size: int, page_size: int, page_elems: int):
        if size % page_size:
            raise ValueError("host pool size must be a whole number of pages")
        self.size = self.logical_size = size
        self.page_size, self.page_elems = page_size, page_elems
        self._lock = threading.Lock()
        self.pages: dict[int, str] = {}  # first slot of a page -> digest of what was written
        self.clear()

    def clear(self) -> None:
        with self._lock:
            self._free = list(range(0, self.size, self.page_size))
            self.pages.clear()

    def available_size(self) -> int:
        with self._lock:
            return len(self._free) * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Page-aligned slots for `need_size` tokens (a whole number of pages), or None."""
        pages = -(-need_size // self.page_size)
        with self._lock:
            if pages > len(self._free):
                return None
            starts, self._free = self._free[:pages], self._free[pages:]
        return torch.cat([torch.arange(s, s + self.page_size) for s in starts])[:need_size] \
            if starts else torch.empty(0, dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> int:
        starts = sorted({int(i) - int(i) % self.page_size for i in indices.tolist()})
        with self._lock:
            for s in starts:
                self.pages.pop(s, None)
            self._free.extend(starts)
        return len(indices)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        """The buffer one page is read into (SGLang's `_generic_page_get`)."""
        return torch.empty(self.page_elems)

    def set_from_flat_data_page(self, index, data_page: torch.Tensor) -> None:
        with self._lock:
            self.pages[int(index)] = digest(data_page)

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        raise NotImplementedError("write-back from a memory-less host pool: not on this path")


class HostPoolGroup:
    """SGLang's HostPoolGroup over one KV pool: what the controller and the cache's drains
    read (`anchor_entry.host_pool`, `entries`, `entry_map`, `layout_lease`, the pool's
    allocation). A side-car pool joins it as SGLang's own `register_host_pool_entry` adds
    one (`add_entry`); a KV-derived side-car shares the KV pool's slots, so SGLang never
    allocates or frees it by its own name (it skips pools with `indices_from_pool`)."""

    def __init__(self, pool: HostPool, kv_name):
        self.anchor_entry = types.SimpleNamespace(host_pool=pool, name=kv_name,
                                                  is_primary_index_anchor=True)
        self.entries, self.entry_map = [self.anchor_entry], {}
        self.pool = pool

    def layout_lease(self):
        return contextlib.nullcontext()

    # By pool, as the group's own (pool_host/group.py): the PP-ticket path names the KV pool.
    def alloc(self, need_size: int, *, pool=None, reclaim=None, start_owner=None):
        indices = self.pool.alloc(need_size)
        if indices is None and reclaim is not None:
            reclaim(need_size)
            indices = self.pool.alloc(need_size)
        return indices

    def free(self, indices: torch.Tensor, *, pool=None) -> int:
        return self.pool.free(indices)

    def available_size(self, pool=None) -> int:
        return self.pool.available_size()

    def get_pool(self, name):
        return self.pool if name is None or name == self.anchor_entry.name else \
            self.entry_map[name].host_pool

    def add_entry(self, entry) -> None:
        """pool_host/group.py's: a side pool, never a second anchor."""
        if entry.name in self.entry_map or entry.is_primary_index_anchor:
            raise ValueError(f"host pool {entry.name} cannot be added")
        self.entries.append(entry)
        self.entry_map[entry.name] = entry

    def __getattr__(self, name):  # size, page_size, alloc, free, available_size, clear, ...
        return getattr(self.__dict__["pool"], name)


class TreeCore:
    """What `prefetch_from_storage`, the per-step reduce and `_handle_prefetch_result` read
    or call on SGLang's tree core; the inserts are recorded (rid order is the caller's)."""

    is_eagle = False
    is_write_back = False  # the cache sets it from its controller's policy (its property)
    # The rolling digest of the host duplicates write_back's host eviction reclaimed (its
    # victims' order), in every packed MIN: none here (sglang_adapter.controller.project_stand_ins).
    write_back_duplicate_reclaim_digest = 0

    def __init__(self, page_size: int, lock_result, dec_result):
        self.page_size, self.enable_storage = page_size, True
        self._lock_result, self._dec_result = lock_result, dec_result
        self.inserted: list[tuple[list[int], list[int], list[str]]] = []
        self.host_locks = 0

    def prefetch_anchor_info(self, node_id):
        return None, None  # the root: no namespace of its own

    def root_node_handle(self, extra_key=None):
        return "root"

    def match_full_device_prefix(self, key):
        """(matched, node, tokens to pin) of the device-resident prefix: none at buffer_only
        here (no device tree), so BufferModePipeline's anchor pin finds nothing to pin."""
        return 0, "root", 0

    def inc_host_lock_ref(self, node_id):
        """SGLang's receipt of a host lock on the anchor (0.5.23 records the node in it)."""
        self.host_locks += 1
        return self._receipt(node_id)

    def _receipt(self, node_id):
        names = {f.name for f in dataclasses.fields(self._lock_result)}
        return self._lock_result(**({"node_id": node_id} if "node_id" in names else {}))

    def dec_host_lock_ref(self, node_id, params):
        self.host_locks -= 1
        return self._dec_result()

    def insert_host(self, node_id, key, host_indices, hash_values):
        self.inserted.append((list(key.token_ids), host_indices.tolist(), list(hash_values)))
        return types.SimpleNamespace(cache_actions=[], host_insert_dropped=False, prefix_len=0)

    def commit_hicache_transfers(self, node_id, phase, comp_xfers, **kwargs) -> None:
        pass


@dataclass
class Tier:
    """The harness's storage tier as this rank's SGLang sees it."""

    storage: Storage
    pool: str  # the tier's pool SGLang's KV pages are read from / written to
    page_elems: int  # values per stored page
    stall_s: float = 0.0  # a read of a slow request's pages stalls this long first
    names: dict[str, str] = field(default_factory=dict)  # SGLang's name -> the tier's
    slow: set[str] = field(default_factory=set)  # tier names whose reads stall
    lock: threading.Lock = field(default_factory=threading.Lock)
    gate: object = None  # pinned: sglang_adapter.controller.pinned.ControllerPin
    # The scheduler step of the latest prefetch issued from each SGLang name (its span's
    # first page): the step its hit query is judged at for pages that land late
    # (HiCacheConfig.land_step); a name never issued: None (whatever has landed).
    issued_at: dict[str, int] = field(default_factory=dict)
    # The write path: each tier name SGLang's backup thread wrote, and whether what it
    # wrote was the KV the harness computed (record_write).
    written: dict[str, bool] = field(default_factory=dict)

    def learn(self, sglang_names: list[str], tier_names: list[str], slow: bool = False,
              step: int | None = None) -> None:
        with self.lock:
            self.names.update(zip(sglang_names, tier_names, strict=True))
            if slow:
                self.slow.update(tier_names)
            if step is not None and sglang_names:
                self.issued_at[sglang_names[0]] = step

    def issue_step(self, keys: list[str]) -> int | None:
        """The step the prefetch whose span starts at keys[0] was issued at (its hit query)."""
        with self.lock:
            return self.issued_at.get(keys[0]) if keys else None

    def stall(self, tier_names: list[str]) -> None:
        """A slow storage node: the read of a slow request's pages waits first."""
        with self.lock:
            slow = any(n in self.slow for n in tier_names)
        if slow:
            time.sleep(self.stall_s)

    def translate(self, keys: list[str]) -> list[str]:
        with self.lock:
            return [self.names.get(k, k) for k in keys]

    def record_write(self, tier_names: list[str], values) -> None:
        """SGLang's backup thread hands the backend these pages (`batch_set`): each is held
        against the KV the harness computed for it (a backup of the wrong slot or page
        differs), what was handed recorded per name for the write path's check."""
        want = expected_rows(tier_names, self.storage.rank, self.pool, self.page_elems)
        same = [torch.equal(torch.as_tensor(v).flatten(), w.to(torch.as_tensor(v).dtype))
                for v, w in zip(values, want, strict=True)]
        with self.lock:
            self.written.update(zip(tier_names, same, strict=True))

    def written_right(self, tier_names: list[str]) -> list[bool]:
        """Per page: handed to the backend by SGLang's backup thread, as computed."""
        with self.lock:
            return [self.written.get(n, False) for n in tier_names]


# This process's tier, set by the rig before SGLang builds the backend (one SGLang, one
# controller per process: sglang_adapter.loader).
TIER: dict[str, Tier] = {}
