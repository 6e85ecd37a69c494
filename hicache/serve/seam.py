"""The seam: everything the harness (`hicache.serve.scheduler`, `hicache.serve.system`) calls on
the cache it serves with. `hicache.cache.cache.HiCache` implements it; a second implementation
(SGLang's own HiCache code behind an adapter, a package of its own) comes in through
`System`'s `make_cache` and nowhere else. docs/design.md, "The seam".

Contract, in the order a serve runs it (all on the scheduler thread, in lock-step with the
other ranks unless a line says otherwise):

- built by a `CacheFactory` with the run's config, this rank's layout and `Comm`, the
  harness's storage tier, the device, the `Stats` to record into and the consensus checker
  its `@rank_consensus` methods log to (None: no check). It records what it decides in
  `stats`: per request `RequestStats` (polls, hit, prefetched tokens, how it ended, its
  ready/IO times) and `stats.decisions[rid] = (how, usable_tokens, hit_tokens | None)`,
  which `bench` compares across ranks. Every collective it issues is counted on
  `stats.counter` under a named call site.
- `start()` before the first step; then per step: `admit` for each broadcast arrival,
  `check_hicache_events` once, `retry_prefetches` once, with PD prefill's admission stage
  on `landed` for the bootstrap queue's requests, the walk (`begin_walk`, then per
  reached request `walk_polls`, `walk_progress`, and for one that is ready
  `cached_tokens`, `device_pages_needed` against `device_free_pages` / `device_room`),
  then per scheduled request `load_back`, the forward, `cache_prefill` and `release`.
- after the last step: `finish_pipeline()`, `stop(grace_s)`, `settle()`, `error()`; after a
  failure: `stop(0.0)` only; `close()` once the process is done with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from hicache.agreement.consensus import ConsensusChecker
    from hicache.comm.comm import CollectiveCounter, Comm
    from hicache.comm.groups import Layout
    from hicache.comm.records import Stats
    from hicache.memory.storage import Storage
    from hicache.spec.config import HiCacheConfig


class PinnedClock(Protocol):
    """The measured clock under a pinned schedule (hicache.spec.pinned.Pin): the wall clock less
    the waits for background work whose virtual time had come."""

    def clock(self) -> float: ...

    def take_waited(self) -> float:
        """Seconds waited for background work since the last call (one step's)."""
        ...

    def leave_out(self, seconds: float) -> float:
        """Leaves `seconds` (if > 0) out of the measured clock; returns what it left out."""
        ...


class CacheUnderTest(Protocol):
    """What the scheduler and the system call on the cache, and nothing else."""

    @property
    def pin(self) -> PinnedClock | None:
        """The pinned schedule's measured clock; None under a free schedule."""
        ...

    @property
    def max_input_tokens(self) -> int:
        """A prompt this long or longer is refused, or cut to it (max_req_input_len)."""
        ...

    @property
    def extra_polls(self) -> int:
        """Polls this step made outside the walk's reach (read after the walk)."""
        ...

    @property
    def poll_timing(self) -> tuple[float, float, bool]:
        """Host seconds this step's polls took (read after the walk): the protocol's own,
        its twin's under the step-paired design (hicache.cache.twin; 0.0 without one), and
        whether the twin polled first this step."""
        ...

    @property
    def beside_counter(self) -> CollectiveCounter | None:
        """The counter of collectives the cache issues beside the system's own on the same
        groups (a twin protocol's), which System.crosscheck adds; None: none."""
        ...

    @property
    def own_groups(self) -> dict[str, torch.distributed.ProcessGroup]:
        """Process groups the cache made itself, beside `Comm`'s (SGLang's own controller
        path makes its hit-query and ack groups): held against torch's sequence numbers by
        System.crosscheck as the harness's are; {} for none."""
        ...

    # ---- lifecycle -------------------------------------------------------------------------

    def warm_host(self, prefixes: list[list[int]]) -> None:
        """Before the serve: these prefixes' pages already in this rank's host tier (a
        scenario in which ranks hold different prefixes, e.g. the span_skew hazard)."""
        ...

    def start(self) -> None:
        """Starts the background threads (each owns its process groups)."""
        ...

    def finish_pipeline(self) -> None:
        """After the last step, on every rank: completes a collective the last step left in
        flight (a pipelined per-step agreement), so it pairs and its errors surface."""
        ...

    def stop(self, grace_s: float) -> None:
        """Tells the background threads to stop; waits up to `grace_s` for each (0: none)."""
        ...

    def settle(self) -> None:
        """After `stop`: frees what outlived the last step and records the end-of-run
        self-checks (`stats.host_slots_unaccounted`, `stats.write_path`)."""
        ...

    def error(self) -> BaseException | None:
        """The first error a background thread raised, or None."""
        ...

    def close(self) -> None:
        """Frees the pools' memory."""
        ...

    # ---- once per step ---------------------------------------------------------------------

    def admit(self, rid: str, tokens: list[int], stamp: float) -> None:
        """A broadcast arrival: prefix match, lock, and the prefetch issue (or not)."""
        ...

    def check_hicache_events(self, stamp: float, busy: bool) -> bool:
        """The per-step agreement (`stamp`: rank 0's clock, virtual when pinned; `busy`:
        this rank's scheduler holds work); returns whether any rank still has work."""
        ...

    def retry_prefetches(self, waiting: list[str], stamp: float) -> None:
        """Right after `check_hicache_events`, before the walk (`waiting`: the queue in its
        order): the storage lookups a release's retries have due now are issued again
        (SGLang 0.5.23 `_process_storage_prefetch_retries`); nothing where it has none."""
        ...

    def has_work(self) -> bool:
        """Prefetches ongoing, or host copies and storage writes not yet acked."""
        ...

    def writes_pending(self) -> bool:
        """Host copies or storage writes not yet acked (the run goes on until they are)."""
        ...

    def prefetching(self, rid: str) -> bool:
        """Whether `rid`'s prefetch is still ongoing on this rank."""
        ...

    def landed(self, rid: str) -> bool:
        """Whether this rank's own prefetch of `rid` has ended (its pages landed here, or it
        was ended or never issued): the stage-local readiness of PD prefill's admission
        (HiCacheConfig.pd_admission), read only with it on."""
        ...

    # ---- the walk --------------------------------------------------------------------------

    def begin_walk(self, waiting: list[str]) -> int:
        """Before the walk (the broadcast queue order); returns the pending polls it made."""
        ...

    def walk_polls(self, rid: str) -> int:
        """Whether reaching `rid` in the walk polls a pending prefetch (0 or 1)."""
        ...

    def walk_progress(self, rid: str) -> bool:
        """The walk's answer for `rid`: ready to schedule, or still prefetching."""
        ...

    def prompt_length(self, rid: str) -> int:
        """Tokens of an admitted request's prompt (after any truncation)."""
        ...

    def cached_tokens(self, rid: str) -> int:
        """Host-resident prefix usable for `rid`'s prompt (at least one token left)."""
        ...

    def device_free_pages(self) -> int:
        """Free device pages now (cheap)."""
        ...

    def device_room(self) -> int:
        """Device pages a prefill can take now: free and unlocked cached ones (walks)."""
        ...

    def device_pages_needed(self, rid: str, cached: int) -> int:
        """Device pages `rid`'s load-back takes of device_room() if scheduled now."""
        ...

    # ---- load-back, prefill, release -------------------------------------------------------

    def load_back(self, rid: str) -> tuple[list[int], float]:
        """Device pages for the prompt before its prefill, and the copy's time (s)."""
        ...

    def cache_prefill(self, rid: str, dev: list[int]) -> None:
        """After the prefill: the device pages are cached (device tier) or go back."""
        ...

    def release(self, rid: str) -> None:
        """The request is done with the cache: its locks and staged pages go back."""
        ...


# HiCache's constructor: (cfg, layout, comm, storage, device, stats, consensus).
CacheFactory = Callable[["HiCacheConfig", "Layout", "Comm", "Storage", "torch.device", "Stats",
                         "ConsensusChecker | None"], CacheUnderTest]
