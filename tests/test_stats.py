"""Metric math against hand-computed numbers (no process group)."""

import math

import numpy as np
import pytest

from bench.stats import (
    Sample,
    diff_of_means_ci,
    per_repeat_ratios,
    percentile,
    ratio_of_medians_ci,
    ratio_of_percentiles_ci,
    weighted_percentile,
)

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


# Percentile ratios with a (cluster) bootstrap: bench compare's B/A intervals.

def test_weighted_percentile_equals_percentile_of_the_expanded_sample():
    values = np.array([1.0, 2.0, 3.0, 7.0])
    weights = np.array([[1, 2, 0, 3], [0, 0, 1, 0], [4, 1, 1, 1]])
    for q in (0, 37, 50, 90, 99, 100):
        expected = [np.percentile(np.repeat(values, w), q) for w in weights]
        assert weighted_percentile(values, weights, q) == pytest.approx(expected)
    # By hand: [1, 2, 2, 7, 7, 7], p50 at position 2.5 -> 2 + 0.5 * (7 - 2) = 4.5
    assert weighted_percentile(values, weights[:1], 50)[0] == pytest.approx(4.5)


def test_percentile_ratio_point_by_hand():
    a = Sample.flat({0: [10, 20, 30], 1: [40, 50, 60]})  # p50 35, p99 59.5
    b = Sample.flat({0: [20, 40], 1: [60, 80, 100]})  # p50 60, p99 99.2
    point, low, high = ratio_of_percentiles_ci(b, a, 50, n_boot=300)
    assert point == pytest.approx(60 / 35) and low <= point <= high
    assert ratio_of_percentiles_ci(b, a, 99, n_boot=300)[0] == pytest.approx(99.2 / 59.5)


def test_percentile_ratio_constant_and_stratified_samples_are_degenerate():
    ten, twenty = Sample.flat({0: [10.0] * 5}), Sample.flat({0: [20.0] * 3, 1: [20.0]})
    assert ratio_of_percentiles_ci(twenty, ten, 99, n_boot=100) == (2.0, 2.0, 2.0)
    # Equal-size strata of 1s and 3s: every stratified resample's median is 2.
    x = Sample.flat({0: [1.0, 1.0, 1.0], 1: [3.0, 3.0, 3.0]})
    assert ratio_of_percentiles_ci(x, Sample.flat({0: [1.0]}), 50, n_boot=200) == (2.0, 2.0, 2.0)


def test_percentile_ratio_resamples_whole_clusters():
    # One unit per repeat: every resample draws that unit again, so the CI is the point.
    x = Sample.clustered({0: [[1.0, 2.0, 3.0, 4.0]], 1: [[5.0, 6.0]]})
    y = Sample.clustered({0: [[2.0, 2.0]]})
    assert ratio_of_percentiles_ci(x, y, 50, n_boot=100) == (1.75, 1.75, 1.75)
    # The same values as single units do vary.
    flat = Sample.flat({0: [1.0, 2.0, 3.0, 4.0], 1: [5.0, 6.0]})
    _, low, high = ratio_of_percentiles_ci(flat, y, 50, n_boot=200)
    assert low < 1.75 < high


def test_percentile_ratio_deterministic_and_covers_a_known_factor():
    rng = np.random.default_rng(5)
    a = Sample.flat({r: rng.lognormal(4, 0.2, 60) for r in range(3)})
    b = Sample.flat({r: 2 * rng.lognormal(4, 0.2, 60) for r in range(3)})
    got = ratio_of_percentiles_ci(b, a, 50, n_boot=1000, seed=3)
    assert got == ratio_of_percentiles_ci(b, a, 50, n_boot=1000, seed=3)
    assert got != ratio_of_percentiles_ci(b, a, 50, n_boot=1000, seed=4)
    assert 1.8 < got[1] < 2.0 < got[2] < 2.2


def test_percentile_ratio_chunks_like_one_pass(monkeypatch):
    import bench.stats

    a = Sample.flat({0: [1.0, 4.0, 9.0, 16.0], 1: [2.0, 3.0]})
    b = Sample.flat({0: [5.0, 1.0, 7.0]})
    whole = ratio_of_percentiles_ci(b, a, 90, n_boot=50, seed=1)
    monkeypatch.setattr(bench.stats, "MAX_CELLS", 7)  # one resample per chunk
    assert ratio_of_percentiles_ci(b, a, 90, n_boot=50, seed=1) == pytest.approx(whole)


def test_percentile_ratio_empty_or_undefined_is_none():
    a = Sample.flat({0: [1.0, 2.0]})
    assert ratio_of_percentiles_ci(Sample.flat({}), a, 50) == (None, None, None)
    assert ratio_of_percentiles_ci(a, Sample.clustered({0: [[], []]}), 50) == (None, None, None)
    assert ratio_of_percentiles_ci(a, Sample.flat({0: [0.0]}), 50) == (None, None, None)
    with pytest.raises(ValueError):
        ratio_of_percentiles_ci(a, a, 101)
    with pytest.raises(ValueError):
        ratio_of_percentiles_ci(a, a, 50, n_boot=0)


# ---- edges the mutation run found untested -------------------------------------------------

@pytest.mark.parametrize("kw", [{"n_boot": 0}, {"level": 0.0}, {"level": 1.0}, {"q": -1},
                                {"q": 100.5}])
def test_percentile_ratio_refuses_bad_settings(kw):
    x = Sample.flat({0: [1.0, 2.0]})
    args = {"q": 50, "n_boot": 10, "level": 0.95, **kw}
    with pytest.raises(ValueError):
        ratio_of_percentiles_ci(x, x, args["q"], n_boot=args["n_boot"], level=args["level"])


@pytest.mark.parametrize("kw", [{"n_boot": 1}, {"q": 0}, {"q": 100}, {"level": 0.5}])
def test_percentile_ratio_accepts_the_edges(kw):
    x = Sample.flat({0: [1.0, 2.0, 4.0]})
    args = {"q": 50, "n_boot": 10, "level": 0.95, **kw}
    point, low, high = ratio_of_percentiles_ci(x, x, args["q"], n_boot=args["n_boot"],
                                               level=args["level"])
    assert point == 1.0 and low is not None and low <= high  # one resample: any interval


def test_percentile_ratio_ci_is_the_central_level_of_the_resamples():
    """A wider level gives a wider interval; 50% and 95% on one sample, same seed."""
    x = Sample.flat({0: list(np.linspace(1.0, 3.0, 40))})
    y = Sample.flat({0: list(np.linspace(1.0, 2.0, 40))})
    _, lo95, hi95 = ratio_of_percentiles_ci(x, y, 50, n_boot=400, level=0.95)
    _, lo50, hi50 = ratio_of_percentiles_ci(x, y, 50, n_boot=400, level=0.50)
    assert lo95 < lo50 < hi50 < hi95
    # ~2.5% of the resamples lie below the 95% interval: it is not the 80% one
    _, lo80, hi80 = ratio_of_percentiles_ci(x, y, 50, n_boot=400, level=0.80)
    assert lo95 < lo80 and hi80 < hi95


def test_diff_of_means_with_one_side_empty_is_unknown():
    assert diff_of_means_ci({}, {0: [1.0]}) == (None, None, None)
    assert diff_of_means_ci({0: [1.0]}, {0: []}) == (None, None, None)


def test_an_empty_sample_pools_to_nothing():
    assert Sample.flat({}).pooled().size == 0
    assert Sample.clustered({0: [[], []]}).pooled().size == 0
