"""Page-granular radix tree over the host pool (the host side of HiCache's prefix cache).

Each node holds a run of whole pages: their tokens, one host slot and one page hash per page.
Only whole pages are ever stored or matched, so a node boundary always falls on a page
boundary and a partial match splits a node exactly there.

Recency is a monotonically increasing counter, not wall time, so eviction order in tests is
deterministic. `lock_ref` counts requests using a node or any node below it; a node with
lock_ref 0 has no locked descendant, so every unlocked node is (eventually) evictable.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field


class _Node:
    """One run of pages. `tokens` has len(slots) * page_size entries."""

    __slots__ = (
        "tokens",
        "slots",
        "hashes",
        "children",
        "parent",
        "lock_ref",
        "last_access",
        "uid",
    )

    def __init__(self, parent: _Node | None, uid: int) -> None:
        self.tokens: list[int] = []
        self.slots: list[int] = []
        self.hashes: list[str] = []
        self.children: dict[tuple[int, ...], _Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0
        self.uid = uid  # tie-breaker so equal access times evict in creation order

    @property
    def num_pages(self) -> int:
        return len(self.slots)


@dataclass(frozen=True)
class MatchResult:
    pages: int
    slots: list[int]
    hashes: list[str]
    last_hash: str | None
    node: _Node = field(repr=False, compare=False)  # opaque handle for lock/unlock


class RadixTree:
    """Host radix tree. Not thread-safe: only the scheduler thread touches it."""

    def __init__(self, page_size: int) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be > 0, got {page_size}")
        self.page_size = page_size
        self._uids = itertools.count()
        self._clock = itertools.count(1)
        self.root = _Node(None, next(self._uids))
        self._total = 0
        self._evictable = 0

    @property
    def total_pages(self) -> int:
        return self._total

    @property
    def evictable_pages(self) -> int:
        return self._evictable

    # ---- lookup / insert -------------------------------------------------------------------

    def match(self, tokens: Sequence[int]) -> MatchResult:
        """Longest cached prefix of `tokens` in whole pages; refreshes recency along the path."""
        whole = len(tokens) // self.page_size * self.page_size
        node, slots, hashes = self._walk(list(tokens[:whole]), next(self._clock))
        return MatchResult(len(slots), slots, hashes, hashes[-1] if hashes else None, node)

    def insert(self, tokens: Sequence[int], slots: list[int], hashes: list[str]) -> int:
        """Insert the first len(slots) pages; return how many leading pages were already there.

        The tree keeps its own slots for those already-present pages, so the caller must free
        the passed slots[:returned]; the remaining passed slots now belong to the tree.
        """
        n = len(slots)
        if len(hashes) != n or n > len(tokens) // self.page_size:
            raise ValueError(
                f"need len(slots) == len(hashes) <= full pages of tokens; got {n} slots, "
                f"{len(hashes)} hashes, {len(tokens) // self.page_size} full pages"
            )
        now = next(self._clock)
        key = list(tokens[: n * self.page_size])
        node, present, _ = self._walk(key, now)
        done = len(present)
        if done < n:
            leaf = _Node(node, next(self._uids))
            leaf.tokens = key[done * self.page_size :]
            leaf.slots = list(slots[done:])
            leaf.hashes = list(hashes[done:])
            leaf.last_access = now
            node.children[self._page_key(leaf.tokens)] = leaf
            self._total += n - done
            self._evictable += n - done  # new nodes are unlocked
        return done

    def _page_key(self, tokens: list[int]) -> tuple[int, ...]:
        return tuple(tokens[: self.page_size])

    def _walk(self, key: list[int], now: int) -> tuple[_Node, list[int], list[str]]:
        """Follow `key` (whole pages) down the tree, splitting at a partial node match.

        Returns the deepest matched node and the slots/hashes of the matched pages.
        """
        node, pos, slots, hashes = self.root, 0, [], []
        node.last_access = now
        while pos < len(key):
            child = node.children.get(self._page_key(key[pos:]))
            if child is None:
                break
            same = self._common_pages(child.tokens, key, pos)
            assert same > 0, "child is keyed by its first page, so that page matched"
            if same < child.num_pages:
                child = self._split(child, same)
            child.last_access = now
            slots += child.slots
            hashes += child.hashes
            pos += same * self.page_size
            node = child
        return node, slots, hashes

    def _common_pages(self, node_tokens: list[int], key: list[int], pos: int) -> int:
        """Number of whole pages that `node_tokens` and `key[pos:]` share from the start."""
        ps = self.page_size
        limit = min(len(node_tokens), len(key) - pos) // ps
        for i in range(limit):
            if node_tokens[i * ps : (i + 1) * ps] != key[pos + i * ps : pos + (i + 1) * ps]:
                return i
        return limit

    def _split(self, child: _Node, pages: int) -> _Node:
        """Cut `child` after `pages` pages; returns the new upper node holding those pages."""
        cut = pages * self.page_size
        upper = _Node(child.parent, next(self._uids))
        upper.tokens, child.tokens = child.tokens[:cut], child.tokens[cut:]
        upper.slots, child.slots = child.slots[:pages], child.slots[pages:]
        upper.hashes, child.hashes = child.hashes[:pages], child.hashes[pages:]
        # Every lock on child's path also covered the new upper node.
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        assert child.parent is not None
        child.parent.children[self._page_key(upper.tokens)] = upper
        upper.children[self._page_key(child.tokens)] = child
        child.parent = upper
        return upper

    # ---- locking ---------------------------------------------------------------------------

    def lock(self, node: _Node) -> None:
        """Protect `node` and its ancestors from eviction while a request uses them."""
        cur: _Node | None = node
        while cur is not None and cur is not self.root:
            if cur.lock_ref == 0:
                self._evictable -= cur.num_pages
            cur.lock_ref += 1
            cur = cur.parent

    def unlock(self, node: _Node) -> None:
        cur: _Node | None = node
        while cur is not None and cur is not self.root:
            assert cur.lock_ref > 0, "unlock without a matching lock"
            cur.lock_ref -= 1
            if cur.lock_ref == 0:
                self._evictable += cur.num_pages
            cur = cur.parent

    # ---- eviction --------------------------------------------------------------------------

    def evict(self, num_pages: int) -> list[int]:
        """Free at least `num_pages` LRU unlocked leaf pages (fewer if nothing else can go).

        The last leaf may be cut from its tail only, keeping its prefix cached.
        """
        heap = [(n.last_access, n.uid, n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_pages:
            _, _, leaf = heapq.heappop(heap)
            key = self._page_key(leaf.tokens)  # taken before the cut can empty the leaf
            take = min(leaf.num_pages, num_pages - len(freed))
            freed += self._cut_tail(leaf, take)
            parent = leaf.parent
            if leaf.num_pages == 0:
                assert parent is not None
                del parent.children[key]
                if parent is not self.root and not parent.children and parent.lock_ref == 0:
                    heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        return freed

    def _cut_tail(self, leaf: _Node, pages: int) -> list[int]:
        keep = leaf.num_pages - pages
        freed = leaf.slots[keep:]
        leaf.tokens = leaf.tokens[: keep * self.page_size]
        leaf.slots = leaf.slots[:keep]
        leaf.hashes = leaf.hashes[:keep]
        self._total -= pages
        self._evictable -= pages
        return freed

    def _leaves(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out
