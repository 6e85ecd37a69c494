"""The workload is seeded, shaped as documented, and puts every prefix in storage."""

import pytest

from bench.run.workload import WorkloadSpec, build
from hicache.memory.hashing import page_hashes


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


def test_burst_and_bystanders():
    import math

    wl = build(WorkloadSpec(requests=3, rate_rps=math.inf, bystanders=4, bystander_tokens=100,
                            output_tokens=7))
    prefetch = [r for r in wl.requests if r.kind == "prefetch"]
    by = [r for r in wl.requests if r.kind == "bystander"]
    assert all(r.arrival_offset_s == 0.0 for r in prefetch)  # an infinite rate is a burst
    assert len(by) == 4 and all(len(r.tokens) == 100 for r in by)
    assert all(r.output_tokens == 7 for r in wl.requests)
    stored = {h for hist in wl.histories for h in page_hashes(hist, 64)}
    assert not any(h in stored for r in by for h in page_hashes(r.tokens, 64))
    arrivals = [r.arrival_offset_s for r in wl.requests]
    assert arrivals == sorted(arrivals)
    assert len(build(WorkloadSpec(requests=3, bystanders=4), n=2, bystanders=0).requests) == 2


def test_plan_sizes_storage_and_forward_from_the_model():
    from bench.run.plan import Cell, RunPlan
    from hicache.spec.shapes import SHAPES
    from hicache.spec.step_time import roofline

    cell = Cell(0, 0, 8.0, "timeout", "pr36425")
    plan = RunPlan(tp=2, model="llama3-8b", gpu="h100")
    cfg = plan.config(cell)
    assert cfg.storage.kv_page_bytes == 4 * 2**20  # 8 MiB per page over 2 TP ranks
    assert cfg.step_time == roofline(SHAPES["llama3-8b"], 2, "h100")
    assert plan.forward == "modelled:h100"
    assert RunPlan(step_ms=20.0).config(cell).step_time.decode_base_ms == 20.0
    cuda = RunPlan(device="cuda")
    assert not cuda.config(cell).step_time.enabled and cuda.forward == "real"
    assert not RunPlan(gpu="none").config(cell).step_time.enabled
