"""Paired designs (docs/usage.md, "Pairing"): the duet's lanes, the paired estimators
(bench.analysis.paired), c beside the cells (bench.run.calibrate.beside), the lanes' merge.
Each test would fail on the bug it exists for: a lane serving the wrong cells, an estimator
pairing steps of two schedules, a c a burst moves, rows lost in the merge."""

import numpy as np
import pandas as pd
import pytest

from bench.analysis import paired
from bench.analysis.conditions import beside_line
from bench.run import calibrate, duet
from bench.run.plan import RunPlan
from bench.rundir.files import write_csv_atomic, write_json_atomic
from bench.rundir.lanes import merge_lanes
from bench.rundir.rundir import RunDir


def test_lanes_split_every_group_and_rotate():
    plan = RunPlan(protocols=("pr27010", "pr36425"), policies=("wait_complete", "timeout"),
                   repeats=4)
    lanes = [duet.lane_cells(plan, i) for i in range(duet.lanes(plan))]
    assert sorted(c.index for lane in lanes for c in lane) == [c.index for c in plan.cells()]
    assert len(lanes[0]) == len(lanes[1])  # equal serves: the barriers pair them
    for a, b in zip(*lanes, strict=True):  # the k-th serves of the lanes run together
        assert (a.repeat, a.policy, a.rate_rps) == (b.repeat, b.policy, b.rate_rps)
        assert a.protocol != b.protocol
    # Each lane serves each protocol in half the repeats: a lane's bias cancels.
    assert {c.protocol for c in lanes[0] if c.repeat == 0} != \
        {c.protocol for c in lanes[0] if c.repeat == 1}


def _steps(side_ms: dict[str, list[np.ndarray]], polled=None, digests=None) -> pd.DataFrame:
    rows = []
    for proto, repeats in side_ms.items():
        for r, ms in enumerate(repeats):
            for k, v in enumerate(ms):
                rows.append({"protocol": proto, "policy": "wait_complete", "repeat": r,
                             "step": k, "step_ms": float(v),
                             "polled": 1 if polled is None else polled[proto][r][k],
                             "schedule_digest": "d" if digests is None else
                             digests[proto][r][k]})
    return pd.DataFrame(rows)


def _bursty(seed: int, repeats: int = 6, n: int = 200, delay: float = 0.0):
    """Two sides sharing, per repeat and step, the machine's burst (what duet serving
    gives), one of them `delay` ms slower per step."""
    rng = np.random.default_rng(seed)
    a, b = [], []
    for _ in range(repeats):
        burst = rng.lognormal(0, 0.6, n) * rng.choice([1, 1, 1, 4], n)  # shared load
        base = 10.0 * burst
        a.append(base + rng.normal(0, 0.3, n))
        b.append(base + delay + rng.normal(0, 0.3, n))
    return a, b


def test_step_delta_recovers_a_planted_delay():
    a, b = _bursty(1, delay=2.0)
    delta = paired.step_delta(_steps({"A": a, "B": b}), "A", "B", "wait_complete")
    assert delta.point == pytest.approx(2.0, rel=0.10)
    assert delta.low <= 2.0 <= delta.high


def test_step_delta_refuses_steps_of_two_schedules():
    """A planted disagreement: from step 5 of repeat 2 B polls another set; the estimator
    must fail, not pair steps that hold different batches."""
    a, b = _bursty(2)
    polled = {p: [[3] * len(x) for x in a] for p in ("A", "B")}
    polled["B"][2][5] = 4
    with pytest.raises(paired.PairingError, match="repeat 2: the decisions disagree from "
                                                   "step 5"):
        paired.step_delta(_steps({"A": a, "B": b}, polled), "A", "B", "wait_complete")
    with pytest.raises(paired.PairingError, match="steps pair by index"):
        paired.step_delta(_steps({"A": a, "B": [x[:-1] for x in b]}), "A", "B",
                          "wait_complete")


