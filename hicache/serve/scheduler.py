"""The scheduler loop every rank runs in lock-step (one step = one iteration below).

Per step, as SGLang's event loop runs it: rank 0 broadcasts the new arrivals and its clock;
check_hicache_events agrees on the per-step counters; unless the waiting queue is empty or
the running batch is full, the waiting queue is walked in arrival order, polling each
reached request at most once; then one forward runs: a prefill of the newly scheduled
requests when there are any (SGLang runs prefill first), else a decode step that gives every
running request one token. A request leaves the running batch after its last token. On CPU
the forward lasts its modelled time (hicache.spec.step_time). Only the scheduler thread runs this.

The clock rank 0 broadcasts is its wall clock under a free schedule; under a pinned one
(hicache.spec.pinned) it is virtual: it starts at 0 and advances per step by the step's modelled
forward time, so arrivals, timeouts and IO completions fall on the same steps in every run.
Each step also extends a digest of what it decided (kind, batch, polled requests and their
outcomes): two runs with one digest ran one schedule.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from dataclasses import dataclass

from hicache.agreement.consensus import ConsensusChecker
from hicache.agreement.pd_admission import BootstrapQueue
from hicache.agreement.protocols import REGISTRY
from hicache.comm.comm import REQUEST_BROADCAST, Comm
from hicache.comm.groups import Layout
from hicache.comm.records import RequestStats, Stats, StepStats
from hicache.memory.events import FORWARD, LOAD_BACK, POLL, STEP
from hicache.model.toy_model import Model
from hicache.serve.seam import CacheUnderTest
from hicache.spec.config import HiCacheConfig
from hicache.spec.request import Request


@dataclass
class Running:
    """A request in the decode batch."""

    rid: str
    context: int  # KV tokens a decode step reads for it: prompt plus tokens so far
    left: int  # tokens it has still to generate


class _Room:
    """The device pages one walk may still give out (SGLang PrefillAdder's
    rem_total_tokens): the free pages first; the cached ones are counted only when a
    request needs more (counting them walks the tree)."""

    def __init__(self, cache: CacheUnderTest):
        self.cache, self.claimed, self.pages = cache, 0, None

    def take(self, pages: int) -> bool:
        want = self.claimed + pages
        if want > self.cache.device_free_pages():
            if self.pages is None:
                self.pages = self.cache.device_room()
            if want > self.pages:
                return False
        self.claimed = want
        return True


class Scheduler:
    """Talks to the cache only through hicache.serve.seam.CacheUnderTest; `consensus` is the
    harness's rank-consensus checker (None: off), whose error stops the loop."""

    def __init__(self, cfg: HiCacheConfig, layout: Layout, comm: Comm, cache: CacheUnderTest,
                 model: Model, stats: Stats, consensus: ConsensusChecker | None = None):
        self.cfg, self.layout, self.comm = cfg, layout, comm
        self.cache, self.model, self.stats = cache, model, stats
        self.consensus = consensus
        self.waiting: deque = deque()
        # PD prefill at PP > 1 (cfg.pd_admission): arrivals wait here until the admission
        # ring lets them into `waiting`; None: they enter it at once.
        self.bootstrap = (BootstrapQueue(comm, layout, REGISTRY[cfg.protocol].ready_in_ring,
                                         cfg.pd_stage_lag_steps)
                          if cfg.pd_admission else None)
        self.running: dict[str, Running] = {}  # in join order
        # Rank-local walk horizon: a skewed rank believes the batch is full sooner (#30760).
        skew = cfg.budget_skew * layout.tp_rank / max(1, layout.tp - 1)
        self.horizon = int(cfg.max_prefill_tokens * (1.0 - skew))
        self.pinned = cfg.schedule == "pinned"
        self.virtual = 0.0  # rank 0's virtual clock (pinned), seconds since the start
        self.digest = ""  # running schedule digest (hex)

    def run(self, requests: list[Request], step_base: int = 0,
            idle_sleep_s: float = 0.001) -> int:
        """Serves `requests` (used on rank 0 only; the others receive them) to completion;
        returns the number of steps. `step_base` counts the process's earlier steps (for
        fault injection at a process-wide step)."""
        pending = deque(sorted(requests, key=lambda r: r.arrival_offset_s))
        t0, step = self._clock(), 0
        while True:
            self._check_faults(step, step_base + step)
            self.stats.counter.step = step  # the broadcast below is this step's collective
            wall = self._clock()
            top = time.monotonic()  # the timeline's stamp of the step's top
            now = self.virtual if self.pinned else wall
            since = now if self.pinned else now - t0
            arrived = []
            while pending and pending[0].arrival_offset_s <= since:
                r = pending.popleft()
                # TTFT runs from the arrival on rank 0's wall clock; pinned, from the top
                # of the step that admits it (the virtual arrival has no wall time).
                arrival = wall if self.pinned else t0 + r.arrival_offset_s
                arrived.append((r.rid, r.tokens, arrival, r.output_tokens, r.kind))
            msg = self.comm.broadcast_object(
                {"now": now, "wall": wall, "reqs": arrived, "all_arrived": not pending},
                REQUEST_BROADCAST)
            last = self._step(step, msg)
            if self.stats.events is not None:  # the step on this rank's own clock
                self.stats.events.span(STEP, top, time.monotonic(), step)
            # The agreed inputs say the serve is over; a PP stage whose own queue drain lags
            # (pre27010 at PP > 1 drains stage-locally) may still hold work: step on for it.
            if last and self.comm.all_idle(self._busy()):
                return step + 1
            if self.layout.rank == 0 and not self._busy():
                self._idle(pending, since, t0 + pending[0].arrival_offset_s - wall
                           if pending else 0.0, idle_sleep_s)
            step += 1

    def _clock(self) -> float:
        """The measured clock: the wall clock (pinned: less the waits for real work whose
        virtual time had come, hicache.spec.pinned.Pin.clock)."""
        pin = self.cache.pin
        return time.monotonic() if pin is None else pin.clock()

    def _idle(self, pending: deque, since: float, until_next_s: float,
              idle_sleep_s: float) -> None:
        """Rank 0 with nothing to do: wait for the next arrival (pinned: jump to it)."""
        if self.pinned:
            if pending:
                self.virtual = max(self.virtual, pending[0].arrival_offset_s)
            return
        time.sleep(min(idle_sleep_s, max(0.0, until_next_s)) if pending else 0.0)

    def _busy(self) -> bool:
        # Host copies and storage writes not yet acked are work too: the serve ends after them.
        return bool(self.waiting or self.running or self.cache.has_work()
                    or (self.bootstrap is not None and self.bootstrap.queue))

    def _step(self, step: int, msg: dict) -> bool:
        self.stats.counter.step = step
        stamp = msg["now"]  # the schedule's clock: virtual when pinned
        for rid, tokens, arrival, output_tokens, kind in msg["reqs"]:
            self.stats.requests[rid] = RequestStats(rid, arrival, kind, output_tokens,
                                                    enqueued=self._clock())
            tokens = self._validate_length(rid, tokens)
            if tokens is not None:
                # the prefetch is issued at arrival, so it runs while the request waits
                (self.waiting.append if self.bootstrap is None else self.bootstrap.add)(rid)
                self.cache.admit(rid, tokens, stamp)
        busy = self._busy()
        any_busy = self.cache.check_hicache_events(stamp, busy)
        # 0.5.23: the storage lookups due again, in queue order (_process_hicache_events)
        self.cache.retry_prefetches(list(self.waiting), stamp)
        if self.bootstrap is not None:  # PD prefill: the ring admits, before the walk
            self.waiting.extend(self.bootstrap.admit(self.cache.landed))
        # t: rank 0's wall clock at the top of the step (step time = t_end - t)
        rec = StepStats(step, msg.get("wall", stamp), waiting=len(self.waiting),
                        running=len(self.running), vt=stamp,
                        prefetching=sum(self.cache.prefetching(rid) for rid in self.waiting))
        if self.cache.pin is not None:
            rec.pin_wait_s = self.cache.pin.take_waited()
        polls: list[tuple[str, bool]] = []
        batch = self._walk(rec, polls)
        if batch and self.bootstrap is not None:  # PD prefill: the PP forward's hand-over
            self.bootstrap.hand_over(batch)
        if batch:
            self._prefill(batch, rec)
        elif self.running:
            self._decode(rec)
        else:
            self._forward(rec, 0, 0, 0)  # idle: the data-plane collectives still pair up
        rec.polled_extra = self.cache.extra_polls
        rec.poll_s, rec.twin_poll_s, rec.twin_first = self.cache.poll_timing
        rec.t_end = self._clock()
        self._extend_digest(rec, batch, polls)
        self.stats.steps.append(rec)
        # Stop on agreed inputs only, so every rank leaves the loop at the same step.
        return msg["all_arrived"] and not any_busy

    def _validate_length(self, rid: str, tokens: list[int]) -> list[int] | None:
        """SGLang's validate_input_length (0.5.23 managers/utils.py): a prompt of
        max_input_tokens or more can never fit the device pool, so it is refused at once
        (None), or cut to that length under allow_auto_truncate. Decided from the broadcast
        request and the pool size the configuration gives every rank: all ranks alike."""
        limit = self.cache.max_input_tokens
        if len(tokens) < limit:
            return tokens
        if self.cfg.allow_auto_truncate:
            return tokens[:limit]
        st = self.stats.requests[rid]
        st.terminated_by, st.prompt_tokens = "rejected", len(tokens)
        self.stats.decisions[rid] = ("rejected", 0, None)  # compared across ranks
        return None

    def _extend_digest(self, rec: StepStats, batch: list[str],
                       polls: list[tuple[str, bool]]) -> None:
        """The running schedule digest: every step's kind, batch, polls and outcomes."""
        text = f"{self.digest}|{rec.kind}|{','.join(batch)}|" + \
            ",".join(f"{rid}:{int(ok)}" for rid, ok in polls)
        self.digest = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
        rec.schedule_digest = self.digest
        if self.pinned:  # rank 0's is the one broadcast
            # The virtual clock moves on by the modelled forward (an idle step's quantum).
            self.virtual += (rec.modelled_ms if rec.modelled_ms > 0
                             else self.cfg.idle_step_ms) / 1e3

    def _walk(self, rec: StepStats, polls: list[tuple[str, bool]]) -> list[str]:
        """SGLang's get_new_batch_prefill: no walk, so no polls, when nothing waits or no
        request slot is free; the walk stops at the slot limit and at the token budget."""
        free = self.cfg.max_running_requests - len(self.running)
        if not self.waiting or free <= 0:
            return []
        batch, used, room, blocked = [], 0, _Room(self.cache), 0
        rec.polled += self.cache.begin_walk(list(self.waiting))
        for rid in list(self.waiting):
            if len(batch) >= free or used >= self.horizon:
                break  # the batch is full (this rank's horizon may be skewed: #30760)
            polled = self.cache.walk_polls(rid)
            rec.polled += polled
            ready = self._poll(rid, polled)
            if polled:
                polls.append((rid, ready))
            if not ready:
                continue  # still prefetching: skipped, polled again next step
            cached = self.cache.cached_tokens(rid)
            extend = self.cache.prompt_length(rid) - cached
            if batch and used + extend > self.cfg.max_prefill_tokens:
                break  # stop walking at the first request that does not fit
            if not room.take(self.cache.device_pages_needed(rid, cached)):
                if batch or self.cache.writes_pending():
                    break  # waits for pages the batch or the write path hold (NO_TOKEN)
                blocked += 1
                continue  # locked by requests behind it only: they go first
            batch.append(rid)
            used += extend
        if blocked == len(self.waiting):
            raise RuntimeError(f"rank {self.layout.rank}: device pool deadlock: none of the "
                               f"{blocked} waiting requests fits beside the device pages the "
                               f"others' prefix locks hold (a larger kv_budget_gib holds more)")
        return batch

    def _poll(self, rid: str, polled: int) -> bool:
        """The walk's answer for `rid` (check_prefetch_progress, or pr33029's lookup of this
        step's bulk poll); with a timeline, a poll of an ongoing prefetch in the walk is an
        event: pending (polled again next step), or how it ended (poll, revoked)."""
        events = self.stats.events
        if events is None or not polled:
            return self.cache.walk_progress(rid)
        t0 = time.monotonic()
        ready = self.cache.walk_progress(rid)
        outcome = self.stats.requests[rid].terminated_by if ready else "pending"
        events.span(POLL, t0, time.monotonic(), rid, outcome)
        return ready

    def _prefill(self, batch: list[str], rec: StepStats) -> None:
        loaded, new_tokens = [], 0
        for rid in batch:
            self.waiting.remove(rid)
            st = self.stats.requests[rid]
            st.scheduled = self._clock()
            dev, st.load_back_s = self.cache.load_back(rid)
            if self.stats.events is not None:
                self.stats.events.span(LOAD_BACK, st.scheduled, time.monotonic(), rid,
                                       st.load_back_bytes)
            loaded.append(dev)
            new_tokens += st.computed_tokens
        rec.kind, rec.scheduled, rec.prefill_tokens = "prefill", len(batch), new_tokens
        done = self._forward(rec, new_tokens, 0, 0)
        for rid, dev in zip(batch, loaded, strict=True):
            st = self.stats.requests[rid]
            st.prefill_s, st.first_token = rec.forward_s, done
            st.token_times.append(done)
            context = self.cache.prompt_length(rid) + 1
            # Decode reads no KV in this model: the prompt's pages are cached (with the
            # device tier) or freed, and the tree locks go back at once.
            self.cache.cache_prefill(rid, dev)
            self.cache.release(rid)
            if st.output_tokens > 1:
                self.running[rid] = Running(rid, context, st.output_tokens - 1)
            else:
                st.finished = done

    def _decode(self, rec: StepStats) -> None:
        rec.kind = "decode"
        rec.context_tokens = sum(r.context for r in self.running.values())
        done = self._forward(rec, 0, len(self.running), rec.context_tokens)
        for r in list(self.running.values()):
            st = self.stats.requests[r.rid]
            st.token_times.append(done)
            r.context, r.left = r.context + 1, r.left - 1
            if r.left == 0:
                del self.running[r.rid]
                st.finished = done

    def _forward(self, rec: StepStats, new_tokens: int, decode_reqs: int,
                 context: int) -> float:
        """Runs the step's forward; returns when its outputs exist (this rank's clock)."""
        t0 = self._clock()
        self.model.forward(new_tokens, decode_reqs)
        # CPU stand-in: sleep out the rest of the modelled forward, releasing the GIL to the
        # controller's threads as a scheduler waiting on its GPU would.
        rec.modelled_ms = self.cfg.step_time.forward_ms(new_tokens, decode_reqs, context)
        computed = self._clock() - t0
        rest = rec.modelled_ms / 1e3 - computed
        if rest > 0 and self.cfg.pad_forward:
            time.sleep(rest)
            if self.cache.pin is not None:
                # Pinned: the OS waking the sleeper late is no cost of the step (a GPU-bound
                # scheduler has none); the measured clock leaves it out.
                rec.forward_late_s = self.cache.pin.leave_out(
                    self._clock() - t0 - max(computed, rec.modelled_ms / 1e3))
        done = self._clock()
        rec.forward_s = done - t0
        if self.stats.events is not None:
            self.stats.events.span(FORWARD, t0, done, new_tokens, decode_reqs)
        return done

    def _check_faults(self, step: int, process_step: int) -> None:
        error = self.cache.error()
        if error is not None:
            raise RuntimeError(f"rank {self.layout.rank}: background thread failed at step "
                               f"{step}: {error}") from error
        if self.consensus is not None and self.consensus.error is not None:
            raise self.consensus.error
        if self.layout.rank == self.cfg.kill_rank and process_step == self.cfg.kill_step:
            os._exit(17)  # fault injection: this rank dies mid-run
