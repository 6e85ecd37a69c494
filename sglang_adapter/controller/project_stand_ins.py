"""SGLang's host pool and tree core over the harness's own (`bench run --cache sglang
--sglang-path controller`, sglang_adapter.controller.cache): what SGLang's controller path loads
lands where the harness's load-back, data checks and host-slot accounting read it.

- `ProjectHostPool`: SGLang's host KV pool as the harness's host `PagePool` (SGLang counts
  token indices, the pool page slots: token index = slot x page size + offset); a page
  SGLang's IO thread reads is written into its slot as it came from storage.
- `ProjectTreeCore`: SGLang's tree core over the harness's `RadixTree`: the anchor of each
  prefetch is its request's matched host prefix (node id = the request id), and
  `insert_host` inserts the prefix plus what was fetched, as the project's own
  finalisation does (`hicache.cache.poll._finalize`); the pages already in the tree are
  reported as SGLang's `prefix_len`, whose host slots SGLang's own end path frees. The
  write path's backups are by int node id (sglang_adapter.controller.writes); under write_back
  SGLang's packed MIN reads `write_back_duplicate_reclaim_digest`, which SGLang's tree
  core rolls over the device-resident host duplicates its host eviction reclaims first:
  0 on every rank, as the harness's host eviction takes host-only leaves and reclaims no
  duplicate (hicache.memory.radix_tree.RadixTree.evict).
Neither issues a collective (SGLang's tree core issues none either).
"""

from __future__ import annotations

import types

import torch

from hicache.memory.pools import PagePool
from hicache.memory.radix_tree import RadixTree
from sglang_adapter.controller.stand_ins import TreeCore


class ProjectHostPool:
    """SGLang's host KV pool over the harness's host `PagePool` (module docstring)."""

    layout = "layer_first"
    shared_allocation_domain = None  # not a shared host layout (pool_host/base.py)

    def __init__(self, pool: PagePool, page_size: int):
        self.pool, self.page_size, self.page_elems = pool, page_size, pool.page_elems
        self.size = self.logical_size = pool.num_pages * page_size

    def available_size(self) -> int:
        return self.pool.available * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Token indices of whole pages for `need_size` tokens, or None."""
        slots = self.pool.alloc(-(-need_size // self.page_size))
        if slots is None:
            return None
        offsets = torch.arange(self.page_size)
        index = [torch.full((self.page_size,), s * self.page_size) + offsets for s in slots]
        return torch.cat(index)[:need_size] if index else torch.empty(0, dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> int:
        self.pool.free(sorted({int(i) // self.page_size for i in indices.tolist()}))
        return len(indices)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        """The buffer one page is read into (SGLang's `_generic_page_get`)."""
        return torch.empty(self.page_elems, dtype=self.pool.data.dtype)

    def set_from_flat_data_page(self, index, data_page: torch.Tensor) -> None:
        self.pool.write([int(index) // self.page_size], data_page.reshape(1, -1))

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        """The page SGLang's backup thread writes to storage (`_generic_page_set`)."""
        return self.pool.data[int(index) // self.page_size].clone()


class ProjectTreeCore(TreeCore):
    """SGLang's tree core over the harness's radix tree (module docstring)."""

    def __init__(self, page_size: int, lock_result, dec_result, tree: RadixTree):
        super().__init__(page_size, lock_result, dec_result)
        self.tree = tree
        self.anchors: dict[str, tuple[list[int], list[str]]] = {}
        self.fetched: dict[str, int] = {}  # rid -> tokens SGLang inserted for it
        self.writes = None  # the write path's copies (sglang_adapter.controller.writes), if on

    # ---- the write path: backups by int node id (a prefetch's anchor is its rid) -----------

    def inc_lock_ref(self, node_id, skip_lock_components=()):
        self.tree.lock(self.writes.node(node_id))
        return self._receipt(node_id)

    def dec_lock_ref(self, node_id, params, skip_swa: bool = False):
        self.tree.unlock(self.writes.node(node_id))
        return self._dec_result()

    def mark_write_through_pending(self, node_ids, ack_id=None):
        """0.5.23 passes the nodes the ack publishes (and takes them back); 0.5.19 one node."""
        return list(node_ids) if ack_id is not None else None

    def finish_write_through(self, node_ids, ack_id) -> None:
        pass  # the harness's tree holds the host copy since it was made (hicache.cache.tiers)

    def build_storage_backup_spec(self, node_id, pass_prefix_keys: bool):
        host, tokens, names = self.writes.storage_spec(node_id)
        return types.SimpleNamespace(host_value=host, token_ids=tokens, hash_value=names,
                                     prefix_keys=None, comp_xfers={})

    def inc_host_lock_ref(self, node_id):
        if isinstance(node_id, int):  # write_backup_storage's, for the backup thread
            self.writes.pin(node_id)
        return super().inc_host_lock_ref(node_id)

    def dec_host_lock_ref(self, node_id, params):
        if isinstance(node_id, int):  # _drain_backup's: the backup is acked
            self.writes.stored(node_id)
        return super().dec_host_lock_ref(node_id, params)

    def anchor(self, rid: str, tokens: list[int], hashes: list[str]) -> None:
        """The host prefix `rid`'s prefetch starts after (its node id is `rid`)."""
        self.anchors[rid] = (list(tokens), list(hashes))

    def insert_host(self, node_id, key, host_indices, hash_values):
        prefix, hashes = self.anchors[node_id]
        base = len(prefix) // self.page_size
        fetched = list(key.token_ids)
        slots = [int(i) // self.page_size for i in host_indices.tolist()[:: self.page_size]]
        overlap = self.tree.insert(prefix + fetched, [-1] * base + slots,
                                   hashes + list(hash_values))
        self.fetched[node_id] = len(fetched)
        self.inserted.append((fetched, host_indices.tolist(), list(hash_values)))
        dup = max(0, overlap - base)  # pages another request inserted meanwhile
        return types.SimpleNamespace(cache_actions=[], host_insert_dropped=False,
                                     prefix_len=dup * self.page_size)
