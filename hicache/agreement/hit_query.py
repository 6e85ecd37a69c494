"""The hit query's agreement (prefetch thread, groups `prefetch` then `prefetch_pp`), by shape.

- `min`: one MIN of this rank's hit pages (every release before 0.5.23's trailing pools, and
  0.5.23 without them: its packed tensor then has a fixed size).
- `span_mask` (0.5.23, a side-car pool with the TRAILING_PAGES hit policy, SWA or Mamba
  shaped; hybrid_cache_controller.py:1468-1516): one MIN of `span + 1` restorable flags (page
  0 always restorable) followed by one verdict per pool (`list(PoolName)`: 23 names,
  hicache_storage.py:85-110; -1 for a pool without one). `span` is
  `len(operation.token_ids) // page_size`, the tokens this rank's own prefix match left
  unmatched; the code assumes it is the same on every rank (its comment, 1479-1480). A rank
  whose match differs sends a tensor of another size, and gloo aborts the peer that expected
  fewer bytes (SGLang PR #39267's report: "4368 vs 2832").
- `bounded_mask` (PR #39267): a fixed-size first MIN of [hit upper bound, endpoint metadata
  present, pool verdicts], then, when every rank has the metadata, the flags of the agreed
  bound's `bound + 1` endpoints: the same size on every rank.

Restorable endpoints: the side-car pages are stored with the KV pages here, so every page up
to the KV hit is a legal endpoint (a trailing window is whole at each); the MIN of the flags
is then the MIN of the hits. What differs between the shapes is the size and number of
collectives, which is what this models.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hicache.comm.comm import HIT_QUERY, Comm

SHAPES = ("min", "span_mask", "bounded_mask")
POOL_NAMES = 23  # len(PoolName) in the 0.5.23 wheel (hicache_storage.py:85-110)
NO_VERDICT = -1  # hybrid_cache_controller.py:57: a pool this rank reported nothing for


def verdicts(kv_pages: int, sidecar_pages: int) -> list[int]:
    """One per PoolName in its order: KV first, the side-car's, the rest none."""
    return [kv_pages, sidecar_pages] + [NO_VERDICT] * (POOL_NAMES - 2)


def flags(span: int, hit: int) -> list[int]:
    """Restorable flag per endpoint 0..span: 0 always, then every page up to the hit."""
    return [1] + [int(p <= hit) for p in range(1, span + 1)]


def agree_hit(shape: str, comm: Comm, groups: tuple[str, ...], rid: str, hit: int,
              span: int) -> int:
    """The hit pages every rank of the grid agrees on; `hit` this rank's, `span` its
    request span in pages."""
    if shape == "min":
        return _min(comm, groups, rid, [hit], torch.int64)[0]
    if shape == "span_mask":
        reduced = _min(comm, groups, rid, flags(span, hit) + verdicts(hit, hit), torch.int32)
        return _last_restorable(reduced[: span + 1])
    if shape == "bounded_mask":
        first = _min(comm, groups, rid, [hit, 1] + verdicts(hit, hit), torch.int32)
        bound, metadata = first[0], first[1]
        if not metadata:  # a backend without endpoint metadata: the contiguous bound
            return bound
        return _last_restorable(_min(comm, groups, rid, flags(bound, hit), torch.int32))
    raise ValueError(f"unknown hit-query shape {shape!r}")


def _min(comm: Comm, groups: tuple[str, ...], rid: str, values: list[int], dtype) -> list[int]:
    t = torch.tensor(values, dtype=dtype)
    # Blocks until every rank of the groups has queried this op (ops arrive in one order
    # on all ranks: the request broadcast); gloo pairs the tensors by position, not size.
    comm.all_reduce_groups(t, dist.ReduceOp.MIN, groups, HIT_QUERY, rid)
    return t.tolist()


def _last_restorable(restorable: list[int]) -> int:
    return max(i for i, ok in enumerate(restorable) if ok)
