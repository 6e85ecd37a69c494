"""Host radix tree: match, insert overlap, splits, LRU eviction and locking.

Page size 2 throughout so expectations are small enough to compute by hand.
"""

import pytest

from hicache.memory.radix_tree import RadixTree

PS = 2


def _hashes(slots):
    return [f"h{s}" for s in slots]


def _tree_with(tokens, slots):
    tree = RadixTree(PS)
    assert tree.insert(tokens, slots, _hashes(slots)) == 0
    return tree


def _count_pages(tree):
    total, evictable, stack = 0, 0, [tree.root]
    while stack:
        node = stack.pop()
        total += node.num_pages
        evictable += node.num_pages if node.lock_ref == 0 else 0
        stack.extend(node.children.values())
    return total, evictable


def _check_counters(tree):
    assert (tree.total_pages, tree.evictable_pages) == _count_pages(tree)


def test_empty_match():
    tree = RadixTree(PS)
    m = tree.match([1, 2, 3])
    assert (m.pages, m.slots, m.hashes, m.last_hash) == (0, [], [], None)
    assert m.node is tree.root


def test_match_whole_pages_only():
    tree = _tree_with([1, 2, 3, 4, 5, 6], [10, 11, 12])
    m = tree.match([1, 2, 3, 4, 5])  # the trailing 5 is a partial page
    assert (m.pages, m.slots, m.hashes, m.last_hash) == (2, [10, 11], ["h10", "h11"], "h11")
    m = tree.match([1, 2, 3, 9])  # second page differs in its last token
    assert (m.pages, m.slots) == (1, [10])
    assert tree.match([1, 9]).pages == 0
    _check_counters(tree)


def test_partial_match_splits_node():
    tree = _tree_with([1, 2, 3, 4, 5, 6], [10, 11, 12])
    m = tree.match([1, 2, 3, 4, 7, 7])
    assert m.pages == 2
    upper = tree.root.children[(1, 2)]
    assert (upper.tokens, upper.slots) == ([1, 2, 3, 4], [10, 11])
    assert upper.children[(5, 6)].slots == [12]
    assert m.node is upper
    assert tree.total_pages == 3
    assert tree.match([1, 2, 3, 4, 5, 6]).slots == [10, 11, 12]
    _check_counters(tree)


def test_insert_returns_overlap_and_keeps_tree_slots():
    tree = _tree_with([1, 2, 3, 4], [10, 11])
    # Pages (1,2),(3,4) already present: overlap 2, the new page 3 keeps slot 22.
    assert tree.insert([1, 2, 3, 4, 5, 6, 7], [20, 21, 22], ["a", "b", "c"]) == 2
    m = tree.match([1, 2, 3, 4, 5, 6])
    assert m.slots == [10, 11, 22]
    assert m.hashes == ["h10", "h11", "c"]
    # Diverging second page: overlap 1, a branch is created after a split.
    assert tree.insert([1, 2, 8, 8], [30, 31], ["x", "y"]) == 1
    assert tree.match([1, 2, 8, 8]).slots == [10, 31]
    assert tree.total_pages == 4
    # Inserting fewer pages than the tokens hold uses only len(slots) pages.
    assert tree.insert([9, 9, 9, 9], [40], ["z"]) == 0
    assert tree.match([9, 9, 9, 9]).pages == 1
    _check_counters(tree)


@pytest.mark.parametrize(
    "tokens,slots,hashes",
    [([1, 2, 3], [1, 2], ["a", "b"]), ([1, 2], [1], ["a", "b"]), ([1, 2], [1], [])],
)
def test_insert_bad_lengths(tokens, slots, hashes):
    with pytest.raises(ValueError):
        RadixTree(PS).insert(tokens, slots, hashes)


def test_evict_lru_leaf_first():
    tree = RadixTree(PS)
    tree.insert([1, 1, 2, 2], [10, 11], ["a", "b"])
    tree.insert([3, 3, 4, 4], [20, 21], ["c", "d"])
    tree.match([1, 1])  # refresh branch 1's first page only: the split leaf (2,2) stays old
    # LRU leaves: (2,2) and (3,3,4,4) both carry their insert time; (2,2) is older.
    assert tree.evict(1) == [11]
    assert tree.evict(1) == [21]  # tail of the (3,3,4,4) leaf, its head stays cached
    assert tree.match([3, 3, 4, 4]).slots == [20]
    assert tree.total_pages == 2
    _check_counters(tree)


def test_evict_cascades_to_parent_and_stops_when_empty():
    tree = _tree_with([1, 1, 2, 2], [10, 11])
    tree.match([1, 1, 5, 5])  # split into (1,1) -> (2,2)
    assert sorted(tree.evict(10)) == [10, 11]
    assert tree.total_pages == 0 and tree.root.children == {}
    assert tree.evict(1) == []


def test_locked_path_never_evicted():
    tree = RadixTree(PS)
    tree.insert([1, 1, 2, 2], [10, 11], ["a", "b"])
    tree.insert([1, 1, 3, 3], [12, 13], ["c", "d"])  # splits: (1,1) -> {(2,2), (3,3)}
    m = tree.match([1, 1, 2, 2])
    tree.lock(m.node)
    assert tree.evictable_pages == 1  # only (3,3)
    _check_counters(tree)
    assert tree.evict(4) == [13]
    assert tree.match([1, 1, 2, 2]).slots == [10, 11]
    tree.unlock(m.node)
    assert tree.evictable_pages == 2
    assert sorted(tree.evict(4)) == [10, 11]
    _check_counters(tree)


def test_lock_survives_later_split():
    tree = _tree_with([1, 1, 2, 2, 3, 3], [10, 11, 12])
    m = tree.match([1, 1, 2, 2, 3, 3])
    tree.lock(m.node)
    tree.match([1, 1, 9, 9])  # splits the locked node: the new upper part inherits the lock
    assert tree.evictable_pages == 0
    assert tree.evict(3) == []
    tree.unlock(m.node)
    assert tree.evictable_pages == 3
    _check_counters(tree)


def test_unlock_below_zero_asserts():
    tree = _tree_with([1, 1], [10])
    node = tree.match([1, 1]).node
    with pytest.raises(AssertionError):
        tree.unlock(node)


def test_bad_page_size():
    with pytest.raises(ValueError):
        RadixTree(0)
