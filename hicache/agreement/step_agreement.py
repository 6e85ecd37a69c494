"""The per-step agreement of check_hicache_events, one shape per SGLang release, side by side
(docs/design.md sections 4 and 12).

Once per step every rank agrees, by MIN, on three lists of counts:
- `head`: finished work (who is still busy, step-batched's timeout flags; finished host
  copies of the write path ride here);
- `loads`: finished load-backs (SGLang's `loading_check` count). Load-back here copies inside
  the step (hicache.memory.loadback), so none is ever pending and the count is 0; the list exists
  because 0.5.18 spends a reduction of its own on it;
- `queues`: the storage control queue sizes (hit queue, ack queue; backup acks ride here).
Releases differ in how many reductions carry them and over which groups. A reduction is
either relayed, SGLang's `_all_reduce` (a TP MIN on PP stage 0, whose result is then passed
down the stages point to point; later stages block until it arrives and drain what stage 0
counted), or stage-local, `_all_reduce_attn_groups` (each stage's own TP MIN, no PP hop: each
stage drains what its own TP group counted, and stages never agree with each other).
With PP = 1 all three are the same one packed MIN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

LISTS = ("head", "loads", "queues")


@dataclass(frozen=True)
class Reduction:
    carries: tuple[str, ...]  # lists packed into one tensor, in this order
    relay: bool = True  # True: stage 0's TP MIN, relayed down the PP stages


@dataclass(frozen=True)
class StepAgreement:
    name: str
    at_pp1: tuple[Reduction, ...]
    at_pp: tuple[Reduction, ...]  # with PP > 1

    def reductions(self, pp: int) -> tuple[Reduction, ...]:
        return self.at_pp1 if pp == 1 else self.at_pp

    def agree(self, values: dict[str, list[int]], pp: int,
              reduce: Callable[[list[int], bool], list[int]]) -> dict[str, list[int]]:
        """The agreed lists; `reduce(packed, relay)` runs one reduction (a collective)."""
        agreed = {}
        for r in self.reductions(pp):
            packed = reduce([v for name in r.carries for v in values[name]], r.relay)
            for name in r.carries:
                n = len(values[name])
                agreed[name], packed = packed[:n], packed[n:]
        return agreed

    def agree_later(self, values: dict[str, list[int]], pp: int,
                    start: Callable[[list[int], bool], Callable[[], list[int]]]
                    ) -> Callable[[], dict[str, list[int]]]:
        """Pipelined (PR #39903): every reduction is issued now by `start(packed, relay)`,
        which returns its wait; the function returned waits for them in order and gives
        the agreed lists, as `agree` would have."""
        waits = [(r, start([v for name in r.carries for v in values[name]], r.relay))
                 for r in self.reductions(pp)]
        sizes = {name: len(v) for name, v in values.items()}

        def finish() -> dict[str, list[int]]:
            agreed = {}
            for r, wait in waits:
                packed = wait()
                for name in r.carries:
                    agreed[name], packed = packed[: sizes[name]], packed[sizes[name]:]
            return agreed

        return finish


PACKED = (Reduction(("queues", "loads", "head")),)

# hiradix_cache.py:1525-1529 (unified_radix_cache.py:2278-2282): writing_check, then
# loading_check, each relayed (1054, 1092); then drain_storage_control_queues, stage-local
# (1567 -> 222).
SGLANG_0_5_18 = StepAgreement("0.5.18", PACKED, (
    Reduction(("head",)), Reduction(("loads",)), Reduction(("queues",), relay=False)))

# unified_radix_cache.py:2807-2821: the finished counts packed and relayed (2816), then the
# queue sizes relayed (drain_storage_control_queues, 2471).
SGLANG_0_5_19 = StepAgreement("0.5.19", PACKED, (
    Reduction(("head", "loads")), Reduction(("queues",))))

# unified_radix_cache.py:3651-3681: one packed `_sync_hicache_ready_counts` at any PP size,
# relayed (3459): later stages send zeros and take stage 0's counts (3418-3425).
SGLANG_0_5_23 = StepAgreement("0.5.23", PACKED, PACKED)

# The same with buffer_only host memory and PP > 1 (3418, 3456-3457): every stage counts its
# own queues and reduces them over its own TP group only.
SGLANG_0_5_23_BUFFER_ONLY = StepAgreement("0.5.23 buffer_only", PACKED, (
    Reduction(("queues", "loads", "head"), relay=False),))
