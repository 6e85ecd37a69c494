"""Seeded multi-turn workload, shaped like SGLang's benchmark/hicache/bench_multiturn.py.

Each client holds a conversation. Turn r's prompt is the whole history (earlier prompts and
answers) plus `request_tokens` new tokens. Before measuring, storage holds the turns that
came before the measured ones (they were served and written through to storage), while the
host and device caches start cold, so prefixes come through the storage tier. A client's
later measured turns find its earlier measured turn in the host tree (write-through of new
turns to storage is not modelled, so their unmatched tail is not in storage). Arrivals are Poisson
at `rate_rps`, turn-major: every client's turn r arrives before any client's turn r+1.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from hicache.scheduler import Request

VOCAB = 32000


@dataclass(frozen=True)
class WorkloadSpec:
    requests: int = 32  # measured requests
    rounds: int = 1  # measured turns per client
    history_rounds: int = 4  # turns each conversation already had (in storage)
    request_tokens: int = 256  # new user tokens per turn
    output_tokens: int = 64  # answer tokens per turn (part of the next turn's history)
    rate_rps: float = 16.0
    warmup_requests: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("requests", "rounds", "request_tokens", "rate_rps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("history_rounds", "output_tokens", "warmup_requests"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Workload:
    requests: list[Request]
    histories: list[list[int]]  # token runs to write to storage before the run


def build(spec: WorkloadSpec, prefix: str = "", n: int | None = None) -> Workload:
    """Deterministic for (spec, prefix): all ranks could build it alike."""
    n = spec.requests if n is None else n
    rng = random.Random(f"{spec.seed}/{prefix}")
    clients = math.ceil(n / spec.rounds)
    turn = spec.request_tokens + spec.output_tokens
    convs = [_tokens(rng, spec.history_rounds * turn) for _ in range(clients)]
    histories = [list(c) for c in convs]  # what storage holds before measuring
    requests, t = [], 0.0
    for r in range(spec.rounds):
        for c in range(clients):
            if len(requests) == n:
                break
            t += rng.expovariate(spec.rate_rps)
            prompt = convs[c] + _tokens(rng, spec.request_tokens)
            requests.append(Request(f"{prefix}c{c:03d}t{r}", prompt, t))
            convs[c] = prompt + _tokens(rng, spec.output_tokens)
    return Workload(requests, histories)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]
