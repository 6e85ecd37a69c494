"""The overhead model's arithmetic against hand-computed numbers (docs/design.md section 8)."""

from __future__ import annotations

import math

import pytest

from bench.analysis.overhead import (
    extra_step_ms,
    hop_ms,
    inflation,
    intervals_overlap,
    per_poll_ms,
    scaled_allreduce_ms,
)
from hicache.spec.cost_model import Setting


def test_per_poll_cost_by_protocol():
    # c_ar 0.3 ms, c_hop 0.1 ms
    assert per_poll_ms("pr27010", "wait_complete", 2, 1, 0.3, 0.1) == pytest.approx(0.3)
    assert per_poll_ms("pr27010", "best_effort", 2, 2, 0.3, 0.1) == pytest.approx(0.4)
    assert per_poll_ms("pr27010", "timeout", 2, 4, 0.3, 0.1) == pytest.approx(0.3 + 3 * 0.1)
    assert per_poll_ms("pr36425", "wait_complete", 8, 4, 0.3, 0.1) == 0.0
    assert per_poll_ms("pr36425", "timeout", 2, 1, 0.3, 0.1) == pytest.approx(0.3)
    assert per_poll_ms("pre27010", "timeout", 2, 2, 0.3, 0.1) == pytest.approx(0.3)  # no hop
    assert per_poll_ms("step-clock", "timeout", 2, 2, 0.3, 0.1) == 0.0
    assert per_poll_ms("pr27010", "wait_complete", 1, 1, 0.3, 0.1) == 0.0  # TP1: no AR


def test_extra_step_time_is_polls_times_cost():
    # The model of docs/design.md section 8.2: 26 requests polled per step at 0.3 ms each
    # add 7.8 ms per step for pr27010
    assert extra_step_ms(Setting("pr27010", "wait_complete", 2, 1), 26, 0.3, 0.15) == \
        pytest.approx(7.8)
    assert extra_step_ms(Setting("pr36425", "wait_complete", 2, 1), 26, 0.3, 0.15) == 0.0
    # pre27010 adds its completion MINs: 0.5 per step at 0.3 ms
    got = extra_step_ms(Setting("pre27010", "wait_complete", 2, 1), 10, 0.3, 0.15, 0.5)
    assert got == pytest.approx(10 * 0.3 + 0.5 * 0.3)


def test_pipelined_per_step_min_is_hidden():
    """pr39903: pr36425's polls, less the per-step MIN it no longer waits for: one TP MIN
    a step at TP2 (0.3 ms), two on stage 0 at TP2 x PP2, none at TP1."""
    def pr39903(policy: str, tp: int, pp: int) -> Setting:
        return Setting("pr39903", policy, tp, pp)

    assert extra_step_ms(pr39903("wait_complete", 2, 1), 26, 0.3, 0.15) == pytest.approx(-0.3)
    assert extra_step_ms(pr39903("timeout", 2, 1), 4, 0.3, 0.15) == pytest.approx(4 * 0.3 - 0.3)
    assert extra_step_ms(pr39903("wait_complete", 2, 2), 5, 0.3, 0.1) == pytest.approx(-0.6)
    assert extra_step_ms(pr39903("wait_complete", 1, 1), 5, 0.3, 0.1) == 0.0


def test_allreduce_scaling():
    assert scaled_allreduce_ms(0.2, 2, 8) == pytest.approx(0.2 * 7)  # ring: p - 1 hops
    assert scaled_allreduce_ms(0.2, 2, 8, "log2") == pytest.approx(0.6)
    assert scaled_allreduce_ms(0.6, 4, 16, "ring") == pytest.approx(0.6 * 15 / 3)
    assert scaled_allreduce_ms(0.2, 2, 1) == 0.0
    with pytest.raises(ValueError, match="scaling"):
        scaled_allreduce_ms(0.2, 2, 4, "star")
    with pytest.raises(ValueError, match=">= 2 ranks"):
        scaled_allreduce_ms(0.2, 1, 4)


def test_hop_latency():
    assert hop_ms(0.3, 2, 0.05) == 0.05
    assert hop_ms(0.3, 2, None) == pytest.approx(0.15)
    assert hop_ms(0.9, 4, math.nan) == pytest.approx(0.9 / 3 / 2)


def test_inflation_and_overlap():
    assert inflation(7.8, 7.8) == pytest.approx(2.0)
    assert inflation(0.0, 5.0) == 1.0
    with pytest.raises(ValueError):
        inflation(1.0, 0.0)
    assert intervals_overlap((1, 2), (2, 3))
    assert not intervals_overlap((1, 2), (2.1, 3))
    assert not intervals_overlap((1, math.nan), (1, 2))
