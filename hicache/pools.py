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
    """

    def __init__(
        self,
        name: str,
        num_pages: int,
        page_elems: int,
        device: torch.device | str = "cpu",
        pin_memory: bool = False,
        dtype: torch.dtype = torch.float32,
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
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low slots first
        self._is_free = [True] * num_pages
        self._lock = threading.Lock()

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


def verify_pages(pool: PagePool, slots: list[int], hashes: list[str], rank: int) -> int:
    """Number of pages in `slots` whose rows differ from their expected content (0 = all good)."""
    assert len(slots) == len(hashes), "one hash per slot"
    if not slots:
        return 0
    want = expected_rows(hashes, rank, pool.name, pool.page_elems).to(pool.data.device)
    index = torch.tensor(slots, dtype=torch.int64, device=pool.data.device)
    got = pool.data.index_select(0, index).to(torch.float32)
    # .item() syncs with the device: verification is off the timed path.
    return int((got != want).any(dim=1).sum().item())
