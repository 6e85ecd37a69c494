"""What one `bench run` does: the frozen plan every rank executes (its named presets:
bench.plan.presets)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.run import workload as synthetic
from bench.run.trace import TraceSpec
from bench.run.workload import Workload, WorkloadSpec
from bench.rundir.env import REPO_DIR
from hicache.spec.config import HiCacheConfig
from hicache.spec.cost_model import POLICIES
from hicache.spec.shapes import get_shape
from hicache.spec.step_time import StepTimeModel, roofline
from hicache.spec.storage_spec import StorageSpec
from sglang_adapter import Target

# The five protocols the project compares: what "every protocol" means for a preset (the
# default, ci and pp presets), so a protocol added for a release finding does not grow them.
PROJECT_PROTOCOLS = ("pre27010", "pr27010", "pr36425", "step-batched", "step-clock")
# Release names for --protocols (docs/releases.md); sglang-0.5.23 is a protocol of its own.
ALIASES = {"before": "pr27010", "after": "pr36425",
           "sglang-0.5.18": "pre27010", "sglang-0.5.19": "pr36425"}
THREADS_PER_RANK = 4  # scheduler, prefetch, IO and ack-sync threads can all be runnable
WRITE_PATH_THREADS = 1  # the backup thread, runnable when a write policy is on
# The trace shipped with the repository (traces/README.md): what `--preset trace` replays.
TRACE_EXCERPT = REPO_DIR / "traces" / \
    "mooncake_conversation_400.jsonl"


@dataclass(frozen=True)
class Cell:
    index: int
    repeat: int
    rate_rps: float
    policy: str
    protocol: str
    delay_ms: float | None = None  # a cost sweep's added cost (None: the plan's own)


@dataclass(frozen=True)
class RunPlan:
    preset: str = "default"
    protocols: tuple[str, ...] = PROJECT_PROTOCOLS
    policies: tuple[str, ...] = POLICIES
    rates: tuple[float, ...] = (16.0,)
    repeats: int = 3
    tp: int = 2
    pp: int = 1
    device: str = "cpu"  # resolved: cpu | cuda
    data_backend: str = ""  # resolved: nccl | gloo (model all-reduces); "" = by device
    seed: int = 0
    # Staged to resolve (bench run --resolve, bench.ab.protocols): stages of `repeats`
    # then more, stage k on seed + k, until the headline's p50 ratios each resolve this
    # half-width or `budget_s` seconds / `budget_repeats` repeats are spent; None: one stage
    # (and no budget: a plan that does not stage records none, as plans before staging)
    resolve: float | None = None
    budget_s: float | None = None
    budget_repeats: int | None = None
    # same: every repeat replays the seed's one workload and storage noise (under a pinned
    # schedule one schedule, so repeats differ by the machine's noise alone); None or
    # distinct: repeat r draws seed * 1000 + r (repeats sample workloads too)
    repeat_seeds: str | None = None
    # Pinned: serve a cell again, up to this many times, when the machine lost more than
    # bench.run.machine.LIMIT of its CPU time to steal or other processes during it
    redo_disturbed: int | None = None
    model: str = "llama3-8b"  # hicache.spec.shapes: KV bytes per page, the forward's time or shape
    gpu: str = "h100"  # the GPU whose forward the CPU stand-in sleeps out; none: no sleep
    step_ms: float | None = None  # overrides the modelled decode step's fixed part
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    # A trace replay instead of the synthetic workload; `rates` are then offered loads
    # (time scale x the window's own rate).
    trace: TraceSpec | None = None
    storage: StorageSpec = field(default_factory=lambda: StorageSpec(latency_ms=2.0,
                                                                     bandwidth_gbps=3.0))
    system: tuple[tuple[str, object], ...] = ()  # HiCacheConfig overrides
    # A planted noisy neighbour running beside the whole run (bench.neighbour's spec text)
    neighbour: str | None = None
    # How the protocols of one repeat are served: None (one after another, interleaved) or
    # "duet" (all at the same time, each on ranks of its own: bench.run.duet) or "step"
    # (every poll also asks the first protocol, back to back in the same step: hicache.cache.twin)
    pairing: str | None = None
    # --cache sglang: SGLang's own decisions behind the seam (sglang_adapter.decisions.cache), its
    # protocol column `Target.name`; None: the project's cache (--cache project)
    sglang: Target | None = None
    # Several SGLangs in one run (--sglang a=SPEC,b=SPEC: sglang_adapter.side_specs): one per
    # protocol, in `protocols`' order, the first the reference; each serves on rank
    # processes of its own (bench.run.sglang_worlds), whose plan's `sglang` is that side's.
    sides: tuple[Target, ...] = ()
    # The project's model of each side's release (--model-beside: pre27010 for 0.5.18,
    # pr36425 for 0.5.19), its protocols after the sides' in `protocols`: served in the same
    # turns by a world of its own (bench.run.sglang_worlds), so the model's ratio and SGLang's are
    # paired by seed in one run (bench.analysis.beside holds one in the other's interval).
    beside: tuple[str, ...] = ()
    # A cost sweep (bench.analysis.sweep): every repeat serves every cell at each of these
    # added costs per control-plane collective (ms), interleaved; () = one cost, the
    # system's collective_delay_ms. Each cost's rows go to a run directory of its own.
    delays_ms: tuple[float, ...] = ()
    # calls | opcodes: after each cell's timed serve, one more serve of its workload whose
    # scheduler thread's Python work is counted (bench.run.host_profile); None: none
    host_work: str | None = None
    out_dir: str = ""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def backend(self) -> str:
        """The data-plane backend actually used (the control plane is always gloo)."""
        return self.data_backend or ("nccl" if self.device == "cuda" else "gloo")

    def cells(self) -> list[Cell]:
        """Repeat-major and interleaved: every repeat runs every configuration once, with the
        protocol order (and a sweep's cost order) rotated per repeat, so slow drift of the
        machine hits all alike; the protocols of one configuration serve back to back."""
        cells = []
        for rep in range(self.repeats):
            for delay in _rotated(self.delays_ms or (None,), rep):
                for rate in self.rates:
                    for policy in self.policies:
                        for proto in _rotated(self.protocols, rep):
                            cells.append(Cell(len(cells), rep, rate, policy, proto, delay))
        return cells

    @property
    def delay_ms(self) -> float:
        """The added cost per control-plane collective of a one-cost plan, ms."""
        return float(dict(self.system).get("collective_delay_ms", 0.0))

    def per_delay(self) -> dict[float | None, RunPlan]:
        """The plan each cell serves under, by its Cell.delay_ms: this one (None), or for
        a sweep one plan per cost, writing to a run directory of its own."""
        if not self.delays_ms:
            return {None: self}
        return {d: self.at_delay(d) for d in self.delays_ms}

    def at_delay(self, delay_ms: float) -> RunPlan:
        """One cost of a sweep: this plan at `delay_ms`, into its own run directory."""
        system = {**dict(self.system), "collective_delay_ms": delay_ms}
        out = str(Path(self.out_dir) / delay_dir(delay_ms)) if self.out_dir else ""
        return replace(self, delays_ms=(), system=tuple(sorted(system.items())), out_dir=out)

    @property
    def forward(self) -> str:
        """What a step's forward is: real (CUDA), modelled on a GPU (CPU sleep), or none."""
        if self.device != "cpu":
            return "real"
        return "none" if self.gpu == "none" else f"modelled:{self.gpu}"

    @property
    def schedule(self) -> str:
        """free (the wall clock decides) or pinned (a virtual clock: hicache.spec.pinned)."""
        return str(dict(self.system).get("schedule", "free"))

    def step_time(self) -> StepTimeModel:
        """The CPU stand-in's forward time (none on CUDA, where the forward is real, unless
        a pinned schedule's virtual clock needs it: then it is modelled, not slept)."""
        if self.gpu == "none" or (self.device != "cpu" and self.schedule != "pinned"):
            return StepTimeModel()
        model = roofline(get_shape(self.model), self.tp, self.gpu)
        return model if self.step_ms is None else replace(model, decode_base_ms=self.step_ms)

    def config(self, cell: Cell) -> HiCacheConfig:
        # --cache sglang: the release's project protocol runs the data path
        target = self.target(cell)
        protocol = target.protocol if target is not None else cell.protocol
        system = dict(self.system)
        if cell.delay_ms is not None:
            system["collective_delay_ms"] = cell.delay_ms
        # SGLang's controller path pins its own PP-ticket threads (docs/sglang.md)
        pin_tickets = target is not None and target.controller
        cfg = HiCacheConfig(protocol=protocol, policy=cell.policy, tp=self.tp,
                            pp=self.pp, model=self.model, step_time=self.step_time(),
                            pad_forward=self.device == "cpu", twin_protocol=self.twin(cell),
                            pin_tickets=pin_tickets, **system)
        # Storage reads take the time of the model's KV bytes on one TP rank.
        page_bytes = get_shape(self.model).kv_bytes_per_page(cfg.page_size, self.tp)
        return replace(cfg, storage=replace(self.storage, seed=self.repeat_seed(cell),
                                            kv_page_bytes=page_bytes))

    def target(self, cell: Cell) -> Target | None:
        """The SGLang serving `cell`: its side's among several, else the run's (or None)."""
        return next((t for t in self.sides if t.name == cell.protocol), self.sglang)

    def consensus_under(self, folder: Path) -> RunPlan:
        """SGLang's rank-consensus checker on in every serve (--sglang-consensus): each
        side's journals under `folder`/side<i> (one SGLang: side0), a folder per serve
        below it (bench.run.worker)."""
        sides = tuple(replace(t, consensus_dir=str(folder / f"side{i}"))
                      for i, t in enumerate(self.sides))
        first = sides[0] if sides else replace(self.sglang, consensus_dir=str(folder / "side0"))
        return replace(self, sides=sides, sglang=first)

    def side_plan(self, side: Target | None) -> RunPlan:
        """The plan one side's ranks run: the whole run's cells, with `sglang` that side's
        (None: the model beside, the project's cache, which pads every step with the MIN
        SGLang's own step adds beside the harness's agreement, HiCacheConfig.step_pad_min:
        the two worlds pay the same collectives a step)."""
        if side is None:
            system = {**dict(self.system), "step_pad_min": True}
            return replace(self, sglang=None, system=tuple(sorted(system.items())))
        return replace(self, sglang=side)

    def twin(self, cell: Cell) -> str:
        """Under step pairing, the protocol every poll of `cell` also asks (the reference,
        the first protocol: hicache.cache.twin); "" otherwise."""
        return self.protocols[0] if self.pairing == "step" else ""

    def repeat_seed(self, cell: Cell) -> int:
        """Common random numbers: one seed per repeat for the workload and the storage noise
        (jitter, failures, missing pages), the same for every protocol within a repeat, so
        protocols pair; across repeats the same one (repeat_seeds same) or a new one."""
        return self.seed * 1000 + (0 if self.repeat_seeds == "same" else cell.repeat)

    @property
    def threads_per_rank(self) -> int:
        writes = dict(self.system).get("write_policy", "none") != "none"
        return THREADS_PER_RANK + (WRITE_PATH_THREADS if writes else 0)

    @property
    def workload_name(self) -> str:
        return "synthetic" if self.trace is None else "trace"

    def build_workload(self, cell: Cell) -> Workload:
        """The cell's requests and what storage holds before them (identical on every
        rank, and across the protocols of one repeat: paired comparisons)."""
        if self.trace is not None:
            return self.trace.workload(cell.rate_rps)
        return synthetic.build(self.workload_for(cell))

    def time_scale(self, cell: Cell) -> float | None:
        return None if self.trace is None else cell.rate_rps / self.trace.base_rate_rps()

    def workload_for(self, cell: Cell) -> WorkloadSpec:
        # The same requests for every protocol within a repeat: paired comparisons.
        return replace(self.workload, rate_rps=cell.rate_rps, seed=self.repeat_seed(cell))


def _rotated(items: tuple, rep: int) -> tuple:
    k = rep % len(items)
    return items[k:] + items[:k]


def delay_dir(delay_ms: float) -> str:
    """A sweep's run directory of one cost, under the sweep's."""
    return f"delay_{delay_ms:g}ms"


def _flat(d: object, prefix: str = "") -> dict[str, object]:
    """Nested dicts as one dict of dotted keys."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, object] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return {k.rstrip("."): v for k, v in out.items()}


def plan_differences(a: dict | None, b: dict | None, sep: str) -> list[str]:
    """'field a-value SEP b-value' for every setting two recorded plans (env.json's `plan`)
    differ in, the settings in UNPLANNED aside."""
    fa, fb = _flat(a or {}), _flat(b or {})
    # A setting recorded as None or empty (off: no sweep, no sides) and one not recorded at
    # all (a plan written before the setting existed) are the same plan.
    fa, fb = ({k: v for k, v in f.items() if v is not None and v != [] and v != ()}
              for f in (fa, fb))
    return [f"{k} {fa.get(k, '(unset)')} {sep} {fb.get(k, '(unset)')}"
            for k in sorted(set(fa) | set(fb))
            if k not in UNPLANNED and fa.get(k, "(unset)") != fb.get(k, "(unset)")]


# Settings that do not change what a run's timed serves are: where it writes, and whether
# an untimed serve counts host work after each cell (bench.run.host_profile)
UNPLANNED = ("out_dir", "host_work")
