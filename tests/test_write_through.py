"""Write-through end to end on one rank: a request's computed pages reach storage, and a
later request with the same prefix, on a server whose device and host do not hold it,
fetches it from storage. Without the write path the later request computes it all again.

The two requests are served by two servers on one file storage, one after the other, so the
later one meets an empty device and host by construction. Served by one server, the prefix
left the host only once three fillers had pushed it out, and a busy machine could serve the
last filler and the repeat in one step: the repeat then found half its prefix on the host.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hicache.comm.groups import Layout
from hicache.memory.storage import StorageSpec
from hicache.serve.scheduler import Request
from hicache.serve.system import System, setup_distributed
from hicache.spec.config import HiCacheConfig

PAGE = 64
PAGES = 8  # the first request's prompt: 8 whole pages and one token
DEVICE, HOST = 12, 20  # pages: the 9-page prompt fits on either


def _prompt(tag: int, pages: int = PAGES) -> list[int]:
    return [tag * 100_000 + i for i in range(pages * PAGE + 1)]


def _serve(policy: str, requests: list[Request], kv_bytes: str = "synthetic",
           root: Path | None = None) -> dict:
    """One server's rows; `root`: a file storage there (kept for the next server)."""
    storage = (StorageSpec(latency_ms=1.0, exists_latency_ms=0.0) if root is None else
               StorageSpec(kind="file", root=str(root), latency_ms=1.0, exists_latency_ms=0.0))
    cfg = HiCacheConfig(protocol="pr36425", policy="wait_complete", write_policy=policy,
                        model="toy", kv_bytes=kv_bytes,
                        host_pool_pages=HOST, device_pool_pages=DEVICE, storage=storage)
    layout = Layout(0, 1, 1)
    system = System(cfg, layout, setup_distributed(layout, torch.device("cpu"), 30.0),
                    torch.device("cpu"))
    stats = system.run(requests)
    system.close()
    assert stats.host_slots_unaccounted == 0
    assert stats.write_path.get("device_slots_unaccounted", 0) == 0
    return {r["rid"]: r for r in stats.request_rows()}


def _first_then_again(policy: str, root: Path, kv_bytes: str = "synthetic") -> tuple[dict, dict]:
    """The prompt served by one server, then again by a second on the same storage."""
    first = _serve(policy, [Request("a", _prompt(1), 0.0)], kv_bytes, root)["a"]
    return first, _serve(policy, [Request("a-again", _prompt(1), 0.0)], kv_bytes,
                         root)["a-again"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kv_bytes", ["synthetic", "real"])
def test_write_through_brings_a_prefix_back_from_storage(kv_bytes, tmp_path):
    # real: pages carry the toy model's KV bytes (32 KiB) too, copied and checked alike.
    first, again = _first_then_again("write_through", tmp_path, kv_bytes)
    assert first["computed_tokens"] == PAGES * PAGE + 1
    assert (again["device_hit_tokens"], again["host_hit_tokens"]) == (0, 0)
    assert again["storage_hit_tokens"] == PAGES * PAGE and again["computed_tokens"] == 1
    assert again["terminated_by"] == "ack" and again["data_errors"] == 0


@pytest.mark.timeout(60)
def test_without_the_write_path_nothing_comes_back(tmp_path):
    _, again = _first_then_again("none", tmp_path)
    assert again["storage_hit_tokens"] == 0 and again["computed_tokens"] == PAGES * PAGE + 1


@pytest.mark.timeout(60)
def test_a_repeat_right_away_hits_the_device():
    rows = _serve("write_through", [Request("a", _prompt(1), 0.0),
                                    Request("b", _prompt(1), 0.1)])
    assert rows["b"]["device_hit_tokens"] == PAGES * PAGE and rows["b"]["computed_tokens"] == 1
