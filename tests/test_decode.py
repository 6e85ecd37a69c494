"""The serving loop on one rank (no process group: every collective is a no-op): decode
batches join and leave, prefill runs first, the running-batch bound gates the walk, and the
CPU stand-in sleeps out the modelled forward time."""

from __future__ import annotations

import math
import time

import pytest
import torch

from hicache.comm.groups import Groups, Layout
from hicache.memory.storage import StorageSpec
from hicache.serve.scheduler import Request
from hicache.serve.system import System
from hicache.spec.config import HiCacheConfig
from hicache.spec.step_time import StepTimeModel
from tests.helpers import prompts

pytestmark = pytest.mark.timeout(60)


def serve(requests: list[Request], prefixes: list[list[int]] = (), **cfg_kw):
    """One rank serving `requests` with `prefixes` in storage; returns its stats."""
    torch.set_num_threads(1)
    cfg = HiCacheConfig(protocol="pr36425", policy="wait_complete",
                        storage=StorageSpec(latency_ms=cfg_kw.pop("latency_ms", 0.0)), **cfg_kw)
    layout = Layout(0, 1, 1)
    system = System(cfg, layout, Groups(layout, "gloo", 10.0), torch.device("cpu"))
    system.populate(list(prefixes))
    stats = system.run(requests)
    system.close()
    return stats


def short(i: int, out: int, at: float = 0.0) -> Request:
    """A bystander: 128 fresh tokens, nothing to prefetch."""
    return Request(f"b{i}", [900_000 + 1000 * i + j for j in range(128)], at, out, "bystander")


def test_every_request_gets_its_tokens_and_leaves():
    stats = serve([short(i, 5) for i in range(4)])
    for r in stats.requests.values():
        assert len(r.token_times) == 5 and r.finished == r.token_times[-1]
        assert r.first_token == r.token_times[0]
        assert r.token_times == sorted(r.token_times)
    kinds = [s.kind for s in stats.steps if s.kind != "idle"]
    assert kinds[0] == "prefill"  # all four arrive together: one prefill, then 4 decodes
    assert kinds.count("decode") == 4
    decode = [s for s in stats.steps if s.kind == "decode"]
    assert all(s.running == 4 for s in decode)
    rows = {r["rid"]: r for r in stats.request_rows()}
    assert all(len(r["itl_s"]) == 4 for r in rows.values())


def test_prefill_runs_first_and_running_requests_wait():
    # b1 arrives while b0 decodes: that step is b1's prefill, and b0 gets no token in it.
    stats = serve([short(0, 40), short(1, 2, at=0.03)])
    b0, b1 = stats.requests["b0"], stats.requests["b1"]
    prefill = next(s for s in stats.steps if s.kind == "prefill" and s.t >= b1.arrival)
    after = next((s.t for s in stats.steps if s.t > prefill.t), math.inf)
    # b1's first token comes out of that prefill: stamped after it starts and before the
    # next step does (an order on one clock, not a tolerance a stalled VM can break)
    assert prefill.t <= b1.first_token <= after
    assert not any(prefill.t <= t <= prefill.t_end for t in b0.token_times[1:])
    assert len(b0.token_times) == 40 and len(b1.token_times) == 2


def test_running_bound_gates_the_walk():
    """max_running_requests = 2: never more than 2 running, and a step whose batch is full
    walks no queue, so it polls no waiting prefetch (SGLang's batch_is_full gate)."""
    # Decode steps of 5 ms x 30 tokens keep two requests running for ~150 ms, while six
    # serial 20 ms reads keep later prefetches pending: the batch is full while they wait,
    # whatever the machine's speed.
    ps = prompts(6, 512, 64)
    reqs = [Request(f"r{i}", p, 0.0, 30) for i, p in enumerate(ps)]
    stats = serve(reqs, [p[:512] for p in ps], max_running_requests=2, latency_ms=20.0,
                  step_time=StepTimeModel(decode_base_ms=5.0))
    assert max(s.running for s in stats.steps) == 2
    full = [s for s in stats.steps if s.running == 2]
    assert full and all(s.polled == 0 and s.scheduled == 0 for s in full)
    assert any(s.prefetching > 0 for s in full), "prefetches waited while the batch was full"
    assert all(len(r.token_times) == 30 for r in stats.requests.values())
    # the walk also stops at the free slots: no prefill ever schedules more than 2
    assert max(s.scheduled for s in stats.steps) <= 2


def test_modelled_forward_time_is_slept_out():
    model = StepTimeModel(prefill_base_ms=20.0, decode_base_ms=10.0, decode_ms_per_ktoken=5.0)
    t0 = time.monotonic()
    stats = serve([short(0, 3)], step_time=model)
    prefill = next(s for s in stats.steps if s.kind == "prefill")
    decode = [s for s in stats.steps if s.kind == "decode"]
    assert prefill.forward_s >= 0.020
    # a decode step reads the prompt (128) plus the tokens so far: 10 + 5 x ~0.13 ms
    assert all(s.forward_s >= 0.0106 for s in decode) and len(decode) == 2
    assert [s.context_tokens for s in decode] == [129, 130]
    assert time.monotonic() - t0 >= 0.040
