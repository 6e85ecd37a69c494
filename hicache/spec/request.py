"""One request of a workload, as the scheduler admits it. Apart from hicache.serve.scheduler so that
a process that only plans runs (the `bench` parent builds every workload) reads it without
importing torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    rid: str
    tokens: list[int]
    arrival_offset_s: float  # seconds after the run's start, on rank 0's clock
    output_tokens: int = 1  # the first token, then one per decode step
    kind: str = "prefetch"  # prefetch | bystander (nothing to fetch): reported apart
