"""Host/device page pools and the deterministic page content used to check every transfer.

A page's content is a pure function of (page hash, rank, pool name), so any reader can check
that a row of a pool holds exactly the page it should: this is how half-written side-car pages
(the PR #27550 race) show up as checksum mismatches instead of silently garbled output.
"""

from __future__ import annotations

import threading
import zlib

import torch

_MOD = 65521  # largest prime < 2**16: every value (+1) is exact in float32


class PagePool:
    """A fixed array of pages plus a free list.

    Thread-safe: the IO thread frees slots of aborted reads while the scheduler thread
    allocates, so alloc/free take a lock. `data` itself is not locked: each slot has one
    writer at a time by construction (the owner of the allocation).

    `data` holds each page's verified float32 signature (`page_content`). With
    `bulk_bytes` > 0 a page also owns that many real bytes in `bulk` (uint8), so a page
    weighs what a model's KV page weighs (`hicache.memory.kv_layout`): writers fill a page's bulk
    with one byte derived from its signature, and `verify_pages` checks a fixed sample of
    bulk positions, so a page copied without its bulk, or a slot holding another page's
    bytes, is caught without generating megabytes of expected content. `bulk` is not
    zeroed on allocation (a memset of gigabytes per configuration); `data` is.
    """

    def __init__(
        self,
        name: str,
        num_pages: int,
        page_elems: int,
        device: torch.device | str = "cpu",
        pin_memory: bool = False,
        dtype: torch.dtype = torch.float32,
        bulk_bytes: int = 0,
    ) -> None:
        if num_pages < 0 or page_elems <= 0:
            raise ValueError(
                f"need num_pages >= 0 and page_elems > 0, got {num_pages} and {page_elems}"
            )
        self.name = name
        self.num_pages = num_pages
        self.page_elems = page_elems
        # Pinning needs a CUDA context; on CPU-only machines it would raise, so never try.
        pin = pin_memory and torch.cuda.is_available() and torch.device(device).type == "cpu"
        self.data = torch.zeros((num_pages, page_elems), dtype=dtype, device=device, pin_memory=pin)
        self.bulk = (torch.empty((num_pages, bulk_bytes), dtype=torch.uint8, device=device,
                                 pin_memory=pin) if bulk_bytes > 0 else None)
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low slots first
        self._is_free = [True] * num_pages
        self._lock = threading.Lock()

    @property
    def page_bytes(self) -> int:
        """Bytes of one page: signature row plus bulk."""
        bulk = 0 if self.bulk is None else self.bulk.shape[1]
        return self.page_elems * self.data.element_size() + bulk

    def tensors(self) -> list[torch.Tensor]:
        """Every per-page tensor, rows indexed by slot (what a page copy must move)."""
        return [self.data] if self.bulk is None else [self.data, self.bulk]

    def write(self, slots: list[int], rows: torch.Tensor) -> None:
        """Pages `rows` (signatures, [len(slots), page_elems]) into `slots`, bulk included."""
        index = torch.tensor(slots, dtype=torch.int64, device=self.data.device)
        self.data.index_copy_(0, index, rows.to(self.data.device))
        if self.bulk is not None:
            for slot, fill in zip(slots, bulk_fill(rows).tolist(), strict=True):
                self.bulk[slot].fill_(fill)

    def release(self) -> None:
        """Drops the page memory (pinned host memory is scarce); the pool is unusable after."""
        self.data, self.bulk = self.data[:0], None

    @property
    def available(self) -> int:
        with self._lock:
            return len(self._free)

    @property
    def used(self) -> int:
        with self._lock:
            return self.num_pages - len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """`n` free slots, or None (and nothing taken) when fewer than `n` are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        with self._lock:
            if n > len(self._free):
                return None
            slots = [self._free.pop() for _ in range(n)]
            for s in slots:
                self._is_free[s] = False
            return slots

    def free(self, slots: list[int]) -> None:
        with self._lock:
            for s in slots:
                assert 0 <= s < self.num_pages, f"{self.name}: slot {s} out of range"
                assert not self._is_free[s], f"{self.name}: double free of slot {s}"
                self._is_free[s] = True
                self._free.append(s)


def _seed(page_hash: str, rank: int, pool: str) -> int:
    # crc32, not hash(): Python's str hash is salted per process and ranks must agree.
    return int(page_hash[:12], 16) ^ (rank * 0x9E3779B1) ^ zlib.crc32(pool.encode())


def _offset_step(seed: int) -> tuple[int, int]:
    # Offset and a nonzero step mod a prime: two elements pin both down, so two different
    # seeds give the same page only when both collide (~1 in 4e9), not 1 in 65521.
    return seed % _MOD, (seed // _MOD) % (_MOD - 1) + 1


def page_content(page_hash: str, rank: int, pool: str, page_elems: int) -> torch.Tensor:
    """Deterministic float32 content of one page; never all zeros (values are in [1, 65521]).

    Exact in any dtype that holds integers up to 65521 (float32, float64, int32), so pools
    meant to be verified should use one of those.
    """
    return expected_rows([page_hash], rank, pool, page_elems)[0]


def expected_rows(hashes: list[str], rank: int, pool: str, page_elems: int) -> torch.Tensor:
    """page_content for many pages at once, shape [len(hashes), page_elems] (one kernel)."""
    params = [_offset_step(_seed(h, rank, pool)) for h in hashes]
    coef = torch.tensor(params, dtype=torch.int64).reshape(len(hashes), 2)
    idx = torch.arange(page_elems, dtype=torch.int64)
    # Values < 2**16 * page_elems: no int64 overflow for any realistic page.
    return ((coef[:, :1] + idx[None, :] * coef[:, 1:]) % _MOD + 1).to(torch.float32)


def bulk_fill(rows: torch.Tensor) -> torch.Tensor:
    """The byte (1..255) a page's bulk is filled with, from its signature row (int64)."""
    return rows[:, 0].to(torch.int64) % 255 + 1


def bulk_sample(bulk_bytes: int, n: int = 16) -> torch.Tensor:
    """Fixed positions checked in every bulk row: spread evenly, first and last included."""
    return torch.linspace(0, bulk_bytes - 1, min(n, bulk_bytes)).round().to(torch.int64)


def verify_pages(pool: PagePool, slots: list[int], hashes: list[str], rank: int) -> int:
    """Number of pages in `slots` whose rows differ from their expected content (0 = all good)."""
    assert len(slots) == len(hashes), "one hash per slot"
    if not slots:
        return 0
    want = expected_rows(hashes, rank, pool.name, pool.page_elems).to(pool.data.device)
    index = torch.tensor(slots, dtype=torch.int64, device=pool.data.device)
    got = pool.data.index_select(0, index).to(torch.float32)
    bad = (got != want).any(dim=1)
    if pool.bulk is not None:
        pos = bulk_sample(pool.bulk.shape[1]).to(pool.data.device)
        sample = pool.bulk[index[:, None], pos[None, :]].to(torch.int64)
        bad |= (sample != bulk_fill(want)[:, None]).any(dim=1)
    # .item() syncs with the device: verification is off the timed path.
    return int(bad.sum().item())
