"""The ranks' grid and the process groups of the system: every group made on every rank in
one fixed order (new_group is collective).

Groups and their owner threads (each thread owns its groups, so the collectives of two
threads never interleave on one group):
- scheduler thread: `sched` (world, request broadcast), `tp_cpu` (its PP stage's TP ranks:
  decisions, completion MIN, per-step MIN), `pp_cpu` (its TP column: the PP hop), `data`
  (model all-reduce: NCCL on CUDA, gloo otherwise);
- prefetch thread: `prefetch` (TP) and `prefetch_pp` (its TP column across the PP stages):
  the hit-query MIN;
- ack sync thread: `ack` (TP) and `ack_pp` (TP column): the per-batch ack MINs;
- prefetch thread on 0.5.23's PP-ticket path also: `ticket` (its TP column): stage 0
  broadcasts each ticket to the later stages (hybrid_cache_controller.py
  `pp_prefetch_command_thread_func`);
- consensus thread: `consensus` (world, rank-consensus digests).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

GROUP_NAMES = ("sched", "tp_cpu", "pp_cpu", "data", "prefetch", "prefetch_pp", "ack", "ack_pp",
               "consensus", "ticket")
HIT_GROUPS = ("prefetch", "prefetch_pp")  # the prefetch thread's background groups
ACK_GROUPS = ("ack", "ack_pp")  # the ack sync thread's


@dataclass(frozen=True)
class Layout:
    """Global rank r is TP rank r % tp of PP stage r // tp (TP ranks of a stage contiguous)."""

    rank: int
    tp: int
    pp: int

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp

    def stage_ranks(self, stage: int) -> list[int]:
        return [stage * self.tp + i for i in range(self.tp)]

    def column_ranks(self, tp_rank: int) -> list[int]:
        return [s * self.tp + tp_rank for s in range(self.pp)]


class Groups:
    """Creates every group on every rank in one fixed order (new_group is collective)."""

    def __init__(self, layout: Layout, data_backend: str, timeout_s: float):
        self.layout, self.data_backend = layout, data_backend
        self.ranks: dict[str, list[int]] = {}
        self.pg: dict[str, dist.ProcessGroup | None] = dict.fromkeys(GROUP_NAMES)
        if layout.world_size == 1:
            return
        to = timedelta(seconds=timeout_s)
        world = list(range(layout.world_size))
        stages = [layout.stage_ranks(s) for s in range(layout.pp)]  # TP groups
        columns = [layout.column_ranks(t) for t in range(layout.tp)]  # PP groups
        self._make("sched", [world], "gloo", to)
        self._make("tp_cpu", stages, "gloo", to)
        self._make("pp_cpu", columns, "gloo", to)
        self._make("data", stages, data_backend, to)
        self._make("prefetch", stages, "gloo", to)
        self._make("prefetch_pp", columns, "gloo", to)
        self._make("ack", stages, "gloo", to)
        self._make("ack_pp", columns, "gloo", to)
        self._make("consensus", [world], "gloo", to)
        self._make("ticket", columns, "gloo", to)

    def _make(self, name: str, partition: list[list[int]], backend: str, to: timedelta) -> None:
        for ranks in partition:
            pg = dist.new_group(ranks, backend=backend, timeout=to)
            if self.layout.rank in ranks:
                self.pg[name], self.ranks[name] = pg, ranks

    def backend(self, name: str) -> str:
        return self.data_backend if name == "data" else "gloo"

    def size(self, name: str) -> int:
        return len(self.ranks.get(name, [self.layout.rank]))

    def sequence_numbers(self) -> dict[str, int]:
        """Collectives (and p2p ops) each group has issued, as counted by torch itself."""
        return {n: pg._get_sequence_number_for_group() for n, pg in self.pg.items()
                if pg is not None and (n != "data" or self.data_backend == "gloo")}
