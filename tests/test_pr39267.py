"""SGLang PR #39267's hazard and its fix, by hand: the hit query with a TRAILING_PAGES
side-car (hicache.agreement.hit_query).

0.5.23 (hybrid_cache_controller.py:1468-1516) MIN-reduces `len(operation.token_ids) //
page_size + 1` restorable flags and 23 pool verdicts: the tensor's size follows this rank's
request span. pr39267 agrees on a fixed-size [bound, metadata, verdicts] first, then on
flags sized by the agreed bound. The two-rank lockstep below pairs the ranks' tensors as
gloo does (by position; a size mismatch is an error), as the PR's reviewer did.
"""

from __future__ import annotations

import threading

import pytest
import torch

from hicache.agreement.hit_query import POOL_NAMES, agree_hit, flags, verdicts
from hicache.agreement.protocols import make_protocol
from hicache.spec.config import HiCacheConfig
from hicache.spec.cost_model import Setting, expected_per_request, hit_query_rounds
from tests.helpers import case, run_cases
from tests.test_counts import N_REQUESTS, PREFIX, STORAGE
from tests.test_counts import _check_layout as check_contract


class SizeMismatch(RuntimeError):
    pass


class Pairing:
    """Two ranks' hit-query reductions paired as gloo pairs them: the i-th of one rank with
    the i-th of the other, MIN element-wise; tensors of different sizes fail both."""

    def __init__(self):
        self.barrier = threading.Barrier(2, timeout=5.0)
        self.sent: dict[tuple[int, int], torch.Tensor] = {}
        self.sizes: list[list[int]] = [[], []]

    def rank(self, r: int):
        pairing = self

        class Comm:
            def all_reduce_groups(self, t, op, groups, site, rid=None):
                assert site == "hit_query" and groups == GROUPS
                pairing.exchange(r, t)

        return Comm()

    def exchange(self, r: int, t: torch.Tensor) -> None:
        i = len(self.sizes[r])
        self.sizes[r].append(t.numel())
        self.sent[(r, i)] = t.clone()
        self.barrier.wait()
        other = self.sent[(1 - r, i)]
        if other.numel() != t.numel():
            raise SizeMismatch(f"{self.sizes[0][i]} vs {self.sizes[1][i]} elements")
        t.copy_(torch.minimum(t, other))


GROUPS = ("prefetch", "prefetch_pp")


def two_ranks(shape: str, ranks: list[tuple[int, int]]) -> list[tuple[int, list[int]]]:
    """(agreed hit pages, sizes of its tensors) on each of two ranks with (hit, span) pages;
    raises SizeMismatch as gloo would fail the pair."""
    pairing, out, errors = Pairing(), [None, None], []

    def run(r):
        try:
            out[r] = agree_hit(shape, pairing.rank(r), GROUPS, "r0", *ranks[r])
        except SizeMismatch as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10.0)
    if errors:
        raise errors[0]
    return [(out[r], pairing.sizes[r]) for r in (0, 1)]


def test_span_mask_is_sized_by_each_ranks_own_span():
    """0.5.23: span 16 (stage 0 matched 8 pages more) against 24: 17 + 23 against
    25 + 23 elements; paired, gloo fails."""
    assert POOL_NAMES == 23 and len(verdicts(8, 8)) == 23
    assert len(flags(16, 8)) == 17 and flags(3, 2) == [1, 1, 1, 0]
    with pytest.raises(SizeMismatch, match="40 vs 48"):
        two_ranks("span_mask", [(8, 16), (16, 24)])


def test_span_mask_agrees_when_the_spans_agree():
    assert two_ranks("span_mask", [(8, 16), (5, 16)]) == [(5, [40]), (5, [40])]


@pytest.mark.parametrize("spans", [(16, 24), (16, 16), (3, 400)])
def test_bounded_mask_sizes_are_equal_whatever_the_spans(spans):
    """pr39267: [bound, metadata, 23 verdicts] (25 elements) on every rank, then the flags
    of the agreed bound (8): 9 elements on every rank, and the same agreed hit."""
    got = two_ranks("bounded_mask", [(8, spans[0]), (16, spans[1])])
    assert got == [(8, [25, 9]), (8, [25, 9])]


