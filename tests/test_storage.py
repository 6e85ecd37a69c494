"""Storage tier: exists semantics, deterministic misses, verified reads, per-page partial reads
(leading pages delivered up to the first failure), file backend, slow side-car pages, the
half-written batch a concurrent reader can see, and spec validation.

Latencies are zeroed unless a test measures them: the machine is shared and small.
"""

import threading
import time

import pytest
import torch

from hicache.memory.hashing import page_hashes
from hicache.memory.pools import PagePool, verify_pages
from hicache.memory.storage import (
    FileStorage,
    ReadResult,
    SimStorage,
    StorageError,
    StorageSpec,
    make_storage,
)

FAST = dict(latency_ms=0.0, exists_latency_ms=0.0)
ELEMS = 16


def _hashes(n, seed=0):
    return page_hashes([seed + i for i in range(n * 4)], 4)


def test_exists_stops_at_first_miss():
    st = SimStorage(StorageSpec(**FAST), rank=0, tp_rank=0)
    hs = _hashes(5)
    st.put(hs[:2] + hs[3:], "kv", ELEMS)
    assert st.batch_exists(hs) == 2
    assert st.batch_exists(hs[3:]) == 2
    assert st.batch_exists([]) == 0


def test_miss_pattern_deterministic_per_tp_rank():
    spec = StorageSpec(miss_prob=0.5, seed=7, **FAST)
    hs = _hashes(200)

    def pattern(rank, tp_rank):
        st = SimStorage(spec, rank, tp_rank)
        st.put(hs, "kv", ELEMS)
        return [st.batch_exists([h]) for h in hs]

    p0 = pattern(0, 0)
    assert p0 == pattern(0, 0)
    assert p0 == pattern(2, 0)  # same TP rank on another PP stage: same misses
    assert p0 != pattern(1, 1)
    assert 60 < sum(p0) < 140  # about half present


def test_batch_get_content_verified():
    rank = 3
    st = make_storage(StorageSpec(**FAST), rank=rank, tp_rank=1)
    hs = _hashes(6)
    st.put(hs, "kv", ELEMS)
    pool = PagePool("kv", 10, ELEMS)
    slots = pool.alloc(10)[4:]  # scattered reads go through a staging buffer
    staging = torch.zeros(len(hs), ELEMS)
    assert st.batch_get(hs, "kv", staging) == ReadResult(len(hs))
    pool.data.index_copy_(0, torch.tensor(slots), staging)
    assert verify_pages(pool, slots, hs, rank=rank) == 0
    assert verify_pages(pool, slots, hs, rank=0) == len(hs)


def test_batch_get_delivers_the_pages_before_a_missing_one():
    st = SimStorage(StorageSpec(**FAST), rank=0, tp_rank=0)
    hs = _hashes(5)
    st.put(hs[:2] + hs[3:], "kv", ELEMS)
    out = torch.zeros(5, ELEMS)
    got = st.batch_get(hs, "kv", out)
    assert got.pages == 2 and "page 2 of 5 is not in storage" in got.error
    pool = PagePool("kv", 2, ELEMS)
    pool.data.copy_(out[:2])
    assert verify_pages(pool, [0, 1], hs[:2], rank=0) == 0
    assert not out[2:].any()  # nothing past the missing page is written
    assert st.batch_get(hs[3:], "kv", out[:2]).pages == 2


def test_batch_get_missing_pool_misshapen_page_or_miss_rule():
    st = SimStorage(StorageSpec(**FAST), rank=0, tp_rank=0)
    hs = _hashes(3)
    st.put(hs[:2], "kv", ELEMS)
    out = torch.zeros(3, ELEMS)
    assert st.batch_get(hs[:2], "indexer", out[:2]).pages == 0  # never stored for that pool
    assert st.batch_get(hs[:2], "kv", torch.zeros(2, ELEMS + 1)).pages == 0  # other width
    with pytest.raises(StorageError):
        st.batch_get(hs[:2], "kv", out)  # out has 3 rows for 2 pages: a caller bug
    assert not out.any()
    missing = SimStorage(StorageSpec(miss_prob=1.0, **FAST), rank=0, tp_rank=0)
    missing.put(hs, "kv", ELEMS)
    assert missing.batch_get(hs, "kv", out).pages == 0  # the miss rule wins over the backend


def test_fail_rate_one_fails_every_read_at_a_random_page():
    st = SimStorage(StorageSpec(fail_rate=1.0, **FAST), rank=0, tp_rank=0)
    hs = _hashes(8)
    st.put(hs, "kv", ELEMS)
    seen = set()
    for _ in range(40):
        out = torch.zeros(8, ELEMS)
        got = st.batch_get(hs, "kv", out)
        assert got.pages < 8 and "injected read failure" in got.error
        assert out[: got.pages].all() and not out[got.pages:].any()
        seen.add(got.pages)
    assert len(seen) > 3  # the failing page is drawn, not always the first


def test_failures_are_deterministic_per_seed_and_rank():
    def pages(seed, rank):
        st = SimStorage(StorageSpec(fail_rate=0.5, seed=seed, **FAST), rank=rank, tp_rank=0)
        hs = _hashes(4)
        st.put(hs, "kv", ELEMS)
        return [st.batch_get(hs, "kv", torch.zeros(4, ELEMS)).pages for _ in range(20)]

    assert pages(1, 0) == pages(1, 0) and pages(1, 0) != pages(1, 1)
    assert 4 in pages(1, 0) and min(pages(1, 0)) < 4


