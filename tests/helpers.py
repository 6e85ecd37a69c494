"""Test doubles and scripted scenarios run on real gloo groups (ranks started per launch).

How the tests start ranks (`START`): "forkserver" by default. Python starts one fresh
interpreter per session (as spawn would, single-threaded, no CUDA), which imports torch and
the project once (tests/conftest.py); each rank is forked from it, never from pytest's own
threaded process, so the reason to spawn holds, and a launch costs about 0.1 s instead of
1.5-2 s of importing torch twice on 2 cores. `HICACHE_TEST_START=spawn` runs every launch
spawned, as `bench run` always does. The one thing a forked rank does not see is an
environment variable the test process set after the server started: a test that needs one
in its ranks passes it as an argument.
"""

from __future__ import annotations

import os

import torch

from bench.run import launch as launcher
from hicache.cache.operations import KV, SIDECAR
from hicache.comm.groups import Layout
from hicache.memory.hashing import page_hashes
from hicache.memory.storage import StorageSpec
from hicache.serve.scheduler import Request
from hicache.serve.system import System, setup_distributed
from hicache.spec.config import HiCacheConfig

START = os.environ.get("HICACHE_TEST_START", "forkserver")
PRELOAD = ["tests.helpers"]  # what the forkserver imports once (torch, hicache)


def launch(world: int, fn, args: tuple = (), timeout_s: float = 120.0) -> list:
    """bench.run.launch.launch, started as the tests start ranks (START)."""
    return launcher.launch(world, fn, args, timeout_s=timeout_s, method=START)


def launch_to_end(world: int, fn, args: tuple = (), timeout_s: float = 120.0):
    """bench.run.launch.launch_to_end, started as the tests start ranks (START)."""
    return launcher.launch_to_end(world, fn, args, timeout_s=timeout_s, method=START)


def prompts(n: int, prefix_tokens: int, new_tokens: int) -> list[list[int]]:
    """Request i: a private prefix (in storage) then new tokens (not in storage)."""
    return [[i * 100_000 + j for j in range(prefix_tokens + new_tokens)] for i in range(n)]


def build_scenario(rank: int, cfg_kw: dict, storage_kw: dict, n: int, prefix_tokens: int,
                   new_tokens: int, gap_s: float) -> tuple[System, list[Request]]:
    """This rank's system with every prefix in storage, and rank 0's requests ([] else)."""
    torch.set_num_threads(1)
    cfg = HiCacheConfig(storage=StorageSpec(**storage_kw), **cfg_kw)
    layout = Layout(rank, cfg.tp, cfg.pp)
    groups = setup_distributed(layout, torch.device("cpu"), cfg.collective_timeout_s)
    system = System(cfg, layout, groups, torch.device("cpu"))
    ps = prompts(n, prefix_tokens, new_tokens)
    system.populate([p[:prefix_tokens] for p in ps])
    reqs = [Request(f"r{i:03d}", p, i * gap_s) for i, p in enumerate(ps)]
    return system, reqs if rank == 0 else []


def scenario(rank: int, world: int, cfg_kw: dict, storage_kw: dict, n: int,
             prefix_tokens: int, new_tokens: int, gap_s: float) -> dict:
    system, reqs = build_scenario(rank, cfg_kw, storage_kw, n, prefix_tokens, new_tokens,
                                  gap_s)
    stats = system.run(reqs)
    return {"rows": stats.request_rows(), "decisions": stats.decisions,
            "crosscheck": system.crosscheck(), "by_site": dict(stats.counter.by_site),
            "steps": stats.step_rows()}


def run_scenario(world: int, cfg_kw: dict, storage_kw: dict | None = None, n: int = 6,
                 prefix_tokens: int = 512, new_tokens: int = 64, gap_s: float = 0.01,
                 timeout_s: float = 90.0) -> list[dict]:
    cfg_kw = {"collective_timeout_s": 30.0, **cfg_kw}
    return launch(world, scenario, (cfg_kw, storage_kw or {}, n, prefix_tokens, new_tokens,
                                    gap_s), timeout_s=timeout_s)


# ---- several configurations in one launch ---------------------------------------------------
#
# Spawning ranks costs about a second and a half here; a launch that runs many configurations
# back to back on the same process groups (created once per process, as in bench) keeps the
# distributed tests fast. Each configuration gets a fresh System, so its counters and its
# cross-check against the groups' sequence numbers start from zero.

FR_BUFFER = "20000"  # flight-recorder ring size: larger than any one launch's collectives


def case(cfg_kw: dict, storage_kw: dict | None = None, n: int = 6, prefix_tokens: int = 512,
         new_tokens: int = 64, gap_s: float = 0.01, holes: tuple = (),
         patch: str = "") -> dict:
    """One configuration and its scripted workload, for `run_cases`. `holes`: (rank,
    request index, page index, pool) of pages that rank's storage lacks (see populate)."""
    return {"cfg_kw": {"collective_timeout_s": 30.0, **cfg_kw}, "storage_kw": storage_kw or {},
            "n": n, "prefix_tokens": prefix_tokens, "new_tokens": new_tokens, "gap_s": gap_s,
            "holes": tuple(holes), "patch": patch}


