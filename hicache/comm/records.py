"""The one surface through which the harness observes the system: plain records, no logic.

Times are this rank's `time.monotonic()` seconds; on rank 0 they share the clock of the
arrival stamps, so TTFT and its breakdown are computed there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hicache.comm.comm import COMPLETION, DECISION, PP_HOP, CollectiveCounter
from hicache.memory.events import EventLog

CRITICAL_SITES = (DECISION, COMPLETION, PP_HOP)  # the poll's own collectives


@dataclass
class RequestStats:
    rid: str
    arrival: float  # rank 0's clock when the request arrived
    kind: str = "prefetch"  # prefetch (its prefix is in storage) | bystander (nothing to fetch)
    output_tokens: int = 1  # tokens it generates: the first, then one per decode step
    enqueued: float | None = None  # this rank received it (request broadcast)
    io_done: float | None = None  # this rank's IO thread finished its prefetch
    ready: float | None = None  # check_prefetch_progress returned True / final ack landed
    scheduled: float | None = None
    load_back_s: float = 0.0
    load_back_bytes: int = 0  # host->device bytes of the load-back (every pool)
    prefill_s: float = 0.0
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)  # every output token, first included
    finished: float | None = None  # its last token
    polls: int = 0  # calls that found the prefetch still ongoing
    absent_polls: int = 0  # calls that found none on this rank and still reduced (pr38284)
    # poll (a poll stopped it, possibly before its hit was agreed) | ack (final ack) |
    # revoked (hit below threshold or no host memory) | none (no prefetch issued) |
    # rejected (its prompt reaches the pool's max_input_tokens: never served)
    terminated_by: str = "none"
    op_issued: bool = False
    # PrefetchOperations issued for it, each with its hit query: 1 for an issued prefetch,
    # more where 0.5.23's retries issued it again (hicache.cache.retries)
    prefetch_ops: int = 0
    retries: int = 0  # 0.5.23's re-issues of its storage lookup (attempts, issued or not)
    io_issued: bool = False
    requested_tokens: int = 0
    hit_tokens: int = 0
    prefetched_tokens: int = 0  # usable prefix agreed at termination
    loaded_tokens: int = 0  # prefix copied host->device at load-back
    # Where the prompt's tokens came from, at scheduling (they sum to prompt_tokens):
    prompt_tokens: int = 0
    device_hit_tokens: int = 0  # already on the device (the device tier)
    host_hit_tokens: int = 0  # on the host before this request's prefetch
    storage_hit_tokens: int = 0  # fetched from storage by this request's prefetch, and used
    computed_tokens: int = 0  # the prefill computed them
    data_errors: int = 0  # pages whose loaded bytes differ from storage
    io_error: str | None = None
    # 0.5.23: "deadline" when an agreed timeout expiry ended its prefetch (never re-issued)
    prefetch_finish: str | None = None
    # The schedule's clock (pinned: virtual) when this rank's reads ended / it was decided.
    io_done_vt: float | None = None
    ready_vt: float | None = None


@dataclass
class StepStats:
    step: int
    t: float  # this rank's clock at the top of the step
    t_end: float = 0.0  # after the forward and its outputs
    kind: str = "idle"  # prefill (newly scheduled requests) | decode (the running batch) | idle
    waiting: int = 0
    prefetching: int = 0  # waiting requests whose prefetch is still ongoing
    polled: int = 0
    # Polls outside the walk's reach of a pending prefetch: pr32725's safe-point sweep and
    # pr38284's all-reduces for a prefetch this rank does not hold.
    polled_extra: int = 0
    scheduled: int = 0
    running: int = 0  # requests in the running (decode) batch during this step
    prefill_tokens: int = 0
    context_tokens: int = 0  # KV tokens the decode step reads
    forward_s: float = 0.0  # the forward, modelled time included
    modelled_ms: float = 0.0  # the forward's modelled time (hicache.spec.step_time)
    vt: float = 0.0  # the schedule's clock at the top of the step (pinned: virtual)
    pin_wait_s: float = 0.0  # pinned: waiting for real work whose virtual time had come
    forward_late_s: float = 0.0  # pinned: the forward's sleep overran (left out of times)
    schedule_digest: str = ""  # running digest of every step's decisions up to this one
    poll_s: float = 0.0  # the walk's polls of pending prefetches, host time (hicache.cache.twin)
    twin_poll_s: float = 0.0  # the same polls asked of the twin protocol (step-paired)
    twin_first: bool = False  # the twin polled first in this step (drawn per step)


@dataclass
class Stats:
    counter: CollectiveCounter = field(default_factory=CollectiveCounter)
    requests: dict[str, RequestStats] = field(default_factory=dict)
    steps: list[StepStats] = field(default_factory=list)
    # rid -> (how it ended, usable tokens, agreed hit tokens): compared across ranks.
    decisions: dict[str, tuple] = field(default_factory=dict)
    # Self-check after the run: host slots neither in the radix tree nor free (0 = every
    # slot accounted for; more = leaked). None until the run has shut down.
    host_slots_unaccounted: int | None = None
    # The write path (hicache.cache.tiers), after the run: pages copied device -> host, written
    # to storage; empty when the device tier is off.
    write_path: dict[str, int] = field(default_factory=dict)
    # The timeline (hicache.memory.events), when the run records one: every collective, poll,
    # storage batch and copy of every thread, stamped. None: nothing is recorded.
    events: EventLog | None = None

    def __post_init__(self) -> None:
        self.counter.events = self.events  # the counter stamps every collective it counts

    def timeline(self) -> dict | None:
        """What the timeline needs of this rank, picklable: every thread's events, and the
        steps and requests with their own (unrounded) stamps. None without a timeline."""
        if self.events is None:
            return None
        return {"threads": self.events.dump(), "steps": [asdict(s) for s in self.steps],
                "requests": [{k: v for k, v in asdict(r).items() if k != "token_times"}
                             for r in self.requests.values()]}

    def request_rows(self) -> list[dict]:
        rows = []
        for rid, r in self.requests.items():
            row = asdict(r)
            row.pop("token_times")  # gaps only, below: the list itself stays in memory
            t = r.token_times
            row["itl_s"] = [b - a for a, b in zip(t[:-1], t[1:], strict=True)]
            row.update({f"coll_{k}": v for k, v in self.counter.by_rid.get(rid, {}).items()})
            row["sync_s"] = self.counter.sched_seconds_by_rid.get(rid, 0.0)
            where = self.counter.where_by_rid.get(rid, {})
            row["call_sites"] = "; ".join(f"{n}x {w}" for w, n in sorted(where.items()))
            rows.append(row)
        return rows

    def step_rows(self) -> list[dict]:
        rows = []
        for s in self.steps:
            row = asdict(s)
            row.update({f"coll_{k}": v for k, v in self.counter.by_step.get(s.step, {}).items()})
            row["sync_s"] = self.counter.sched_seconds_by_step.get(s.step, 0.0)
            by_site = self.counter.sched_seconds_by_step_site.get(s.step, {})
            row["decision_sync_s"] = sum(by_site.get(k, 0.0) for k in CRITICAL_SITES)
            rows.append(row)
        return rows
