"""Page-granular radix tree of HiCache's prefix cache: host pages, and with the device tier
on (hicache.cache.tiers) the device pages of the same prefixes.

Each node holds a run of whole pages: their tokens and one page hash per page, one host slot
per page when the run is on the host (`slots`, empty when it is not) and one device slot per
page when it is on the device (`dev`, None when it is not). Only whole pages are ever stored
or matched, so a node boundary always falls on a page boundary and a partial match splits a
node exactly there. Without the device tier every node is on the host and `dev` stays None.

Tiers, as SGLang's unified radix tree keeps them (unified_tree_core.py): the nodes on the
device form a subtree from the root (device eviction takes device leaves only), and so do
the nodes backed up to the host (a backup covers the unbacked ancestors first). A node is
on the device, on the host or both; one on neither is removed.

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
        "dev",
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
        self.dev: list[int] | None = None  # device slots, when the run is on the device

    @property
    def num_pages(self) -> int:
        return len(self.hashes)

    @property
    def on_host(self) -> bool:
        return bool(self.slots) or not self.hashes


@dataclass(frozen=True)
class MatchResult:
    pages: int  # matched pages, in any tier
    slots: list[int]  # host slots of the leading pages on the host
    hashes: list[str]
    last_hash: str | None
    node: _Node = field(repr=False, compare=False)  # opaque handle for lock/unlock
    dev_slots: list[int] = field(default_factory=list)  # the leading pages on the device
    # Host slots of the matched pages past the device prefix (all on the host).
    host_tail: list[int] = field(default_factory=list)

    @property
    def device_pages(self) -> int:
        return len(self.dev_slots)


class RadixTree:
    """Host radix tree. Not thread-safe: only the scheduler thread touches it."""

    def __init__(self, page_size: int) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be > 0, got {page_size}")
        self.page_size = page_size
        self._uids = itertools.count()
        self._clock = itertools.count(1)
        self.root = _Node(None, next(self._uids))
        self._total = 0  # pages on the host
        self._evictable = 0  # pages on the host that no request locks
        self._device_total = 0  # pages on the device

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
        path = self._walk(list(tokens[:whole]), next(self._clock))
        hashes = [h for n in path for h in n.hashes]
        host = _leading(path, lambda n: n.on_host)
        dev = _leading(path, lambda n: n.dev is not None)
        return MatchResult(len(hashes), [s for n in host for s in n.slots], hashes,
                           hashes[-1] if hashes else None, path[-1] if path else self.root,
                           [s for n in dev for s in n.dev],
                           [s for n in path[len(dev):] for s in n.slots])

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
        path = self._walk(key, now)
        node = path[-1] if path else self.root
        done = sum(p.num_pages for p in path)
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

    def _walk(self, key: list[int], now: int) -> list[_Node]:
        """Follow `key` (whole pages) down the tree, splitting at a partial node match.

        Returns the matched nodes from the root's child down (the root itself excluded).
        """
        node, pos, path = self.root, 0, []
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
            path.append(child)
            pos += same * self.page_size
            node = child
        return path

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
        if child.dev is not None:
            upper.dev, child.dev = child.dev[:pages], child.dev[pages:]
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
                self._evictable -= len(cur.slots)
            cur.lock_ref += 1
            cur = cur.parent

    def unlock(self, node: _Node) -> None:
        cur: _Node | None = node
        while cur is not None and cur is not self.root:
            assert cur.lock_ref > 0, "unlock without a matching lock"
            cur.lock_ref -= 1
            if cur.lock_ref == 0:
                self._evictable += len(cur.slots)
            cur = cur.parent

    # ---- host eviction -----------------------------------------------------------------------

    def evict(self, num_pages: int, pinned=None) -> list[int]:
        """Free at least `num_pages` LRU unlocked host leaf pages (fewer if nothing else can
        go); returns their host slots. A leaf still on the device is no host leaf (SGLang
        evicts host-only leaves), nor is one `pinned(node)` holds (a storage write reads it).

        The last leaf may be cut from its tail only, keeping its prefix cached.
        """
        def evictable(n: _Node) -> bool:
            return (n.lock_ref == 0 and n.dev is None and not n.children
                    and not (pinned and pinned(n)))

        heap = [(n.last_access, n.uid, n) for n in self._leaves() if evictable(n)]
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
                if parent is not self.root and evictable(parent):
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

    # ---- the device tier (hicache.cache.tiers) ---------------------------------------------------

    def attach_device(self, tokens: Sequence[int], hashes: list[str], dev: list[int],
                      start: int) -> tuple[list[int], list[_Node]]:
        """After a prefill the first len(dev) pages of `tokens` are on the device: pages
        before `start` already were (the request's locked device hit, dev[:start] are the
        tree's own slots); dev[start:] are this request's new device slots, for host pages it
        loaded back and pages it computed (a new leaf, on the device only). Returns the slots
        of pages another request put on the device meanwhile (the caller frees them) and the
        path of nodes that now holds the pages."""
        n, ps = len(dev), self.page_size
        key = list(tokens[: n * ps])
        path, pos, dup = self._walk(key, next(self._clock)), 0, []
        for node in path:
            k = node.num_pages
            if node.dev is None:
                node.dev = dev[pos: pos + k]
                self._device_total += k
            else:
                dup += [d for i, d in enumerate(dev[pos: pos + k]) if pos + i >= start]
            pos += k
        if pos < n:
            parent = path[-1] if path else self.root
            leaf = _Node(parent, next(self._uids))
            leaf.tokens, leaf.hashes, leaf.dev = key[pos * ps:], list(hashes[pos:n]), dev[pos:]
            leaf.last_access = parent.last_access
            parent.children[self._page_key(leaf.tokens)] = leaf
            self._device_total += n - pos
            path.append(leaf)
        return dup, path

    def set_host(self, node: _Node, slots: list[int]) -> None:
        """A device node's pages got host copies (a backup to the host)."""
        assert not node.slots and len(slots) == node.num_pages
        node.slots = list(slots)
        self._total += len(slots)
        if node.lock_ref == 0:
            self._evictable += len(slots)

    @property
    def device_pages(self) -> int:
        return self._device_total

    def evictable_device_pages(self) -> int:
        """Device pages no request locks: evict_device can free them all (an unlocked node
        has no locked descendant, so its device subtree goes leaf by leaf)."""
        return sum(n.num_pages for n in self._nodes()
                   if n is not self.root and n.dev is not None and n.lock_ref == 0)

    def unlocked_device_pages_on_path(self, node: _Node) -> int:
        """Device pages on the path root..node that no request locks yet: locking `node`
        takes them out of evictable_device_pages."""
        pages = 0
        while node is not None and node is not self.root:
            if node.dev is not None and node.lock_ref == 0:
                pages += node.num_pages
            node = node.parent
        return pages

    def evict_device(self, num_pages: int, write_back=None) -> tuple[list[int], list[int]]:
        """Free at least `num_pages` device pages from LRU unlocked device leaves, whole
        nodes (SGLang evict_device_leaf); returns (device slots, host slots) freed. A leaf
        with host copies is demoted to the host. One without: `write_back(node)` may copy it
        to the host first (write_back policy); otherwise it is on no tier and goes, with its
        subtree (write_through drops an unbacked leaf), and the subtree's host pages."""
        def evictable(n: _Node) -> bool:
            return (n is not self.root and n.dev is not None and n.lock_ref == 0
                    and all(c.dev is None for c in n.children.values()))

        heap = [(n.last_access, n.uid, n) for n in self._nodes() if evictable(n)]
        heapq.heapify(heap)
        dev, host = [], []
        while heap and len(dev) < num_pages:
            _, _, node = heapq.heappop(heap)
            if not node.slots and write_back is not None:
                write_back(node)
            dev += node.dev
            self._device_total -= node.num_pages
            node.dev = None
            parent = node.parent
            if not node.slots:
                host += self._remove_subtree(node)
            if evictable(parent):
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        return dev, host

    def _remove_subtree(self, node: _Node) -> list[int]:
        """Unlinks an unlocked node and everything below it; returns their host slots."""
        freed, stack = [], [node]
        while stack:
            cur = stack.pop()
            assert cur.lock_ref == 0, "a locked node cannot go"
            assert cur is node or cur.dev is None, "device nodes form a subtree from the root"
            freed += cur.slots
            stack.extend(cur.children.values())
        assert node.parent is not None
        del node.parent.children[self._page_key(node.tokens)]
        self._total -= len(freed)
        self._evictable -= len(freed)
        return freed

    def _nodes(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _leaves(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out


def _leading(path: list[_Node], keep) -> list[_Node]:
    """The nodes of `path` up to the first one `keep` rejects."""
    out = []
    for node in path:
        if not keep(node):
            break
        out.append(node)
    return out
