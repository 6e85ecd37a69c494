"""`python -m bench run`: the main job. Every option is validated before any rank starts.

Locally it launches tp*pp ranks itself; under torchrun (any --nnodes) each process is one
rank and uses the launcher's environment. Exit codes: 0 OK, 1 FAILED (a check failed or a
rank died), 2 bad input.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.commands import cost_sweep, trace_flags
from bench.commands.common import CliParser, UsageError, add_cache_options, run_verb
from bench.run import options
from bench.run.options import PAIRINGS, REPEAT_SEEDS
from bench.run.plan import (
    ALIASES,
    PRESET_HELP,
    PRESETS,
    RunPlan,
)
from bench.rundir.env import short_sha
from bench.rundir.rundir import RunDir
from bench.rundir.schema import FAILURE_COLUMNS
from bench.tables import fit
from hicache.spec.cost_model import HOST_MEMORY, POLICIES, PROTOCOLS
from hicache.spec.pinned import SCHEDULES
from hicache.spec.shapes import SHAPES
from hicache.spec.step_time import GPUS

PROG = "bench run"
GROUPS = {  # --help's sections: title -> what they set
    'what runs': 'the protocols and policies of the cells, and how often',
    'layout and device': "ranks, the model's shape and where its forward runs",
    'synthetic workload': 'the queue burst and its bystanders (the synthetic presets)',
    'trace replay and cache tiers': 'a Mooncake-format trace instead of the synthetic workload',
    'storage': 'the storage tier the prefetches read',
    'system': 'HiCache settings',
    'hazards and faults': 'reproduce a known hazard or kill a rank',
    'output': None,
}


def _group(p: CliParser, title: str):
    """The add_argument of --help's section `title`."""
    return p.add_argument_group(title, GROUPS[title]).add_argument


