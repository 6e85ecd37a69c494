"""Real KV bytes (hicache.memory.kv_layout), bulk pages (pools) and the load-back copy
(hicache.memory.loadback) on CPU; the pinned / side-stream / H2D-peak paths run on CUDA only (they
skip without a GPU and run in scripts/gpu_check.sh).
"""

from __future__ import annotations

import pytest
import torch

from hicache.memory.kv_layout import kv_layout
from hicache.memory.loadback import LoadBack, h2d_peak, runs
from hicache.memory.pools import PagePool, expected_rows, verify_pages
from hicache.spec.config import HiCacheConfig
from tests.helpers import run_scenario

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
HASHES = [f"{i:02x}" * 32 for i in range(1, 7)]


def test_runs_merge_consecutive_pairs_only():
    assert runs([4, 5, 6], [10, 11, 12]) == [(4, 10, 3)]
    assert runs([6, 5, 4], [12, 11, 10]) == [(4, 10, 3)]  # order of pairs does not matter
    assert runs([1, 2, 3], [7, 6, 5]) == [(1, 7, 1), (2, 6, 1), (3, 5, 1)]
    assert runs([0, 1, 5, 6], [3, 4, 0, 1]) == [(0, 3, 2), (5, 0, 2)]
    assert runs([], []) == []


def test_kv_layout_synthetic_on_cpu_and_toy():
    kv = kv_layout(HiCacheConfig(model="llama3-8b"), CPU)
    assert not kv.real and kv.bulk_bytes == 0 and kv.host_pages == 8192
    assert not kv_layout(HiCacheConfig(), CUDA).real  # the toy model keeps synthetic pages


def test_kv_layout_real_pages_bounded_by_budget():
    kv = kv_layout(HiCacheConfig(model="llama3-8b"), CUDA)
    assert kv.real and kv.page_bytes == 8 * 2**20  # 64 tokens x 128 KiB
    assert kv.bulk_bytes == 8 * 2**20 - 128 * 4  # the signature is part of the page
    assert kv.host_pages == kv.device_pages == 512  # 4 GiB / 8 MiB
    tp2 = kv_layout(HiCacheConfig(model="llama3-8b", tp=2, kv_budget_gib=1.0), CUDA)
    assert tp2.page_bytes == 4 * 2**20 and tp2.host_pages == 256
    small = kv_layout(HiCacheConfig(kv_bytes="real", host_pool_pages=10), CPU)
    assert small.real and small.host_pages == 10  # the configured count when it fits
    with pytest.raises(ValueError, match="holds no llama3-70b page"):
        kv_layout(HiCacheConfig(model="llama3-70b", kv_budget_gib=0.01), CUDA)
    with pytest.raises(ValueError, match="kv_bytes"):
        HiCacheConfig(kv_bytes="huge")


def _filled_pools(bulk: int, device=CPU) -> tuple[PagePool, PagePool, list[int]]:
    host = PagePool("kv", 8, 16, "cpu", pin_memory=device.type == "cuda", bulk_bytes=bulk)
    dev = PagePool("kv", 8, 16, device, bulk_bytes=bulk)
    src = [5, 6, 7, 1, 2, 0]
    host.write(src, expected_rows(HASHES, 0, "kv", 16))
    return host, dev, src


@pytest.mark.parametrize("direct_min_bytes", [1, 1 << 20])  # bulk copied by runs / gathered
def test_load_back_copies_every_byte(direct_min_bytes):
    host, dev, src = _filled_pools(bulk=3000)
    dst = [0, 1, 2, 7, 3, 5]  # runs and strays on both sides
    seconds, nbytes = LoadBack(CPU, direct_min_bytes).copy([(host, dev)], src, dst)
    assert nbytes == 6 * (16 * 4 + 3000) and seconds >= 0
    assert verify_pages(dev, dst, HASHES, rank=0) == 0
    assert torch.equal(dev.bulk[dst], host.bulk[src])


def test_verify_catches_missing_or_foreign_bulk():
    host, dev, src = _filled_pools(bulk=3000)
    dst = [0, 1, 2, 3, 4, 5]
    dev.data.index_copy_(0, torch.tensor(dst), host.data[src])  # signatures only
    dev.bulk.zero_()
    assert verify_pages(dev, dst, HASHES, rank=0) == 6
    dev.bulk[dst] = host.bulk[src]
    assert verify_pages(dev, dst, HASHES, rank=0) == 0
    dev.bulk[3, -1] ^= 0xFF  # the last byte of one page: in the fixed sample
    assert verify_pages(dev, dst, HASHES, rank=0) == 1
    assert host.page_bytes == 16 * 4 + 3000 and len(host.tensors()) == 2


def test_load_back_grows_its_staging_and_release_frees():
    host, dev, src = _filled_pools(bulk=0)
    lb = LoadBack(CPU)
    lb.copy([(host, dev)], src[:2], [0, 1])
    lb.copy([(host, dev)], src, [2, 3, 4, 5, 6, 7])  # more rows than the first buffer
    assert verify_pages(dev, [2, 3, 4, 5, 6, 7], HASHES, rank=0) == 0
    host.release()
    assert host.data.numel() == 0 and host.bulk is None


def test_h2d_peak_on_cpu_says_why_none():
    out = h2d_peak(CPU)
    assert out["h2d_peak_gbps"] is None and "no CUDA device" in out["h2d_reason"]


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_real_kv_bytes_end_to_end_on_cpu():
    """Two gloo ranks, toy shape with real page bytes: the IO thread fills bulk bytes, the
    load-back copies and verifies them; bytes per load-back = pages x page bytes."""
    rows = run_scenario(2, {"protocol": "pr36425", "policy": "wait_complete", "tp": 2,
                            "kv_bytes": "real"}, {"latency_ms": 5.0}, n=4)
    page = 2 * 2 * 2 * 16 * 4 * 64  # toy: K,V x 2 layers x 2 KV heads/rank x 16 x fp32 x 64
    for rank in rows:
        for r in rank["rows"]:
            assert r["data_errors"] == 0 and r["loaded_tokens"] == 512
            assert r["load_back_bytes"] == 8 * page


@cuda
@pytest.mark.parametrize("direct_min_bytes", [1, 1 << 20])
def test_load_back_on_cuda_pinned_side_stream(direct_min_bytes):
    host, dev, src = _filled_pools(bulk=2 << 20, device=CUDA)
    assert host.data.is_pinned() and host.bulk.is_pinned()
    lb = LoadBack(CUDA, direct_min_bytes)
    seconds, nbytes = lb.copy([(host, dev)], src, [0, 1, 2, 7, 3, 5])
    assert seconds > 0 and nbytes == 6 * (64 + (2 << 20))
    assert verify_pages(dev, [0, 1, 2, 7, 3, 5], HASHES, rank=0) == 0


@cuda
def test_h2d_peak_on_cuda():
    out = h2d_peak(CUDA, nbytes=64 << 20, reps=3)
    assert out["h2d_peak_gbps"] > 1.0 and out["h2d_bytes"] == 64 << 20
