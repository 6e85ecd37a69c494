"""What one `bench run` does: the frozen plan every rank executes, and the named presets.

Presets are small functions returning the plan fields they set; command-line flags
override them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.workload import WorkloadSpec
from hicache.config import HiCacheConfig
from hicache.cost_model import POLICIES, PROTOCOLS
from hicache.storage import StorageSpec

ALIASES = {"before": "pr27010", "after": "pr36425"}


@dataclass(frozen=True)
class Cell:
    index: int
    repeat: int
    rate_rps: float
    policy: str
    protocol: str


@dataclass(frozen=True)
class RunPlan:
    preset: str = "default"
    protocols: tuple[str, ...] = PROTOCOLS
    policies: tuple[str, ...] = POLICIES
    rates: tuple[float, ...] = (16.0,)
    repeats: int = 3
    tp: int = 2
    pp: int = 1
    device: str = "cpu"  # resolved: cpu | cuda
    data_backend: str = ""  # resolved: nccl | gloo (model all-reduces); "" = by device
    seed: int = 0
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    storage: StorageSpec = field(default_factory=lambda: StorageSpec(latency_ms=20.0))
    system: tuple[tuple[str, object], ...] = ()  # HiCacheConfig overrides
    out_dir: str = ""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def backend(self) -> str:
        """The data-plane backend actually used (the control plane is always gloo)."""
        return self.data_backend or ("nccl" if self.device == "cuda" else "gloo")

    @property
    def model(self) -> str:
        return dict(self.system).get("model", "toy")

    def cells(self) -> list[Cell]:
        """Repeat-major and interleaved: every repeat runs every configuration once, with the
        protocol order rotated per repeat, so slow drift of the machine hits all alike."""
        cells = []
        for rep in range(self.repeats):
            protos = self.protocols[rep % len(self.protocols):] + \
                self.protocols[: rep % len(self.protocols)]
            for rate in self.rates:
                for policy in self.policies:
                    for proto in protos:
                        cells.append(Cell(len(cells), rep, rate, policy, proto))
        return cells

    def config(self, cell: Cell) -> HiCacheConfig:
        return HiCacheConfig(protocol=cell.protocol, policy=cell.policy, tp=self.tp,
                             pp=self.pp, storage=replace(self.storage, seed=self.seed),
                             **dict(self.system))

    def workload_for(self, cell: Cell) -> WorkloadSpec:
        # The same requests for every protocol within a repeat: paired comparisons.
        return replace(self.workload, rate_rps=cell.rate_rps,
                       seed=self.seed * 1000 + cell.repeat)


def _default(gpus: int) -> dict:
    return {"tp": min(gpus, 8) if gpus > 1 else 2, "repeats": 3}


def _ci(gpus: int) -> dict:
    return {"tp": 2, "repeats": 3, "requests": 12}


def _sweep(gpus: int) -> dict:
    return {"tp": min(gpus, 8) if gpus > 1 else 2, "repeats": 2, "requests": 16,
            "protocols": ("pr27010", "pr36425", "step-clock"),
            "policies": ("wait_complete", "timeout"), "rates": (4.0, 8.0, 16.0, 32.0)}


def _pp(gpus: int) -> dict:
    return {"tp": 2, "pp": 2, "repeats": 2, "requests": 16}


def _race(gpus: int) -> dict:
    return {"tp": 2, "repeats": 1, "requests": 12, "protocols": ("pre27010", "pr36425"),
            "policies": ("wait_complete",), "extra_pool": True,
            "sidecar_page_ms": 5.0}


PRESETS = {"default": _default, "ci": _ci, "sweep": _sweep, "pp": _pp, "race": _race}
PRESET_HELP = {
    "default": "make bench: all protocols x policies, 3 repeats, TP = local GPUs (2 on CPU)",
    "ci": "quick CI run for the gate: all protocols x policies, 3 repeats, 12 requests",
    "sweep": "TTFT vs arrival rate (4-32 req/s) for pr27010, pr36425, step-clock",
    "pp": "TP2 x PP2 on 4 ranks",
    "race": "PR #27550 side-car race: pre27010 vs pr36425 with a slow side-car pool",
}