def parser() -> CliParser:
    p = CliParser.from_doc(f"python -m {PROG}", __doc__)
    a = _group(p, 'what runs')
    a("--preset", default="default", choices=sorted(PRESETS),
      help="; ".join(f"{k}: {v}" for k, v in PRESET_HELP.items()))
    a("--protocols", help=f"comma list of {', '.join(PROTOCOLS)} (aliases: "
      f"{', '.join(f'{k}={v}' for k, v in ALIASES.items())}; docs/releases.md)")
    a("--policies", help=f"comma list of {', '.join(POLICIES)}")
    a("--repeats", type=int, help="repeats of every cell: whole serves, the unit an interval "
      "is taken over (the preset's)")
    a("--seed", type=int, default=0, help="the workload and storage noise of every protocol "
      "in a repeat: seed SEED x 1000 + r in repeat r, or SEED x 1000 in every repeat under "
      "--repeat-seeds same")
    a("--repeat-seeds", choices=REPEAT_SEEDS, help="same: every repeat replays one workload "
      "(with --schedule pinned one schedule, so repeats differ by the machine's noise "
      "alone: the default, queue and releases presets); distinct: each repeat a workload "
      "of its own, so the interval spans workloads too (every other preset)")
    a("--redo-disturbed", type=int, metavar="N", help="under a pinned schedule, serve a "
      "cell again (up to N times) when the machine lost more than 5%% of its CPU time to "
      "steal or to other processes during it, and keep the last serve (ranks.csv: attempts, "
      "steal_s, other_cpu_s, cpu_lost); 0: never (1 in the default and queue presets, 0 "
      "elsewhere)")
    a("--schedule", choices=SCHEDULES, help="pinned: arrivals, IO completions and timeouts "
      "on a virtual clock advanced by the modelled forward, one schedule per seed, so a "
      "difference is the protocol's host cost (the cost, queue and ci presets); free: "
      "on the wall clock, the end-to-end effect with its feedback through the schedule "
      "(every other preset; docs/design.md, Pinned schedules)")
    a("--pairing", choices=("serial", *PAIRINGS), help="how the protocols of a repeat "
      "serve: serial (one after another, the protocol order rotated per repeat: the "
      "default), duet (all at the same time, each on ranks of its own, each repeat one "
      "pair in time; a burst of load hits every side alike) or step (pr27010 / pr36425 "
      "only: every poll asks the first protocol too, back to back on the same facts, each "
      "timed, their answers checked equal: the host cost per step paired within the step; "
      "docs/usage.md, Pairing)")
    add_cache_options(a, "its protocol is the release's, e.g. sglang-0.5.23@unified",
                      several=True)
    from sglang_adapter import SGLANG_PATHS

    a("--sglang-path", choices=SGLANG_PATHS, help="with --cache sglang, what of SGLang runs: "
      "controller (SGLang's controller path is the data path too: prefetch_from_storage, "
      "its hit-query, IO and ack threads on the groups it makes, its drains and end path, "
      "over the harness's storage, host pool and tree; 0.5.19 on, any --tp x --pp, host "
      "memory a cache tier or buffer_only at --pp > 1 (SGLang's PP-ticket path, 0.5.21 "
      "on), no side-car pool, any --write-policy), decisions (SGLang's "
      "check_hicache_events and check_prefetch_progress on the project's data path), or "
      "auto (the default: controller where the run fits it, else decisions; docs/sglang.md)")
    a("--sglang-consensus", action="store_true", help="with --cache sglang: SGLang's own "
      "rank-consensus checker on in every serve, as its scheduler configures it (0.5.23 on; "
      "its collectives on its own groups, counted apart); consensus.csv says per serve "
      "whether it fired, and where, and a fired checker fails the run (docs/hazards.md)")
    a("--model-beside", action="store_true", help="with several SGLangs (--sglang A,B): "
      "the project's model of each side's release (0.5.18 pre27010, 0.5.19 pr36425) serves "
      "too, on a world of its own in the same turns and seeds, and a fidelity line per "
      "metric says whether the model's ratio lies inside SGLang's 95%% interval (preset "
      "seed-pr; docs/sglang.md, The seed PR as released)")
    a("--neighbour", metavar="SPEC", help="plant a noisy neighbour for the whole run: a "
      "process taking CPU in seeded bursts (default: cpu=0.5,burst=50ms-2s,seed=0; or "
      "cpu=F,burst=MIN-MAX,seed=N), recorded in env.json (docs/usage.md, Pairing)")
    a = _group(p, 'layout and device')
    a("--tp", type=int, help="tensor-parallel ranks (the preset's; 2 on CPU)")
    a("--pp", type=int, help="pipeline stages (1)")
    a("--nproc", type=int, help="ranks to launch locally (default tp*pp)")
    a("--device", choices=("auto", "cpu", "cuda"), default="auto",
      help="auto: cuda when every local rank has a GPU (and NCCL), else cpu")
    a("--data-backend", choices=("nccl", "gloo"),
      help="model all-reduces: nccl (default on CUDA, one GPU per rank) or gloo (the only one "
      "on CPU; on CUDA lets ranks share GPUs, rank r on GPU r %% GPUs: not an NCCL measurement)")
    a("--model", choices=sorted(SHAPES), help="model shape (llama3-8b): KV bytes per page; "
      "the forward's modelled time on CPU, its real shape on CUDA")
    a("--gpu", choices=(*GPUS, "none"), help="GPU whose forward the CPU stand-in sleeps out "
      "(h100); none: steps last their CPU work")
    a("--step-ms", type=float, help="the modelled decode step's fixed part, ms (default: "
      "the model's roofline on --gpu, e.g. 4.5 for llama3-8b at TP2 on h100)")
    a("--kv-budget-gib", type=float,
      help="real KV pages (CUDA, non-toy model): GiB of each of the host (pinned) and device "
      "KV pools per rank; page counts follow from it (default 4)")
    a = _group(p, 'synthetic workload')
    a("--requests", type=int, help="measured requests per configuration and repeat")
    a("--rate", type=float, help="Poisson arrival rate of the prefetching requests, "
      "requests/s; inf = a burst")
    a("--bystanders", type=int, help="requests with nothing to prefetch (short prompts)")
    a("--bystander-rate", type=float, help="their Poisson arrival rate, requests/s")
    a("--output-tokens", type=int, help="tokens every request generates (64)")
    a("--max-running", type=int, help="running batch bound, max_running_requests (256)")
    a = _group(p, 'trace replay and cache tiers')
    trace_flags.add_flags(a)
    a = _group(p, 'storage')
    a("--storage", choices=("sim", "file"), default="sim",
      help="sim: pages in memory, reads timed by the latency and bandwidth below; file: "
      "real files under results/.storage")
    a("--storage-latency-ms", type=float, help="per 128-page batch read (2)")
    a("--storage-gbps", type=float, help="storage read bandwidth per rank, GB/s (3, Mooncake "
      "over TCP); a batch costs latency + its KV bytes / bandwidth")
    a("--jitter", type=float, help="per-rank storage slowdown spread, e.g. 0.5")
    a("--fail-rate", type=float, help="probability that a storage batch read fails")
    a("--stall-ms", type=float, help="extra delay of every storage read (a stalling tier)")
    a("--extra-pool", action="store_true", help="read a side-car pool after the KV pages")
    a = _group(p, 'system')
    a("--host-memory", choices=HOST_MEMORY, help="cache (default): host memory is an L2 "
      "tier; buffer_only: staging for one load-back, and with --pp > 1 sglang-0.5.23's "
      "PP-ticket path (docs/releases.md)")
    a("--timeout-base", type=float, help="prefetch timeout base, s (default 1.0)")
    a("--consensus", action="store_true",
      help="online rank-consensus checker (docs/design.md section 6)")
    a("--timeline", action="store_true", help="record every collective, poll, storage "
      "batch and copy per thread, for `python -m bench timeline` (docs/timeline.md)")
    a("--collective-timeout", type=float, help="seconds before a collective fails (60)")
    a("--collective-delay-ms", metavar="MS", help="an added cost: every control-plane "
      "collective of the system under test (the scheduler's and the background threads'; "
      "SGLang's too under --cache sglang) first waits MS ms, a sleep, on every rank, as on a "
      "slow interconnect; the calibrated c includes it (0). A comma list (0,0.5,1,2,3) is a "
      "cost sweep: every repeat serves at each cost, interleaved, each cost's rows in a "
      "run directory of its own, and sweep.md / sweep.png compare them (preset delay-sweep)")
    a = _group(p, 'hazards and faults')
    a("--no-race-guard", action="store_true", help="pre27010 without PR #27550's guard")
    a("--budget-skew", type=float, help="rank-local walk horizon skew (#30760), 0..1")
    a("--land-step", type=int, help="the prefixes in storage are another writer's, landing "
      "at this scheduler step: a hit query issued before it misses them (0.5.23 retries "
      "it, docs/hazards.md 'Retries (0.5.23)'); 0: stored from the start")
    a("--land-skew-steps", type=int, help="every TP rank but 0 sees them this many steps "
      "later than rank 0 (ranks that see a miss differently)")
    a("--kill-rank", type=int, help="fault injection: this rank exits at --kill-step")
    a("--kill-step", type=int, help="the process-wide step at which --kill-rank exits")
    a("--host-work", choices=("calls", "opcodes", "none"), help="after each cell's timed "
      "serve, serve its workload once more untimed and count the scheduler thread's Python "
      "work per step and per poll (calls: function calls; opcodes: bytecodes): ranks.csv "
      "host_* columns, gated by bench gate (gate.json host_work); the ci preset's: calls")
    a("--plant", metavar="PROTOCOL:MS", help="fault injection: every step of PROTOCOL's "
      "cells whose walk polls a pending prefetch spins MS ms more (a known host cost: "
      "what a paired design must recover, docs/usage.md, Pairing); PROTOCOL:Ncalls makes N "
      "extra Python calls instead (host work of a fixed size: bench.run.hostwork counts it)")
    a = _group(p, 'output')
    a("--out", type=Path,
      help="results directory, new or empty (default results/<UTC>_<preset>_<sha>)")
    return p


