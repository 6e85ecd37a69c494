"""What one poll case of SGLang's own poll is (sglang_adapter.decisions.poll runs it): imports no
torch, so a verb checks its options before it loads anything."""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("best_effort", "wait_complete", "timeout")
STEP_S = 1.0  # the virtual clock's advance per poll (one scheduler step)
PAGE = 64


@dataclass(frozen=True)
class PollCase:
    policy: str
    pending_polls: int  # polls that find it pending before it may end (not best_effort)
    prompt_tokens: int = 16 * PAGE

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r}: one of {', '.join(POLICIES)}")
        if self.pending_polls < 1:
            raise ValueError("pending_polls must be >= 1")
