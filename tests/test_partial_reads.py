"""Per-page reads on real gloo groups: a page storage cannot return after the hit query ends
the prefetch there, the pages before it are kept, and every rank keeps the same count.

Holes are pages one rank's storage lacks although its hit query counted them (see
tests.helpers.populate): the ack MIN (or pre27010's completion MIN) carries the short
count of that rank to the other.
"""

from __future__ import annotations

import pytest

from hicache.spec.cost_model import PROTOCOLS
from tests.helpers import case, run_cases

pytestmark = pytest.mark.dist

# Request r000's KV page 1 is missing on rank 1 only: 64 tokens are usable, not 0.
KV_HOLE = ((1, 0, 1, "kv"),)
# 16-token pages, 256-page prefix (two read batches); r000's side-car page 130 is missing on
# rank 1: the first batch and two pages of the second are usable (130 pages, 2080 tokens).
SIDE_HOLE = ((1, 0, 130, "indexer"),)
FAST = {"latency_ms": 2.0}

KV_VARIANTS = [(p, "wait_complete") for p in PROTOCOLS] + [("pr36425", "timeout")]
SIDE_VARIANTS = [(p, "wait_complete") for p in PROTOCOLS]


@pytest.fixture(scope="module")
def results():
    kv = [case({"protocol": p, "policy": q, "tp": 2}, FAST, n=3, holes=KV_HOLE)
          for p, q in KV_VARIANTS]
    side = [case({"protocol": p, "policy": q, "tp": 2, "page_size": 16, "extra_pool": True},
                 FAST, n=3, prefix_tokens=4096, holes=SIDE_HOLE) for p, q in SIDE_VARIANTS]
    keys = [("kv", *v) for v in KV_VARIANTS] + [("side", *v) for v in SIDE_VARIANTS]
    return dict(zip(keys, run_cases(2, kv + side, timeout_s=100), strict=True))


def _check(per_rank: list[dict], usable_r000: int, full: int) -> None:
    assert per_rank[0]["decisions"] == per_rank[1]["decisions"], "ranks disagree"
    for rank, res in enumerate(per_rank):
        rows = {r["rid"]: r for r in res["rows"]}
        assert rows["r000"]["prefetched_tokens"] == usable_r000, f"rank {rank}"
        assert rows["r000"]["loaded_tokens"] == usable_r000, f"rank {rank}"
        assert all(r["prefetched_tokens"] == full for rid, r in rows.items() if rid != "r000")
        assert all(r["data_errors"] == 0 for r in rows.values()), f"rank {rank}"
    assert per_rank[1]["rows"][0]["io_error"], "rank 1's read of r000 did not come up short"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("protocol", "policy"), KV_VARIANTS,
                         ids=[f"{p}-{q}" for p, q in KV_VARIANTS])
def test_missing_kv_page_keeps_the_pages_before_it(results, protocol, policy):
    _check(results[("kv", protocol, policy)], usable_r000=64, full=512)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("protocol", "policy"), SIDE_VARIANTS,
                         ids=[f"{p}-{q}" for p, q in SIDE_VARIANTS])
def test_missing_sidecar_page_clamps_the_prefix_to_the_pages_before_it(results, protocol,
                                                                       policy):
    _check(results[("side", protocol, policy)], usable_r000=130 * 16, full=4096)
