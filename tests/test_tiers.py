"""The device tier and the write path without a process group: eviction order on the device
(LRU unlocked leaves, demoted to the host when backed up, dropped when not), on the host
(LRU host-only leaves, gone; none that a storage write still reads), write-through vs
write-back, and what reaches storage.

Page size 4, pools of a few pages, so every expectation can be followed by hand.
"""

from __future__ import annotations

import torch

from hicache.cache.controller import CacheController, ControllerSettings
from hicache.cache.operations import KV
from hicache.cache.tiers import Tiers
from hicache.memory.pools import PagePool, verify_pages
from hicache.memory.radix_tree import RadixTree
from hicache.memory.storage import SimStorage, StorageSpec

PS = 4
ELEMS = 8


def _tiers(policy: str = "write_through", dev_pages: int = 8, host_pages: int = 16):
    tree = RadixTree(PS)
    host = PagePool("kv", host_pages, ELEMS)
    dev = PagePool("kv", dev_pages, ELEMS)
    storage = SimStorage(StorageSpec(latency_ms=0.0, exists_latency_ms=0.0), 0, 0)
    # threads never started
    ctl = CacheController(None, storage, host, None, ControllerSettings(PS, True))
    return Tiers(policy, tree, host, dev, ctl, PS, 0, unbounded=False), storage


def _prompt(tag: int, pages: int) -> list[int]:
    return [tag * 1000 + i for i in range(pages * PS + 1)]  # one token past the last page


def _serve(t: Tiers, tokens: list[int]) -> tuple[int, int]:
    """One request as the cache serves it, acks and backups included; (device hit pages,
    host pages loaded back)."""
    m = t.tree.match(tokens)
    t.tree.lock(m.node)
    dev, hit, src = t.place(tokens, m)
    for h, d in zip(t.host.tensors(), t.dev.tensors(), strict=True):
        d[dev[hit: hit + len(src)]] = h[src]  # the load-back copy
    hashes = t.computed(tokens, m, dev, hit + len(src))
    assert verify_pages(t.dev, dev, hashes, 0) == 0
    t.cache_prefill(tokens, hashes, dev, hit)
    t.tree.unlock(m.node)
    _ack_all(t)
    return hit, len(src)


def _ack_all(t: Tiers) -> None:
    t.drain_copies(t.finished_copies())
    q = t.controller.backup_queue
    while not q.empty():
        op = q.get()
        t.controller._page_backup(op)  # the backup thread's work, inline
        t.controller.backup_acks.put(op)
    t.drain_backups(t.controller.backup_acks.qsize(), lambda q: q.get_nowait())
    assert not t.busy


def _where(t: Tiers, tokens: list[int]) -> tuple[int, int]:
    m = t.tree.match(tokens)
    return m.device_pages, len(m.slots)


def test_second_request_hits_the_device():
    t, _ = _tiers()
    a = _prompt(1, 2)
    assert _serve(t, a) == (0, 0)
    assert _serve(t, a) == (2, 0)
    assert t.tree.device_pages == 2 and t.dev.available == 6


def test_device_evicts_lru_unlocked_leaf_and_demotes_it_to_the_host():
    t, _ = _tiers(dev_pages=6)
    a, b, c = _prompt(1, 2), _prompt(2, 2), _prompt(3, 2)
    for p in (a, b, c):
        _serve(t, p)
    t.tree.match(a)  # a is now more recent than b
    _serve(t, _prompt(4, 2))  # needs 2 device pages: b is the LRU leaf
    assert _where(t, b) == (0, 2)  # demoted: host only (write-through had copied it)
    assert _where(t, a) == (2, 2) and _where(t, c) == (2, 2)
    assert _serve(t, b) == (0, 2)  # loaded back from the host


def test_locked_pages_are_not_evicted():
    t, _ = _tiers(dev_pages=4)
    a = _prompt(1, 2)
    _serve(t, a)
    lock = t.tree.match(a)
    t.tree.lock(lock.node)
    _serve(t, _prompt(2, 2))  # fits beside a
    try:
        _serve(t, _prompt(3, 2))
    except RuntimeError as e:  # b was evicted; a is locked, so only 2 pages can go
        raise AssertionError("two unlocked pages should have been enough") from e
    assert _where(t, a)[0] == 2