def test_repairing_at_random_widens_a_paired_aa():
    """Duet benchmarking's control on an A/A whose pairs share bursts: paired, the
    interval holds 1 and is narrow; re-paired at random, it is several times wider."""
    a, b = _bursty(3)
    steps = _steps({"A": a, "B": b})
    same = paired.step_ratio(steps, "A", "B", "wait_complete")
    again = paired.repaired_ratio(steps, "A", "B", "wait_complete")
    assert same.low <= 1 <= same.high and same.half_width < 0.02
    assert again.half_width > 3 * same.half_width


def test_c_beside_the_cells_is_not_moved_by_a_burst():
    rng = np.random.default_rng(0)
    cells = [list(rng.lognormal(np.log(0.3), 0.2, calibrate.BESIDE_N)) for _ in range(20)]
    quiet = calibrate.beside(cells, None)["c_ms"]
    cells[4] = [x * 10 for x in cells[4]]  # a burst over one cell's samples
    cells[11] = [x * 10 for x in cells[11]]
    assert calibrate.beside(cells, None)["c_ms"] == pytest.approx(quiet, rel=0.05)
    assert np.mean(np.concatenate(cells)) > 1.5 * quiet  # what a mean would have said


def test_upfront_c_flagged_when_it_differs():
    cells = [[0.3, 0.31, 0.29, 0.3]] * 12
    moved = {"mean_ms": 0.9, "mean_ci_low_ms": 0.8, "mean_ci_high_ms": 1.0}
    held = {"mean_ms": 0.3, "mean_ci_low_ms": 0.28, "mean_ci_high_ms": 0.33}
    b = calibrate.beside(cells, moved)
    assert b["upfront_differs"] and "DIFFERS" in beside_line({"beside": b})
    b = calibrate.beside(cells, held)
    assert not b["upfront_differs"] and "agrees" in beside_line({"beside": b})
    assert calibrate.beside([], held)["c_ms"] is None and beside_line({}) is None


def test_median_interval_brackets_by_order_statistics():
    assert calibrate.median_interval(list(range(10))) == (1.0, 8.0)  # x(2), x(9): 97.9 %
    assert calibrate.median_interval([5.0, 1.0, 3.0]) == (1.0, 5.0)  # too few: the range


def test_median_interval_is_scipy_stats_binom_ppf():
    """The rank is scipy.stats' binom.ppf, computed from an exact CDF without scipy (a run
    must finish on a node without it): the same order statistics for every n and level."""
    binom = pytest.importorskip("scipy.stats").binom

    rng = np.random.default_rng(0)
    for n in range(1, 300):
        a = np.sort(rng.normal(size=n))
        for level in (0.9, 0.95, 0.99):
            j = max(1, int(binom.ppf((1 - level) / 2, n, 0.5)))
            assert calibrate.median_interval(list(a), level) == (a[j - 1], a[n - j]), (n, level)


def test_merge_lanes_keeps_every_row(tmp_path):
    lanes = []
    for i, proto in enumerate(("pr27010", "pr36425")):
        lane = RunDir(tmp_path / f"lane{i}")
        lane.path.mkdir()
        write_csv_atomic(lane.file("steps"), [{"protocol": proto, "step": k}
                                              for k in range(3)], ["protocol", "step"])
        write_json_atomic(lane.file("env"), {"plan": {"out_dir": str(lane.path)}})
        write_json_atomic(lane.file("calibration"), {"allreduce": {"mean_ms": 0.1 * (i + 1)}})
        lanes.append(lane.path)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    merge_lanes(run, lanes)
    merged = pd.read_csv(run.file("steps"))
    assert list(merged["protocol"]) == ["pr27010"] * 3 + ["pr36425"] * 3
    assert run.env()["plan"]["out_dir"] == str(run.path)
    assert [c["mean_ms"] for c in run.calibration()["lanes"]] == [0.1, 0.2]
