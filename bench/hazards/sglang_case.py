"""One cell of the skew scenarios on SGLang's own poll (bench.hazards.sglang runs it):
imports no torch, so `bench sglang-poll --hazard` checks its options before it loads
anything."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_adapter import PollCase

HAZARDS = {"walk-skew": "#30760", "ongoing-skew": "#38273"}
TP = 2


@dataclass(frozen=True)
class HazardCase:
    scenario: str
    policy: str
    pending_polls: int = 2  # polls that find each prefetch pending before it may end
    timeout_s: float = 4.0  # the TP group's collective timeout

    def __post_init__(self):
        if self.scenario not in HAZARDS:
            raise ValueError(f"hazard {self.scenario!r}: one of {', '.join(HAZARDS)}")
        PollCase(self.policy, self.pending_polls)  # validates both
        if not 1 <= self.timeout_s <= 60:
            raise ValueError(f"collective timeout {self.timeout_s}: 1..60 s")

    @property
    def steps(self) -> int:
        """Every rank runs this many steps (the scheduler steps on whatever it polls)."""
        return self.pending_polls + 3