def test_host_evicts_lru_host_only_leaves_and_they_are_gone():
    t, _ = _tiers(dev_pages=4, host_pages=6)
    a, b, c = _prompt(1, 2), _prompt(2, 2), _prompt(3, 2)
    _serve(t, a)
    _serve(t, b)  # device holds a, b; host holds copies of both
    _serve(t, c)  # device: evicts a (LRU) to host-only; host: 6 pages used
    assert t.tree.device_pages == 4 and t.host.available == 0
    # d: the device demotes b; d's own host copy needs 2 host pages, and the LRU host-only
    # leaf is a (b is host-only too, but more recent). (A match refreshes recency, so
    # nothing is looked at before this point.)
    _serve(t, _prompt(4, 2))
    assert t.tree.match(a).pages == 0  # gone from both tiers
    assert _where(t, b) == (0, 2) and _where(t, c) == (2, 2)


def test_host_keeps_pages_a_storage_write_still_reads():
    t, _ = _tiers(dev_pages=2, host_pages=2)
    a = _prompt(1, 2)
    _serve(t, a)
    node = t.tree.match(a).node
    t._pinned.update(node.slots)  # as if its storage write were still in flight
    _serve(t, _prompt(2, 2))  # a is demoted, but its host pages may not go: no host copy
    assert _where(t, a) == (0, 2)


def test_write_through_drops_a_leaf_that_has_no_host_copy():
    t, _ = _tiers(dev_pages=2, host_pages=0)  # no host: every copy fails
    a = _prompt(1, 2)
    _serve(t, a)
    assert _where(t, a) == (2, 0)
    _serve(t, _prompt(2, 2))
    assert t.tree.match(a).pages == 0 and t.dropped_pages == 0  # no host pages to free
    assert t.host_copied_pages == 0


def test_write_through_reaches_storage_write_back_only_on_eviction():
    t, storage = _tiers("write_through")
    a = _prompt(1, 2)
    _serve(t, a)
    hashes = t.tree.match(a).hashes
    assert storage.batch_exists(hashes) == 2
    wb, wb_storage = _tiers("write_back", dev_pages=2)
    _serve(wb, a)
    assert _where(wb, a) == (2, 0) and wb_storage.batch_exists(hashes) == 0
    _serve(wb, _prompt(2, 2))  # evicts a: copied to the host, then written to storage
    _ack_all(wb)
    assert _where(wb, a) == (0, 2) and wb_storage.batch_exists(hashes) == 2


def test_storage_holds_the_host_copy():
    t, storage = _tiers()
    a = _prompt(1, 3)
    _serve(t, a)
    hashes = t.tree.match(a).hashes
    out = torch.empty((3, ELEMS))
    assert storage.batch_get(hashes, KV, out).pages == 3
    host = PagePool("kv", 3, ELEMS)
    host.write([0, 1, 2], out)
    assert verify_pages(host, [0, 1, 2], hashes, 0) == 0


def test_two_requests_in_one_prefill_keep_one_copy_of_their_shared_pages():
    t, _ = _tiers(dev_pages=8)
    a = _prompt(1, 2)
    placed = []
    for _ in range(2):  # both placed before either is cached: one batch computes both
        m = t.tree.match(a)
        t.tree.lock(m.node)
        dev, hit, src = t.place(a, m)
        placed.append((m, dev, hit, t.computed(a, m, dev, hit + len(src))))
    assert t.dev.used == 4  # 2 pages each, no device hit yet
    for m, dev, hit, hashes in placed:
        t.cache_prefill(a, hashes, dev, hit)
        t.tree.unlock(m.node)
    _ack_all(t)
    assert t.tree.device_pages == t.dev.used == 2  # the second's copies went back
    assert t.summary()["device_slots_unaccounted"] == 0
