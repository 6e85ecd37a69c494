"""One cell of the hazard matrix on one rank: serve the scenario's burst, and write what
this rank saw to `rank<R>.json` in the cell's directory, whatever happened.

A rank whose serve failed (a collective timed out or was mispaired, a check raised) writes
its report and then fails itself, so the launcher sees a nonzero exit. Nothing here waits on
another rank after the serve: a peer may be dead or blocked.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from bench.hazards.scenarios import Scenario
from hicache.cache.cache import HiCache
from hicache.comm.groups import Layout
from hicache.serve.system import System, setup_distributed
from hicache.spec.config import HiCacheConfig
from hicache.spec.request import Request
from hicache.spec.storage_spec import StorageSpec

HARNESS_TIMEOUT_S = 30.0
SERVING = ".serving"  # rank<R>.serving: that rank has started; its serve's bound runs


def serve_bound_s(collective_timeout_s: float) -> float:
    """A cell's wall-clock bound from the moment every rank has started: a serve of a few
    hundred steps (10 s), a deadlock's two collective timeouts, and the harness group's."""
    return HARNESS_TIMEOUT_S + 10.0 + 2 * collective_timeout_s


class CellFailed(RuntimeError):
    """This rank's serve failed; its report is on disk."""


class Journal(list):
    """A list that also writes each item as a JSON line, flushed to the OS at once: what a
    rank logged survives it when gloo aborts the process (a collective of another size)."""

    def __init__(self, path: Path):
        super().__init__()
        self._file = open(path, "w", buffering=1)  # noqa: SIM115 (open for the cell's life)

    def append(self, item) -> None:
        super().append(item)
        self._file.write(json.dumps(item) + "\n")


def read_journal(path: Path) -> list:
    """The items a rank's journal holds (a torn last line, from an abort, is dropped)."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def journal_paths(cell_dir: Path, rank: int) -> dict[str, Path]:
    return {k: cell_dir / f"rank{rank}.{k}.jsonl" for k in ("records", "record_steps",
                                                             "sequence")}


def config(s: Scenario, protocol: str, seed: int, timeout_s: float) -> HiCacheConfig:
    # consensus_check on: SGLang's @rank_consensus log of every check_prefetch_progress
    # call is what the matrix compares between ranks to find the first divergence.
    return HiCacheConfig(protocol=protocol, policy=s.policy, tp=2, pp=s.pp,
                         collective_timeout_s=timeout_s, consensus_check=True,
                         max_prefill_tokens=2048, storage=StorageSpec(seed=seed, **s.storage),
                         **s.system)


def prompts(s: Scenario) -> list[list[int]]:
    """Request i: a private prefix (in storage), then tokens the prefill computes."""
    n = s.prefix_tokens + s.new_tokens
    return [[i * 1_000_003 + j for j in range(n)] for i in range(s.requests)]


def run_cell(rank: int, world: int, s: Scenario, protocol: str, seed: int, timeout_s: float,
             cell_dir: str, sglang=None) -> dict:
    """The launcher's entry point (bench.run.launch) on every rank; `sglang`: a
    sglang_adapter.target.Target whose decisions serve behind the seam (None: HiCache)."""
    torch.set_num_threads(1)
    # A process gloo aborts (a peer's collective of another size) says why only on its
    # stderr, in C++ (EnforceNotMet, with both sizes): kept in the cell for the classifier.
    os.dup2(os.open(Path(cell_dir) / f"rank{rank}.stderr",
                    os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    cfg = config(s, protocol, seed, timeout_s)
    layout = Layout(rank, cfg.tp, cfg.pp)
    # The harness's own group waits long enough for every rank to start; the system's
    # groups time out after the cell's collective timeout.
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=HARNESS_TIMEOUT_S))
    groups = setup_distributed(layout, torch.device("cpu"), timeout_s)
    system = System(cfg, layout, groups, torch.device("cpu"), seed, _cache_factory(sglang))
    # Every collective in order (the pairing check) and the rank-consensus log, journaled.
    paths = journal_paths(Path(cell_dir), rank)
    system.stats.counter.sequence = Journal(paths["sequence"])
    system.consensus.records = Journal(paths["records"])
    system.consensus.record_steps = Journal(paths["record_steps"])
    ps = prompts(s)
    system.populate([p[: s.prefix_tokens] for p in ps])
    reqs = [Request(f"r{i:02d}", p, i * s.gap_ms / 1e3) for i, p in enumerate(ps)]
    dist.barrier()  # every rank starts serving together (harness group)
    mark_serving(cell_dir, rank)
    t0 = time.monotonic()
    error = None
    try:
        system.run(reqs if rank == 0 else [])
    except Exception as e:  # the finding of this cell, reported below, then re-raised
        error = e
        _await_thread_error(system, e)
    report = _report(system, rank, error, t0)
    write_rank_json(Path(cell_dir) / f"rank{rank}.json", report)
    if error is not None:
        raise CellFailed(report["error"])
    return {"rank": rank}


def mark_serving(cell_dir: str, rank: int) -> None:
    """Tells the launcher this rank's start-up is over (bench.hazards.matrix.all_serving)."""
    (Path(cell_dir) / f"rank{rank}{SERVING}").touch()


