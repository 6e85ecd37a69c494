"""PD prefill's bootstrap admission at PP > 1: which bootstrapped requests enter the waiting
queue this step, agreed by a two-pass ring over the PP stages (SGLang issue #34572, PR
#34568; docs/hazards.md "#34568: PP admission (PD prefill)").

In SGLang's disaggregated prefill with PP (0.5.18 / 0.5.19 `scheduler_pp_mixin.py`
`_pp_pd_get_bootstrapped_ids`, `_pp_pd_send_consensus_bootstrapped_ids`,
`process_bootstrapped_queue`) a request waits in the bootstrap queue until every stage
agrees it bootstrapped. Pass 1: stage 0 sends its (good, bad) sets to stage 1, each later
stage keeps the good rids it holds too and adds its bad ones, and passes on. Pass 2: the
last stage's result goes round the ring (last -> 0 -> 1 -> ... -> last), so every stage
receives it and admits it. Point-to-point python objects between the stages' TP rank 0s,
each broadcast to its stage's TP group on arrival; no all-reduce.

Two rules for the stage-local readiness of the request's storage prefetch:
- before #34568 (`fold_readiness` False): the ring agrees on the bootstrapped set only, and
  each stage then admits those its own readiness says are ready; the rest wait. Prefetches
  end at different times on different stages, so the stages' waiting queues part;
- #34568 (`fold_readiness` True, protocol `pr34568`): each stage filters its good set by
  its readiness inside the ring (`stage_sets`), so a request is admitted when every stage
  is ready, by every stage in the same step.
`stage_sets` is the pure rule; `BootstrapQueue` runs the ring on the scheduler thread, the
owner of `pp_cpu`.
"""

from __future__ import annotations

from collections.abc import Callable

from hicache.comm.comm import BOOTSTRAP_RING, PP_PROXY, PROXY_TAG, Comm
from hicache.comm.groups import Layout

Sets = tuple[list[str], list[str]]  # (good, bad) rids, in the order the ring carries them


def ready_filter(good: list[str], ready: Callable[[str], bool], pp: int) -> list[str]:
    """#34568's local filter: the good rids that are ready, in order. Every candidate is
    checked (no early stop: readiness is asked of each). Storage on and PP > 1 only: at
    PP 1 the good set is returned as it is."""
    if pp <= 1:
        return list(good)
    verdicts = [(rid, ready(rid)) for rid in good]
    return [rid for rid, ok in verdicts if ok]


def stage_sets(prev: Sets | None, good: list[str], bad: list[str], ready: Callable[[str], bool],
               pp: int, fold_readiness: bool) -> Sets:
    """One stage's step of the ring's first pass. `prev`: what the previous stage sent
    (None on stage 0); `good` / `bad`: this stage's bootstrapped and failed rids.
    Good: stage 0's own (filtered by readiness with #34568); a later stage's is the
    previous stage's list, in its order, keeping the rids in its own good set (and, with
    #34568, ready here). Bad: the previous stage's, then this stage's not already there."""
    mine = ready_filter(good, ready, pp) if fold_readiness else list(good)
    if prev is None:
        return mine, list(dict.fromkeys(bad))
    keep = set(mine)
    prev_good, prev_bad = prev
    return ([rid for rid in prev_good if rid in keep],
            list(prev_bad) + [rid for rid in dict.fromkeys(bad) if rid not in set(prev_bad)])


