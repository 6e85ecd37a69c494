"""What every rank runs: the plan's cells in order, in lock-step; rank 0 gathers each
cell's per-rank stats (off the timed path), checks agreement and data, and writes rows.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from bench.run import calibrate, duet, fit, host_profile, machine, turns, workload
from bench.run.duet import Lane
from bench.run.plan import Cell, RunPlan
from bench.run.sglang_worlds import Side
from bench.run.sink import ResultSink
from bench.rundir.rundir import write_serve_record
from hicache.cache.cache import HiCache
from hicache.comm.groups import Groups, Layout
from hicache.memory.loadback import h2d_peak
from hicache.serve.seam import CacheFactory
from hicache.serve.system import System, pick_device, setup_distributed

log = logging.getLogger("bench")


@dataclass(frozen=True)
class RankContext:
    """What one rank serves with, built once (_setup) and passed down to every serve: its
    place in the layout, its groups and device, the process-wide scheduler step count
    (fault injection counts across cells), its lane of a duet, and the system under test."""

    layout: Layout
    groups: Groups
    device: torch.device
    steps: list[int]
    lane: Lane | None
    make_cache: CacheFactory

    @property
    def rank0(self) -> bool:
        return self.layout.rank == 0


def run_rank(rank: int, world: int, plan: RunPlan, lane: Lane | None = None,
             side: Side | None = None) -> dict:
    """Entry point of one rank (spawned locally, or in-process under torchrun); `lane`: this
    rank's lane of a duet (bench.run.duet), which serves only its own cells; `side`: this
    rank's side of several SGLangs (bench.run.sglang_worlds), which serves its own cells in turn.
    A cost sweep's cells each serve under the plan of their added cost (plan.per_delay).
    Where another revision's run serves this one as a side (bench.run.turns.ENV set), its
    turns come from that run."""
    side = side or (None if lane else turns.from_env(rank, world, plan))
    plans = plan.per_delay()  # one plan (and sink) per added cost of a sweep, else one
    with side.setup() if side else contextlib.nullcontext():
        sinks, ctx = _setup(rank, world, plan, plans, lane)
    if plan.sglang is not None:
        _freeze_imports()
    cells = (side.cells(plan) if side else duet.lane_cells(plan, lane.index) if lane
             else plan.cells())
    for cell in cells:
        with side.serve(cell) if side else contextlib.nullcontext():
            _cell(plans[cell.delay_ms], cell, len(plan.cells() if side else cells),
                  sinks.get(cell.delay_ms), ctx)
    if side:
        side.end(plan)  # nothing of this side's end overlaps another side's serve
    for sink in sinks.values():
        sink.finish()
    return {"dir": plan.out_dir} if sinks else {}


def _setup(rank: int, world: int, plan: RunPlan, plans: dict,
           lane: Lane | None) -> tuple[dict, RankContext]:
    """Rank 0's sinks, one per added cost; this rank's context: its groups, calibration (at
    each added cost of a sweep: c includes it) and system under test."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    layout = Layout(rank, plan.tp, plan.pp)
    device = pick_device(plan.device, int(os.environ.get("LOCAL_RANK", rank)))
    timeout = dict(plan.system).get("collective_timeout_s", 60.0)
    groups = setup_distributed(layout, device, timeout, plan.backend)
    # Measured once, before any configuration, by rank 0 (the others wait at the barrier).
    h2d = h2d_peak(device) if rank == 0 else None
    sinks = {d: ResultSink(p, h2d) for d, p in plans.items()} if rank == 0 else {}
    for d, p in plans.items():
        # c for the overhead model, measured before any cell on quiet groups.
        c = calibrate.measure(layout, groups, delay_ms=p.delay_ms)
        samples = _gather({"rank": rank, "c": c}, world)
        if sinks:
            sinks[d].calibration([s["c"] for s in samples])
    if sinks:
        next(iter(sinks.values())).say(fit.oversized_line(plan, device))
    # process-wide scheduler steps: fault injection counts across cells
    return sinks, RankContext(layout, groups, device, [0], lane, cache_factory(plan))