def test_file_round_trip(tmp_path):
    spec = StorageSpec(kind="file", root=str(tmp_path), **FAST)
    hs = _hashes(3)
    make_storage(spec, rank=1, tp_rank=1).put(hs, "kv", ELEMS)
    path = tmp_path / "rank1" / "kv" / f"{hs[0]}.bin"
    assert path.stat().st_size == ELEMS * 4
    reader = FileStorage(spec, rank=1, tp_rank=1)  # a fresh instance sees the files
    assert reader.batch_exists(hs) == 3
    assert FileStorage(spec, rank=0, tp_rank=0).batch_exists(hs) == 0  # other rank's dir
    pool = PagePool("kv", 3, ELEMS)
    assert reader.batch_get(hs, "kv", pool.data).pages == 3
    assert verify_pages(pool, [0, 1, 2], hs, rank=1) == 0
    (tmp_path / "rank1" / "kv" / f"{hs[1]}.bin").write_bytes(b"\0" * 4)  # a short page
    assert reader.batch_get(hs, "kv", torch.zeros(3, ELEMS)).pages == 1
    path.unlink()
    assert reader.batch_exists(hs) == 0
    assert reader.batch_get(hs, "kv", torch.zeros(3, ELEMS)).pages == 0


def test_sidecar_pages_slower_and_half_written_batch_visible():
    spec = StorageSpec(sidecar_page_ms=25.0, **FAST)
    st = SimStorage(spec, rank=0, tp_rank=0)
    hs = _hashes(4)
    st.put(hs, "kv", ELEMS)
    st.put(hs, "indexer", ELEMS)

    t0 = time.perf_counter()
    st.batch_get(hs, "kv", torch.zeros(4, ELEMS))
    kv_s = time.perf_counter() - t0

    out = torch.zeros(4, ELEMS)
    reader = threading.Thread(target=st.batch_get, args=(hs, "indexer", out))
    t0 = time.perf_counter()
    reader.start()
    while not out[0].any():  # wait for the first row to land...
        time.sleep(0.001)
    half_written = not out[3].any()  # ...the last one is >= 75 ms behind it
    reader.join()
    side_s = time.perf_counter() - t0
    assert half_written
    assert side_s >= 0.09  # 4 pages x 25 ms, minus scheduling slack
    assert kv_s < side_s
    assert out[3].any()


class _VirtualClock:
    """Stands in for the storage module's `time`: sleeping advances the clock exactly, so a
    read's modelled duration is measured to the nanosecond on any machine, both ways."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.now += seconds


def test_read_time_model(monkeypatch):
    # (latency 10 ms + 8 pages x 4 kB at 1 MB/s = 32 ms) x rank factor 1 + stall 10 ms = 52 ms.
    import hicache.memory.storage

    clock = _VirtualClock()
    monkeypatch.setattr(hicache.memory.storage, "time", clock)
    spec = StorageSpec(latency_ms=10.0, bandwidth_gbps=0.001, stall_ms=10.0, exists_latency_ms=0)
    st = SimStorage(spec, rank=0, tp_rank=0)
    hs = _hashes(8)
    st.put(hs, "kv", 1000)
    assert st.batch_get(hs, "kv", torch.zeros(8, 1000)) == ReadResult(8)
    assert clock.now == pytest.approx(0.052, abs=1e-9)


def test_read_time_model_sleeps_for_real():
    """The model's time is spent in real sleeps (never shorter: a lower bound is the one
    bound a shared machine allows on a real clock)."""
    spec = StorageSpec(latency_ms=10.0, bandwidth_gbps=0.001, stall_ms=10.0, exists_latency_ms=0)
    st = SimStorage(spec, rank=0, tp_rank=0)
    hs = _hashes(8)
    st.put(hs, "kv", 1000)
    t0 = time.perf_counter()
    st.batch_get(hs, "kv", torch.zeros(8, 1000))
    assert time.perf_counter() - t0 >= 0.05


def test_read_time_from_model_bytes():
    """A batch costs latency + bytes / bandwidth with a KV page's bytes from the model shape:
    Llama-3-8B at TP2 is 4 MiB per 64-token page; 20 pages at 3 GB/s = 27.96 ms + 2 ms."""
    from hicache.spec.shapes import SHAPES

    page_bytes = SHAPES["llama3-8b"].kv_bytes_per_page(64, tp=2)
    spec = StorageSpec(latency_ms=2.0, bandwidth_gbps=3.0, kv_page_bytes=page_bytes)
    st = SimStorage(spec, rank=0, tp_rank=0)
    head_s, row_s = st._read_times(20, 128, "kv", 1.0)
    assert head_s == pytest.approx(0.002)
    assert 20 * row_s == pytest.approx(20 * 4 * 2**20 / 3e9)
    # side-car pages keep their own (content) bytes: 16 float32 = 64 bytes each
    assert st._read_times(20, 16, "indexer", 1.0)[1] == pytest.approx(64 / 3e9)


def test_rank_factor_drawn_once_per_rank():
    def factors(seed):
        return [SimStorage(StorageSpec(jitter=0.5, seed=seed), r, r).rank_factor for r in range(4)]

    assert all(1.0 <= f <= 1.5 for f in factors(1))
    assert factors(1) == factors(1) and factors(1) != factors(2)
    assert len(set(factors(1))) == 4
    assert SimStorage(StorageSpec(), 0, 0).rank_factor == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kind="s3"),
        dict(kind="file"),
        dict(latency_ms=-1.0),
        dict(exists_latency_ms=-0.1),
        dict(bandwidth_gbps=0.0),
        dict(jitter=-0.5),
        dict(miss_prob=1.5),
        dict(fail_rate=-0.1),
        dict(stall_ms=-1.0),
        dict(sidecar_page_ms=-2.0),
        dict(kv_page_bytes=-1),
    ],
)
def test_bad_spec(kwargs):
    with pytest.raises(ValueError):
        StorageSpec(**kwargs)
