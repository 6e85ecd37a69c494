"""What a run's storage tier is (`StorageSpec`): its kind, latency, bandwidth and fault
model, validated when made. Apart from hicache.memory.storage, which implements it, so that a
process that only plans or reports runs (the `bench` parent) reads it without importing
torch (about 1.5 s of every `python -m bench` call)."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("sim", "file")


@dataclass(frozen=True)
class StorageSpec:
    kind: str = "sim"
    latency_ms: float = 2.0  # per batch read
    bandwidth_gbps: float = 10.0  # GB/s per rank
    # Modelled bytes of one KV page on this rank (the model's KV shape over TP ranks); the
    # stored content is smaller and synthetic. 0: time the content's own bytes.
    kv_page_bytes: int = 0
    exists_latency_ms: float = 0.2  # per batch_exists call
    jitter: float = 0.0  # per-rank slowdown spread, and lognormal sigma = jitter / 2
    miss_prob: float = 0.0  # per page, per TP rank, deterministic
    fail_rate: float = 0.0  # probability that a batch read fails, at a random page of it
    stall_ms: float = 0.0  # extra sleep on every batch read
    sidecar_page_ms: float = 0.0  # extra sleep per page of a non-"kv" pool
    root: str | None = None  # directory for kind="file"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"storage kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "file" and not self.root:
            raise ValueError("storage kind 'file' needs a root directory")
        for name in ("latency_ms", "exists_latency_ms", "jitter", "stall_ms", "sidecar_page_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.kv_page_bytes < 0:
            raise ValueError(f"kv_page_bytes must be >= 0, got {self.kv_page_bytes}")
        if not self.bandwidth_gbps > 0:
            raise ValueError(f"bandwidth_gbps must be > 0, got {self.bandwidth_gbps}")
        for name in ("miss_prob", "fail_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
