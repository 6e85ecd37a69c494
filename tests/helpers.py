"""Test doubles and scripted scenarios run on real gloo groups (spawned per test)."""

from __future__ import annotations

import torch

from bench.launch import launch
from hicache.comm import Layout
from hicache.config import HiCacheConfig
from hicache.scheduler import Request
from hicache.storage import StorageSpec
from hicache.system import System, setup_distributed


def prompts(n: int, prefix_tokens: int, new_tokens: int) -> list[list[int]]:
    """Request i: a private prefix (in storage) then new tokens (not in storage)."""
    return [[i * 100_000 + j for j in range(prefix_tokens + new_tokens)] for i in range(n)]


def scenario(rank: int, world: int, cfg_kw: dict, storage_kw: dict, n: int,
             prefix_tokens: int, new_tokens: int, gap_s: float) -> dict:
    torch.set_num_threads(1)
    cfg = HiCacheConfig(storage=StorageSpec(**storage_kw), **cfg_kw)
    layout = Layout(rank, cfg.tp, cfg.pp)
    groups = setup_distributed(layout, torch.device("cpu"), cfg.collective_timeout_s)
    system = System(cfg, layout, groups, torch.device("cpu"))
    ps = prompts(n, prefix_tokens, new_tokens)
    system.populate([p[:prefix_tokens] for p in ps])
    reqs = [Request(f"r{i:03d}", p, i * gap_s) for i, p in enumerate(ps)]
    stats = system.run(reqs if rank == 0 else [])
    return {"rows": stats.request_rows(), "decisions": stats.decisions,
            "crosscheck": system.crosscheck(), "by_site": dict(stats.counter.by_site),
            "steps": stats.step_rows()}


def run_scenario(world: int, cfg_kw: dict, storage_kw: dict | None = None, n: int = 6,
                 prefix_tokens: int = 512, new_tokens: int = 64, gap_s: float = 0.01,
                 timeout_s: float = 90.0) -> list[dict]:
    cfg_kw = {"collective_timeout_s": 30.0, **cfg_kw}
    return launch(world, scenario, (cfg_kw, storage_kw or {}, n, prefix_tokens, new_tokens,
                                    gap_s), timeout_s=timeout_s)
