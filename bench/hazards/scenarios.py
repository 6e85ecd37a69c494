"""The hazard scenarios of `bench hazards` (docs/hazards.md), one small function each.

A scenario is a layout, a prefetch policy, the system settings that provoke one known
hazard of SGLang's prefetch loop, and a short burst of requests whose prefixes are in
storage. Everything that varies between ranks is seeded (the storage noise) or structural
(a rank's skewed horizon, the one rank that drops a prefetch), so a scenario replays from
its seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache.spec.cost_model import ADMISSION_PROTOCOLS
from hicache.spec.step_time import StepTimeModel


@dataclass(frozen=True)
class Scenario:
    name: str
    issue: str  # the SGLang issue or PR it reproduces
    what: str  # one line for the table
    pp: int = 1
    policy: str = "timeout"
    system: dict = field(default_factory=dict)  # HiCacheConfig overrides
    storage: dict = field(default_factory=dict)  # StorageSpec overrides
    requests: int = 8
    prefix_tokens: int = 512  # in storage: 8 pages of 64
    new_tokens: int = 512  # computed by the prefill
    gap_ms: float = 2.0  # between arrivals
    protocols: tuple[str, ...] | None = None  # None: every protocol can run it
    # --cache sglang: its hazard lives in SGLang's own controller path (the retry set its
    # hit drain arms; the acks its sync thread MIN-reduces over TP and PP), so that path is
    # the data path where the cell fits it; else SGLang's decisions on the project's data
    # path (every other scenario plants its hazard in the project's data path)
    sglang_controller: bool = False
    # Its hazard is in a stage of the model that no SGLang release has (PD prefill's
    # admission ring: docs/hazards.md), so `--cache sglang` has no cell for it
    model_only: bool = False

    @property
    def world(self) -> int:
        return 2 * self.pp  # TP 2 on every stage


# Storage reads slower than a scheduler step, so a pending prefetch is polled many times;
# a timeout long enough that it never fires on its own.
SLOW_READS = {"latency_ms": 20.0}
NO_TIMEOUT = {"timeout_base_s": 30.0, "timeout_per_ki_token_s": 0.0}


def _budget_skew() -> Scenario:
    # A prefill (60 ms) outlasts several reads (15 ms each, one after another), so the walk
    # after it finds several prefetches done: rank 0 batches them all, rank 1 stops after
    # the first; and the walk that schedules the first finds the second still pending.
    return Scenario("walk-skew", "#30760", "rank-local walk trip counts differ (TP rank 1's "
                    "token horizon is 10% of rank 0's)",
                    system={"budget_skew": 0.9, "step_time": StepTimeModel(prefill_base_ms=60.0),
                            **NO_TIMEOUT}, storage={"latency_ms": 15.0})


def _ongoing_skew() -> Scenario:
    return Scenario("ongoing-skew", "#38273", "one request is in TP rank 0's ongoing_prefetch "
                    "and not in rank 1's (its hit judged below the threshold there)",
                    system={"hazard": "ongoing_skew", **NO_TIMEOUT}, storage=SLOW_READS)


def _early_return() -> Scenario:
    return Scenario("early-return", "#27489", "write-through; TP rank 1's first host copy "
                    "finds no host memory, and writing_check returns before its own MIN "
                    "on a rank whose ongoing_write_through is empty (the code before the fix)",
                    system={"hazard": "early_return", "write_policy": "write_through",
                            **NO_TIMEOUT}, storage=SLOW_READS)


def _pp_stages() -> Scenario:
    # Under --cache sglang the stages' different progress meets SGLang's own ack MINs (its
    # sync thread's, over the TP group and then the PP group) and its per-step relay.
    return Scenario("pp-stages", "#22607", "storage reads fail on some ranks and not others "
                    "(fail rate 0.3, seeded per rank), so PP stages see different progress",
                    pp=2, system=NO_TIMEOUT, storage={**SLOW_READS, "fail_rate": 0.3},
                    sglang_controller=True)


def _sidecar_race() -> Scenario:
    return Scenario("sidecar-race", "#27550", "side-car pages written after the KV pages, "
                    "without PR #27550's pool_transfers_done guard",
                    policy="wait_complete", system={"extra_pool": True, "race_guard": False},
                    storage={"latency_ms": 5.0, "sidecar_page_ms": 5.0})


def _pp_busy() -> Scenario:
    # Under --cache sglang: SGLang's own PP-ticket path (its command, IO and ack threads,
    # the ticket group, BufferModePipeline: sglang_adapter.controller.tickets).
    return Scenario("pp-busy", "0.5.23", "buffer_only at PP 2: the busy flag agreed per stage "
                    "only, stages with different storage progress (jitter 0.5)",
                    pp=2, policy="wait_complete", system={"host_memory": "buffer_only"},
                    storage={**SLOW_READS, "jitter": 0.5},
                    protocols=("sglang-0.5.23",), sglang_controller=True)


def _span_skew() -> Scenario:
    # PR #39267's report: PP 2, the hit query's mask sized by each stage's own request span
    # (`len(operation.token_ids) // page_size + 1`); stage 0 had cached two prefill chunks
    # more than stage 1. Here stage 0 holds the first 8 of 16 stored pages of every prompt:
    # spans of 16 and 24 pages (512 new tokens follow), both above the threshold. Arrivals
    # 150 ms apart, each request prefetched and prefilled alone: in a burst the stages'
    # different extends fit different batches in the prefill budget, a divergence that no
    # hit-query change closes (docs/hazards.md).
    return Scenario("span-skew", "#39267", "a TRAILING_PAGES side-car (SWA / Mamba shaped); "
                    "PP stage 0 already caches the first half of each prefix, stage 1 not, "
                    "so their request spans (and 0.5.23's hit masks) differ in length",
                    pp=2, policy="wait_complete", prefix_tokens=1024, requests=4, gap_ms=150.0,
                    system={"extra_pool": True, "sidecar_hit_policy": "trailing_pages",
                            "hazard": "span_skew"},
                    storage=SLOW_READS, protocols=("sglang-0.5.23", "pr39267"),
                    sglang_controller=True)  # the mask is SGLang's own hit query's


# The retry scenarios (0.5.23's StoragePrefetchRetries, docs/hazards.md "Retries (0.5.23)"):
# every prompt's 8 stored pages are another writer's, landing while the burst (all at
# once) waits; each
# prompt's 1536 new tokens fill most of the 2048-token prefill budget, so the walk
# schedules one request a step and the tail still waits when its retry falls due (8 passes
# after the miss, SGLang's default). pr36425 (0.5.19, the same poll, no retries) beside it.
RETRY_PROTOCOLS = ("pr36425", "sglang-0.5.23")


def _late_write() -> Scenario:
    return Scenario("late-write", "#36227", "every prefix lands in storage at scheduler step 4 "
                    "(another writer's backup committing): the first lookups miss, a retry "
                    "8 passes later finds them while the request still waits",
                    requests=16, new_tokens=1536, gap_ms=0.0,
                    system={"land_step": 4, **NO_TIMEOUT}, storage=SLOW_READS,
                    protocols=RETRY_PROTOCOLS, sglang_controller=True)


def _miss_skew() -> Scenario:
    return Scenario("miss-skew", "#36227", "TP rank 0 holds every prefix from the start, "
                    "TP rank 1 only from step 6: the ranks see the first lookups' miss "
                    "differently (8 pages against 0)",
                    requests=16, new_tokens=1536, gap_ms=0.0,
                    system={"land_skew_steps": 6, **NO_TIMEOUT}, storage=SLOW_READS,
                    protocols=RETRY_PROTOCOLS, sglang_controller=True)


def _pp_admission() -> Scenario:
    # SGLang issue #34572: PD prefill at PP 2, each stage admitting a bootstrapped request
    # by its own prefetch's readiness. Stage 1 sees a prefetch end 3 steps after stage 0
    # (`pd_stage_lag_steps`, structural: the PP pipeline's offset), so the stages' queues
    # part at the first request, in the same step of every run. The before rule is 0.5.19's
    # ring (pr36425's release), #34568 the PR on it.
    return Scenario("pp-admission", "#34568", "PD prefill's bootstrap admission at PP 2: "
                    "stage 1 sees each prefetch end 3 steps after stage 0, and each stage "
                    "admits by its own readiness (before the PR)",
                    pp=2, policy="wait_complete",
                    system={"pd_admission": True, "pd_stage_lag_steps": 3,
                            "step_time": StepTimeModel(prefill_base_ms=20.0)},
                    storage=SLOW_READS, protocols=("pr36425", "pr34568"), model_only=True)


SCENARIOS = {s.name: s for s in (_budget_skew(), _ongoing_skew(), _early_return(),
                                 _pp_stages(), _sidecar_race(), _pp_busy(), _span_skew(),
                                 _late_write(), _miss_skew(), _pp_admission())}


def runs(scenario: Scenario, protocol: str, sglang: bool = False) -> bool:
    """Whether the matrix has a cell for this pair (pre27010 has no buffer_only mode; a
    protocol that changes only PD prefill's admission runs only where it is on; `sglang`:
    SGLang's code serves, which has no cell for a stage only the model has)."""
    if sglang and scenario.model_only:
        return False
    if scenario.protocols is None:
        return protocol not in ADMISSION_PROTOCOLS
    return protocol in scenario.protocols


def check_choice(names: list[str], pp: int | None) -> list[Scenario]:
    """The named scenarios; ValueError (one line) for an unknown one, or one that needs
    PP > 1 when the layout is pinned to PP 1."""
    out = []
    for name in names:
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
        s = SCENARIOS[name]
        if pp is not None and s.pp > pp:
            raise ValueError(f"scenario {name} needs PP >= {s.pp} (its hazard is between PP "
                             f"stages), got --pp {pp}")
        out.append(s)
    return out