def populate(system: System, rank: int, prefixes: list[list[int]], holes=()) -> None:
    """Every full page of every prefix into this rank's storage, KV and (when configured)
    side-car, except the holes of this rank. A page missing from every configured pool is
    stored under the other pool's name, so the hit query (any pool) still counts it and
    only the read finds it missing: a page lost after the hit query."""
    if not any(r == rank for r, *_ in holes):
        system.populate(prefixes)
        return
    cfg = system.cfg
    pools = {KV: cfg.kv_page_elems}
    if cfg.extra_pool:
        pools[SIDECAR] = cfg.sidecar_page_elems
    other = {KV: SIDECAR, SIDECAR: KV}
    for i, prefix in enumerate(prefixes):
        for j, h in enumerate(page_hashes(prefix, cfg.page_size)):
            lacks = {pool for r, q, p, pool in holes if (r, q, p) == (rank, i, j)}
            for pool, elems in pools.items():
                if pool not in lacks:
                    system.storage.put([h], pool, elems)
            if lacks >= set(pools):
                pool = other[next(iter(lacks))]
                system.storage.put([h], pool, pools.get(pool, cfg.kv_page_elems))


def _fr_entries() -> list[dict]:
    """The flight recorder's entries so far, oldest first (no stack traces: they are most of
    the cost of a dump)."""
    import pickle

    trace = torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False)
    return sorted(pickle.loads(trace)["entries"], key=lambda e: e["record_id"])


def _fr_per_case(groups, first_id: int, n_cases: int) -> list[dict[str, int]]:
    """Flight-recorder entries per system group for each of `n_cases` configurations run
    since record `first_id`, from one dump: each configuration ends with one barrier on the
    default group (the harness's group, not counted), which closes its share of the entries."""
    import torch.distributed as dist

    entries = [e for e in _fr_entries() if e["record_id"] >= first_id]
    if not entries or entries[0]["record_id"] != first_id:
        raise RuntimeError(f"the flight recorder's ring ({FR_BUFFER} entries) overflowed: "
                           "raise FR_BUFFER or run fewer configurations in one launch")
    names: dict[str, list[str]] = {}  # torch's group name -> the system's names for it
    for name, pg in groups.pg.items():
        if pg is not None:
            names.setdefault(pg.group_name, []).append(name)
    default = dist.distributed_c10d._get_default_group().group_name
    fresh = {name: 0 for group in names.values() for name in group}
    per_case = [dict(fresh)]
    for e in entries:
        pg_name = e["process_group"][0]
        if pg_name == default:  # the harness's: not counted; its barrier ends a configuration
            if e["profiling_name"].endswith(":barrier"):
                per_case.append(dict(fresh))
            continue
        if pg_name not in names:
            raise RuntimeError(f"a collective on group {pg_name}, not the system's or the "
                               "harness's")
        for name in names[pg_name]:
            per_case[-1][name] += 1
    if len(per_case) != n_cases + 1 or any(per_case[-1].values()):
        raise RuntimeError(f"{len(per_case) - 1} harness barriers recorded for {n_cases} "
                           "configurations")
    return per_case[:-1]


def _run_one(rank: int, groups, c: dict) -> dict:
    import torch.distributed as dist

    cfg = HiCacheConfig(storage=StorageSpec(**c["storage_kw"]), **c["cfg_kw"])
    layout = Layout(rank, cfg.tp, cfg.pp)
    system = System(cfg, layout, groups, torch.device("cpu"))
    if c.get("patch"):  # "module:function", called with (system, rank) before the serve
        import importlib

        module, name = c["patch"].split(":")
        getattr(importlib.import_module(module), name)(system, rank)
    ps = prompts(c["n"], c["prefix_tokens"], c["new_tokens"])
    populate(system, rank, [p[: c["prefix_tokens"]] for p in ps], c.get("holes", ()))
    reqs = [Request(f"r{i:03d}", p, i * c["gap_s"]) for i, p in enumerate(ps)]
    stats = system.run(reqs if rank == 0 else [])
    host = system.cache.host_kv
    out = {"rows": stats.request_rows(), "decisions": stats.decisions,
           "crosscheck": system.crosscheck(), "by_site": dict(stats.counter.by_site),
           "steps": stats.step_rows(), "raw_by_group": dict(stats.counter.raw_by_group),
           "layout": (layout.tp_rank, layout.pp_rank),
           # Host pool accounting from the outside: free + in the tree must be all of it.
           "host_pages": host.num_pages, "host_free": host.available,
           "host_in_tree": system.cache.tree.total_pages,
           "host_slots_unaccounted": getattr(stats, "host_slots_unaccounted", None),
           "write_path": stats.write_path}
    system.close()
    dist.barrier()  # the next configuration starts on quiet groups on every rank
    return out


def cases_worker(rank: int, world: int, cases: list[dict], flight_recorder: bool) -> list[dict]:
    import os

    if flight_recorder:
        os.environ["TORCH_FR_BUFFER_SIZE"] = FR_BUFFER  # read when the first group is made
    torch.set_num_threads(1)
    first = HiCacheConfig(**cases[0]["cfg_kw"])
    assert all((c["cfg_kw"].get("tp", 1), c["cfg_kw"].get("pp", 1)) == (first.tp, first.pp)
               for c in cases), "one launch, one layout"
    assert first.world_size == world
    groups = setup_distributed(Layout(rank, first.tp, first.pp), torch.device("cpu"),
                               first.collective_timeout_s)
    before = _fr_entries() if flight_recorder else []
    first_id = before[-1]["record_id"] + 1 if before else 0
    results = [_run_one(rank, groups, c) for c in cases]
    if flight_recorder:  # one dump for the launch: a dump per configuration cost quadratic time
        for out, fr in zip(results, _fr_per_case(groups, first_id, len(cases)), strict=True):
            out["fr"] = fr
    return results


def run_cases(world: int, cases: list[dict], timeout_s: float = 90.0,
              flight_recorder: bool = False) -> list[list[dict]]:
    """Runs every case in one launch; returns results[case][rank]."""
    per_rank = launch(world, cases_worker, (cases, flight_recorder), timeout_s=timeout_s)
    return [[per_rank[r][i] for r in range(world)] for i in range(len(cases))]
