"""The scheduler loop every rank runs in lock-step (one step = one iteration below).

Per step: rank 0 broadcasts the new arrivals and its clock; check_hicache_events agrees on
the per-step counters with one packed MIN; the waiting queue is walked in arrival order,
polling each reached request at most once; the batch is loaded back host->device and
prefilled; its first tokens end TTFT. Only the scheduler thread runs this.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass

from hicache.cache import HiCache
from hicache.comm import REQUEST_BROADCAST, Comm, Layout
from hicache.config import HiCacheConfig
from hicache.model import Model
from hicache.stats import RequestStats, Stats, StepStats


@dataclass(frozen=True)
class Request:
    rid: str
    tokens: list[int]
    arrival_offset_s: float  # seconds after the run's start, on rank 0's clock


class Scheduler:
    def __init__(self, cfg: HiCacheConfig, layout: Layout, comm: Comm, cache: HiCache,
                 model: Model, stats: Stats):
        self.cfg, self.layout, self.comm = cfg, layout, comm
        self.cache, self.model, self.stats = cache, model, stats
        self.waiting: deque = deque()
        # Rank-local walk horizon: a skewed rank believes the batch is full sooner (#30760).
        skew = cfg.budget_skew * layout.tp_rank / max(1, layout.tp - 1)
        self.horizon = int(cfg.max_prefill_tokens * (1.0 - skew))

    def run(self, requests: list[Request], step_base: int = 0,
            idle_sleep_s: float = 0.001) -> int:
        """Serves `requests` (used on rank 0 only; the others receive them) to completion;
        returns the number of steps. `step_base` counts the process's earlier steps (for
        fault injection at a process-wide step)."""
        pending = deque(sorted(requests, key=lambda r: r.arrival_offset_s))
        t0, step = time.monotonic(), 0
        while True:
            self._check_faults(step, step_base + step)
            self.stats.counter.step = step  # the broadcast below is this step's collective
            now = time.monotonic()
            arrived = []
            while pending and t0 + pending[0].arrival_offset_s <= now:
                r = pending.popleft()
                arrived.append((r.rid, r.tokens, t0 + r.arrival_offset_s))
            msg = self.comm.broadcast_object(
                {"now": now, "reqs": arrived, "all_arrived": not pending}, REQUEST_BROADCAST)
            if self._step(step, msg):
                return step + 1
            if self.layout.rank == 0 and not self.waiting and not self.cache.ongoing:
                time.sleep(min(idle_sleep_s, max(0.0, t0 + pending[0].arrival_offset_s - now))
                           if pending else 0.0)
            step += 1

    def _step(self, step: int, msg: dict) -> bool:
        self.stats.counter.step = step
        stamp = msg["now"]
        for rid, tokens, arrival in msg["reqs"]:
            self.stats.requests[rid] = RequestStats(rid, arrival, enqueued=time.monotonic())
            self.waiting.append(rid)
            self.cache.admit(rid, tokens, stamp)
        busy = bool(self.waiting or self.cache.ongoing)
        any_busy = self.cache.check_hicache_events(stamp, busy)
        rec = StepStats(step, stamp, waiting=len(self.waiting))
        batch = self._walk(rec)
        self._run_batch(batch)
        rec.scheduled = len(batch)
        self.stats.steps.append(rec)
        # Stop on agreed inputs only, so every rank leaves the loop at the same step.
        return msg["all_arrived"] and not any_busy

    def _walk(self, rec: StepStats) -> list[str]:
        batch, used = [], 0
        for rid in list(self.waiting):
            if used >= self.horizon:
                break  # this rank thinks the batch is full
            rec.polled += rid in self.cache.ongoing
            if not self.cache.check_prefetch_progress(rid):
                continue  # still prefetching: skipped, polled again next step
            tokens = self.cache.prompts[rid]
            extend = len(tokens) - self.cache.cached_tokens(tokens)
            if batch and used + extend > self.cfg.max_prefill_tokens:
                break  # stop walking at the first request that does not fit
            batch.append(rid)
            used += extend
        return batch

    def _run_batch(self, batch: list[str]) -> None:
        loaded, new_tokens = [], 0
        for rid in batch:
            self.waiting.remove(rid)
            st = self.stats.requests[rid]
            st.scheduled = time.monotonic()
            dev, st.load_back_s = self.cache.load_back(rid)
            loaded.append(dev)
            new_tokens += len(self.cache.prompts[rid]) - st.loaded_tokens
        t0 = time.monotonic()
        self.model.forward(new_tokens)  # runs every step: decode batches never stop
        # Pad the step to a decode forward's length: how often waiting requests get polled.
        rest = t0 + self.cfg.min_step_ms / 1e3 - time.monotonic()
        if rest > 0:
            time.sleep(rest)
        done = time.monotonic()
        for rid, dev in zip(batch, loaded, strict=True):
            st = self.stats.requests[rid]
            st.prefill_s, st.first_token = done - t0, done
            self.cache.free_device(dev)
            self.cache.release(rid)

    def _check_faults(self, step: int, process_step: int) -> None:
        error = self.cache.controller.error
        if error is not None:
            raise RuntimeError(f"rank {self.layout.rank}: background thread failed at step "
                               f"{step}: {error}") from error
        if self.cache.consensus is not None and self.cache.consensus.error is not None:
            raise self.cache.consensus.error
        if self.layout.rank == self.cfg.kill_rank and process_step == self.cfg.kill_step:
            os._exit(17)  # fault injection: this rank dies mid-run
