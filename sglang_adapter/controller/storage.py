"""The storage backend SGLang's own controller reads through: a subclass of the wheel's own
`HiCacheStorage` that serves the harness's storage tier (`hicache.memory.storage.Storage`).

SGLang builds it itself, through `StorageBackendFactory.create_backend("dynamic", config,
host_pool)` with `extra_config = {"backend_name", "module_path":
"sglang_adapter.controller.storage", "class_name": "HarnessStorage"}` (the path any out-of-tree
backend takes), so this module is imported only in a process where SGLang is loaded
(sglang_adapter.loader) and subclasses the class SGLang checks against.

Page names: SGLang names a page by its own chain (`get_storage_hash_str`, seeded by the
request's namespace), the tier by the project's (`hicache.memory.hashing.page_hashes`). The rig
records, before SGLang issues a prefetch, SGLang's name of each page against the tier's
(`sglang_adapter.controller.stand_ins.Tier.learn`); a name it never learnt is asked of the tier as
itself, which holds no such page (a miss, as for a page never stored). For a request with
no namespace and no prior page the two chains are the same SHA-256 chain over uint32 tokens
(0.5.23's `hash_binding.cpp` and `hicache/memory/hashing.py` agree byte for byte), so the table
maps each name to itself; it matters for namespaced requests and mid-prompt priors.

A side-car pool (`--extra-pool`, docs/sglang.md "A side-car pool"): SGLang's v2 per-pool
calls. `batch_exists_v2` from its prefetch thread's hit query (a request with a side-car
transfer), `batch_get_v2` from its IO thread, per batch, for a KV-derived side-car
(`_page_transfer_kv_batch`: same slots and keys as the batch's KV pages). The tier's
existence is by page name whatever the pool, and the harness stores a side-car page with
every KV page (hicache.serve.system), so each pool's verdict is the KV hit and every page up
to it is restorable (no `restorable_prefix_pages`: SGLang's contiguous contract).
"""

from __future__ import annotations

import sys

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolTransferResult

from sglang_adapter.controller.pinned import plan_of
from sglang_adapter.controller.stand_ins import TIER


def _plan(depth: int = 8):
    """Pinned: the read plan of the batch SGLang's IO thread is reading, from its
    `_page_transfer` frame (the operation and the batch's first page); else None."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        if frame.f_code.co_name == "_page_transfer" and "operation" in frame.f_locals:
            return plan_of(frame.f_locals["operation"], frame.f_locals.get("i", 0))
        frame = frame.f_back
    return None


class HarnessStorage(HiCacheStorage):
    """SGLang's storage backend over the harness's tier (module docstring). Called from
    SGLang's prefetch thread (`batch_exists`), IO thread (`batch_get`) and backup thread
    (`batch_set`)."""

    def __init__(self, storage_config, kwargs=None):
        self.storage_config = storage_config
        self.tier = TIER["tier"]

    def batch_exists(self, keys, extra_info=None) -> int:
        if self.tier.gate is not None:  # its modelled time (sglang_adapter.controller.pinned)
            self.tier.gate.exists_calls += 1
        keys = list(keys)  # judged at its prefetch's issue step (pages that land late)
        return self.tier.storage.batch_exists(self.tier.translate(keys),
                                              self.tier.issue_step(keys))

    def exists(self, key) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Pages up to the first the tier could not return; None from there on (SGLang's
        `_generic_page_get` stops at the first None)."""
        tier = self.tier
        names = tier.translate(list(keys))
        tier.stall(names)
        out = torch.empty(len(keys), tier.page_elems)
        got = tier.storage.batch_get(names, tier.pool, out, _plan()).pages
        return [out[i] if i < got else None for i in range(len(keys))]

    def get(self, key, target_location=None, target_sizes=None):
        return self.batch_get([key])[0]

    # ---- the v2 per-pool interface: a side-car pool (module docstring) ---------------------

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The KV hit, and for each side-car transfer its own verdict: the same pages (the
        tier holds a side-car page wherever it holds the KV page)."""
        kv = self.batch_exists(keys, extra_info)
        return PoolTransferResult(kv_hit_pages=kv, extra_pool_hit_pages={
            t.name: kv for t in pool_transfers or ()})

    def batch_get_v2(self, transfers, extra_info=None) -> dict:
        """Each transfer's pages from the tier's pool of its name into the host pool
        registered under it (`register_mem_host_pool_v2`), at its host indices; per pool,
        per page: read (True) up to the first the tier could not return."""
        tier, out = self.tier, {}
        for t in transfers:
            host = self.registered_pools[t.name]
            names = tier.translate(list(t.keys))
            tier.stall(names)
            rows = torch.empty(len(names), host.page_elems, dtype=host.pool.data.dtype)
            got = tier.storage.batch_get(names, host.pool.name, rows).pages
            starts = t.host_indices.tolist()[:: host.page_size]
            for i in range(got):
                host.set_from_flat_data_page(starts[i], rows[i])
            out[t.name] = [i < got for i in range(len(names))]
        return out

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        rows = torch.stack([torch.as_tensor(v, dtype=torch.float32) for v in values])
        names = self.tier.translate(list(keys))
        self.tier.record_write(names, values)  # the write path's self-check
        return self.tier.storage.batch_set(names, self.tier.pool, rows) == len(keys)

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        return self.batch_set([key], [value])
