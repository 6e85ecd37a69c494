"""What the scheduler and the cache controller's threads (hicache.cache.controller) hand
each other: a storage->host prefetch (PrefetchOp), one of its acks (Ack), a host->storage
write (BackupOp), and the names of the host pools a prefetch reads into."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

KV, SIDECAR = "kv", "indexer"


@dataclass(eq=False)
class PrefetchOp:
    """One storage->host prefetch (SGLang's PrefetchOperation)."""

    rid: str
    tokens: list[int]  # the page-aligned unmatched part of the prompt
    prior_hash: str | None  # hash of the last page matched in the host tree
    start_time: float  # this rank's clock at enqueue (timeout input in most protocols)
    start_stamp: float  # rank 0's step clock at enqueue (step-clock's timeout input)
    hashes: list[str] = field(default_factory=list)
    # Truncated to the agreed hit pages, then to the host slots it got (memory pressure).
    hash_value: list[str] = field(default_factory=list)
    hit_drained: bool = False  # the scheduler took the agreed hit (same step on all ranks)
    host_slots: list[int] | None = None
    completed_tokens: int = 0  # pre27010: this rank's IO progress; else the agreed acks
    sidecar_started: bool = False  # pre27010: the side-car read (after all KV) began
    sidecar_pages: int = 0  # pre27010: side-car pages written to host memory
    pool_transfers_done: bool = False  # extra-pool reads over (pre27010) / acked (others)
    decided: bool = False  # step-level "stop" (step-batched, step-clock)
    frozen_tokens: int = 0  # completed_tokens when the step-level decision was taken
    wait_start: float | None = None  # 0.5.23: this rank's clock at its first blocked poll
    wait_tokens: int | None = None  # its budget's requested tokens (None: this op's own)
    ticketed: bool = False  # 0.5.23's PP-ticket path: the threads own it until ready
    io_error: str | None = None
    t_io_done: float | None = None
    # Pinned schedules (hicache.spec.pinned): virtual times and the real thread's progress.
    terminated_v: float | None = None  # virtual time of the step whose poll ended it
    hit_due: float | None = None  # virtual time its agreed hit becomes visible
    plans: list = field(default_factory=list)  # one ReadPlan per IO batch
    real_tokens: int = 0  # pre27010: tokens the IO thread really wrote (visible later)
    io_stopped: bool = False  # its reads ended on the virtual clock
    io_end_v: float | None = None  # ...at this virtual time
    terminated: threading.Event = field(default_factory=threading.Event)
    io_done: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)  # ticket: final ack synced
    # 0.5.23's retries (hicache.cache.retries): the scheduler step it was issued at (the
    # storage tier's landing of late writes is judged at it), the prompt tokens before its
    # span, and whether a known hit let it skip batch_exists (`assume_stored`).
    issue_step: int = 0
    storage_start: int = 0
    assume_stored: bool = False

    page_size: int = 64

    @property
    def hit_tokens(self) -> int:
        return len(self.hash_value) * self.page_size


@dataclass(frozen=True)
class Ack:
    """One PrefetchAck: exactly one of the three roles below."""

    op: PrefetchOp
    tokens: int | None = None  # per batch: cumulative usable tokens (MIN-reduced)
    pool_pages: int | None = None  # extra-pool hits, not KV-derived (MIN-reduced)
    final: bool = False  # the op's IO stopped (SGLang's completed_req): not reduced


@dataclass(eq=False)
class BackupOp:
    """One host->storage write (SGLang's StorageOperation for a backup)."""

    hashes: list[str]
    slots: list[int]  # host slots, held (pinned) until the ack is drained
    written_pages: int = 0
