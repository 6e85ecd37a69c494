"""The device pages of a request's prefill: the load-back before it (the host-resident
prefix copied to fresh device pages, with the device tier after the device hit, then checked
against storage's hashes off the timed path) and, after it, the pages cached on the device
(with the device tier) or handed back. The copy itself: `hicache.memory.loadback`.

Runs on the scheduler thread only and issues no collective: every rank places the same
pages because the prefix match and the agreed prefetch results it starts from are the same.
"""

from __future__ import annotations

import torch

from hicache.cache.tiers import Tiers, token_sources
from hicache.comm.records import Stats
from hicache.memory.hashing import page_hashes
from hicache.memory.kv_layout import KVLayout, max_input_tokens
from hicache.memory.loadback import LoadBack
from hicache.memory.pools import PagePool, verify_pages
from hicache.memory.radix_tree import MatchResult


class PrefillPages:
    """Places a request's prompt on the device pools (`pairs`: the (host, device) pools a
    load-back copies, the KV pool first) and takes the pages back after its prefill."""

    def __init__(self, page: int, rank: int, stats: Stats, kv: KVLayout,
                 pairs: list[tuple[PagePool, PagePool]], tiers: Tiers | None,
                 device: torch.device):
        self.page, self.rank, self.stats, self.kv = page, rank, stats, kv
        self.pairs, self.tiers = pairs, tiers
        self.host_kv, self.dev_kv = pairs[0]
        self.loader = LoadBack(device)
        self._placed: dict[str, tuple[list[str], int]] = {}  # rid -> (page hashes, device hit)
        # Every rank sizes its pool from the same configuration: the same limit everywhere.
        self.max_input_tokens = max_input_tokens(self.dev_kv.num_pages, page)

    def load_back(self, rid: str, tokens: list[int], m: MatchResult, base_pages: int,
                  staged: tuple[list[int], list[str]]) -> tuple[list[int], float]:
        """Device pages for the prompt (`m`: its prefix match, locked; `base_pages`: the
        match at its arrival; `staged`: buffer_only's staging slots and hashes); returns
        them and the copy's time."""
        staged_slots, staged_hashes = staged
        if self.tiers is not None:
            (dev, hit, src), hashes = self.tiers.place(tokens, m), m.hashes
        else:
            src, hashes = m.slots + staged_slots, m.hashes + staged_hashes
            hit, src = 0, src[: min(len(src), (len(tokens) - 1) // self.page)]
            dev = self._alloc_device(rid, len(src))
        usable, st = hit + len(src), self.stats.requests[rid]
        seconds, st.load_back_bytes = self.loader.copy(self.pairs, src, dev[hit:usable])
        st.loaded_tokens = len(src) * self.page
        sources = token_sources(len(tokens), self.page, base_pages,
                                st.prefetched_tokens // self.page, hit, usable)
        for name, value in sources.items():
            setattr(st, name, value)
        st.data_errors += self._verify(tokens, hashes[:usable], dev[:usable])
        self.host_kv.free(staged_slots)  # buffer_only: the staging has served its one load-back
        if self.tiers is not None:
            self._placed[rid] = (self.tiers.computed(tokens, m, dev, usable), hit)
        return dev, seconds

    def _alloc_device(self, rid: str, pages: int) -> list[int]:
        dev = self.dev_kv.alloc(pages)
        if dev is None:
            raise RuntimeError(f"device pool exhausted loading {pages} pages for {rid} "
                               f"({self.dev_kv.num_pages} pages of {self.kv.page_bytes} bytes; "
                               f"a larger kv_budget_gib holds more)")
        return dev

    def _verify(self, tokens, hashes: list[str], dev: list[int]) -> int:
        """Pages whose loaded bytes or hash chain differ from storage (off the timed path)."""
        want = page_hashes(tokens[: len(hashes) * self.page], self.page)
        bad = sum(a != b for a, b in zip(want, hashes, strict=True))
        for _, devp in self.pairs:
            bad += verify_pages(devp, dev, want, self.rank)
        return bad

    def cache_prefill(self, rid: str, tokens: list[int], dev: list[int]) -> None:
        """After the prefill: with the device tier its pages stay cached on the device
        (and start toward the host and storage); without, the device pages go back."""
        if self.tiers is None:
            self.dev_kv.free(dev)
            return
        hashes, hit = self._placed.pop(rid)
        self.tiers.cache_prefill(tokens, hashes, dev, hit)
