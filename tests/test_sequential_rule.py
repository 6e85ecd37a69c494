"""The sequential rule of every served A/B and review (bench.ab.sequential): where a check
stands against its threshold, how the next stage is sized, and the one stage loop
(`staged`) that `bench ab`, the gate and `bench review` run, on fake samples."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from bench.ab import sequential
from bench.ab.sequential import Budget, more
from bench.stats import ratio_interval
from bench.verdict.thresholds import decide
from bench.verdict.words import FAIL, PASS, UNRESOLVED

# ---- the sequential rule ----------------------------------------------------------------


@pytest.mark.parametrize("low, high, state", [
    (0.98, 1.02, PASS), (0.90, 1.029, PASS), (1.031, 1.10, FAIL),
    (0.99, 1.05, UNRESOLVED), (0.99, 1.03, UNRESOLVED), (1.03, 1.06, UNRESOLVED),
    (None, None, UNRESOLVED), (math.nan, 1.0, UNRESOLVED)])
def test_a_check_passes_below_and_fails_above_one_plus_threshold(low, high, state):
    assert decide(low, high, 0.03) == state


def state(point, half, t=0.03):
    low, high = point / (1 + half), point * (1 + half)
    return (decide(low, high, t), point, low, high, t)


BUDGET = Budget(repeats=60, seconds=300.0, least_more=4)


def test_the_rule_stops_when_every_check_is_decided_or_one_fails():
    assert more([state(1.0, 0.01), state(0.9, 0.05)], 12, 60.0, BUDGET) == 0
    assert more([state(1.10, 0.02), state(1.0, 0.05)], 12, 60.0, BUDGET) == 0  # a FAIL


def test_the_rule_sizes_the_next_stage_by_the_most_undecided_check():
    # point 1.0, half-width 4.5 % over 12 pairs against 3 %: needs 12 * (ln 1.045 / ln 1.03)^2
    add = more([state(1.0, 0.045), state(1.0, 0.01)], 12, 60.0, BUDGET)
    want = sequential.needed(1.0, 1 / 1.045, 1.045, 0.03, 12)
    assert 26.5 < want < 26.7 and add == min(math.ceil(want * 1.2) - 12, 12)
    # fewer than double: the stage the check needs
    assert more([state(1.0, 0.031)], 24, 60.0, BUDGET) == math.ceil(
        sequential.needed(1.0, 1 / 1.031, 1.031, 0.03, 24) * 1.2) - 24 < 24
    # a point at the threshold can never be decided: the smallest stage, within the budget
    assert more([state(1.03, 0.02)], 12, 60.0, BUDGET) == BUDGET.least_more


def test_a_stage_at_most_doubles_the_pairs():
    """A check far from decided at 12 pairs gets 12 more, not the budget: its point read off
    12 pairs is too rough to spend the budget on."""
    for n in (4, 12, 24):
        assert more([state(1.02, 0.03)], n, 5.0 * n, Budget(200, 10_000.0)) == n
    assert more([state(1.02, 0.03)], 2, 10.0, Budget(200, 10_000.0)) == BUDGET.least_more


def test_the_rule_stays_within_its_budget():
    assert more([state(1.0, 0.045)], 60, 100.0, BUDGET) == 0  # no repeats left
    assert more([state(1.0, 0.045)], 12, 300.0, BUDGET) == 0  # no seconds left
    # 5 s a repeat so far and 30 s left: 6 repeats at most
    assert more([state(1.0, 0.045)], 12, 270.0, Budget(60, 300.0)) <= 6


@dataclass
class FakeStage:
    repeats: int
    seed: int
    ok: bool = True


def sequential_gate(effect: float, sd: float, seed: int, t: float = 0.03,
                    first: int = 12) -> tuple[str, int]:
    """The one stage loop (sequential.staged) driven by fake paired repeats (log-normal B/A
    about `effect`, each stage's drawn from its own seed); the budget's seconds never bind."""
    a, b = {}, {}

    def serve(index, repeats, stage_seed):
        rng = random.Random(f"{seed}:{stage_seed}")
        for r in range(len(a), len(a) + repeats):
            a[r] = 10.0 * math.exp(rng.gauss(0, 0.05))
            b[r] = a[r] * effect * math.exp(rng.gauss(0, sd))
        return FakeStage(repeats, stage_seed)

    def judge(stages):
        iv = ratio_interval(b, a)
        s = (decide(iv.low, iv.high, t), iv.point, iv.low, iv.high, t)
        return [s], s[0]

    stages, verdict = sequential.staged(first, 0, serve, judge, sequential.deciding(BUDGET), print,
                                        "fake")
    return verdict, sum(s.repeats for s in stages)


def test_one_stage_loop_seeds_each_stage_and_stops_where_the_rule_says():
    """sequential.staged, the loop of `bench ab`, the gate and `bench review`: stage k on
    seed + k, the first stage always, one stage without a budget, a failed stage ends the run
    keeping the last judged result, and each added stage is announced with its seed."""
    undecided = [state(1.0, 0.045)]  # wants more pairs
    said = []

    def serve(index, repeats, seed):
        return FakeStage(repeats, seed, ok=index < 2)

    def judge(stages):
        return None if not stages[-1].ok else (undecided, len(stages))

    stages, last = sequential.staged(12, 5, serve, judge,
                                     sequential.deciding(Budget(200, 1e6)), said.append, "fake")
    assert [(s.seed, s.repeats) for s in stages] == [(5, 12), (6, 12), (7, 24)]
    assert last == 2  # the third stage failed: the second's result stands
    assert said == ["fake: 1 gated check(s) undecided after 12 paired repeats: a stage of 12 "
                    "more (seed 6)", "fake: 1 gated check(s) undecided after 24 paired "
                    "repeats: a stage of 24 more (seed 7)"]
    stages, last = sequential.staged(12, 5, serve, judge, None, said.append, "fake")
    assert len(stages) == 1 and last == 1  # no budget: one stage
    decided = sequential.staged(12, 0, serve, lambda st: ([state(1.0, 0.01)], "PASS"),
                                sequential.deciding(Budget(200, 1e6)), said.append, "fake")
    assert len(decided[0]) == 1 and decided[1] == "PASS" and len(said) == 2


def test_on_fake_samples_same_code_passes_and_a_regression_fails():
    """Paired noise of 4 % a repeat: no change ends PASS, 10 % slower ends FAIL, and a
    change exactly at the threshold never reads PASS (nor, mostly, FAIL)."""
    assert all(sequential_gate(1.0, 0.04, s)[0] == PASS for s in range(20))
    assert all(sequential_gate(1.10, 0.04, s)[0] == FAIL for s in range(20))
    at = [sequential_gate(1.03, 0.04, s) for s in range(20)]
    assert sum(x[0] == PASS for x in at) <= 2 and all(x[1] <= BUDGET.repeats for x in at)
