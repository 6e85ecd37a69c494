"""One frozen, validated configuration for the system under test."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from hicache.spec.cost_model import (
    BUFFER_ONLY_PROTOCOLS,
    HOST_MEMORY,
    POLICIES,
    PROTOCOLS,
    TWINS,
    ticket_path,
)
from hicache.spec.pinned import SCHEDULES
from hicache.spec.shapes import get_shape
from hicache.spec.step_time import StepTimeModel
from hicache.spec.storage_spec import StorageSpec

WRITE_POLICIES = ("none", "write_through", "write_back")
HAZARDS = ("", "ongoing_skew", "early_return", "span_skew")
SIDECAR_HIT_POLICIES = ("all_pages", "trailing_pages")


@dataclass(frozen=True)
class HiCacheConfig:
    protocol: str = "pr36425"
    policy: str = "timeout"
    tp: int = 1
    pp: int = 1
    page_size: int = 64
    prefetch_threshold: int = 256  # tokens; shorter page-aligned prefixes are not fetched
    # 0.5.23's storage prefetch retries (hicache.cache.retries; SGLang's
    # --hicache-storage-prefetch-retry-poll-interval / -max-attempts, defaults 8 and 8): a
    # miss is looked up again after this many scheduler passes (0: never), at most this
    # many re-issues a request. Read only by the releases that retry (sglang-0.5.23, pr39267).
    retry_poll_interval: int = 8
    retry_max_attempts: int = 8
    # Another writer's pages landing during the serve (the retry scenarios,
    # docs/hazards.md): the prefixes stored before the serve count for a hit query only
    # from the query's scheduler step `land_step` on (0: from the start); on every TP rank
    # but 0 from `land_step + land_skew_steps` (ranks that see the miss differently).
    land_step: int = 0
    land_skew_steps: int = 0
    timeout_base_s: float = 1.0  # UnifiedRadixCache defaults
    timeout_per_ki_token_s: float = 0.25
    race_guard: bool = True  # PR #27550's pool_transfers_done check (pre27010 only)
    extra_pool: bool = False  # side-car INDEXER pool read after the KV pages
    # Its hit policy: "all_pages" (INDEXER shaped, every page needed) or "trailing_pages"
    # (SWA / Mamba shaped: 0.5.23 then agrees on restorable endpoints: hicache.agreement.hit_query).
    sidecar_hit_policy: str = "all_pages"
    # "cache": host memory is an L2 tier (prefetched pages stay in the host tree);
    # "buffer_only": staging only (freed after load-back), and with PP > 1 0.5.23's
    # PP-ticket path (docs/releases.md).
    host_memory: str = "cache"
    kv_page_elems: int = 128  # floats per KV page (content is synthetic)
    sidecar_page_elems: int = 16
    host_pool_pages: int = 8192
    device_pool_pages: int = 4096
    max_prefill_tokens: int = 4096  # the batch token budget, agreed by all ranks
    model: str = "toy"  # hicache.spec.shapes: KV bytes, step-time model, CUDA forward shapes
    # KV pages: "real" = the model's KV bytes per page (hicache.memory.kv_layout), "synthetic" = a
    # float32 signature row only, "auto" = real on CUDA with a non-toy model.
    kv_bytes: str = "auto"
    kv_budget_gib: float = 4.0  # real pages: bytes of each of the host and device pools
    budget_skew: float = 0.0  # rank-local walk horizon skew (SGLang #30760), 0 = off
    layers: int = 2  # prefill emulation: per layer a matmul and a data-plane all-reduce
    hidden: int = 64
    allreduce_tokens: int = 16  # rows of the per-layer all-reduce (fixed: a padded decode batch)
    max_running_requests: int = 256  # the running (decode) batch's bound; full: no walk
    # The device tier and the write path (hicache.cache.tiers): "none" = computed pages are not
    # kept (the synthetic presets); write_through (SGLang's default) / write_back = a
    # device prefix cache whose pages reach the host and then storage.
    write_policy: str = "none"
    # Pools never evict (checks): page counts are the *_pool_pages fields as given, the
    # budget and the prefetch rate limit do not apply.
    unbounded_pools: bool = False
    # With the device tier: the host pool's budget over the device pool's (SGLang's
    # --hicache-ratio, 2.0 by default in cache mode); 1 without it (kv_budget_gib each).
    host_ratio: float = 2.0
    consensus_check: bool = False  # SGLang's @rank_consensus, off by default
    # Record the timeline (hicache.memory.events: every collective, poll, storage batch and copy,
    # stamped), for `bench timeline`; off by default (docs/timeline.md, "Cost").
    timeline: bool = False
    consensus_interval_s: float = 0.05
    collective_timeout_s: float = 60.0
    # A fixed blocking wait (a sleep: no CPU spent) added to every control-plane collective
    # of the system under test, the same on every rank: a slow interconnect or a busy host
    # (hicache.comm.comm.DELAYED_SITES; SGLang's under --cache sglang, sglang_adapter.door).
    collective_delay_ms: float = 0.0
    # One more MIN over the TP group every step, agreeing on nothing: what SGLang's own
    # check_hicache_events adds beside the harness's agreement under --cache sglang (on
    # either path: 2 per-step MINs a step at TP2, the project's cache 1). --model-beside
    # sets it on the model's world, so the model pays the sides' collectives a step.
    step_pad_min: bool = False
    # A prompt of max_input_tokens or more (the device pool's, hicache.cache.prefill_pages) is
    # refused, as SGLang's validate_input_length does; True cuts it to that length instead
    # (SGLang's --allow-auto-truncate).
    allow_auto_truncate: bool = False
    # Hazard variants (docs/hazards.md): "ongoing_skew" = one rank alone drops a prefetch
    # from its ongoing set (SGLang #38273); "early_return" = the per-step MIN is skipped by
    # a rank whose own host-copy queue is empty, and one rank's first host copy fails
    # (before #27489 / #26923; needs a write_policy); "span_skew" = PP stage 0 already holds
    # the first half of every prefix in its host tree and later stages do not, so the
    # stages' request spans differ (SGLang PR #39267's report; needs PP > 1). "" = none.
    hazard: str = ""
    # PD prefill's bootstrap admission at PP > 1 (hicache.agreement.pd_admission): an arrival
    # waits in a bootstrap queue until a two-pass ring over the PP stages admits it into
    # the waiting queue (the protocol picks the rule: before or after SGLang PR #34568).
    # Off: arrivals enter the waiting queue at once, as in every run before it.
    pd_admission: bool = False
    # With it: PP stage s sees its prefetches end s x this many scheduler steps after stage
    # 0 does (the PP pipeline's micro-batch offset: a later stage runs each step's work
    # later), the structural per-stage delay behind SGLang issue #34572. 0: none.
    pd_stage_lag_steps: int = 0
    kill_rank: int = -1  # fault injection: this rank exits at kill_step
    kill_step: int = -1
    # Fault injection: every step whose walk polls a pending prefetch spins this many ms
    # more, in `planted_protocol`'s cells only: a known host cost that a paired design must
    # recover (tests/test_pairing.py). 0: none.
    planted_step_ms: float = 0.0
    planted_protocol: str = ""
    # Fault injection of host *work*, not time: the same polls make this many extra Python
    # calls (hicache.cache.twin._work), the same count on any machine, so a host-work count
    # (bench.run.host_profile) sees it exactly where a spin's count would vary with the CPU.
    # 0: none.
    planted_step_calls: int = 0
    # The step-paired design (hicache.cache.twin): every poll also asks this protocol, back to back
    # on the same facts, each side timed; their answers must agree. "" = no twin.
    twin_protocol: str = ""
    # Fault injection: from this step on the twin's answers are flipped, so the pair disagrees
    # and the run must fail (tests/test_step_pairing.py). -1: never.
    planted_disagreement_from_step: int = -1
    storage: StorageSpec = field(default_factory=StorageSpec)
    # Modelled forward time on CPU (hicache.spec.step_time); all zero: steps last their CPU work.
    step_time: StepTimeModel = field(default_factory=StepTimeModel)
    # The step sleeps out the rest of its modelled forward (the CPU stand-in); False where
    # the forward is real and step_time only drives a pinned schedule's virtual clock.
    pad_forward: bool = True
    # "free": the wall clock decides when things become true; "pinned": a virtual clock
    # advanced by the modelled forward (hicache.spec.pinned), the same schedule on every run.
    schedule: str = "free"
    idle_step_ms: float = 1.0  # pinned: virtual time of a step without a forward
    # Who serves 0.5.23's PP-ticket path pinned: SGLang's controller path gates its ticket
    # threads on the virtual clock (sglang_adapter.controller.pinned.TicketPin); the
    # project's data path does not pin it (set by the run's plan, not a user option).
    pin_tickets: bool = False

    def _check_pinned(self) -> None:
        """The combinations a pinned schedule cannot pin (yet): one line each."""
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose from "
                             f"{', '.join(SCHEDULES)}")
        if self.schedule == "free":
            return
        if not self.step_time.enabled:
            raise ValueError("a pinned schedule needs a modelled forward time (its virtual "
                             "clock advances by it): --gpu none cannot be pinned")
        if self.tiers:
            raise ValueError("a pinned schedule does not yet pin the write path's host "
                             "copies and storage writes: write_policy needs none, or "
                             "--schedule free")
        if self.extra_pool:
            raise ValueError("a pinned schedule does not pin side-car pool reads: "
                             "--extra-pool needs --schedule free")
        if ticket_path(self.protocol, self.pp, self.host_memory) and not self.pin_tickets:
            raise ValueError("a pinned schedule does not pin 0.5.23's PP-ticket path "
                             "(buffer_only, PP > 1): use --schedule free")
        if not self.idle_step_ms > 0:
            raise ValueError(f"idle_step_ms must be > 0, got {self.idle_step_ms}")

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; "
                             f"choose from {', '.join(PROTOCOLS)}")
        if self.host_memory not in HOST_MEMORY:
            raise ValueError(f"host_memory must be {' or '.join(HOST_MEMORY)}, "
                             f"got {self.host_memory!r}")
        if self.host_memory == "buffer_only" and self.protocol not in BUFFER_ONLY_PROTOCOLS:
            raise ValueError(f"host_memory buffer_only is not modelled for {self.protocol} "
                             f"(its releases have no such mode); choose from "
                             f"{', '.join(BUFFER_ONLY_PROTOCOLS)}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from {', '.join(POLICIES)}")
        for name in ("tp", "pp", "page_size", "host_pool_pages", "device_pool_pages",
                     "max_prefill_tokens", "max_running_requests", "layers", "hidden",
                     "allreduce_tokens", "kv_page_elems", "sidecar_page_elems"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        get_shape(self.model)  # ValueError naming the known models
        if self.twin_protocol and not {self.protocol, self.twin_protocol} <= set(TWINS):
            raise ValueError(f"step pairing pairs protocols that decide alike in the poll "
                             f"({', '.join(TWINS)}), got {self.protocol} and "
                             f"{self.twin_protocol}")
        if self.planted_step_ms < 0:
            raise ValueError(f"planted_step_ms must be >= 0, got {self.planted_step_ms}")
        if self.planted_step_calls < 0:
            raise ValueError(f"planted_step_calls must be >= 0, got {self.planted_step_calls}")
        if self.kv_bytes not in ("auto", "real", "synthetic"):
            raise ValueError(f"kv_bytes must be auto, real or synthetic, got {self.kv_bytes!r}")
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {', '.join(WRITE_POLICIES)}, "
                             f"got {self.write_policy!r}")
        if self.write_policy != "none" and self.host_memory == "buffer_only":
            raise ValueError("buffer_only host memory holds no cache tier (the tree never has "
                             "host pages): write_policy needs host_memory cache")
        if self.write_policy != "none" and self.extra_pool:
            raise ValueError("the device tier does not model side-car pools: write_policy "
                             "needs extra_pool off")
        if not self.host_ratio > 0:
            raise ValueError(f"host_ratio must be > 0, got {self.host_ratio}")
        if not self.kv_budget_gib > 0:
            raise ValueError(f"kv_budget_gib must be > 0, got {self.kv_budget_gib}")
        if self.prefetch_threshold < 0:
            raise ValueError("prefetch_threshold must be >= 0")
        if self.land_step < 0 or self.land_skew_steps < 0:
            raise ValueError(f"land_step and land_skew_steps must be >= 0, got "
                             f"{self.land_step} and {self.land_skew_steps}")
        if self.retry_poll_interval < 0 or self.retry_max_attempts < 0:
            raise ValueError(f"retry_poll_interval and retry_max_attempts must be >= 0, got "
                             f"{self.retry_poll_interval} and {self.retry_max_attempts}")
        if not 0.0 <= self.budget_skew < 1.0:
            raise ValueError(f"budget_skew must be in [0, 1), got {self.budget_skew}")
        if self.timeout_base_s < 0 or self.timeout_per_ki_token_s < 0:
            raise ValueError("prefetch timeouts must be >= 0")
        if self.hazard not in HAZARDS:
            raise ValueError(f"unknown hazard {self.hazard!r}; choose from "
                             f"{', '.join(h for h in HAZARDS if h)} or none")
        if self.hazard == "early_return" and self.write_policy == "none":
            raise ValueError("hazard early_return needs a write policy (its queue is the "
                             "host copies of the write path)")
        if self.sidecar_hit_policy not in SIDECAR_HIT_POLICIES:
            raise ValueError(f"sidecar_hit_policy must be {' or '.join(SIDECAR_HIT_POLICIES)}, "
                             f"got {self.sidecar_hit_policy!r}")
        if self.sidecar_hit_policy == "trailing_pages" and not self.extra_pool:
            raise ValueError("sidecar_hit_policy trailing_pages needs extra_pool (the side-car)")
        if self.hazard == "span_skew" and self.pp < 2:
            raise ValueError("hazard span_skew needs PP > 1 (its spans differ between stages)")
        if self.pd_admission and self.pp < 2:
            raise ValueError(f"pd_admission needs PP > 1 (its ring runs between PP stages), "
                             f"got pp {self.pp}")
        if self.pd_stage_lag_steps < 0 or (self.pd_stage_lag_steps and not self.pd_admission):
            raise ValueError(f"pd_stage_lag_steps must be >= 0 and needs pd_admission, got "
                             f"{self.pd_stage_lag_steps}")
        if self.collective_timeout_s <= 0:
            raise ValueError("collective_timeout_s must be > 0")
        if not 0 <= self.collective_delay_ms < math.inf:
            raise ValueError(f"collective_delay_ms must be finite and >= 0, got "
                             f"{self.collective_delay_ms}")
        self._check_pinned()

    @property
    def tiers(self) -> bool:
        """The device tier and the write path are on."""
        return self.write_policy != "none"

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def row(self) -> dict:
        """Flat fields for run headers and result rows."""
        d = asdict(self)
        storage = d.pop("storage")
        d.update({f"storage_{k}": v for k, v in storage.items()})
        d.update({f"step_time_{k}": v for k, v in d.pop("step_time").items()})
        return d
