"""Metric math against hand-computed numbers (no process group)."""

import math

import numpy as np
import pytest

from bench.stats import per_repeat_ratios, percentile, ratio_of_medians_ci

ONE_TO_TEN = list(range(1, 11))


@pytest.mark.parametrize(
    ("q", "method", "expected"),
    [
        (90, "nearest-rank", 9.0),  # rank ceil(0.9 * 10) = 9
        (90, "linear", 9.1),  # position 0.9 * 9 = 8.1 -> 9 + 0.1 * (10 - 9)
        (50, "nearest-rank", 5.0),  # rank 5
        (50, "linear", 5.5),
        (99, "nearest-rank", 10.0),  # rank ceil(9.9) = 10
        (99, "linear", 9.91),
        (0, "nearest-rank", 1.0),  # rank 1 by convention
        (0, "linear", 1.0),
        (100, "nearest-rank", 10.0),
        (100, "linear", 10.0),
        (10, "nearest-rank", 1.0),  # rank ceil(1.0) = 1, not 2
        (11, "nearest-rank", 2.0),  # rank ceil(1.1) = 2
    ],
)
def test_percentile_one_to_ten(q, method, expected):
    assert percentile(ONE_TO_TEN, q, method) == pytest.approx(expected)


def test_percentile_unsorted_input_and_float_noise():
    assert percentile([3, 1, 2], 50, "nearest-rank") == 2.0
    # 7 / 100 * 100 is 7.000000000000001 in floating point; the rank must still be 7.
    assert percentile(list(range(1, 101)), 7, "nearest-rank") == 7.0


def test_percentile_empty_is_none():
    assert percentile([], 50) is None
    assert percentile(np.array([]), 99, "nearest-rank") is None


@pytest.mark.parametrize("q", [-1, 100.5, float("nan"), "50"])
def test_percentile_bad_q(q):
    with pytest.raises(ValueError):
        percentile([1, 2], q)


def test_percentile_bad_method():
    with pytest.raises(ValueError, match="method"):
        percentile([1, 2], 50, "midpoint")


X = {0: [10, 20, 30], 1: [40, 50, 60]}  # pooled median 35
Y = {0: [10, 10, 10], 1: [20, 20, 20]}  # pooled median 15


def test_ratio_of_medians_point():
    point, low, high = ratio_of_medians_ci(X, Y, n_boot=500)
    assert point == pytest.approx(35 / 15)
    assert low <= point <= high


def test_ratio_of_medians_deterministic_per_seed():
    assert ratio_of_medians_ci(X, Y, seed=3) == ratio_of_medians_ci(X, Y, seed=3)
    rng = np.random.default_rng(1)
    x = {r: rng.lognormal(size=50) for r in range(3)}
    y = {r: rng.lognormal(size=50) for r in range(3)}
    assert ratio_of_medians_ci(x, y, seed=0) != ratio_of_medians_ci(x, y, seed=1)


def test_ratio_ci_identical_constant_samples_is_degenerate():
    same = {0: [5.0] * 4, 1: [5.0] * 4}
    assert ratio_of_medians_ci(same, same, n_boot=100) == (1.0, 1.0, 1.0)


def test_ratio_ci_stratified_keeps_repeat_sizes():
    # Repeat 0 of x is all 1s and repeat 1 all 3s, equal sizes: a stratified resample always
    # holds three of each, so every bootstrap median is (1 + 3) / 2 = 2.
    x = {0: [1.0, 1.0, 1.0], 1: [3.0, 3.0, 3.0]}
    y = {0: [1.0, 1.0, 1.0], 1: [1.0, 1.0, 1.0]}
    assert ratio_of_medians_ci(x, y, n_boot=200) == (2.0, 2.0, 2.0)


def test_ratio_ci_wider_at_higher_level():
    rng = np.random.default_rng(7)
    x = {r: rng.normal(100, 10, 40) for r in range(3)}
    y = {r: rng.normal(100, 10, 40) for r in range(3)}
    _, lo90, hi90 = ratio_of_medians_ci(x, y, level=0.90)
    _, lo99, hi99 = ratio_of_medians_ci(x, y, level=0.99)
    assert lo99 <= lo90 < hi90 <= hi99


def test_ratio_empty_sides_are_none():
    assert ratio_of_medians_ci({}, Y) == (None, None, None)
    assert ratio_of_medians_ci(X, {0: []}) == (None, None, None)
    assert ratio_of_medians_ci(X, {0: [0.0, 0.0]}) == (None, None, None)  # undefined ratio


def test_ratio_bad_arguments():
    with pytest.raises(ValueError):
        ratio_of_medians_ci(X, Y, level=1.5)
    with pytest.raises(ValueError):
        ratio_of_medians_ci(X, Y, n_boot=0)


def test_per_repeat_ratios():
    got = per_repeat_ratios(X, Y)
    assert got == {0: pytest.approx(2.0), 1: pytest.approx(2.5)}


def test_per_repeat_ratios_only_shared_nonempty_repeats():
    got = per_repeat_ratios({0: [2.0], 1: [4.0], 2: []}, {0: [1.0], 2: [1.0], 3: [1.0]})
    assert got == {0: 2.0}
    assert all(not math.isnan(v) for v in got.values())
