"""Seeded multi-turn workload, shaped like SGLang's benchmark/hicache/bench_multiturn.py.

Each client holds a conversation. Turn r's prompt is the whole history (earlier prompts and
answers) plus `request_tokens` new tokens. Before measuring, storage holds the turns that
came before the measured ones (they were served and written through to storage), while the
host and device caches start cold, so prefixes come through the storage tier. A client's
later measured turns find its earlier measured turn in the host tree (write-through of new
turns to storage is not modelled, so their unmatched tail is not in storage). Arrivals are Poisson
at `rate_rps`, turn-major: every client's turn r arrives before any client's turn r+1; an
infinite rate is a burst (all at the start, as SGLang's bench_serving sends by default).

Bystanders are requests with nothing to prefetch: short prompts with no history (below the
prefetch threshold), arriving as their own Poisson stream. They show what the prefetching
requests' polls cost everyone else. Every request generates `output_tokens` tokens.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from hicache.spec.request import Request

VOCAB = 32000


@dataclass(frozen=True)
class WorkloadSpec:
    requests: int = 32  # measured requests with a prefix in storage ("prefetch")
    rounds: int = 1  # measured turns per client
    history_rounds: int = 4  # turns each conversation already had (in storage)
    request_tokens: int = 256  # new user tokens per turn
    output_tokens: int = 64  # tokens each request generates (each turn's answer)
    rate_rps: float = 16.0  # inf: a burst
    bystanders: int = 0  # measured requests with nothing to prefetch
    bystander_rate_rps: float = 20.0
    bystander_tokens: int = 128  # prompt length: below the 256-token prefetch threshold
    warmup_requests: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("requests", "rounds", "request_tokens", "rate_rps", "output_tokens",
                     "bystander_rate_rps", "bystander_tokens"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("history_rounds", "bystanders", "warmup_requests"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Workload:
    requests: list[Request]
    histories: list[list[int]]  # token runs to write to storage before the run


def build(spec: WorkloadSpec, prefix: str = "", n: int | None = None,
          bystanders: int | None = None) -> Workload:
    """Deterministic for (spec, prefix): all ranks could build it alike. `n` and
    `bystanders` override the spec's counts (the warm-up uses fewer)."""
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
            requests.append(Request(f"{prefix}c{c:03d}t{r}", prompt, t, spec.output_tokens))
            convs[c] = prompt + _tokens(rng, spec.output_tokens)
    count = spec.bystanders if bystanders is None else bystanders
    requests += _bystanders(spec, rng, prefix, count)
    return Workload(sorted(requests, key=lambda q: q.arrival_offset_s), histories)


def _bystanders(spec: WorkloadSpec, rng: random.Random, prefix: str, count: int) -> list:
    out, t = [], 0.0
    for i in range(count):
        t += rng.expovariate(spec.bystander_rate_rps)
        out.append(Request(f"{prefix}b{i:03d}", _tokens(rng, spec.bystander_tokens), t,
                           spec.output_tokens, kind="bystander"))
    return out


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]