def resolve_device(kind: str, ranks_here: int, data_backend: str | None = None) -> str:
    from bench.run.gpus import gpus_and_nccl

    gpus, nccl = gpus_and_nccl()
    if kind == "auto":
        if data_backend == "gloo":
            return "cuda" if gpus else "cpu"
        return "cuda" if gpus >= ranks_here and nccl else "cpu"
    if kind == "cuda" and data_backend == "gloo":
        if gpus == 0:
            raise UsageError("--device cuda needs a GPU, found none")
    elif kind == "cuda":
        if gpus < ranks_here:
            raise UsageError(f"--device cuda needs {ranks_here} GPU(s) on this node (one per "
                             f"local rank for NCCL), found {gpus}; --data-backend gloo lets "
                             f"ranks share GPUs (not an NCCL measurement)")
        if not nccl:
            raise UsageError("--device cuda needs NCCL, which this torch build lacks "
                             "(--data-backend gloo runs without it)")
    return kind


def resolve_data_backend(device: str, asked: str | None) -> str:
    if device == "cpu" and asked == "nccl":
        raise UsageError("--data-backend nccl needs --device cuda (CPU runs use gloo)")
    return asked or ("nccl" if device == "cuda" else "gloo")


def build_plan(args) -> RunPlan:
    """The parsed command line, unpacked once into RunOptions, resolved to a plan."""
    try:
        return options.build_plan(options.RunOptions.from_values(vars(args)))
    except options.OptionError as e:
        raise UsageError(str(e)) from None


