"""A resolved plan placed on this machine (bench.plan.resolve makes it): the device and data
backend, torchrun's world and the results folder, each checked before any rank starts. A
check that fails is a UserError (bench.errors), one line."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from bench.errors import UserError
from bench.plan import resolve
from bench.plan.options import RunOptions
from bench.run.plan import RunPlan
from bench.rundir.env import short_sha
from bench.rundir.rundir import RunDir


def resolve_device(kind: str, ranks_here: int, data_backend: str | None = None) -> str:
    from bench.run.gpus import gpus_and_nccl

    gpus, nccl = gpus_and_nccl()
    if kind == "auto":
        if data_backend == "gloo":
            return "cuda" if gpus else "cpu"
        return "cuda" if gpus >= ranks_here and nccl else "cpu"
    if kind == "cuda" and data_backend == "gloo":
        if gpus == 0:
            raise UserError("--device cuda needs a GPU, found none")
    elif kind == "cuda":
        if gpus < ranks_here:
            raise UserError(f"--device cuda needs {ranks_here} GPU(s) on this node (one per "
                            f"local rank for NCCL), found {gpus}; --data-backend gloo lets "
                            f"ranks share GPUs (not an NCCL measurement)")
        if not nccl:
            raise UserError("--device cuda needs NCCL, which this torch build lacks "
                            "(--data-backend gloo runs without it)")
    return kind


def resolve_data_backend(device: str, asked: str | None) -> str:
    if device == "cpu" and asked == "nccl":
        raise UserError("--data-backend nccl needs --device cuda (CPU runs use gloo)")
    return asked or ("nccl" if device == "cuda" else "gloo")


def _check_model_on_device(plan: RunPlan) -> None:
    """The real forward's all-reduces carry each rank's own batch: ranks whose batches
    differ (--budget-skew) would pair all-reduces of different sizes, which NCCL does not
    detect. The toy forward pads its all-reduce to a fixed size for exactly that case."""
    if plan.device == "cuda" and plan.model != "toy" and \
            dict(plan.system).get("budget_skew", 0.0) > 0:
        raise UserError("--budget-skew needs --model toy on CUDA (the real forward's "
                        "all-reduce sizes follow each rank's batch)")


def out_dir(out: Path | None, preset: str) -> Path:
    """The results folder (--out, else a new one under results/), made and writable."""
    if out is not None:
        path = out
    else:
        path = RunDir.new("run", preset, short_sha()).path
    held = RunDir(path).leftovers() if path.is_dir() else []
    if held:
        # A run's files left there (failures.csv, a side's rows) would join this run's
        # report; and "nothing already written is lost".
        raise UserError(f"--out {path} already holds a run's files ({', '.join(held[:3])}"
                        f"{', ...' if len(held) > 3 else ''}): pick a new folder (or remove "
                        "them)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"cannot write results to {path}: {e.strerror or e}") from None
    return path


def placed_plan(opts: RunOptions) -> RunPlan:
    """The options' plan (bench.plan.resolve), placed on this machine: its device, data
    backend and results folder (UserError if it cannot be)."""
    from bench.run.launch import under_torchrun

    plan = resolve.build_plan(opts)
    torchrun = under_torchrun()
    if torchrun and plan.sides:
        raise UserError("several SGLangs serve on a world of ranks per side, which bench run "
                        "launches itself: run it without torchrun")
    if torchrun and int(os.environ["WORLD_SIZE"]) != plan.world_size:
        raise UserError(f"torchrun started {os.environ['WORLD_SIZE']} ranks but --tp "
                        f"{plan.tp} x --pp {plan.pp} = {plan.world_size}")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", plan.world_size))
    device = resolve_device(opts.device, local, opts.data_backend)
    plan = replace(plan, device=device,
                   data_backend=resolve_data_backend(device, opts.data_backend))
    _check_model_on_device(plan)
    if plan.device == "cuda" and plan.step_ms is not None:
        raise UserError("--step-ms sets the CPU stand-in's modelled forward; on CUDA the "
                        "forward is real")
    if torchrun and opts.sglang_consensus:
        raise UserError("--sglang-consensus journals every rank into the run's folder: run "
                        "it without torchrun")
    if torchrun and int(os.environ["RANK"]) != 0:
        return replace(plan, out_dir="")  # only rank 0 writes
    plan = replace(plan, out_dir=str(out_dir(opts.out, plan.preset)))
    if opts.sglang_consensus:
        plan = plan.consensus_under(RunDir(plan.out_dir).file("consensus_dir"))
    return plan
