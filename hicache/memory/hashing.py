"""Page hash chain used to name pages in the storage tier (docs/design.md section 2, step 3).

h_i = SHA256(bytes(h_{i-1}) || page_i tokens as uint32 little-endian), as hex digests.
Chaining makes a page's name depend on the whole prefix before it, so two requests share a
stored page only when they share every token up to and including that page.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

_UINT32_LIMIT = 2**32


def _token_bytes(tokens: Sequence[int]) -> bytes:
    """All tokens as uint32 little-endian bytes; rejects tokens outside uint32."""
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= _UINT32_LIMIT):
        raise ValueError("tokens must satisfy 0 <= t < 2**32")
    return arr.astype("<u4").tobytes()


def page_hashes(tokens: Sequence[int], page_size: int, prior: str | None = None) -> list[str]:
    """Hex hash chain over the full pages of `tokens`; a trailing partial page is ignored.

    `prior` is the hash of the page just before `tokens[0]` (the last matched host page), so
    hashing a suffix with the right prior gives the tail of the chain over the whole sequence.
    """
    if page_size <= 0:
        raise ValueError(f"page_size must be > 0, got {page_size}")
    # Convert once (every token validated, the ignored partial page too: bad input is a bug),
    # then slice bytes: this runs for every request, thousands of pages.
    data = _token_bytes(tokens)
    page_nbytes = 4 * page_size
    prev = bytes.fromhex(prior) if prior is not None else b""
    out: list[str] = []
    for i in range(len(tokens) // page_size):
        page = data[i * page_nbytes : (i + 1) * page_nbytes]
        prev = hashlib.sha256(prev + page).digest()
        out.append(prev.hex())
    return out
