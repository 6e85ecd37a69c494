"""The storage tier (HiCache L3) behind one small interface, with a latency/fault model.

Backends: "sim" (in-process, content regenerated on read) and "file" (one raw float32 file
per page). Both share the model in `Storage`: per-call latency, bandwidth, a per-rank
slowdown (jitter), deterministic per-TP-rank misses, random read failures, a stalling tier
and slow side-car pages. Stored content is always `page_content(hash, rank, pool)`, so
every read can be verified with `pools.verify_pages`.

Reads are per page, as SGLang's storage backends report them (`batch_get_v1` returns one
result per page, and the controller counts pages up to the first failure): `batch_get`
delivers the leading pages it can and says how many (`ReadResult`).

Threads: the prefetch thread calls `batch_exists`, the IO thread `batch_get`, the backup
thread `batch_set`; the RNG they share is guarded by a lock.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from hicache.memory.pools import expected_rows
from hicache.spec.storage_spec import StorageSpec  # noqa: F401 (re-exported)

KV_POOL = "kv"  # every other pool name is a side-car pool (slower per page when configured)
PUT_CHUNK_PAGES = 2048
_SLEEP_MIN_S = 0.0005  # below this a sleep costs more than it models: fold it into the next


class StorageError(RuntimeError):
    """A read was asked for with a destination of the wrong shape (a caller bug)."""


@dataclass(frozen=True)
class ReadResult:
    """What one batch read delivered: out[:pages] hold hashes[:pages]; `error` says why
    page `pages` did not come (None when every page did)."""

    pages: int
    error: str | None = None


@dataclass(frozen=True)
class ReadPlan:
    """A batch read decided before it runs (pinned schedules, hicache.spec.pinned): the draws,
    the pages it will deliver and its modelled time, so the scheduler knows when it
    completes on the virtual clock while the IO thread does the read itself."""

    pages: int  # leading pages the read delivers
    fail_at: int  # the injected failure's page, the batch's length when none
    head_s: float  # modelled seconds before the first row
    row_s: float  # modelled seconds per row

    @property
    def seconds(self) -> float:
        return self.head_s + self.pages * self.row_s


class Storage(ABC):
    """Public API and the latency/fault model; backends implement the hooks below."""

    def __init__(self, spec: StorageSpec, rank: int, tp_rank: int) -> None:
        self.spec = spec
        self.rank = rank
        self.tp_rank = tp_rank
        self._rng = random.Random(spec.seed * 1_000_003 + rank)
        self._rng_lock = threading.Lock()
        # Drawn once: a rank that is slow stays slow, as a loaded storage node would.
        self.rank_factor = 1.0 + spec.jitter * self._rng.random()
        # False under a pinned schedule: modelled time passes on the virtual clock, so the
        # calls do their real work without sleeping it out (hicache.spec.pinned).
        self.paced = True
        # Another writer's pages landing during the serve (HiCacheConfig.land_step): pages
        # `put` before the serve count for a hit query only from this scheduler step on.
        # Reads are not gated: a rank reads only pages the agreed (MIN) hit counted.
        self.land_step = 0
        self._late: set[str] = set()

    # ---- public API ------------------------------------------------------------------------

    def batch_exists(self, hashes: list[str], step: int | None = None) -> int:
        """Number of leading pages present on this rank (stops at the first miss) for a hit
        query issued at scheduler step `step` (None: whatever has landed by the end)."""
        self._pace(self.spec.exists_latency_ms / 1e3)
        # The miss rule goes first: a "missing" page is absent whatever the backend holds.
        kept = next((i for i, h in enumerate(hashes) if self._missing(h)), len(hashes))
        if step is not None and step < self.land_step:  # another writer's, not landed yet
            kept = next((i for i, h in enumerate(hashes[:kept]) if h in self._late), kept)
        return self._leading_present(hashes[:kept])

    def batch_get(self, hashes: list[str], pool: str, out: torch.Tensor,
                  plan: ReadPlan | None = None) -> ReadResult:
        """Read pages into out[i] for hashes[i], one row at a time, paced by the model, up to
        the first page that cannot be returned (missing, short, or an injected failure).

        Rows land in order while the read is "in flight", so a concurrent reader of `out` can
        see a half-written batch. Rows past the first failed page are never written. With a
        `plan` (from `plan_read`) its draws are used instead of new ones.
        """
        n = len(hashes)
        if out.dim() != 2 or out.shape[0] != n:
            raise StorageError(f"out must have shape [{n}, page_elems], got {tuple(out.shape)}")
        if n == 0:
            return ReadResult(0)
        if plan is None:
            fail_at, noise = self._draw(n)
            head_s, row_s = self._read_times(n, out.shape[1], pool, noise)
        else:
            fail_at, head_s, row_s = plan.fail_at, plan.head_s, plan.row_s
        rows = self._load(hashes[: min(self._kept(hashes), fail_at)], pool,
                          out.shape[1]).to(out.device)
        if self.paced:  # a failed read still costs its round trip
            self._paced_copy(rows, out, head_s, row_s)
        else:
            out[: rows.shape[0]].copy_(rows)
        got = rows.shape[0]
        if got == n:
            return ReadResult(n)
        why = (f"injected read failure at page {got} of {n}" if got == fail_at
               else f"page {got} of {n} is not in storage")
        return ReadResult(got, f"rank {self.rank} ({pool}): {why}")

    def batch_set(self, hashes: list[str], pool: str, rows: torch.Tensor) -> int:
        """Writes rows[i] (CPU float32) as page hashes[i] of `pool`, the backup thread's
        write (SGLang `batch_set`); it takes a read's time for the same bytes (latency +
        bytes / bandwidth). Returns the pages written; storage keeps them for good."""
        if not hashes:
            return 0
        head_s, row_s = self._read_times(len(hashes), rows.shape[1], pool, 1.0)
        self._pace(head_s + row_s * len(hashes))
        self._store(hashes, pool, rows.to(torch.float32).cpu())
        return len(hashes)

    def plan_read(self, hashes: list[str], pool: str, page_elems: int) -> ReadPlan:
        """The next batch read of `hashes`, drawn now from this rank's seeded RNG (in the
        order the reads will run), with the pages it delivers and its modelled time."""
        n = len(hashes)
        fail_at, noise = self._draw(n)
        head_s, row_s = self._read_times(n, page_elems, pool, noise)
        deliverable = hashes[: min(self._kept(hashes), fail_at)]
        return ReadPlan(self._loadable(deliverable, pool, page_elems), fail_at, head_s, row_s)

    def _kept(self, hashes: list[str]) -> int:
        # The miss rule goes first: a "missing" page is absent whatever the backend holds.
        return next((i for i, h in enumerate(hashes) if self._missing(h)), len(hashes))

    def _pace(self, seconds: float) -> None:
        if self.paced:
            _sleep(seconds)

    def put(self, hashes: list[str], pool: str, page_elems: int) -> None:
        """Store pages with content page_content(hash, self.rank, pool); costs no model time.
        In chunks: a trace's history is tens of thousands of pages, and one tensor of them
        all (with its int64 intermediates) would be hundreds of MB that the allocator keeps."""
        if self.land_step > 0:
            self._late.update(hashes)  # visible to hit queries from land_step on
        for i in range(0, len(hashes), PUT_CHUNK_PAGES):
            chunk = hashes[i: i + PUT_CHUNK_PAGES]
            self._store(chunk, pool, expected_rows(chunk, self.rank, pool, page_elems))

    def stored(self, hashes: list[str], pool: str, page_elems: int) -> torch.Tensor:
        """What storage holds for the leading stored pages of `hashes` (a self-check after
        a write: no model time, no draw from the read model's RNG)."""
        return self._load(hashes, pool, page_elems)

    # ---- backend hooks ---------------------------------------------------------------------

    @abstractmethod
    def close(self) -> None:
        """Release backend resources."""

    @abstractmethod
    def _leading_present(self, hashes: list[str]) -> int:
        """Number of leading pages stored (for any pool), stopping at the first absent one."""

    @abstractmethod
    def _loadable(self, hashes: list[str], pool: str, page_elems: int) -> int:
        """How many leading pages `_load` would return, without reading them."""

    @abstractmethod
    def _load(self, hashes: list[str], pool: str, page_elems: int) -> torch.Tensor:
        """Stored content of the leading pages stored for `pool` with `page_elems` values, as
        a CPU float32 tensor [k, page_elems]; stops at the first page that is not."""

    @abstractmethod
    def _store(self, hashes: list[str], pool: str, rows: torch.Tensor) -> None:
        """Persist rows[i] as page hashes[i] of `pool`."""

    # ---- model -----------------------------------------------------------------------------

    def _missing(self, page_hash: str) -> bool:
        """Deterministic per (seed, tp_rank, hash): a rank always misses the same pages."""
        p = self.spec.miss_prob
        if p <= 0.0 or p >= 1.0:
            return p >= 1.0
        key = f"{self.spec.seed}:{self.tp_rank}:{page_hash}".encode()
        u = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") / 2**64
        return u < p

    def _draw(self, n: int) -> tuple[int, float]:
        """(page at which this n-page read fails, n when it does not; lognormal noise
        factor) from the per-rank seeded RNG."""
        spec = self.spec
        with self._rng_lock:
            failed = spec.fail_rate > 0 and self._rng.random() < spec.fail_rate
            fail_at = self._rng.randrange(n) if failed else n
            noise = self._rng.lognormvariate(0.0, spec.jitter / 2) if spec.jitter > 0 else 1.0
        return fail_at, noise

    def _read_times(self, n: int, page_elems: int, pool: str, noise: float) -> tuple[float, float]:
        """(seconds before the first row, seconds per row) of one batch read."""
        spec = self.spec
        scale = self.rank_factor * noise
        # latency + bytes / bandwidth, with a KV page's bytes from the model's shape
        page_bytes = spec.kv_page_bytes if pool == KV_POOL and spec.kv_page_bytes else \
            page_elems * 4  # float32 content
        transfer_ms = n * page_bytes / (spec.bandwidth_gbps * 1e6)
        head_ms = spec.latency_ms * scale + spec.stall_ms
        row_ms = transfer_ms * scale / n + (spec.sidecar_page_ms if pool != KV_POOL else 0.0)
        return head_ms / 1e3, row_ms / 1e3

    @staticmethod
    def _paced_copy(rows: torch.Tensor, out: torch.Tensor, head_s: float, row_s: float) -> None:
        """Writes rows into out[:len(rows)] at the model's pace (head latency, then per row)."""
        # Pace against deadlines, not per-row sleeps: the total time stays right even when a
        # row's share is far below what one time.sleep call costs.
        start = time.perf_counter()
        for i in range(rows.shape[0]):
            wait = start + head_s + (i + 1) * row_s - time.perf_counter()
            if wait >= _SLEEP_MIN_S:
                time.sleep(wait)
            out[i].copy_(rows[i])
        tail = start + head_s + rows.shape[0] * row_s - time.perf_counter()
        _sleep(tail)


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


class SimStorage(Storage):
    """In-process storage for one rank; content is regenerated on read (it is a pure function
    of hash, rank and pool), so only each page's size is kept."""

    def __init__(self, spec: StorageSpec, rank: int, tp_rank: int) -> None:
        super().__init__(spec, rank, tp_rank)
        self._pages: dict[str, dict[str, int]] = {}  # pool -> hash -> page_elems
        self._any: set[str] = set()

    def _leading_present(self, hashes: list[str]) -> int:
        return next((i for i, h in enumerate(hashes) if h not in self._any), len(hashes))

    def _loadable(self, hashes: list[str], pool: str, page_elems: int) -> int:
        stored = self._pages.get(pool, {})
        return next((i for i, h in enumerate(hashes) if stored.get(h) != page_elems),
                    len(hashes))

    def _load(self, hashes: list[str], pool: str, page_elems: int) -> torch.Tensor:
        k = self._loadable(hashes, pool, page_elems)
        return expected_rows(hashes[:k], self.rank, pool, page_elems)

    def _store(self, hashes: list[str], pool: str, rows: torch.Tensor) -> None:
        table = self._pages.setdefault(pool, {})
        for h in hashes:
            table[h] = rows.shape[1]
        self._any.update(hashes)

    def close(self) -> None:
        self._pages.clear()
        self._any.clear()


class FileStorage(Storage):
    """One raw float32 file per page under root/rank{rank}/{pool}/{hash}.bin; real reads."""

    def __init__(self, spec: StorageSpec, rank: int, tp_rank: int) -> None:
        super().__init__(spec, rank, tp_rank)
        assert spec.root is not None  # validated by StorageSpec
        self.rank_dir = os.path.join(spec.root, f"rank{rank}")

    def _path(self, pool: str, page_hash: str) -> str:
        return os.path.join(self.rank_dir, pool, f"{page_hash}.bin")

    def _leading_present(self, hashes: list[str]) -> int:
        # Re-list pools on every call: another process may have written this directory.
        pools = os.listdir(self.rank_dir) if os.path.isdir(self.rank_dir) else []
        for i, h in enumerate(hashes):
            if not any(os.path.exists(self._path(p, h)) for p in pools):
                return i
        return len(hashes)

    def _loadable(self, hashes: list[str], pool: str, page_elems: int) -> int:
        for i, h in enumerate(hashes):
            try:
                if os.path.getsize(self._path(pool, h)) != page_elems * 4:
                    return i
            except OSError:
                return i
        return len(hashes)

    def _load(self, hashes: list[str], pool: str, page_elems: int) -> torch.Tensor:
        out = np.empty((len(hashes), page_elems), dtype=np.float32)
        for i, h in enumerate(hashes):
            try:
                row = np.fromfile(self._path(pool, h), dtype=np.float32)
            except OSError:
                return torch.from_numpy(out[:i])  # absent (or unreadable): stop here
            if row.size != page_elems:
                return torch.from_numpy(out[:i])  # a short page is not returned
            out[i] = row
        return torch.from_numpy(out)

    def _store(self, hashes: list[str], pool: str, rows: torch.Tensor) -> None:
        os.makedirs(os.path.join(self.rank_dir, pool), exist_ok=True)
        data = rows.numpy()
        for i, h in enumerate(hashes):
            data[i].tofile(self._path(pool, h))

    def close(self) -> None:
        pass  # files stay on disk: a later run (or another process) may read them


def make_storage(spec: StorageSpec, rank: int, tp_rank: int) -> Storage:
    """The backend named by spec.kind for one rank."""
    if spec.kind == "file":
        return FileStorage(spec, rank, tp_rank)
    return SimStorage(spec, rank, tp_rank)
