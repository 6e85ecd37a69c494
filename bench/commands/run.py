"""`python -m bench run`: the main job. Every option is validated before any rank starts.

Locally it launches tp*pp ranks itself; under torchrun (any --nnodes) each process is one
rank and uses the launcher's environment. Exit codes: 0 OK, 1 FAILED (a check failed or a
rank died), 2 bad input.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from bench.commands import cost_sweep, run_flags
from bench.commands.common import CliParser, run_verb
from bench.plan import resolve
from bench.plan.options import RunOptions
from bench.plan.placement import placed_plan
from bench.report.printer import fit, say, say_err
from bench.run.plan import RunPlan
from bench.rundir.rundir import RunDir
from bench.rundir.schema import FAILURE_COLUMNS

PROG = "bench run"


def parser() -> CliParser:
    return run_flags.parser(f"python -m {PROG}", __doc__)


def build_plan(args) -> RunPlan:
    """The parsed command line, unpacked once into RunOptions, resolved to a plan."""
    return resolve.build_plan(RunOptions.from_values(vars(args)))


def resolve_plan(argv: list[str]) -> RunPlan:
    """The validated plan of a command line, placed on this machine (UserError if not)."""
    return placed_plan(RunOptions.from_values(vars(parser().parse_args(argv))))


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
    if rank == 0 and plan.resolve:
        say_err(f"{PROG}: note: under torchrun the run is one stage of {plan.repeats} "
                "repeats (--resolve stages a local run: each stage starts its ranks anew)")
    t0 = time.monotonic()
    run_rank(rank, world, plan)
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank != 0:
        return 0
    return (cost_sweep.finish if plan.delays_ms else _finish)(Path(plan.out_dir), t0)


def _run_local(plan: RunPlan) -> int:
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
        say_err("bench run: warning: TORCH_DISTRIBUTED_DEBUG=DETAIL adds hidden collectives and "
                "~20x latency; counts and timings of this run are not comparable")
    said = [f"hicache-bench: preset {plan.preset}, {len(plan.cells())} runs "
            f"({len(plan.protocols)} protocols x {len(plan.policies)} policies x "
            f"{len(plan.rates)} rates x {plan.repeats} repeats), TP{plan.tp} x PP{plan.pp} on "
            f"{plan.device}/{plan.backend}, results in {plan.out_dir}"]
    threads, cores = plan.world_size * plan.threads_per_rank, os.cpu_count() or 1
    if threads > cores:
        said.append(f"bench run: note: {plan.world_size} ranks x {plan.threads_per_rank} "
                    f"threads exceed {cores} cores: timings are partly CPU-bound, not only "
                    "collective-bound (the report says so too); compare ratios within the run")
    say_err(fit(*said))
    RunDir(plan.out_dir).link_latest()
    if plan.delays_ms:
        cost_sweep.announce(plan)
    t0 = time.monotonic()
    timeout = dict(plan.system).get("collective_timeout_s", 60.0)
    with planted(plan) as record:
        if plan.resolve:
            from bench.ab.protocols import serve_staged

            error = serve_staged(plan, lambda p: _served(p, timeout), say_err)
        else:
            error = _served(plan, timeout)
    if record:
        RunDir(plan.out_dir).add_to_env("neighbour", record)
    if plan.delays_ms:
        return cost_sweep.finish(Path(plan.out_dir), t0, error)
    return _finish(Path(plan.out_dir), t0, error)


def _served(plan: RunPlan, timeout: float) -> str | None:
    """Every cell of `plan` served (a stage's, or the whole run's), with a bound on it; a
    failure recorded in its folder (failures.csv). The error, or None."""
    error = _serve_all(plan, _budget_s(plan) + 2 * timeout)
    if error:
        _record_failure(Path(plan.out_dir), error)
    return error


def _serve_all(plan: RunPlan, timeout_s: float) -> str | None:
    """Every cell served, serially in one world or as a duet; the error, or None."""
    from bench.run.launch import Entry, LaunchError, launch
    from bench.rundir.lanes import merge_lanes

    if plan.sides:  # several SGLangs: a world of ranks per side, taking turns
        from bench.run import sglang_worlds

        errors = sglang_worlds.run_sides(plan, timeout_s)
        merge_lanes(RunDir(plan.out_dir), sglang_worlds.side_dirs(plan))
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
        from bench.verdict.run_rules import findings

        # SGLang's checker, where it ran, may say why: it stops the ranks where they part
        said = findings(consensus_serves.tabulate(run_dir))[0]
        say(f"FAILED: {'; '.join([*said, error or 'the ranks wrote no rows'])} {took}")
        return 1
    try:
        report = write_report(run_dir, plots=plots_wanted())
    except ValueError as e:  # ResultFileError: a result file the ranks wrote is unusable
        say(f"FAILED: could not build the report: {e} {took}")
        return 1
    say(format_table(report.summary))
    say("\n".join(report.lead))
    for note in report.verdict.notes:
        say_err(fit(f"note: {note}"))
    kept = "; finished configurations are kept" if error else ""
    say(f"{report.verdict.line} {took}{kept}")
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
