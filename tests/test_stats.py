"""Metric math against hand-computed numbers (no process group): percentiles, per-repeat
statistics and their between-repeat intervals (t and the two-stage bootstrap)."""

import math

import numpy as np
import pytest

from bench import stats
from bench.stats import (
    Sample,
    bootstrap_ratio_interval,
    diff_interval,
    paired,
    per_repeat_ratios,
    per_repeat_stat,
    percentile,
    ratio_interval,
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


# ---- between-repeat intervals, by hand -------------------------------------------------------
# Four paired repeats whose ratios x_r / y_r are 2, 2, 2e^0.1, 2e^-0.1: d_r = ln 2 + (0, 0, 0.1,
# -0.1); mean ln 2, sd = sqrt(0.02 / 3) = 0.08165, se = 0.040825, t_{3, 0.975} = 3.182446.
X4 = {0: 2.0, 1: 4.0, 2: 2 * math.exp(0.1) * 3, 3: 2 * math.exp(-0.1) * 5}
Y4 = {0: 1.0, 1: 2.0, 2: 3.0, 3: 5.0}
H4 = 3.182446 * math.sqrt(0.02 / 3) / 2


def test_ratio_interval_by_hand():
    iv = ratio_interval(X4, Y4)
    assert iv.point == pytest.approx(2.0)  # exp(mean d): the geometric mean of the ratios
    assert iv.low == pytest.approx(2 * math.exp(-H4), rel=1e-6)
    assert iv.high == pytest.approx(2 * math.exp(H4), rel=1e-6)
    assert iv.half_width == pytest.approx(math.expm1(H4), rel=1e-6)  # about 13.9%
    assert iv.n == 4 and iv.note == "" and iv.has_interval


def test_diff_interval_by_hand():
    # differences 1, 2, 3, 6: mean 3, sd sqrt(14/3), t_{3, 0.975} = 3.182446
    iv = diff_interval({0: 2.0, 1: 4.0, 2: 6.0, 3: 10.0}, {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0})
    h = 3.182446 * math.sqrt(14 / 3) / 2
    assert iv.point == pytest.approx(3.0)
    assert (iv.low, iv.high) == pytest.approx((3 - h, 3 + h), rel=1e-6)
    assert iv.half_width == pytest.approx(h, rel=1e-6)


def test_pairing_is_by_repeat_not_by_position():
    # y's repeats listed in another order, plus one x lacks and one non-positive value:
    # pairs are (0, 0), (1, 1), (3, 3) only.
    x = {3: 8.0, 0: 2.0, 1: 3.0, 2: 0.0, 9: 1.0}
    y = {0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0, 4: 7.0}
    assert paired(x, y, log=True) == pytest.approx([math.log(2), math.log(3), math.log(4)])
    assert paired(x, y, log=False) == pytest.approx([1.0, 2.0, -1.0, 6.0])
    assert ratio_interval(x, y).n == 3


def test_too_few_repeats_gives_the_point_and_refuses_an_interval():
    iv = ratio_interval({0: 2.0, 1: 3.0}, {0: 1.0, 1: 1.0})
    assert iv.point == pytest.approx(math.sqrt(6))  # exp(mean(ln 2, ln 3))
    assert iv.low is None and iv.high is None and iv.half_width is None
    assert iv.note == "too few repeats for an interval (2 paired, needs 3)"
    assert not iv.has_interval
    assert ratio_interval({0: 2.0}, {1: 1.0}).point is None  # nothing paired


def test_repeats_that_differ_widely_give_a_wide_interval():
    # The same median ratio 2 in both, but one set of repeats wanders (1.2x to 3.5x).
    steady = ratio_interval({r: 2.0 * (1 + 0.01 * (-1) ** r) for r in range(6)},
                            dict.fromkeys(range(6), 1.0))
    wide = ratio_interval(dict(enumerate([1.2, 3.5, 1.5, 3.0, 2.0, 2.4])),
                          dict.fromkeys(range(6), 1.0))
    assert steady.half_width < 0.015 and wide.half_width > 0.4
    assert wide.low < 1.6 and wide.high > 2.6


def test_many_samples_per_repeat_do_not_narrow_the_interval():
    # 1000 requests per repeat, tightly clustered around each repeat's own level: the interval
    # is as wide as the spread of the levels, not of the requests.
    rng = np.random.default_rng(0)
    levels = [1.0, 1.3, 0.8, 1.1, 0.9, 1.2]
    x = per_repeat_stat({r: lv * rng.normal(100, 1, 1000) for r, lv in enumerate(levels)},
                        "p50")
    y = per_repeat_stat({r: rng.normal(100, 1, 1000) for r in range(6)}, "p50")
    assert ratio_interval(x, y).half_width > 0.15


def test_no_scipy_gives_points_only(monkeypatch):
    monkeypatch.setattr(stats, "_scipy_stats", lambda: None)
    iv = ratio_interval(X4, Y4)
    assert iv.point == pytest.approx(2.0) and iv.low is None
    assert iv.note == "scipy is not installed"


def test_level_must_be_a_probability():
    with pytest.raises(ValueError):
        ratio_interval(X4, Y4, level=1.5)


def test_per_repeat_stat_and_ratios():
    by_repeat = {0: [10, 20, 30], 1: [40, 50, 60], 2: []}
    assert per_repeat_stat(by_repeat, "p50") == {0: 20.0, 1: 50.0}
    assert per_repeat_stat(by_repeat, "mean") == {0: 20.0, 1: 50.0}
    assert per_repeat_ratios({0: 2.0, 1: 4.0, 2: 1.0}, {0: 1.0, 1: 1.0, 3: 1.0}) == \
        {0: 2.0, 1: 4.0}


# ---- the two-stage bootstrap (cross-check) ----------------------------------------------------

def test_weighted_percentile_equals_percentile_of_the_expanded_sample():
    values = np.array([1.0, 2.0, 3.0, 7.0])
    weights = np.array([[1, 2, 0, 3], [0, 0, 1, 0], [4, 1, 1, 1]])
    for q in (0, 37, 50, 90, 99, 100):
        expected = [np.percentile(np.repeat(values, w), q) for w in weights]
        assert weighted_percentile(values, weights, q) == pytest.approx(expected)
    # By hand: [1, 2, 2, 7, 7, 7], p50 at position 2.5 -> 2 + 0.5 * (7 - 2) = 4.5
    assert weighted_percentile(values, weights[:1], 50)[0] == pytest.approx(4.5)


def test_bootstrap_of_constant_repeats_is_the_point():
    # Every repeat's values are constant: the second stage changes nothing, and every
    # repeat's ratio is 2, so every first-stage draw is 2 as well.
    x = Sample.flat({r: [20.0] * 5 for r in range(4)})
    y = Sample.flat({r: [10.0] * 3 for r in range(4)})
    iv = bootstrap_ratio_interval(x, y, "p50", n_boot=200)
    assert (iv.point, iv.low, iv.high) == pytest.approx((2.0, 2.0, 2.0))


def test_bootstrap_first_stage_by_hand():
    # Constant within repeats, ratios 1, 2, 4 (d = 0, ln 2, ln 4): the first stage draws 3
    # of them with replacement; the extreme draws are (1, 1, 1) and (4, 4, 4), and the
    # point is exp(mean d) = 2. Every draw's mean lies within [0, ln 4].
    x = Sample.flat({0: [1.0, 1.0], 1: [2.0, 2.0], 2: [4.0, 4.0]})
    y = Sample.flat({0: [1.0], 1: [1.0], 2: [1.0]})
    iv = bootstrap_ratio_interval(x, y, "mean", n_boot=2000, seed=1)
    assert iv.point == pytest.approx(2.0)
    assert 1.0 <= iv.low < 2.0 < iv.high <= 4.0
    assert iv == bootstrap_ratio_interval(x, y, "mean", n_boot=2000, seed=1)  # seeded


def test_bootstrap_resamples_whole_clusters_within_repeats():
    # One unit per repeat: the second stage draws that unit again, so only repeats vary.
    x = Sample.clustered({r: [[1.0, 2.0, 3.0, 4.0]] for r in range(3)})
    y = Sample.clustered({r: [[2.0, 2.0]] for r in range(3)})
    iv = bootstrap_ratio_interval(x, y, "p50", n_boot=100)
    assert (iv.point, iv.low, iv.high) == pytest.approx((1.25, 1.25, 1.25))
    # The same values as single units do vary within the repeat.
    flat = Sample.flat({r: [1.0, 2.0, 3.0, 4.0] for r in range(3)})
    wide = bootstrap_ratio_interval(flat, y, "p50", n_boot=300)
    assert wide.low < 1.25 < wide.high


def test_bootstrap_agrees_with_t_on_lognormal_repeats():
    rng = np.random.default_rng(5)
    level = rng.lognormal(0, 0.1, 8)  # each repeat's own level, shared by both sides
    a = Sample.flat({r: level[r] * rng.lognormal(4, 0.2, 60) for r in range(8)})
    b = Sample.flat({r: 2 * level[r] * rng.lognormal(4, 0.2, 60) * rng.lognormal(0, 0.05)
                     for r in range(8)})
    boot = bootstrap_ratio_interval(b, a, "p50", n_boot=2000, seed=3)
    t = ratio_interval(b.per_repeat("p50"), a.per_repeat("p50"))
    assert boot.point == pytest.approx(t.point)
    assert 1.7 < boot.low < 2.0 < boot.high < 2.3
    assert 0.5 < boot.half_width / t.half_width < 2.0


def test_bootstrap_chunks_like_one_pass(monkeypatch):
    a = Sample.flat({r: [1.0, 4.0, 9.0, 16.0, 2.0, 3.0] for r in range(3)})
    b = Sample.flat({r: [5.0, 1.0, 7.0 + r] for r in range(3)})
    whole = bootstrap_ratio_interval(b, a, "p90", n_boot=50, seed=1)
    monkeypatch.setattr(stats, "MAX_CELLS", 7)  # one resample per chunk
    again = bootstrap_ratio_interval(b, a, "p90", n_boot=50, seed=1)
    assert (again.low, again.high) == pytest.approx((whole.low, whole.high))


def test_bootstrap_refuses_like_t():
    two = Sample.flat({0: [1.0, 2.0], 1: [2.0, 3.0]})
    iv = bootstrap_ratio_interval(two, two, "p50")
    assert iv.low is None and "too few repeats" in iv.note
    with pytest.raises(ValueError):
        bootstrap_ratio_interval(two, two, "median")
    with pytest.raises(ValueError):
        bootstrap_ratio_interval(two, two, "p50", n_boot=0)


# ---- edges the mutation run found untested -------------------------------------------------

@pytest.mark.parametrize("kw", [{"n_boot": 0}, {"level": 0.0}, {"level": 1.0}])
def test_bootstrap_refuses_bad_settings(kw):
    x = Sample.flat({r: [1.0, 2.0] for r in range(3)})
    with pytest.raises(ValueError):
        bootstrap_ratio_interval(x, x, "p50", **{"n_boot": 10, "level": 0.95, **kw})


@pytest.mark.parametrize("kw", [{"n_boot": 1}, {"level": 0.5}])
def test_bootstrap_accepts_the_edges(kw):
    x = Sample.flat({r: [1.0, 2.0, 4.0] for r in range(3)})
    iv = bootstrap_ratio_interval(x, x, "p50", **{"n_boot": 10, "level": 0.95, **kw})
    assert iv.point == 1.0 and iv.low is not None and iv.low <= iv.high


def test_bootstrap_interval_is_the_central_level_of_the_draws():
    """A wider level gives a wider interval; 50%, 80% and 95% on one sample, same seed."""
    rng = np.random.default_rng(2)
    x = Sample.flat({r: list(rng.lognormal(0.3 * r, 0.3, 40)) for r in range(5)})
    y = Sample.flat({r: list(rng.lognormal(0.0, 0.3, 40)) for r in range(5)})
    lo95, hi95 = (lambda i: (i.low, i.high))(bootstrap_ratio_interval(x, y, "p50", 400, level=0.95))
    lo80, hi80 = (lambda i: (i.low, i.high))(bootstrap_ratio_interval(x, y, "p50", 400, level=0.80))
    lo50, hi50 = (lambda i: (i.low, i.high))(bootstrap_ratio_interval(x, y, "p50", 400, level=0.50))
    assert lo95 < lo80 < lo50 < hi50 < hi80 < hi95


def test_diff_interval_with_one_side_empty_is_unknown():
    assert diff_interval({}, {0: 1.0}).point is None
    assert diff_interval({0: 1.0}, {}).point is None


def test_empty_units_and_repeats_are_dropped():
    assert Sample.flat({0: [], 1: [2.0]}).values.keys() == {1}
    assert Sample.clustered({0: [[], []]}).values == {}
    assert Sample.clustered({0: [[], [1.0, 2.0], [3.0]]}).units[0].tolist() == [0, 0, 1]


def test_nearest_rank_is_numpys_inverted_cdf_but_for_float_noise():
    """Kept by hand: numpy's method="inverted_cdf" is the same definition, but takes
    0.07 * 100 for more than 7 and returns rank 8 of 100 for p7; ours rounds that noise."""
    for n in range(1, 120):
        values = list(range(n))
        for q in (0, 1, 5, 10, 25, 33.3, 50, 66.7, 75, 90, 95, 99, 99.9, 100):
            assert percentile(values, q, "nearest-rank") == \
                float(np.percentile(values, q, method="inverted_cdf")), (n, q)
    assert percentile(list(range(100)), 7, "nearest-rank") == 6.0  # rank 7 of 100
    assert float(np.percentile(list(range(100)), 7, method="inverted_cdf")) == 7.0


def test_binomial_half_cdf_is_exact_and_scipy_stats():
    """The CDF that the c-beside interval and the sign test use without scipy is exact (by
    hand for n = 4) and equals scipy.stats' where scipy exists."""
    assert list(stats.binomial_half_cdf(4)) == [1 / 16, 5 / 16, 11 / 16, 15 / 16, 1.0]
    binom = pytest.importorskip("scipy.stats").binom
    for n in range(0, 300):
        got = stats.binomial_half_cdf(n)
        assert np.allclose(got, binom.cdf(np.arange(n + 1), n, 0.5), rtol=1e-12, atol=0), n


def test_sign_test_is_exact_and_scipy_stats_binomtest():
    assert stats.sign_test_p(6, 6) == 2 / 64 and stats.sign_test_p(3, 6) == 1.0
    binomtest = pytest.importorskip("scipy.stats").binomtest
    for n in range(1, 40):
        for k in range(n + 1):
            want = binomtest(k, n, 0.5).pvalue
            assert stats.sign_test_p(k, n) == pytest.approx(want, rel=1e-12), (k, n)
    with pytest.raises(ValueError):
        stats.sign_test_p(7, 6)


def test_without_scipy_the_sign_test_stays_and_wilcoxon_goes(monkeypatch):
    from bench.ab.order import order_section, rank_tests

    monkeypatch.setattr(stats, "_scipy_stats", lambda: None)
    assert rank_tests([1.1, 1.2, 0.9, 1.05, 0.95, 1.3]) == (None, stats.sign_test_p(4, 6))
    said = [line for line in order_section([["x"]], 0) if "scipy" in line]
    assert said == ["No Wilcoxon p: scipy is not installed (the sign test's is exact "
                    "without it)."]