def _cell(plan: RunPlan, cell: Cell, n_cells: int, sink: ResultSink | None,
          ctx: RankContext) -> None:
    """One cell served (again while rank 0 finds it disturbed and the plan allows), its
    rows written by rank 0, then c measured beside it (at the cell's added cost)."""
    layout = ctx.layout
    if sink:
        sink.begin(cell, n_cells)
    attempt = 0
    while True:
        attempt += 1
        payload = run_cell(plan, cell, ctx)
        gathered = _gather(payload, layout.world_size)
        why = _disturbed(gathered) if layout.rank == 0 else None
        # Pinned, the next serve replays the same schedule; free, it would not. Every
        # rank knows from the plan whether another serve may follow: only then ask rank 0.
        may_redo = plan.schedule == "pinned" and attempt <= (plan.redo_disturbed or 0)
        if not may_redo or not _agree(why is not None, layout):
            break
        if sink:
            sink.again(why)
    if sink:
        sink.add(cell, gathered, attempt)
    # c beside the cells: after every serve, outside its timed region (bench.run.calibrate)
    c = calibrate.measure(layout, ctx.groups, calibrate.BESIDE_N, calibrate.BESIDE_WARMUP,
                          plan.delay_ms)
    if sink:
        sink.beside(c)


def _disturbed(gathered: list[dict]) -> str | None:
    """Why rank 0 counts the serve just gathered as disturbed (bench.run.machine), or None.
    Sets every payload's `machine` figures: rank 0's machine's CPU account around the serve
    against the CPU time of the ranks on that machine."""
    here = gathered[0]
    local = sum(p["cpu_s"] for p in gathered if p["host"] == here["host"])
    figures = machine.interference(*here["cpu_times"], local, here["wall_s"])
    for p in gathered:
        p["machine"] = figures
    return machine.disturbed(figures)


def _agree(flag: bool, layout: Layout) -> bool:
    """Rank 0's `flag` on every rank (outside the timed region, on the harness group)."""
    if layout.world_size == 1:
        return flag
    box = [flag]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])


def cache_factory(plan: RunPlan) -> CacheFactory:
    """The system under test (hicache.serve.seam): the project's HiCache, or with --cache sglang
    SGLang's decisions behind the seam (sglang_adapter.decisions.cache, which imports SGLang in this
    process once)."""
    if plan.sglang is None:
        return HiCache
    from sglang_adapter import cache_factory

    return cache_factory(plan.sglang)


def run_cell(plan: RunPlan, cell: Cell, ctx: RankContext) -> dict:
    cfg = plan.config(cell)
    spec = plan.workload_for(cell)
    layout, rank0 = ctx.layout, ctx.rank0
    if spec.warmup_requests:  # warm threads, groups and allocators; its figures are dropped
        short = replace(spec, output_tokens=min(4, spec.output_tokens))
        warm = workload.build(short, prefix="warm-", n=spec.warmup_requests, bystanders=0)
        _settled(plan)
        _serve(cfg, warm, plan.seed,
               replace(ctx, make_cache=_checked(ctx.make_cache, plan, cell, "warm", rank0)))
    main = plan.build_workload(cell)
    main_ctx = replace(ctx, make_cache=_checked(ctx.make_cache, plan, cell, "main", rank0))
    threads = _settled(plan)
    machine0, cpu0, wall0 = machine.read(), time.process_time(), time.monotonic()
    sched = host_profile.SchedCpu()
    system, stats = _serve(cfg, main, plan.seed, main_ctx, lambda _: sched)
    cpu_s, wall_s, machine1 = time.process_time() - cpu0, time.monotonic() - wall0, \
        machine.read()
    payload = {"rank": layout.rank, "tp_rank": layout.tp_rank, "pp_rank": layout.pp_rank,
            "timeline": _timeline(stats, layout, ctx.groups),
            "requests": stats.request_rows(), "steps": stats.step_rows() if rank0 else [],
            "decisions": stats.decisions, "by_site": dict(stats.counter.by_site),
            "crosscheck": system.crosscheck(),
            "host_slots_unaccounted": stats.host_slots_unaccounted,
            "write_path": stats.write_path,
            # CPU seconds this rank's threads used while serving (and the wall time):
            # together with the other ranks', how busy the machine's cores were.
            "cpu_s": cpu_s, "wall_s": wall_s, "host": socket.gethostname(),
            "threads": threads,
            # The machine's CPU account around the serve (rank 0's is read: _disturbed).
            "cpu_times": (machine0, machine1)}
    # after the crosscheck above: the counted serve's collectives move torch's numbers on
    counted = _counted(plan, cfg, main, main_ctx)
    payload["host_work"] = host_profile.columns(*counted, sched, stats)
    return payload


def _freeze_imports() -> None:
    """With SGLang's code behind the seam, after its import: what this process holds now
    (torch's and SGLang's modules, the groups) moves out of the collector's reach
    (gc.freeze), so a collection scans only what the serves made. Each full collection
    before a serve (_settled) took ~0.1 s on the 2-core VM with that heap in reach, ~2 ms
    without: two per cell, a tenth of a two-side run's time."""
    gc.collect()
    gc.freeze()


