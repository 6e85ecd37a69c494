"""A serve ends only when every rank is idle (Comm.all_idle, the harness's own agreement).

pre27010 at PP > 1 drains its hit and ack queues stage by stage (SGLang 0.5.18), so a PP
stage whose storage is slower can still hold a prefetch when stage 0, whose view the
per-step agreement carries, has none. Ending the serve then would leave that stage's host
slots allocated (a leak by the self-check's rule) and its prefetch undecided.
"""

from __future__ import annotations

import pytest

from tests.helpers import case, run_cases

pytestmark = pytest.mark.dist

# Rank 1's storage is ~2.2x slower than rank 0's (seed 3: rank factors 1.14 and 2.54).
SLOW_STAGE_1 = {"latency_ms": 15.0, "jitter": 3.0, "seed": 3}


@pytest.mark.timeout(120)
def test_a_lagging_pp_stage_finishes_its_prefetches_before_the_serve_ends():
    c = case({"protocol": "pre27010", "policy": "wait_complete", "tp": 1, "pp": 2},
             SLOW_STAGE_1, n=6, prefix_tokens=512, new_tokens=64)
    for per_rank in run_cases(2, [c, c], timeout_s=100):
        for rank, res in enumerate(per_rank):
            ended = [r["terminated_by"] for r in res["rows"]]
            assert "none" not in ended, f"rank {rank} left a prefetch undecided: {ended}"
            assert res["host_slots_unaccounted"] == 0, f"rank {rank}: host slots leaked"
            # The harness's agreement is on the default group: no system group moved for it.
            for group, (counted, seq) in res["crosscheck"].items():
                assert counted == seq, (rank, group)