def _cache_factory(sglang):
    """The system under test: HiCache, or SGLang's decisions (imported in this rank)."""
    if sglang is None:
        return HiCache
    from sglang_adapter import cache_factory

    return cache_factory(sglang)


def _await_thread_error(system: System, error: Exception, bound_s: float = 1.0) -> None:
    """A peer that died (gloo aborted it) fails this rank's collectives on every group
    within moments: give this rank's background threads that long (bounded, local) to
    record theirs, which names the collective the peer died in."""
    if "Connection" not in str(error):
        return
    deadline = time.monotonic() + bound_s
    while system.cache.controller.error is None and time.monotonic() < deadline:
        time.sleep(0.01)


def _report(system: System, rank: int, error: Exception | None, t0: float) -> dict:
    stats, counter = system.stats, system.stats.counter
    now = time.monotonic()
    recent = [{"step": st, "site": site, "group": g, "rid": rid, "ago_s": round(now - t, 3)}
              for st, site, g, rid, t in list(counter.recent)]
    rows = stats.request_rows()
    return {
        "rank": rank, "tp_rank": system.layout.tp_rank, "pp_rank": system.layout.pp_rank,
        "error": None if error is None else f"{type(error).__name__}: {error}",
        "error_kind": None if error is None else type(error).__name__,
        # A background thread's own failure (hit query, acks), which the serve's error
        # may not be: a peer gloo aborted fails it first.
        "thread_error": None if system.cache.controller.error is None
        else f"{type(system.cache.controller.error).__name__}: {system.cache.controller.error}",
        "step": counter.step, "elapsed_s": now - t0, "recent": recent,
        # Seconds since this rank's last completed collective: how long it sat in the one
        # that failed (bounded by the collective timeout).
        "stuck_s": None if not recent else recent[-1]["ago_s"],
        "records": list(system.consensus.records) if system.consensus else [],
        "record_steps": list(system.consensus.record_steps) if system.consensus else [],
        "sequence": [list(c) for c in counter.sequence or []],
        "group_ranks": {g: list(r) for g, r in system.groups.ranks.items()},
        "decisions": {rid: list(d) for rid, d in stats.decisions.items()},
        "data_errors": sum(r["data_errors"] for r in rows),
        "polls": sum(r["polls"] + r["absent_polls"] for r in rows),
        "decision_collectives": sum(r.get("coll_decision", 0) for r in rows),
        "steps": len(stats.steps),
        "step_collectives": sum(n for site, n in counter.by_site.items()
                                if site in ("decision", "completion", "per_step_min")),
        "by_site": dict(counter.by_site),  # every call site's count (the admission ring's too)
        "ready_lag_ms": [(r["ready"] - r["io_done"]) * 1e3 for r in rows
                         if r["ready"] is not None and r["io_done"] is not None],
        "crosscheck": system.crosscheck() if error is None else {},
    }


def write_rank_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, default=str))
    os.replace(tmp, path)
