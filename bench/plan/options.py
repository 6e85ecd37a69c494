"""`bench run`'s options, unpacked once from its command line (bench.commands.run): the
values as given, before bench.plan.resolve checks every one and resolves them to a plan. A bad
value is a UserError (bench.errors), one line naming the flag."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

REPEAT_SEEDS = ("same", "distinct")
# Serve designs besides serial (every cell after the other): docs/usage.md, "Pairing".
PAIRINGS = ("duet", "step")
# "0": never serve a disturbed cell again, whatever the preset says. bench ab sets it for
# both sides, so a revision with --redo-disturbed and one from before it run alike.
REDO_ENV = "BENCH_REDO_DISTURBED"


@dataclass(frozen=True)
class RunOptions:
    """Every option of `bench run` (None: not given, the preset's or the default value)."""

    preset: str = "default"
    protocols: str | None = None
    policies: str | None = None
    nproc: int | None = None
    tp: int | None = None
    pp: int | None = None
    requests: int | None = None
    rate: float | None = None
    bystanders: int | None = None
    bystander_rate: float | None = None
    output_tokens: int | None = None
    max_running: int | None = None
    model: str | None = None
    gpu: str | None = None
    repeats: int | None = None
    resolve: float | None = None
    budget_s: float | None = None
    budget_repeats: int | None = None
    seed: int = 0
    device: str = "auto"
    data_backend: str | None = None
    kv_budget_gib: float | None = None
    storage: str = "sim"
    storage_latency_ms: float | None = None
    storage_gbps: float | None = None
    jitter: float | None = None
    fail_rate: float | None = None
    stall_ms: float | None = None
    extra_pool: bool = False
    host_memory: str | None = None
    no_race_guard: bool = False
    budget_skew: float | None = None
    land_step: int | None = None
    land_skew_steps: int | None = None
    timeout_base: float | None = None
    step_ms: float | None = None
    consensus: bool = False
    collective_timeout: float | None = None
    collective_delay_ms: str | None = None  # MS, or MS,MS,... (a cost sweep)
    kill_rank: int | None = None
    kill_step: int | None = None
    workload: str | None = None
    trace: Path | None = None
    trace_skip: int | None = None
    trace_requests: int | None = None
    time_scale: str | None = None
    write_policy: str | None = None
    page_size: int | None = None
    unbounded_pools: bool = False
    timeline: bool = False
    schedule: str | None = None
    repeat_seeds: str | None = None
    redo_disturbed: int | None = None
    allow_auto_truncate: bool = False
    neighbour: str | None = None
    host_work: str | None = None
    pairing: str | None = None
    plant: str | None = None
    cache: str = "project"
    sglang: str | None = None
    sglang_path: str | None = None  # auto | controller | decisions (None: auto)
    sglang_consensus: bool = False  # SGLang's own rank-consensus checker in every serve
    model_beside: bool = False  # the project's model of each side's release, in the turns
    out: Path | None = None

    @classmethod
    def from_values(cls, values: dict) -> RunOptions:
        """The options from a parsed command line's values (unknown names are a bug)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        assert not unknown, f"RunOptions lacks fields for {unknown}"
        return cls(**values)
