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
"""

from __future__ import annotations

import sys

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

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

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        rows = torch.stack([torch.as_tensor(v, dtype=torch.float32) for v in values])
        names = self.tier.translate(list(keys))
        self.tier.record_write(names, values)  # the write path's self-check
        return self.tier.storage.batch_set(names, self.tier.pool, rows) == len(keys)

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        return self.batch_set([key], [value])