class BootstrapQueue:
    """The bootstrap queue of one rank and its admission ring. Owned by the scheduler thread,
    as SGLang's: the ring's sends and receives are TP rank 0's, point to point on `pp_cpu`
    (its TP column: each stage's TP rank 0), and a stage's TP rank 0 broadcasts what it
    received to its TP group on `tp_cpu` (0.5.19 `_pp_send_pyobj_to_next_stage` /
    `_pp_recv_pyobj_from_prev_stage`: attn TP rank 0 only, then `broadcast_pyobj`), all at
    call site `bootstrap_ring`. Bootstrap itself is instant and agreed here (the request
    broadcast reaches every stage in the same step), so no request ever fails it: the bad
    set the ring carries stays empty.

    Stage-local readiness: the cache's `landed` (this rank's prefetch ended), seen by
    stage s `lag_steps x s` steps after it first held (the PP pipeline's offset: a later
    stage runs each step's work later). With the stage on, each prefill batch is also
    handed down the stages as SGLang's PP forward hands over its proxy tensors
    (`hand_over`): every TP rank, on its column, on its own tag, at call site `pp_proxy`;
    stages whose queues parted then leave a send no receive meets."""

    def __init__(self, comm: Comm, layout: Layout, fold_readiness: bool, lag_steps: int = 0):
        assert layout.pp > 1, "the admission ring runs between PP stages"
        self.comm, self.layout, self.fold = comm, layout, fold_readiness
        self.delay = lag_steps * layout.pp_rank
        self.queue: list[str] = []
        self.landed_at: dict[str, int] = {}  # rid -> the step this rank first saw it landed
        self._proxy_sends: list = []

    def add(self, rid: str) -> None:
        self.queue.append(rid)

    def admit(self, landed: Callable[[str], bool]) -> list[str]:
        """The rids that enter the waiting queue this step, in bootstrap-queue order; they
        leave the bootstrap queue, and so do the agreed bad ones."""
        for wait in self._proxy_sends:  # last step's hand-over: blocks until taken
            wait()
        self._proxy_sends.clear()
        step = self.comm.counter.step
        for rid in self.queue:
            if rid not in self.landed_at and landed(rid):
                self.landed_at[rid] = step

        def ready(rid: str) -> bool:
            return rid in self.landed_at and step >= self.landed_at[rid] + self.delay

        good, bad = self._ring(ready)
        if not self.fold:  # before #34568: the agreed set, then this rank's own readiness
            good = [rid for rid in good if ready(rid)]
        leave = set(good) | set(bad)
        admitted = [rid for rid in self.queue if rid in set(good)]
        self.queue = [rid for rid in self.queue if rid not in leave]
        return admitted

    def hand_over(self, batch: list[str]) -> None:
        """The PP forward's P2P of a prefill batch (SGLang `_pp_recv_proxy_tensors` before
        a stage's forward, `_pp_send_dict_to_next_stage` after it, sent async and waited on
        at the next step): a later stage takes the previous stage's batch, which must be
        its own; a stage with no batch takes nothing, so a batch only one stage ran is a
        send that never completes (SGLang issue #34572's hang)."""
        stage = self.layout.pp_rank
        if stage > 0:
            got = self.comm.recv_object(stage - 1, PP_PROXY, PROXY_TAG)
            if got != batch:
                raise RuntimeError(f"rank {self.layout.rank}: PP stage {stage - 1} ran batch "
                                   f"{got}, this stage {batch} (their queues parted)")
        if stage < self.layout.pp - 1:
            self._proxy_sends.append(self.comm.send_object(batch, stage + 1, PP_PROXY,
                                                           PROXY_TAG))

    def _ring(self, ready: Callable[[str], bool]) -> Sets:
        """Both passes; every rank ends with the last stage's sets (its TP rank 0's)."""
        stage, last = self.layout.pp_rank, self.layout.pp - 1
        sends: list = []
        # Pass 1: blocks until the previous stage's sets arrive (stage 0 starts it).
        prev = self._recv(stage - 1) if stage > 0 else None
        mine = stage_sets(prev, list(self.queue), [], ready, self.layout.pp, self.fold)
        if stage < last:
            self._send(mine, stage + 1, sends)
        # Pass 2: the last stage's result round the ring; each stage admits what it receives.
        if stage == last:
            self._send(mine, 0, sends)
        final = self._recv((stage - 1) % self.layout.pp)
        if stage < last:
            self._send(final, stage + 1, sends)
        for wait in sends:  # SGLang's _pp_commit_comm_work: the step's sends complete
            wait()
        good, bad = final
        return list(good), list(bad)

    def _send(self, sets: Sets, stage: int, sends: list) -> None:
        if self.layout.tp_rank == 0:  # the other TP ranks send nothing
            sends.append(self.comm.send_object(sets, stage, BOOTSTRAP_RING))

    def _recv(self, stage: int) -> Sets:
        """TP rank 0 receives from `stage`, then its TP group takes it by broadcast (blocks
        until TP rank 0 has it)."""
        got = self.comm.recv_object(stage, BOOTSTRAP_RING) if self.layout.tp_rank == 0 else None
        return self.comm.broadcast_object(got, BOOTSTRAP_RING, group="tp_cpu")
