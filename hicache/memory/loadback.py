"""Load-back: the host->device copy of a request's cached prefix before its prefill, and the
host->device peak it is compared with.

On GPU the host pools are pinned and the copies run on a side stream, timed with CUDA
events; the forward (current stream) waits for that stream before it reads the pages.
Each pool tensor is copied one of two ways:
- pages of at least `direct_min_bytes` (real KV pages: MiBs each) are copied straight from
  the pinned pool, one copy per run of consecutive slots (both sides), no host copy at all;
- small pages (the float32 signatures, side-car pages) are gathered straight into a pinned
  staging buffer (one host copy, not the two of a pageable gather then `pin_memory()`),
  copied in one transfer, and scattered into their device slots on the device.
On CPU the same two paths run synchronously and the time is wall clock.
"""

from __future__ import annotations

import time

import torch

from hicache.memory.pools import PagePool

DIRECT_MIN_BYTES = 1 << 20  # from ~1 MiB a pinned copy runs near the link's peak
H2D_PEAK_BYTES = 256 << 20  # >= 64 MiB: past the size where copy overheads matter


def runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """(first src slot, first dst slot, length) of the maximal runs consecutive on both sides."""
    out: list[tuple[int, int, int]] = []
    for s, d in sorted(zip(src, dst, strict=True)):
        if out and s == out[-1][0] + out[-1][2] and d == out[-1][1] + out[-1][2]:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((s, d, 1))
    return out


class LoadBack:
    """Owns the copy stream and the pinned staging buffers; used by the scheduler thread only.

    A staging buffer is reused by the next load-back: safe because every `copy` waits for
    its transfers to land before it returns.
    """

    def __init__(self, device: torch.device, direct_min_bytes: int = DIRECT_MIN_BYTES):
        self.device, self.direct_min_bytes = device, direct_min_bytes
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._staging: dict[int, torch.Tensor] = {}  # host tensor's data_ptr -> buffer

    def copy(self, pairs: list[tuple[PagePool, PagePool]], src: list[int],
             dst: list[int]) -> tuple[float, int]:
        """Copies host page src[i] to device page dst[i] of every (host, device) pool pair;
        returns (seconds, bytes copied)."""
        nbytes = len(src) * sum(host.page_bytes for host, _ in pairs)
        if self.stream is None:
            t0 = time.monotonic()
            self._copy_all(pairs, src, dst)
            return time.monotonic() - t0, nbytes
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(self.stream)
        with torch.cuda.stream(self.stream):
            self._copy_all(pairs, src, dst)
        end.record(self.stream)
        end.synchronize()  # blocks until the copies landed: off the forward's stream
        # The forward (current stream) must not read the pages before the copy stream is done.
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return start.elapsed_time(end) / 1e3, nbytes

    def _copy_all(self, pairs, src: list[int], dst: list[int]) -> None:
        if not src:
            return
        for host, dev in pairs:
            for h, d in zip(host.tensors(), dev.tensors(), strict=True):
                if h.shape[1] * h.element_size() >= self.direct_min_bytes:
                    self._copy_runs(h, d, src, dst)
                else:
                    self._copy_gathered(h, d, src, dst)

    @staticmethod
    def _copy_runs(h: torch.Tensor, d: torch.Tensor, src: list[int], dst: list[int]) -> None:
        for s, t, n in runs(src, dst):
            d[t: t + n].copy_(h[s: s + n], non_blocking=True)  # pinned: async on the stream

    def _copy_gathered(self, h: torch.Tensor, d: torch.Tensor, src: list[int],
                       dst: list[int]) -> None:
        staging = self._buffer(h, len(src))
        torch.index_select(h, 0, torch.tensor(src, dtype=torch.int64), out=staging)
        index = torch.tensor(dst, dtype=torch.int64, device=d.device)
        d.index_copy_(0, index, staging.to(d.device, non_blocking=True))

    def _buffer(self, h: torch.Tensor, rows: int) -> torch.Tensor:
        """A staging buffer for `rows` rows of `h`, pinned on GPU runs, grown on demand."""
        buf = self._staging.get(h.data_ptr())
        if buf is None or buf.shape[0] < rows:
            pin = self.stream is not None
            buf = torch.empty((max(rows, 2 * (0 if buf is None else buf.shape[0])),
                               h.shape[1]), dtype=h.dtype, pin_memory=pin)
            self._staging[h.data_ptr()] = buf
        return buf[:rows]


def h2d_peak(device: torch.device, nbytes: int = H2D_PEAK_BYTES, reps: int = 5) -> dict:
    """The host->device peak to compare load-backs with: the best of `reps` pinned copies of
    `nbytes`, timed with CUDA events after one warm-up copy. On CPU: None and why."""
    if device.type != "cuda":
        return {"h2d_peak_gbps": None, "h2d_bytes": None,
                "h2d_reason": "no CUDA device: load-back is a host memcpy, no link to measure"}
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)  # warm-up: the first copy maps the pages
    best = 0.0
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()  # blocks until this copy is done: the timed region ends here
        best = max(best, nbytes / (start.elapsed_time(end) / 1e3) / 1e9)
    return {"h2d_peak_gbps": round(best, 2), "h2d_bytes": nbytes, "h2d_reason": None}
