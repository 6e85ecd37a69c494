"""Write-through end to end on one rank: a request's computed pages reach storage, and once
the device and the host have evicted them, a later request with the same prefix fetches it
from storage. Without the write path the later request computes it all again.
"""

from __future__ import annotations

import pytest
import torch

from hicache.comm.groups import Layout
from hicache.memory.storage import StorageSpec
from hicache.serve.scheduler import Request
from hicache.serve.system import System, setup_distributed
from hicache.spec.config import HiCacheConfig

PAGE = 64
PAGES = 8  # the first request's prompt: 8 whole pages and one token
DEVICE, HOST = 12, 20  # two 8-page prompts never fit on the device, three not on the host


def _prompt(tag: int, pages: int = PAGES) -> list[int]:
    return [tag * 100_000 + i for i in range(pages * PAGE + 1)]


def _serve(policy: str, requests: list[Request], kv_bytes: str = "synthetic") -> dict:
    cfg = HiCacheConfig(protocol="pr36425", policy="wait_complete", write_policy=policy,
                        model="toy", kv_bytes=kv_bytes,
                        host_pool_pages=HOST, device_pool_pages=DEVICE,
                        storage=StorageSpec(latency_ms=1.0, exists_latency_ms=0.0))
    layout = Layout(0, 1, 1)
    system = System(cfg, layout, setup_distributed(layout, torch.device("cpu"), 30.0),
                    torch.device("cpu"))
    stats = system.run(requests)
    system.close()
    assert stats.host_slots_unaccounted == 0
    assert stats.write_path.get("device_slots_unaccounted", 0) == 0
    return {r["rid"]: r for r in stats.request_rows()}


def _workload() -> list[Request]:
    first = Request("a", _prompt(1), 0.0)
    # Three others of 8 pages each: the device demotes a at the first, the host evicts it
    # at the second (its tail) and third. The host is larger than the device (SGLang's
    # default ratio is 2), so a-again's 8-page prefetch fits beside the last two.
    fillers = [Request(f"f{i}", _prompt(10 + i), 0.3 * (i + 1)) for i in range(3)]
    again = Request("a-again", _prompt(1), 1.2)
    return [first, *fillers, again]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kv_bytes", ["synthetic", "real"])
def test_write_through_brings_an_evicted_prefix_back_from_storage(kv_bytes):
    # real: pages carry the toy model's KV bytes (32 KiB) too, copied and checked alike.
    rows = _serve("write_through", _workload(), kv_bytes)
    assert rows["a"]["computed_tokens"] == PAGES * PAGE + 1
    again = rows["a-again"]
    assert (again["device_hit_tokens"], again["host_hit_tokens"]) == (0, 0)
    assert again["storage_hit_tokens"] == PAGES * PAGE and again["computed_tokens"] == 1
    assert again["terminated_by"] == "ack" and again["data_errors"] == 0


@pytest.mark.timeout(60)
def test_without_the_write_path_nothing_comes_back():
    rows = _serve("none", _workload())
    again = rows["a-again"]
    assert again["storage_hit_tokens"] == 0 and again["computed_tokens"] == PAGES * PAGE + 1


@pytest.mark.timeout(60)
def test_a_repeat_right_away_hits_the_device():
    rows = _serve("write_through", [Request("a", _prompt(1), 0.0),
                                    Request("b", _prompt(1), 0.1)])
    assert rows["b"]["device_hit_tokens"] == PAGES * PAGE and rows["b"]["computed_tokens"] == 1
