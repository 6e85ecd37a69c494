"""The per-step half of HiCache: check_hicache_events, once per scheduler step, agrees on
the step's counts (hicache.agreement.step_agreement: who is busy, finished copies, queue sizes) and
drains the controller's queues by them; PR #39903 pipelines that agreement (issued at the
end of one step, waited on at the next). A mixin of hicache.cache.cache.HiCache, whose state it
reads; it runs on the scheduler thread, and its collectives go through `Comm` on the
scheduler's groups (`tp_cpu`, `pp_cpu`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hicache.cache.operations import PrefetchOp
from hicache.comm.comm import PER_STEP_MIN


class StepEvents:
    """check_hicache_events and the reductions it issues (mixed into HiCache)."""

    def check_hicache_events(self, stamp: float, busy: bool) -> bool:
        """Drains hit-query results and acks by counts all ranks agree on; returns whether
        any rank (of PP stage 0) still has work."""
        self.step_stamp, self.extra_polls = stamp, 0
        self.twin_polls.begin_step(self.stats.counter.step)
        if self.pin is not None:  # before anything reads the threads' results
            for op in self.pin.advance(stamp, self.ongoing):
                st = self.stats.requests[op.rid]  # the measured clock: when it became true
                st.io_done_vt, st.io_done = op.io_end_v, self.pin.clock()
        self.comm.drain_sends()  # backpressure on the PP hop sends of the last step
        self.free_stopped_tails()
        if self.cfg.step_pad_min and self.layout.tp > 1:
            self._pad_step()
        if self.protocol.pipelined:
            return self._events_pipelined(busy)
        pending, facts, values, copies = self._step_inputs(busy)
        agreed = self.agreement.agree(values, self.layout.pp, self._reduce_step)
        if copies is not None:
            agreed["head"].append(self._writing_check(copies))
        return self._apply_agreed(pending, facts, agreed)

    def _pad_step(self) -> None:
        """HiCacheConfig.step_pad_min: the MIN over the TP group that SGLang's own
        check_hicache_events issues before the harness's agreement under --cache sglang
        (sglang_adapter.decisions.cache, controller.cache), here with nothing to agree on, so
        that the model beside SGLang's sides pays the same collectives a step as they do."""
        self.comm.all_reduce(torch.zeros(1, dtype=torch.int64), dist.ReduceOp.MIN, "tp_cpu",
                             PER_STEP_MIN)

    def _events_pipelined(self, busy: bool) -> bool:
        """PR #39903: the agreement issued at the end of the last step is waited on now
        and applied (what it lets through is seen one step later); this step's counts,
        taken after that, are issued without waiting. The first step has nothing agreed
        yet and says busy."""
        last, self._in_flight = self._in_flight, None
        any_busy = True
        if last is not None:
            pending, facts, finish, copies = last
            agreed = finish()
            if copies is not None:
                agreed["head"].append(copies)
            any_busy = self._apply_agreed(pending, facts, agreed)
        pending, facts, values, copies = self._step_inputs(busy)
        finish = self.agreement.agree_later(values, self.layout.pp, self._start_step)
        if copies is not None:  # the hazard's own MIN, after the one just issued
            copies = self._writing_check(copies)
        self._in_flight = (pending, facts, finish, copies)
        return any_busy

    def finish_pipeline(self) -> None:
        """After the last step: wait for the agreement still in flight (every rank issued
        it in the same step), so it pairs and its errors surface."""
        if self._in_flight is not None:
            self._in_flight[2]()
            self._in_flight = None

    def _step_inputs(self, busy: bool):
        """(pending ops, their facts, this rank's per-step values, and the hazard
        early_return's copies count taken out of them, else None)."""
        pending = [op for _, op in sorted(self.ongoing.items())
                   if op.host_slots is not None and not op.decided]
        facts = [self._facts(op) for op in pending]
        values = self._step_values(busy, [self.protocol.step_vote(f) for f in facts])
        before_fix = self.cfg.hazard == "early_return" and self.tiers is not None
        return pending, facts, values, values["head"].pop() if before_fix else None

    def _apply_agreed(self, pending: list[PrefetchOp], facts: list, agreed: dict) -> bool:
        """Step decisions, then the queue drains, by the agreed counts; returns whether
        any rank (of PP stage 0) still has work."""
        head, queues = agreed["head"], agreed["queues"]
        flags = head[1: 1 + sum(self.protocol.step_vote(f) is not None for f in facts)]
        for op, f in zip(pending, flags, strict=False):
            if f == -1:
                self._decide(op)
        for op, f in zip(pending, facts, strict=True):
            if not op.decided and self.protocol.step_decide(f):
                self._decide(op)
        if self.tiers is not None:  # writing_check comes before the queue drains
            self.tiers.drain_copies(head[-1])
        self._drain_hits(queues[0])
        self._drain_acks(queues[1])
        if self.tiers is not None:
            self.tiers.drain_backups(queues[2], self._get)
        if self.protocol.sweep:
            self._sweep()
        return head[0] == -1

    def _sweep(self) -> None:
        """pr32725's safe point: every ongoing prefetch holding host slots is polled, in
        request-id order, and finalized when the poll says it may stop (the walk need not
        reach it). The set is the same on every rank only while `ongoing` is (#38273)."""
        for rid in sorted(self.ongoing):
            if self.ongoing[rid].host_slots is not None:
                self.extra_polls += 1
                self.check_prefetch_progress(rid)

    def _step_values(self, busy: bool, votes: list[int | None]) -> dict[str, list[int]]:
        """This rank's per-step counts, by list (hicache.agreement.step_agreement), all
        MIN-reduced."""
        # Who is busy, and step-batched's timeout flags: a MAX rides in the MIN by negation.
        head = [-int(busy)] + [-v for v in votes if v is not None]
        loads = [0]  # load-back copies inside the step (hicache.memory.loadback): none pending
        queues = [self.controller.hit_queue.qsize(), self.controller.synced_acks.qsize()]
        if self.pin is not None:  # what has completed on the virtual clock
            queues = [self.pin.hits.visible(self.step_stamp, self.pin.wait),
                      self.pin.visible_acks()]
        if self.tiers is not None:
            # The write path's counts ride here, no collective of their own (docs/design.md
            # section 12): finished host copies with the head, backup acks with the queues.
            head.append(self.tiers.finished_copies())
            queues.append(self.tiers.backup_queue_size())
        return {"head": head, "loads": loads, "queues": queues}

    def _start_step(self, values: list[int], relay: bool):
        """One reduction of the step's agreement issued without waiting (PR #39903):
        the TP MIN now (relayed: on stage 0 only); the wait returned also takes the PP
        hop (a later stage blocks in it until stage 0 waited on its MIN)."""
        t = torch.tensor(values, dtype=torch.int64)
        wait_tp = (self.comm.start_all_reduce(t, dist.ReduceOp.MIN, "tp_cpu", PER_STEP_MIN)
                   if not relay or self.layout.pp_rank == 0 else (lambda: None))

        def finish() -> list[int]:
            wait_tp()
            if relay:
                self.comm.pp_hop(t)
            return t.tolist()

        return finish

    def _writing_check(self, copies: int) -> int:
        """Hazard early_return (SGLang before #27489 / #26923): writing_check's own MIN of
        the finished host copies, skipped by a rank whose ongoing_write_through is empty
        ("all ranks have the same", its comment says), whatever the other ranks hold."""
        if not self.tiers.copies:
            return copies  # the early return: no MIN
        return self._reduce_step([copies], True)[0]

    def _reduce_step(self, values: list[int], relay: bool) -> list[int]:
        """One reduction of the step's agreement: relayed (TP MIN on stage 0, then the PP
        hop) or stage-local (this stage's TP group only)."""
        t = torch.tensor(values, dtype=torch.int64)
        # Blocks until every rank of the group (and, relayed, stage 0) reaches this step.
        if relay:
            self.comm.reduce_tp_then_pp(t, dist.ReduceOp.MIN, PER_STEP_MIN)
        else:
            self.comm.all_reduce(t, dist.ReduceOp.MIN, "tp_cpu", PER_STEP_MIN)
        return t.tolist()

    def _decide(self, op: PrefetchOp) -> None:
        op.decided, op.frozen_tokens = True, op.completed_tokens