def test_min_shape_is_one_scalar():
    assert two_ranks("min", [(8, 16), (16, 24)]) == [(8, [1]), (8, [1])]


def test_which_protocol_uses_which_shape():
    """Only with a TRAILING_PAGES side-car; every other pool keeps the scalar MIN."""
    shapes = {p: make_protocol(p, "timeout").hit_shape("trailing_pages")
              for p in ("pr36425", "sglang-0.5.23", "pr39267", "pr39903")}
    assert shapes == {"pr36425": "min", "sglang-0.5.23": "span_mask",
                      "pr39267": "bounded_mask", "pr39903": "min"}
    assert make_protocol("pr39267", "timeout").hit_shape("all_pages") == "min"


@pytest.mark.parametrize(("tp", "pp", "per"), [(2, 1, 1), (2, 2, 2), (1, 2, 1)])
def test_hit_query_counts_by_hand(tp, pp, per):
    """pr39267 with a trailing side-car: two reductions, each T + P; 0.5.23 one."""
    assert hit_query_rounds("pr39267", True) == 2 and hit_query_rounds("pr39267", False) == 1
    assert hit_query_rounds("sglang-0.5.23", True) == 1
    for proto, rounds in (("pr39267", 2), ("sglang-0.5.23", 1)):
        e = expected_per_request(Setting(proto, "wait_complete", tp, pp, extra_pool=True,
                                         trailing_sidecar=True),
                                 3, 8, True, True)
        assert (e.hit_query, e.ack, e.decision) == (rounds * per, 2 * per, 0)
    e = expected_per_request(Setting("pr39267", "wait_complete", tp, pp, trailing_sidecar=True),
                             3, 0, False, False)
    assert e.hit_query == 0  # no prefetch issued: no query


def test_config_needs_the_side_car_and_pp_for_the_skew():
    with pytest.raises(ValueError, match="needs extra_pool"):
        HiCacheConfig(sidecar_hit_policy="trailing_pages")
    with pytest.raises(ValueError, match="sidecar_hit_policy must be"):
        HiCacheConfig(sidecar_hit_policy="sparse")
    with pytest.raises(ValueError, match="span_skew needs PP > 1"):
        HiCacheConfig(hazard="span_skew")


# ---- on real gloo groups: the count contract with a trailing side-car ----------------------

TRAIL = {"extra_pool": True, "sidecar_hit_policy": "trailing_pages"}
VARIANTS = [("pr39267", "wait_complete", "trail"), ("pr39267", "timeout", "trail"),
            ("sglang-0.5.23", "wait_complete", "trail")]


def _cases(tp: int, pp: int) -> list[dict]:
    return [case({"protocol": p, "policy": q, "tp": tp, "pp": pp, **TRAIL}, STORAGE,
                 n=N_REQUESTS, prefix_tokens=PREFIX, new_tokens=64) for p, q, _ in VARIANTS]


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_contract_tp2():
    """Request by request and call site, the cost model's counts (pr39267's hit query
    twice, 0.5.23's once); counter = torch's sequence numbers = the flight recorder."""
    results = dict(zip(VARIANTS, run_cases(2, _cases(2, 1), timeout_s=100,
                                           flight_recorder=True), strict=True))
    for variant in VARIANTS:
        check_contract(results, variant, 2, 1)
        want = 2 if variant[0] == "pr39267" else 1
        assert all(r.get("coll_hit_query", 0) == want for r in results[variant][0]["rows"])


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_contract_tp2pp2():
    """TP2 x PP2: each reduction over TP, then PP: 4 hit-query collectives a request on
    every rank for pr39267, 2 for 0.5.23 (equal spans: no mismatch)."""
    results = dict(zip(VARIANTS, run_cases(4, _cases(2, 2), timeout_s=150,
                                           flight_recorder=True), strict=True))
    for variant in VARIANTS:
        check_contract(results, variant, 2, 2)
        want = 4 if variant[0] == "pr39267" else 2
        for res in results[variant]:
            assert all(r.get("coll_hit_query", 0) == want for r in res["rows"])