def _check_model_on_device(plan: RunPlan) -> None:
    """The real forward's all-reduces carry each rank's own batch: ranks whose batches
    differ (--budget-skew) would pair all-reduces of different sizes, which NCCL does not
    detect. The toy forward pads its all-reduce to a fixed size for exactly that case."""
    if plan.device == "cuda" and plan.model != "toy" and \
            dict(plan.system).get("budget_skew", 0.0) > 0:
        raise UsageError("--budget-skew needs --model toy on CUDA (the real forward's "
                         "all-reduce sizes follow each rank's batch)")


def out_dir(args, preset: str) -> Path:
    if args.out is not None:
        path = args.out
    else:
        path = RunDir.new("run", preset, short_sha()).path
    held = RunDir(path).leftovers() if path.is_dir() else []
    if held:
        # A run's files left there (failures.csv, a side's rows) would join this run's
        # report; and "nothing already written is lost".
        raise UsageError(f"--out {path} already holds a run's files ({', '.join(held[:3])}"
                         f"{', ...' if len(held) > 3 else ''}): pick a new folder (or remove "
                         "them)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write results to {path}: {e.strerror or e}") from None
    return path


def resolve_plan(argv: list[str]) -> RunPlan:
    """The validated plan of a command line, resolved for this machine (UsageError if not)."""
    from bench.run.launch import under_torchrun

    args = parser().parse_args(argv)
    plan = build_plan(args)
    torchrun = under_torchrun()
    if torchrun and plan.sides:
        raise UsageError("several SGLangs serve on a world of ranks per side, which bench run "
                         "launches itself: run it without torchrun")
    if torchrun and int(os.environ["WORLD_SIZE"]) != plan.world_size:
        raise UsageError(f"torchrun started {os.environ['WORLD_SIZE']} ranks but --tp "
                         f"{plan.tp} x --pp {plan.pp} = {plan.world_size}")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", plan.world_size))
    device = resolve_device(args.device, local, args.data_backend)
    plan = replace(plan, device=device,
                   data_backend=resolve_data_backend(device, args.data_backend))
    _check_model_on_device(plan)
    if plan.device == "cuda" and plan.step_ms is not None:
        raise UsageError("--step-ms sets the CPU stand-in's modelled forward; on CUDA the "
                         "forward is real")
    if torchrun and args.sglang_consensus:
        raise UsageError("--sglang-consensus journals every rank into the run's folder: run "
                         "it without torchrun")
    if torchrun and int(os.environ["RANK"]) != 0:
        return replace(plan, out_dir="")  # only rank 0 writes
    plan = replace(plan, out_dir=str(out_dir(args, plan.preset)))
    if args.sglang_consensus:
        plan = plan.consensus_under(RunDir(plan.out_dir).file("consensus_dir"))
    return plan


def _main(argv: list[str]) -> int:
    from bench.run.launch import under_torchrun

    plan = resolve_plan(argv)
    return _run_torchrun(plan) if under_torchrun() else _run_local(plan)


def _run_torchrun(plan: RunPlan) -> int:
    """Under torchrun: this process is one rank; rank 0 reports."""
    import torch.distributed as dist

    from bench.run.worker import run_rank

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0 and plan.delays_ms:
        cost_sweep.announce(plan)
    t0 = time.monotonic()
    run_rank(rank, world, plan)
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank != 0:
        return 0
    return (cost_sweep.finish if plan.delays_ms else _finish)(Path(plan.out_dir), t0)


def _run_local(plan: RunPlan) -> int:
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
        print("bench run: warning: TORCH_DISTRIBUTED_DEBUG=DETAIL adds hidden collectives and "
              "~20x latency; counts and timings of this run are not comparable",
              file=sys.stderr)
    said = [f"hicache-bench: preset {plan.preset}, {len(plan.cells())} runs "
            f"({len(plan.protocols)} protocols x {len(plan.policies)} policies x "
            f"{len(plan.rates)} rates x {plan.repeats} repeats), TP{plan.tp} x PP{plan.pp} on "
            f"{plan.device}/{plan.backend}, results in {plan.out_dir}"]
    threads, cores = plan.world_size * plan.threads_per_rank, os.cpu_count() or 1
    if threads > cores:
        said.append(f"bench run: note: {plan.world_size} ranks x {plan.threads_per_rank} "
                    f"threads exceed {cores} cores: timings are partly CPU-bound, not only "
                    "collective-bound (the report says so too); compare ratios within the run")
    print(fit(*said), file=sys.stderr)
    RunDir(plan.out_dir).link_latest()
    if plan.delays_ms:
        cost_sweep.announce(plan)
    t0 = time.monotonic()
    timeout = dict(plan.system).get("collective_timeout_s", 60.0)
    with planted(plan) as record:
        error = _serve_all(plan, _budget_s(plan) + 2 * timeout)
    if record:
        RunDir(plan.out_dir).add_to_env("neighbour", record)
    if error:
        _record_failure(Path(plan.out_dir), error)
    if plan.delays_ms:
        return cost_sweep.finish(Path(plan.out_dir), t0, error)
    return _finish(Path(plan.out_dir), t0, error)


