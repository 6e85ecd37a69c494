"""The one surface through which the harness observes the system: plain records, no logic.

Times are this rank's `time.monotonic()` seconds; on rank 0 they share the clock of the
arrival stamps, so TTFT and its breakdown are computed there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hicache.comm import CollectiveCounter


@dataclass
class RequestStats:
    rid: str
    arrival: float  # rank 0's clock when the request arrived
    enqueued: float | None = None  # this rank received it (request broadcast)
    io_done: float | None = None  # this rank's IO thread finished its prefetch
    ready: float | None = None  # check_prefetch_progress returned True / final ack landed
    scheduled: float | None = None
    load_back_s: float = 0.0
    load_back_bytes: int = 0  # host->device bytes of the load-back (every pool)
    prefill_s: float = 0.0
    first_token: float | None = None
    polls: int = 0  # calls that found the prefetch still ongoing
    # poll (a poll stopped it, possibly before its hit was agreed) | ack (final ack) |
    # revoked (hit below threshold or no host memory) | none (no prefetch issued)
    terminated_by: str = "none"
    op_issued: bool = False
    io_issued: bool = False
    requested_tokens: int = 0
    hit_tokens: int = 0
    prefetched_tokens: int = 0  # usable prefix agreed at termination
    loaded_tokens: int = 0  # prefix copied host->device at load-back
    data_errors: int = 0  # pages whose loaded bytes differ from storage
    io_error: str | None = None


@dataclass
class StepStats:
    step: int
    t: float
    waiting: int = 0
    polled: int = 0
    scheduled: int = 0


@dataclass
class Stats:
    counter: CollectiveCounter = field(default_factory=CollectiveCounter)
    requests: dict[str, RequestStats] = field(default_factory=dict)
    steps: list[StepStats] = field(default_factory=list)
    # rid -> (how it ended, usable tokens, agreed hit tokens): compared across ranks.
    decisions: dict[str, tuple] = field(default_factory=dict)

    def request_rows(self) -> list[dict]:
        rows = []
        for rid, r in self.requests.items():
            row = asdict(r)
            row.update({f"coll_{k}": v for k, v in self.counter.by_rid.get(rid, {}).items()})
            row["sync_s"] = self.counter.sched_seconds_by_rid.get(rid, 0.0)
            rows.append(row)
        return rows

    def step_rows(self) -> list[dict]:
        rows = []
        for s in self.steps:
            row = asdict(s)
            row.update({f"coll_{k}": v for k, v in self.counter.by_step.get(s.step, {}).items()})
            row["sync_s"] = self.counter.sched_seconds_by_step.get(s.step, 0.0)
            rows.append(row)
        return rows
