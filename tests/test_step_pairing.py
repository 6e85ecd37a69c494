"""The step-paired design (hicache.cache.twin, bench run --pairing step): every poll asks the
cell's protocol and its twin back to back on the same facts, each timed.

Fast (2 gloo ranks, one launch): the twin leaves the system's counts and schedule as they
were (its collectives counted apart and added in the cross-check), a planted disagreement
fails the run, the balanced estimator recovers a known per-step delay within 10 % through
an order effect, a planted spin lands once a step before its side's first poll (by
construction, no clock) and makes that side's polls at least as long. Statistical (make
test-stats, not in make test, whose verdict must not be chance; it holds at 95 %): on a
quiet machine the planted per-step delay comes back from bench run, with the design's A/A
at 0."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from bench.analysis import paired
from bench.run.launch import LaunchError
from bench.rundir.rundir import RunDir
from hicache.spec.config import HiCacheConfig
from tests.helpers import case, run_cases
from tests.test_counts import N_REQUESTS, PREFIX, STORAGE
from tests.test_pinned import PINNED

PLANT_MS = 2.0


def _digests(result: list[dict]) -> list[str]:
    return [s["schedule_digest"] for s in result[0]["steps"]]


def test_twin_keeps_counts_and_schedule_and_a_disagreement_fails():
    base = {**PINNED, "protocol": "pr36425", "policy": "wait_complete"}
    alone, paired_run, planted = run_cases(2, [
        case(base, STORAGE, n=N_REQUESTS, prefix_tokens=PREFIX),
        case({**base, "twin_protocol": "pr27010"}, STORAGE, n=N_REQUESTS,
             prefix_tokens=PREFIX),
        case({**base, "twin_protocol": "pr27010", "planted_protocol": "pr36425",
              "planted_step_ms": PLANT_MS}, STORAGE, n=N_REQUESTS, prefix_tokens=PREFIX)])
    assert _digests(paired_run) == _digests(alone)  # the primary drives one schedule
    for r in (alone, paired_run):
        assert r[0]["by_site"].get("decision", 0) == 0  # pr36425's own: none
        for group, (counted, torch_saw) in r[0]["crosscheck"].items():
            assert counted == torch_saw, group
    steps = paired_run[0]["steps"]
    polled = [s for s in steps if s["polled"]]
    assert polled and all(s["twin_poll_s"] > 0 for s in polled)
    assert {s["twin_first"] for s in polled} == {True, False}  # drawn per step
    # pr27010's twin all-reduced once per poll: its raw tp_cpu count is the extra
    extra = paired_run[0]["crosscheck"]["tp_cpu"][1] - alone[0]["crosscheck"]["tp_cpu"][1]
    assert extra == sum(s["polled"] for s in steps)
    # The plant (--plant) leaves the schedule as it was, and it is a spin, so the planted
    # side's polls of every polling step take at least its length on any machine. That floor
    # would hold for any spin of that length in those polls: that it is the planted side's
    # alone, once a step, is test_the_plant_spins_once_a_step_before_its_sides_first_poll's.
    assert _digests(planted) == _digests(alone)
    polled = [s for s in planted[0]["steps"] if s["polled"]]
    assert polled and min(s["poll_s"] for s in polled) >= PLANT_MS / 1e3
    with pytest.raises(LaunchError, match="does not decide alike"):
        run_cases(2, [case({**base, "twin_protocol": "pr27010",
                            "planted_disagreement_from_step": 0}, STORAGE, n=N_REQUESTS,
                           prefix_tokens=PREFIX)])


class _Recorded:
    """A protocol that only notes its polls (no collective) and answers True."""

    def __init__(self, name: str, events: list):
        self.name, self.events = name, events

    def poll(self, facts, comm, rid) -> bool:
        self.events.append(("poll", self.name))
        return True


@pytest.mark.parametrize("planted", ["pr36425", "pr27010"])
def test_the_plant_spins_once_a_step_before_its_sides_first_poll(monkeypatch, planted):
    """Where the plant goes, by construction (no clock): one spin of planted_step_ms per
    step, right before the first poll of the planted protocol's side, never the other's,
    whichever side the step's draw puts first."""
    from hicache.cache import twin

    events = []
    monkeypatch.setattr(twin, "_spin", lambda seconds: events.append(("spin", seconds)))
    cfg = SimpleNamespace(twin_protocol="pr27010", policy="wait_complete", race_guard=True,
                          storage=SimpleNamespace(seed=0), planted_protocol=planted,
                          planted_step_ms=PLANT_MS, planted_step_calls=0,
                          planted_disagreement_from_step=-1)
    polls = twin.TwinPolls(cfg, _Recorded("pr36425", events),
                           SimpleNamespace(layout=None, groups=None, delay_s=0.0))
    polls.twin = _Recorded("pr27010", events)
    firsts = set()
    for step in range(16):
        polls.begin_step(step)
        firsts.add(polls.twin_first)
        start = len(events)
        for i in range(3):
            polls.poll(None, None, f"r{i}")
        mine = events[start:]
        spins = [k for k, e in enumerate(mine) if e[0] == "spin"]
        assert [mine[k] for k in spins] == [("spin", PLANT_MS / 1e3)], mine
        first = next(k for k, e in enumerate(mine) if e == ("poll", planted))
        assert spins == [first - 1], mine
    assert firsts == {True, False}  # both orders drawn


