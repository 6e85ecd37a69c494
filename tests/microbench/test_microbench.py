"""Micro-benchmarks (pytest-benchmark): one check_prefetch_progress poll per protocol x
policy on a real 2-rank gloo group, radix-tree match/insert, and the page hash chain.

Run with `python -m bench microbench RUN_DIR` (or `pytest -m microbench tests/microbench
--benchmark-enable`); the normal test run deselects them. Every benchmark records what it
measured in extra_info, and the poll benchmarks also check it: collectives per poll equal
the cost model, and both ranks returned the same answers.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest
import torch

from hicache.comm.comm import CollectiveCounter
from hicache.memory.events import EventLog
from hicache.memory.hashing import page_hashes
from hicache.memory.radix_tree import RadixTree
from hicache.spec.cost_model import POLICIES, PROTOCOLS, decision_per_poll
from tests.microbench.pollbench import RID, TP, PollGroup, counts, install_pending, more

pytestmark = pytest.mark.microbench

POLL_ROUNDS = 200  # timed polls per protocol x policy, each one round
POLL_WARMUP = 50  # untimed polls first (same lock-step, so the peer's count matches)
PAGE = 64


@pytest.fixture(scope="module")
def poll_group():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    group = PollGroup()
    try:
        yield group
    finally:
        group.close()
        torch.set_num_threads(threads)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_poll(benchmark, poll_group, protocol, policy):
    """Median cost of one poll of a pending prefetch on rank 0 (TP2, PP1)."""
    cache = poll_group.start(protocol, policy)
    results = []
    poll = cache.check_prefetch_progress

    def setup():
        install_pending(cache)
        more(1)  # both ranks enter the timed poll together

    def target():
        results.append(poll(RID))

    try:
        for _ in range(POLL_WARMUP):
            setup()
            target()
        benchmark.pedantic(target, setup=setup, rounds=POLL_ROUNDS, iterations=1,
                           warmup_rounds=0)
        peer = poll_group.finish()
    except BaseException:
        poll_group.broken = True
        raise
    mine = counts(cache)
    polls = len(results)
    ar, hop = decision_per_poll(protocol, policy, TP, 1)
    benchmark.extra_info.update(
        kind="poll", protocol=protocol, policy=policy, tp=TP, pp=1, polls=polls,
        decision_collectives_per_poll=mine["decision"] / polls,
        completion_collectives_per_poll=mine["completion"] / polls,
        stopped_per_poll=sum(results) / polls,
        ranks_agree=peer["results"] == results and peer["counts"] == mine)
    assert peer["results"] == results, "the ranks' polls decided differently"
    assert peer["counts"] == mine, "the ranks issued different collectives"
    assert mine["decision"] == polls * (ar + hop), "decision collectives differ from the model"


def _prompts(rng: random.Random, n: int, shared_pages: int, own_pages: int) -> list[list[int]]:
    """n prompts over a few system prompts: a shared head, then private pages."""
    heads = [[rng.randrange(50_000) for _ in range(shared_pages * PAGE)] for _ in range(8)]
    return [rng.choice(heads) + [rng.randrange(50_000) for _ in range(own_pages * PAGE)]
            for _ in range(n)]


@pytest.fixture(scope="module")
def tree_and_prompts():
    """A host tree of 512 requests (8 shared 16-page heads, 16 private pages each)."""
    rng = random.Random(0)
    prompts = _prompts(rng, 512, 16, 16)
    tree = RadixTree(PAGE)
    slot = 0
    for p in prompts:
        pages = len(p) // PAGE
        tree.insert(p, list(range(slot, slot + pages)), [f"h{slot + i}" for i in range(pages)])
        slot += pages
    return tree, prompts, rng


def test_radix_match(benchmark, tree_and_prompts):
    """Longest-prefix match of a 32-page prompt that is fully cached."""
    tree, prompts, _ = tree_and_prompts
    prompt = prompts[100]
    m = benchmark(tree.match, prompt)
    assert m.pages == len(prompt) // PAGE
    benchmark.extra_info.update(kind="radix_match", pages=m.pages,
                                tree_pages=tree.total_pages)


def test_radix_insert(benchmark, tree_and_prompts):
    """Insert of a new 32-page prompt sharing a cached 16-page head (one new leaf)."""
    tree, prompts, _ = tree_and_prompts
    head = prompts[0][: 16 * PAGE]
    slots, hashes = list(range(32)), [f"n{i}" for i in range(32)]
    fresh = itertools.count(1_000_000, 16 * PAGE)

    def setup():  # a private tail nobody inserted before (untimed)
        start = next(fresh)
        return (head + list(range(start, start + 16 * PAGE)),), {}

    overlap = benchmark.pedantic(lambda p: tree.insert(p, slots, hashes), setup=setup,
                                 rounds=2000, iterations=1, warmup_rounds=50)
    assert overlap == 16
    benchmark.extra_info.update(kind="radix_insert", pages=32, shared_pages=16)


def test_hash_chain(benchmark):
    """page_hashes over 64 pages of 64 tokens (SHA256 chain)."""
    tokens = list(range(64 * PAGE))
    out = benchmark(page_hashes, tokens, PAGE)
    assert len(out) == 64
    benchmark.extra_info.update(kind="hash_chain", pages=64, page_size=PAGE)


@pytest.mark.parametrize("timeline", [False, True])
def test_collective_record(benchmark, timeline):
    """The counter's record of one collective, without and with the timeline (the event the
    timeline adds: docs/timeline.md, "Cost"); 1000 calls per round."""
    counter = CollectiveCounter(EventLog() if timeline else None)

    def target():
        for _ in range(1000):
            counter.record("decision", "tp_cpu", 1, "r0", 0.001, 5.0)

    benchmark.pedantic(target, rounds=50, iterations=1, warmup_rounds=2)
    benchmark.extra_info.update(kind="collective_record", timeline=timeline, calls=1000)


def test_event_span(benchmark):
    """One EventLog.span with two clock reads, as a poll or storage read records it; 1000
    per round (the timeline's cost per event on the recording thread)."""
    log = EventLog()

    def target():
        for _ in range(1000):
            t0 = time.monotonic()
            log.span("read", t0, time.monotonic(), "r0", "kv", 128, 128, 65536)

    benchmark.pedantic(target, rounds=50, iterations=1, warmup_rounds=2)
    benchmark.extra_info.update(kind="event_span", calls=1000)
