"""The poll half of HiCache: the walk's polls (per request, or pr33029's bulk poll),
`check_prefetch_progress` and how a prefetch ends (finalised into the host tree, or
revoked). A mixin of hicache.cache.cache.HiCache, whose state it reads: like the rest of HiCache
it runs on the scheduler thread only, and its collectives go through `Comm` on the
scheduler's groups (`tp_cpu`, `pp_cpu`).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hicache.agreement.consensus import rank_consensus
from hicache.agreement.protocols import Facts
from hicache.cache.operations import PrefetchOp
from hicache.comm.comm import COMPLETION


class PrefetchPoll:
    """check_prefetch_progress and its neighbours (mixed into HiCache)."""

    # ---- the walk's polls: per request, or all at once (pr33029) ---------------------------

    def begin_walk(self, waiting: list[str]) -> int:
        """Before the walk: pr33029's bulk_check_prefetch_progress polls every waiting
        request once, in queue order (the queue is broadcast: the same on every rank).
        Returns the pending prefetches it polled."""
        self._bulk = None
        if not self.protocol.bulk:
            return 0
        polled = sum(rid in self.ongoing for rid in waiting)
        self._bulk = {rid: self.check_prefetch_progress(rid) for rid in waiting}
        return polled

    def walk_polls(self, rid: str) -> int:
        """Whether reaching `rid` in the walk polls a pending prefetch."""
        return int(self._bulk is None and rid in self.ongoing)

    def walk_progress(self, rid: str) -> bool:
        """The walk's answer for `rid`: a local lookup after a bulk poll, else the poll."""
        if self._bulk is not None:
            return self._bulk.get(rid, True)  # no collective: the trip count is free
        return self.check_prefetch_progress(rid)

    @property
    def poll_timing(self) -> tuple[float, float, bool]:
        """This step's polls' host seconds, the protocol's and its twin's, and whether the
        twin went first (hicache.cache.twin)."""
        p = self.twin_polls
        return p.seconds[0], p.seconds[1], p.twin_first

    @property
    def beside_counter(self):
        """The twin protocol's collective counter (None without a twin)."""
        return self.twin_polls.twin_counter

    # ---- the poll ---------------------------------------------------------------------------

    @rank_consensus(same_params=True, same_results=True)
    def check_prefetch_progress(self, rid: str) -> bool:
        op = self.ongoing.get(rid)
        if op is None:
            return self._absent_poll(rid)
        self.stats.requests[rid].polls += 1
        if not self.twin_polls.poll(self._facts(op), self.comm, rid):
            self._blocked(op)
            return False
        if op.ticketed:
            self._take_ticket(op)
            return True
        self._end_at_poll(op)
        return True

    def _end_at_poll(self, op: PrefetchOp) -> None:
        """A poll said the prefetch may end: it ends here, revoked or finalised."""
        self._expire(op)
        self._terminate(op)  # the IO thread stops at its next batch boundary
        if op.host_slots is None:
            # Stopped before its hit was agreed: no host slots, nothing usable, and no
            # completion MIN (SGLang revokes it first: hiradix_cache check_prefetch_progress).
            self._revoke(op, via="poll")
            if op.rid not in self.expired:  # 0.5.23: a poll miss, unless its deadline
                self._arm_retry(op.rid)  # (unified_radix_cache.py:2412-2416)
        else:
            self._finalize(op, self._usable_after_poll(op), "poll")

    def _absent_poll(self, rid: str) -> bool:
        """Nothing ongoing on this rank: not a poll, except that pr38284 still enters the
        poll's all-reduce with a contribution that cannot change the MAX."""
        vote = self.protocol.absent_vote()
        if vote is not None:
            self.stats.requests[rid].absent_polls += 1
            self.extra_polls += 1
            self.protocol.reduce(vote, self.comm, rid)
        return True

    def _blocked(self, op: PrefetchOp) -> None:
        # 0.5.23 starts the timeout clock at the first poll that finds it pending
        # (unified_radix_cache.py `_start_storage_prefetch_wait`); a ticket has no clock.
        # The wait is the request's: a retry's prefetch keeps it, budget and clock (popped
        # only at admission, 2734).
        if self.protocol.clock == "first_blocked_poll" and self.cfg.policy == "timeout" \
                and op.wait_start is None and not op.ticketed:
            op.wait_start, op.wait_tokens = self._now(), len(op.tokens)
            self.waits[op.rid] = op

    def _expire(self, op: PrefetchOp) -> None:
        """0.5.23: under timeout a poll that ends a prefetch still running is the ranks'
        agreed expiry (unified_radix_cache.py:2404-2409); it marks the deadline expired,
        cancelling the request's retries (2285-2289), so prefetch_from_storage never issues
        it again (2098-2100: `admit` here), and its prefetch ends with reason "deadline"
        (2413-2414, 2456)."""
        if self.protocol.deadline_expiry and self.cfg.policy == "timeout" \
                and not op.terminated.is_set():
            self.expired.add(op.rid)
            self.stats.requests[op.rid].prefetch_finish = "deadline"

    def _take_ticket(self, op: PrefetchOp) -> None:
        """Stage 0 found the ticket ready: wait for this rank's own final ack (a TP peer or a
        later stage may be a moment behind: `take_ready_pp_prefetch`), then end it with
        what the acks agreed; a miss ends with nothing usable."""
        if not op.ready.wait(self.cfg.collective_timeout_s):
            raise RuntimeError(f"rank {self.layout.rank}: ticket of {op.rid} not ready "
                               f"within {self.cfg.collective_timeout_s}s of stage 0's")
        st = self.stats.requests[op.rid]
        st.hit_tokens, st.io_issued = op.hit_tokens, True  # every ticket went to the IO thread
        self._finalize(op, op.completed_tokens, "poll")

    def _facts(self, op: PrefetchOp) -> Facts:
        return Facts(
            completed=bool(op.hash_value) and op.completed_tokens == op.hit_tokens,
            timed_out=self._timed_out(op), terminated=op.terminated.is_set(),
            has_sidecar=self.host_side is not None, sidecar_done=op.pool_transfers_done,
            decided=op.decided, ticketed=op.ticketed, ticket_ready=op.ready.is_set(),
            pp_rank=self.layout.pp_rank)

    def _timed_out(self, op: PrefetchOp) -> bool:
        cfg = self.cfg
        if self.protocol.clock == "first_blocked_poll":
            # 0.5.23 (unified_radix_cache.py:2259-2283): once every KV page landed it never
            # times out; the budget counts the requested pages, from the first blocked poll.
            landed = op.host_slots is not None and op.completed_tokens >= op.hit_tokens
            tokens = len(op.tokens) if op.wait_tokens is None else op.wait_tokens
            budget = cfg.timeout_base_s + tokens / 1024 * cfg.timeout_per_ki_token_s
            return not landed and op.wait_start is not None and \
                self._now() - op.wait_start > budget
        if self.protocol.clock == "step" or self.pinned:
            # rank 0's clock, identical on all (pinned: the virtual one, for every protocol)
            elapsed = self.step_stamp - op.start_stamp
        else:
            elapsed = time.monotonic() - op.start_time  # this rank's wall clock
        # The budget grows with the hit. The prefetch thread sets it when its query ends
        # (wall time); pinned reads it only once drained, at its step on the virtual clock.
        hit = op.hit_tokens if op.hit_drained or not self.pinned else 0
        return elapsed > cfg.timeout_base_s + hit / 1024 * cfg.timeout_per_ki_token_s

    def _usable_after_poll(self, op: PrefetchOp) -> int:
        if self.protocol.uses_acks:
            return op.frozen_tokens if op.decided else op.completed_tokens
        # pre27010: one MIN over TP of [completed_tokens, *pool_hit_pages] picks the usable
        # length (ops holding host slots only). Side-car hits count as soon as their read
        # was issued: the bug PR #27550's guard works around by not terminating until
        # pool_transfers_done.
        vec = [op.completed_tokens]
        if self.host_side is not None:
            side = op.sidecar_pages if op.pool_transfers_done else len(op.hash_value)
            vec.append(side * self.page if op.sidecar_started else 0)
        t = torch.tensor(vec, dtype=torch.int64)
        self.comm.all_reduce(t, dist.ReduceOp.MIN, "tp_cpu", COMPLETION, op.rid)
        return int(t.min().item())

    # ---- termination ------------------------------------------------------------------------

    def _now(self) -> float:
        """The timeout policy's clock: this rank's wall clock; pinned, the virtual one."""
        return self.step_stamp if self.pinned else time.monotonic()

    def _terminate(self, op: PrefetchOp) -> None:
        op.terminated_v = self.step_stamp  # when, on the virtual clock (pinned)
        op.terminated.set()

    def _revoke(self, op: PrefetchOp, via: str = "revoked") -> None:
        self._terminate(op)
        self._end(op, via, 0)

    def _finalize(self, op: PrefetchOp, usable: int, via: str) -> None:
        """Inserts the fetched prefix into the host tree; frees the rest once IO stopped."""
        pages = usable // self.page
        slots = op.host_slots
        base = self.matches[op.rid][0]
        if self.buffer_only:  # held for this request's load-back only
            self.staged[op.rid] = (slots[:pages], op.hash_value[:pages])
        elif pages:
            tokens = self.prompts[op.rid][: (base.pages + pages) * self.page]
            # Pages already in the tree keep their own slots: the base's are placeholders
            # (with the device tier part of the base may be on the device only).
            overlap = self.tree.insert(tokens, [-1] * base.pages + slots[:pages],
                                       base.hashes + op.hash_value[:pages])
            dup = max(0, overlap - base.pages)  # pages another request inserted meanwhile
            self.host_kv.free(slots[:dup])
        self._tails.append((op, slots[pages:]))
        self._end(op, via, pages * self.page)

    def _end(self, op: PrefetchOp, via: str, usable: int) -> None:
        del self.ongoing[op.rid]
        self.tokens_in_flight -= len(op.tokens)
        st = self.stats.requests[op.rid]
        st.terminated_by, st.prefetched_tokens = via, usable
        st.io_error = op.io_error
        if self.pin is None:
            st.ready, st.io_done = time.monotonic(), op.t_io_done
        else:  # its IO end is stamped when it becomes visible (check_hicache_events)
            st.ready = self.pin.clock()
        st.ready_vt = self.step_stamp
        # The hit is part of the record only once agreed and drained (the same on all ranks).
        hit = op.hit_tokens if op.hit_drained else None
        self.stats.decisions[op.rid] = (via, usable, hit)

    def free_stopped_tails(self, final: bool = False) -> None:
        """Frees the unfetched host slots of ended prefetches whose IO has stopped; called
        every step and once more (`final`) after the IO thread has ended (a read can
        outlive the scheduler's last step). Pinned: stopped on the virtual clock, then
        really (the slots are reused only after the thread's last write)."""
        keep = []
        for op, slots in self._tails:
            if self.pin is not None and op.io_stopped and not final:
                self.pin.wait(op.io_done.is_set, f"IO of {op.rid}")
            if op.io_done.is_set() and (op.io_stopped or final or self.pin is None):
                self.host_kv.free(slots)
                if self.pin is None:
                    self.stats.requests[op.rid].io_done = op.t_io_done
            else:
                keep.append((op, slots))
        self._tails = keep

    def host_slots_unaccounted(self) -> int:
        """Host slots neither in the tree nor free: 0 after a run, or slots leaked."""
        staged = sum(len(slots) for slots, _ in self.staged.values())
        return self.host_kv.num_pages - self.host_kv.available - self.tree.total_pages - staged