def test_only_decide_alike_protocols_pair():
    with pytest.raises(ValueError, match="step pairing pairs protocols that decide alike"):
        HiCacheConfig(protocol="step-clock", twin_protocol="pr27010")


def test_balanced_estimator_cancels_the_order_effect():
    """The first side waits for the other ranks (+o); with an unlucky share of one order a
    plain mean is off by o x (share - 1/2), the balanced one is not."""
    rng = np.random.default_rng(0)
    rows = []
    for r in range(4):
        first = rng.random(200) < (0.8 if r % 2 else 0.2)  # lopsided orders
        d = 1.0 + np.where(first, -3.0, 3.0)  # true delta 1.0, order effect 3.0
        for k in range(200):
            rows.append({"protocol": "B", "policy": "timeout", "repeat": r, "step": k,
                         "polled": 2, "poll_ms": 5.0 + d[k] + rng.normal(0, 0.1),
                         "twin_poll_ms": 5.0, "twin_first": bool(first[k]), "step_ms": 20.0})
    steps = pd.DataFrame(rows)
    delta = paired.twin_delta(steps, "B", "timeout")
    assert delta.point == pytest.approx(1.0, abs=0.05) and delta.low <= 1.0 <= delta.high
    with pytest.raises(paired.PairingError, match="no twin polls"):
        paired.twin_delta(steps.assign(twin_poll_ms=None), "B", "timeout")


# ---- slow: bench run --pairing step ----------------------------------------------------------

SMALL = ["--protocols", "pr27010,pr36425", "--policies", "timeout", "--pairing", "step",
         "--requests", "12", "--bystanders", "12", "--output-tokens", "32", "--repeats", "4"]


def _run(out, *args: str) -> pd.DataFrame:
    env = {**os.environ, "BENCH_NO_PLOTS": "1"}
    done = subprocess.run([sys.executable, "-m", "bench", "run", *SMALL, *args, "--out",
                           str(out)], capture_output=True, text=True, timeout=500, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return RunDir(out).steps()


# ---- statistical: hold at 95 %, so not in make test (make test-stats) -----------------------
# Beside a neighbour neither claim holds 19 times in 20 (docs/testing.md, "Tiers";
# docs/results/2026-12-03_pairing_30379a0.md), so neither is asserted there.


@pytest.mark.slow
@pytest.mark.statistical
def test_a_planted_delay_is_recovered(tmp_path):
    """Under timeout pr36425 and pr27010 issue the same MAX per poll (an A/A'); a 2 ms spin
    planted in pr36425's polls of every step comes back: its 95 % interval over 4 repeats
    excludes 0, and the reference's A/A (its cells twinned with itself) holds 0.

    Quiet only: beside the planted neighbour 4 repeats cannot resolve 2 ms beside a 1 s
    burst. Not within 10 % of 2 ms on 2 over-committed cores either: the spin costs more
    than its length there (it takes a core from the peer rank and the background threads,
    which the next all-reduce then waits for), 3.23 [2.90, 3.56] ms quiet
    (docs/results/2026-12-03_pairing_30379a0.md). The estimator's own 10 % is held on data
    whose truth is known (test_balanced_estimator_cancels_the_order_effect), the plant's
    wiring by test_twin_keeps_counts_and_schedule_and_a_disagreement_fails."""
    extra = ["--plant", f"pr36425:{PLANT_MS}"]
    steps = _run(tmp_path / "r", *extra)
    delta = paired.twin_delta(steps, "pr36425", "timeout")
    assert delta.low > 0 and 0.9 * PLANT_MS <= delta.point <= 2.5 * PLANT_MS, delta
    aa = paired.twin_delta(steps, "pr27010", "timeout")
    assert aa.low <= 0 <= aa.high, aa