def _settled(plan: RunPlan) -> int | None:
    """Before a serve, outside every timed region: with SGLang's code behind the seam, the
    serves before it collected (its objects form cycles, threads and their bound methods,
    that can hold a process group SGLang's teardown destroyed, and its gloo threads with
    it: sglang_adapter.controller.rig.ControllerRig.stop); then this process's threads, as the
    serve finds them (ranks.csv `threads`). The project's own serves leave no such garbage
    and are not collected: a collection before each of them slows their steps
    (docs/results/2026-12-06_controller_teardown_6ba7ee8.md)."""
    if plan.sglang is not None:
        gc.collect()
    return machine.threads()


def _checked(make_cache: CacheFactory, plan: RunPlan, cell: Cell, serve: str,
             rank0: bool) -> CacheFactory:
    """With SGLang's rank-consensus checker on (--sglang-consensus), the cache of this serve
    journals into a folder of its own, named by the cell (rank 0 writes serve.json there:
    which cell, which serve); otherwise the factory as it is."""
    target = plan.sglang
    if target is None or target.consensus_dir is None:
        return make_cache
    folder = Path(target.consensus_dir) / f"{cell.index:03d}-{serve}"
    folder.mkdir(parents=True, exist_ok=True)
    if rank0:
        write_serve_record(folder, {
            "protocol": cell.protocol, "policy": cell.policy, "repeat": cell.repeat,
            "rate_rps": cell.rate_rps, "serve": serve, "world": plan.world_size,
            "root": target.root})
    return functools.partial(make_cache, target=replace(target, consensus_dir=str(folder)))


def _timeline(stats, layout: Layout, groups: Groups) -> dict | None:
    """This rank's timeline of the cell (None unless recorded) with the member ranks of
    its groups, so ranks' collectives can be matched (the harness's default group: all)."""
    record = stats.timeline()
    if record is None:
        return None
    members = {**groups.ranks, "default": list(range(layout.world_size))}
    return {**record, "tp_rank": layout.tp_rank, "pp_rank": layout.pp_rank,
            "groups": members}


def _counted(plan: RunPlan, cfg, wl, ctx: RankContext) -> tuple:
    """--host-work: the cell's workload served once more, untimed, its scheduler thread's
    Python work counted (bench.run.host_profile); (meter, stats), or (None, None) without it."""
    if not plan.host_work:
        return None, None
    made: list[host_profile.HostWork] = []

    def meter(system) -> host_profile.HostWork:
        made.append(host_profile.meter_for(system, plan.host_work))
        return made[-1]

    # No forward padding: the pinned clock advances by the modelled forward all the same,
    # the serve takes its CPU time only, and the count loses a path that varied with timing
    # (the sleep, skipped when a step's work overran its modelled time).
    _, stats = _serve(replace(cfg, pad_forward=False), wl, plan.seed, replace(ctx, lane=None),
                      meter)
    return made[-1], stats


def _serve(cfg, wl, seed: int, ctx: RankContext, meter=None):
    """One serve; `meter(system)`: a context the scheduler thread serves inside (its CPU
    time, or its Python work counted: bench.run.host_profile)."""
    layout, device, lane, steps, rank0 = ctx.layout, ctx.device, ctx.lane, ctx.steps, ctx.rank0
    system = System(cfg, layout, ctx.groups, device, seed, ctx.make_cache)
    system.populate(wl.histories)
    _barrier(layout, device)  # all ranks start the timed region together
    if lane is not None:
        lane.start()  # ... and every lane of a duet too
    cpu0, wall0 = time.process_time(), time.monotonic()
    with meter(system) if meter else contextlib.nullcontext():
        stats = system.run(wl.requests if rank0 else [], steps[0])
    if lane is not None:  # as busy as this serve was, until every lane is done
        lane.finish((time.process_time() - cpu0) / max(time.monotonic() - wall0, 1e-9))
    steps[0] += system.steps_run
    _barrier(layout, device)
    system.close()
    return system, stats


def _barrier(layout: Layout, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if layout.world_size > 1:
        dist.barrier()


def _gather(payload: dict, world: int) -> list[dict]:
    if world == 1:
        return [payload]
    out = [None] * world if payload["rank"] == 0 else None
    dist.gather_object(payload, out, dst=0)  # harness group, outside the timed region
    return out
