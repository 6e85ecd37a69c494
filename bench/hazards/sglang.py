"""The hazard matrix's skew scenarios on SGLang's own poll (docs/sglang.md, "Hazards"):
the engine of `bench sglang-poll --hazard`.

Two TP ranks load SGLang from the SPEC and step alike: each step SGLang's own
check_hicache_events, then a walk that polls the pending prefetches with SGLang's own
check_prefetch_progress (sglang_adapter.decisions.poll's rig). The skew is planted in the walk, the
one place SGLang leaves rank-local:
- walk-skew (#30760): two prefetches pending; in the first step TP rank 1's walk stops
  after the first (its budget ran out), rank 0's polls both;
- ongoing-skew (#38273): the prefetch is in TP rank 0's `ongoing_prefetch` only (rank 1
  judged its hit below the threshold), so rank 1's poll returns before any collective.
Every collective SGLang issues is journaled at the door (group, SGLang's file:function:line,
request, step) before it is made, so a rank gloo aborts keeps its log. The cell is named by
the project's own classifier (bench.hazards.classify: the first unpaired collective, an
abort, a failed collective, ranks that ended a request differently, else OK), plus what
gloo itself did with the unpaired call: aborted (its size check), timed out, or paired it.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from bench.hazards.cell import (
    HARNESS_TIMEOUT_S,
    Journal,
    journal_paths,
    mark_serving,
    serve_bound_s,
    write_rank_json,
)
from bench.hazards.classify import classify
from bench.hazards.hang import classify_hang
from bench.hazards.matrix import (
    START_S,
    all_serving,
    exit_codes_text,
    fresh_cell,
    killed_ranks,
    read_rank_json,
    report_from_journal,
    stall_s,
    unreported,
)
from bench.hazards.sglang_case import HAZARDS, TP, HazardCase
from bench.run.launch import launch_to_end
from sglang_adapter import STEP_S, Door, PollCase, Source, load, make_rig


def _registered(rig, case: HazardCase, rank: int) -> list:
    """The prefetches this rank registered, in walk order."""
    pc = PollCase(case.policy, case.pending_polls)
    if case.scenario == "ongoing-skew":
        handle = rig.admit(pc, "r0")
        if rank == 1:  # its hit was below the threshold here: never registered
            rig.cache.ongoing_prefetch.pop(handle)
        return [handle]
    return [rig.admit(pc, f"r{i}") for i in range(2)]


def _walk(case: HazardCase, rank: int, step: int, pending: list) -> list:
    if case.scenario == "walk-skew" and rank == 1 and step == 0:
        return pending[:1]  # rank 1's budget ran out after the first
    return pending


def _rid(handle) -> str:
    return getattr(handle, "rid", handle)


def _serve(rig, door: Door, case: HazardCase, rank: int, log: dict) -> None:
    """Every step: SGLang's check_hicache_events, then the walk's polls, each journaled as
    a rank-consensus record ("rid -> answer", what SGLang's own @rank_consensus compares)."""
    cache = rig.cache
    cache.prefetch_stop_policy = case.policy
    rig.set_budget((case.pending_polls - 0.5) * STEP_S)
    pending = _registered(rig, case, rank)
    for step in range(case.steps):
        door.step, door.rid = step, None
        rig.step()
        for handle in _walk(case, rank, step, list(pending)):
            rid = door.rid = _rid(handle)
            if case.policy == "wait_complete" and step >= case.pending_polls:
                # Its IO landed and the ack drain ended it (poll.py), at the same
                # (virtual) time on every rank, whatever each rank polled before.
                cache.ongoing_prefetch.pop(handle, None)
            ready = bool(cache.check_prefetch_progress(handle))
            log["records"].append(f"{rid} -> {ready}")
            log["record_steps"].append(step)
            if ready:
                pending.remove(handle)
                log["ready_steps"][rid] = step
        rig.clock.now += STEP_S


def hazard_rank(rank: int, world: int, source: Source, case: HazardCase,
                cell_dir: str) -> dict:
    """A spawned rank: serves the case and writes rank<R>.json, whatever happened."""
    torch.set_num_threads(1)
    # gloo says why it aborted a process only on stderr (bench.hazards.classify.gloo_abort).
    os.dup2(os.open(Path(cell_dir) / f"rank{rank}.stderr",
                    os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=HARNESS_TIMEOUT_S))
    tp_group = dist.new_group(list(range(TP)), backend="gloo",
                              timeout=timedelta(seconds=case.timeout_s))
    loaded = load(source)
    door = Door(source.root)
    door.register("tp", tp_group)
    paths = journal_paths(Path(cell_dir), rank)
    door.sequence = Journal(paths["sequence"])
    log = {"records": Journal(paths["records"]), "record_steps": Journal(paths["record_steps"]),
           "ready_steps": {}}
    rig = make_rig(loaded, rank, TP, 1, tp_group, None)
    dist.barrier()  # every rank starts serving together (harness group)
    mark_serving(cell_dir, rank)
    error, t0 = None, time.monotonic()
    door.install()
    try:
        _serve(rig, door, case, rank, log)
    except Exception as e:  # the cell's finding: reported, then re-raised
        error = f"{type(e).__name__}: {e}"
    finally:
        door.uninstall()
    write_rank_json(Path(cell_dir) / f"rank{rank}.json",
           _report(rank, door, log, error, case, time.monotonic() - t0))
    if error is not None:
        raise RuntimeError(error)
    return {"rank": rank}


def _report(rank: int, door: Door, log: dict, error: str | None, case: HazardCase,
            elapsed: float) -> dict:
    # Classified: the collectives' pairing and the polls' answers (records). Not
    # classified: the step each rank found a request ready (`ready_steps`): under
    # walk-skew rank 1 reaches r1 a step late by construction, whatever SGLang does.
    return {"rank": rank, "error": error, "thread_error": None, "recent": [],
            "records": list(log["records"]), "record_steps": list(log["record_steps"]),
            "ready_steps": log["ready_steps"], "sequence": list(door.sequence),
            "group_ranks": {"tp": list(range(TP))}, "decisions": {},
            "data_errors": 0, "steps": None if error else case.steps,
            "elapsed_s": round(elapsed, 3)}


def run_hazard(source: Source, case: HazardCase, out: Path, bound_s: float | None = None,
               tag: str = "") -> dict:
    """One cell: its row (the classifier's outcome, site, step, detail; what gloo did).
    `bound_s` bounds the serve from the moment both ranks have started (START_S bounds the
    start-up, SGLang's import on each); by default the matrix's cells' bound."""
    if bound_s is None:
        bound_s = serve_bound_s(case.timeout_s)
    cell_dir = out / f"{case.scenario}__{source.label}__{case.policy}{tag}"
    fresh_cell(cell_dir)
    got, dead = launch_to_end(TP, hazard_rank, (source, case, str(cell_dir)),
                              timeout_s=bound_s, started=lambda: all_serving(cell_dir, TP),
                              start_s=START_S)
    killed_at = time.time()
    reports = [read_rank_json(cell_dir / f"rank{r}.json") or report_from_journal(cell_dir, r, dead)
               for r in range(TP)]
    # A rank still running at the bound: a hang, classified as the matrix's cells are
    # (bench.hazards.hang: deadlock, livelock, or harness only where it could not run).
    killed = killed_ranks(cell_dir, reports, got, dead, killed_at)
    found = classify_hang(killed, stall_s(case.timeout_s), bound_s) if killed else \
        classify(reports, unreported(got, dead, bound_s, TP))
    row = {"scenario": case.scenario, "issue": HAZARDS[case.scenario],
           "sglang": source.label, "policy": case.policy, **found,
           "gloo": _gloo(reports), "exit_codes": exit_codes_text(got, dead, TP),
           # per rank, SGLang's collectives issued while a poll was in hand
           "poll_collectives": [None if r is None else sum(1 for c in r["sequence"] if c[2])
                                for r in reports]}
    return row


def _gloo(reports: list[dict | None]) -> str:
    """What gloo did with the cell's collectives, in its own words where it said any."""
    for rep in reports:
        if rep is not None and rep.get("gloo"):
            return f"aborted rank {rep['rank']}: {rep['gloo']}"
    errors = [f"rank {r['rank']}: {r['error'][:160]}" for r in reports if r and r["error"]]
    if errors:
        return "; ".join(errors)
    return "every collective completed"
