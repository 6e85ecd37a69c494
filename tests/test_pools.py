"""Page pools (alloc/free bookkeeping, thread safety) and the page-content checksum."""

import threading

import pytest
import torch

from hicache.memory.pools import PagePool, expected_rows, page_content, verify_pages

H1 = "ab" * 32
H2 = "cd" * 32


def test_alloc_free_counts():
    pool = PagePool("kv", 4, 8)
    assert pool.data.shape == (4, 8) and pool.data.dtype == torch.float32
    a = pool.alloc(3)
    assert sorted(a) == [0, 1, 2] and pool.used == 3 and pool.available == 1
    assert pool.alloc(2) is None and pool.available == 1  # nothing taken on failure
    assert pool.alloc(0) == []
    pool.free(a[:2])
    assert pool.available == 3
    assert len(pool.alloc(3)) == 3


def test_bad_alloc_and_free():
    pool = PagePool("kv", 2, 4)
    with pytest.raises(ValueError):
        pool.alloc(-1)
    s = pool.alloc(1)
    pool.free(s)
    with pytest.raises(AssertionError):
        pool.free(s)  # double free
    with pytest.raises(AssertionError):
        pool.free([2])  # out of range


def test_pin_memory_ignored_without_cuda():
    pool = PagePool("kv", 2, 4, pin_memory=True)
    assert pool.data.is_pinned() == torch.cuda.is_available()


def test_concurrent_alloc_free_keeps_slots_unique():
    pool = PagePool("kv", 64, 1)

    def churn():
        for _ in range(200):
            slots = pool.alloc(4)
            if slots is not None:
                pool.free(slots)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.available == 64
    assert sorted(pool.alloc(64)) == list(range(64))


def test_page_content_deterministic_and_distinct():
    a = page_content(H1, 0, "kv", 16)
    assert a.dtype == torch.float32 and a.shape == (16,)
    assert torch.equal(a, page_content(H1, 0, "kv", 16))
    assert not torch.equal(a, page_content(H2, 0, "kv", 16))
    assert not torch.equal(a, page_content(H1, 1, "kv", 16))
    assert not torch.equal(a, page_content(H1, 0, "indexer", 16))
    assert bool((a >= 1).all()) and bool((a <= 65521).all())
    rows = expected_rows([H1, H2], 0, "kv", 16)
    assert torch.equal(rows[0], a) and torch.equal(rows[1], page_content(H2, 0, "kv", 16))


def test_verify_pages():
    pool = PagePool("kv", 4, 8)
    slots = pool.alloc(3)
    hashes = [H1, H2, "ef" * 32]
    assert verify_pages(pool, slots, hashes, rank=0) == 3  # zero-filled rows never match
    for s, h in zip(slots, hashes, strict=True):
        pool.data[s] = page_content(h, 0, "kv", 8)
    assert verify_pages(pool, slots, hashes, rank=0) == 0
    assert verify_pages(pool, slots, hashes, rank=1) == 3  # content depends on the rank
    pool.data[slots[1], 5] += 1  # one element off is one bad page
    assert verify_pages(pool, slots, hashes, rank=0) == 1
    assert verify_pages(pool, [], [], rank=0) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_verify_pages_on_cuda():
    pool = PagePool("kv", 2, 8, device="cuda")
    slots = pool.alloc(2)
    pool.data[slots[0]] = page_content(H1, 0, "kv", 8).cuda()
    assert verify_pages(pool, slots, [H1, H2], rank=0) == 1
