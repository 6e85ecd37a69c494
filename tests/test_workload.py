"""The workload is seeded, shaped as documented, and puts every prefix in storage."""

import pytest

from bench.workload import WorkloadSpec, build
from hicache.hashing import page_hashes


def test_same_seed_same_requests_and_poisson_order():
    spec = WorkloadSpec(requests=10, seed=3)
    a, b = build(spec), build(spec)
    assert [(r.rid, r.tokens, r.arrival_offset_s) for r in a.requests] == \
        [(r.rid, r.tokens, r.arrival_offset_s) for r in b.requests]
    arrivals = [r.arrival_offset_s for r in a.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    assert build(WorkloadSpec(requests=10, seed=4)).requests[0].tokens != a.requests[0].tokens


def test_first_turn_prefix_is_in_storage_and_new_tokens_are_not():
    spec = WorkloadSpec(requests=4, history_rounds=2, request_tokens=256, output_tokens=64)
    wl = build(spec)
    stored = {h for hist in wl.histories for h in page_hashes(hist, 64)}
    for r in wl.requests:
        hashes = page_hashes(r.tokens, 64)
        assert len(r.tokens) == 2 * 320 + 256
        assert all(h in stored for h in hashes[:10])  # the 640-token history
        assert not any(h in stored for h in hashes[10:])  # this turn's new tokens


def test_later_turns_extend_the_same_conversation():
    wl = build(WorkloadSpec(requests=4, rounds=2, history_rounds=1))
    by_rid = {r.rid: r.tokens for r in wl.requests}
    assert by_rid["c001t1"][: len(by_rid["c001t0"])] == by_rid["c001t0"]
    assert len(wl.histories) == 2  # two clients, two turns each


@pytest.mark.parametrize("field,value", [("requests", 0), ("rate_rps", -1.0), ("rounds", 0)])
def test_bad_spec_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        WorkloadSpec(**{field: value})