def _serve_all(plan: RunPlan, timeout_s: float) -> str | None:
    """Every cell served, serially in one world or as a duet; the error, or None."""
    from bench.run.launch import Entry, LaunchError, launch
    from bench.rundir.lanes import merge_lanes

    if plan.sides:  # several SGLangs: a world of ranks per side, taking turns
        from bench.run import sides

        errors = sides.run_sides(plan, timeout_s)
        merge_lanes(RunDir(plan.out_dir), sides.side_dirs(plan))
        return "; ".join(errors) or None
    if plan.pairing == "duet":
        from bench.run import duet

        errors = duet.run_duet(plan, timeout_s * duet.lanes(plan))
        merge_lanes(RunDir(plan.out_dir), duet.lane_dirs(plan))
        return "; ".join(errors) or None
    try:
        launch(plan.world_size, Entry("bench.run.worker", "run_rank"), (plan,),
               timeout_s=timeout_s)
    except LaunchError as e:
        return str(e)
    return None


@contextlib.contextmanager
def planted(plan: RunPlan):
    """The plan's noisy neighbour running for the block (none: nothing); yields a dict that
    holds, after the block, what the neighbour ran (for env.json)."""
    from bench import neighbour

    spec = neighbour.parse(plan.neighbour)
    record: dict = {}
    if spec is None:
        yield record
        return
    with neighbour.Neighbour(spec) as n:
        try:
            yield record
        finally:
            n.stop()
            record.update(n.record())


def _finish(run_dir: Path, t0: float, error: str | None = None) -> int:
    """The end of every run, in this one process: summary, plots, verdict and report built
    once from the rows the ranks wrote, printed from the same objects."""
    from bench.analysis.plot_switch import plots_wanted
    from bench.analysis.report import write_report  # matplotlib only where it draws
    from bench.analysis.summarize import format_table

    took = f"({time.monotonic() - t0:.0f}s, {run_dir})"
    if not RunDir(run_dir).has("requests"):  # not even one configuration finished
        from bench.analysis import consensus_serves

        # SGLang's checker, where it ran, may say why: it stops the ranks where they part
        said = consensus_serves.findings(consensus_serves.tabulate(run_dir))[0]
        print(f"FAILED: {'; '.join([*said, error or 'the ranks wrote no rows'])} {took}")
        return 1
    try:
        report = write_report(run_dir, plots=plots_wanted())
    except ValueError as e:  # ResultFileError: a result file the ranks wrote is unusable
        print(f"FAILED: could not build the report: {e} {took}")
        return 1
    print(format_table(report.summary))
    print("\n".join(report.lead))
    for note in report.verdict.notes:
        print(fit(f"note: {note}"), file=sys.stderr)
    kept = "; finished configurations are kept" if error else ""
    print(f"{report.verdict.line} {took}{kept}")
    return 0 if report.verdict.ok else 1


def _budget_s(plan: RunPlan) -> float:
    """A generous bound on the whole run, so a wedged run still ends."""
    wl = plan.workload
    per_cell = (30.0 + 3.0 * wl.requests / min(plan.rates)
                + 3.0 * wl.bystanders / wl.bystander_rate_rps + 0.05 * wl.output_tokens)
    if plan.trace is not None:
        per_cell = plan.trace.cell_budget_s(min(plan.rates))
    return 60.0 + per_cell * len(plan.cells())


def _record_failure(run_dir: Path, error: str) -> None:
    """failures.csv names the configuration that was running; the report is built from the
    configurations that finished (their rows were written atomically)."""
    import json

    from bench.rundir.files import write_csv_atomic

    run = RunDir(run_dir)
    progress = run.file("progress")
    cell = json.loads(progress.read_text()) if progress.exists() else {}
    write_csv_atomic(run.file("failures"),
                     [{"protocol": cell.get("protocol"), "policy": cell.get("policy"),
                       "repeat": cell.get("repeat"), "error": error}], FAILURE_COLUMNS)


def main(argv: list[str]) -> int:
    return run_verb(PROG, _main, argv)
