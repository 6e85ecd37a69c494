"""A prompt the device KV pool can never hold is refused, as SGLang 0.5.23's
validate_input_length does (managers/utils.py; the limit from tp_worker.py: kv_capacity - 1
- 5 tokens here, the model having no context length of its own), on every rank alike, and
the run goes on; with allow_auto_truncate it is cut to that length and served. Prompts
that fit, but not beside the pages other requests hold, wait instead of failing the run.

At TP2 with the device tier on (every whole page of a prompt takes a device page): a pool
of 8 pages of 64 tokens holds prompts of at most 512 - 6 = 506 tokens, exclusive.
"""

from __future__ import annotations

import pytest
import torch

from hicache.comm.groups import Layout
from hicache.memory.storage import StorageSpec
from hicache.serve.scheduler import Request
from hicache.serve.system import System, setup_distributed
from hicache.spec.config import HiCacheConfig
from tests.helpers import launch

PAGE, POOL = 64, 8
LIMIT = POOL * PAGE - 6  # SGLang's max_req_input_len


def _prompt(i: int, n: int) -> list[int]:
    return [i * 100_000 + j for j in range(n)]


def _serve(rank: int, groups, lengths: list[int], gap_s: float, **kw) -> dict:
    cfg = HiCacheConfig(tp=2, protocol="pr36425", policy="wait_complete", page_size=PAGE,
                        write_policy="write_through", kv_bytes="synthetic",
                        device_pool_pages=POOL, host_pool_pages=64, kv_budget_gib=1024.0,
                        collective_timeout_s=30.0, storage=StorageSpec(latency_ms=0.1), **kw)
    system = System(cfg, Layout(rank, 2, 1), groups, torch.device("cpu"))
    reqs = [Request(f"r{i}", _prompt(i, n), i * gap_s) for i, n in enumerate(lengths)]
    stats = system.run(reqs if rank == 0 else [])
    system.close()
    return {"limit": system.cache.max_input_tokens,
            "rows": {r["rid"]: r for r in stats.request_rows()},
            "decisions": stats.decisions, "write_path": stats.write_path,
            "unaccounted": stats.host_slots_unaccounted}


def _worker(rank: int, world: int) -> list[dict]:
    torch.set_num_threads(1)
    groups = setup_distributed(Layout(rank, 2, 1), torch.device("cpu"), 30.0)
    # One page longer than the pool, the longest that is refused and the longest served.
    refused = _serve(rank, groups, [(POOL + 1) * PAGE, LIMIT, LIMIT - 1], gap_s=0.05)
    cut = _serve(rank, groups, [(POOL + 1) * PAGE], gap_s=0.05, allow_auto_truncate=True)
    # Five pages each, all at once: the second fits only after the first's pages are cached
    # (its write-through ack unlocks them), so it waits a few steps.
    waits = _serve(rank, groups, [5 * PAGE + 10, 5 * PAGE + 20, 5 * PAGE + 30], gap_s=0.0)
    return [refused, cut, waits]


@pytest.fixture(scope="module")
def runs() -> list[list[dict]]:
    per_rank = launch(2, _worker, timeout_s=120.0)
    return [[per_rank[r][i] for r in range(2)] for i in range(3)]


@pytest.mark.timeout(150)
def test_a_prompt_past_the_pool_is_refused_and_one_below_the_limit_served(runs):
    for rank in runs[0]:
        assert rank["limit"] == LIMIT
        rows = rank["rows"]
        assert [rows[r]["terminated_by"] == "rejected" for r in ("r0", "r1", "r2")] == \
            [True, True, False]
        assert rows["r0"]["prompt_tokens"] == (POOL + 1) * PAGE  # its length, recorded
        assert rows["r0"]["first_token"] is None and rows["r1"]["first_token"] is None
        assert rows["r2"]["first_token"] is not None
        assert rows["r2"]["prompt_tokens"] == LIMIT - 1 and rows["r2"]["data_errors"] == 0
        assert rank["decisions"]["r0"] == ("rejected", 0, None)
        assert rank["write_path"]["device_slots_unaccounted"] == 0 and rank["unaccounted"] == 0
    assert runs[0][0]["decisions"] == runs[0][1]["decisions"]  # every rank alike


@pytest.mark.timeout(150)
def test_auto_truncate_cuts_it_to_the_limit_and_serves_it(runs):
    for rank in runs[1]:
        row = rank["rows"]["r0"]
        assert row["terminated_by"] != "rejected" and row["first_token"] is not None
        assert row["prompt_tokens"] == LIMIT


@pytest.mark.timeout(150)
def test_prompts_that_fit_only_one_at_a_time_wait_and_are_all_served(runs):
    for rank in runs[2]:
        rows = rank["rows"]
        assert all(rows[r]["first_token"] is not None for r in ("r0", "r1", "r2"))
        firsts = sorted(rows[r]["first_token"] for r in ("r0", "r1", "r2"))
        assert firsts[0] < firsts[1] < firsts[2]  # one prefill each: the others waited
        assert rank["write_path"]["device_slots_unaccounted"] == 0
