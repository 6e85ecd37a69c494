"""An added cost per control-plane collective (--collective-delay-ms) and the cost
sweep built on it.

Tiers: the config and plan (no process group); `Comm`'s and the door's delay on a thread
world or a stand-in torch (which sites pay it, and that the wait is inside the collective's
timed span); the sweep's arithmetic against hand-computed rows; a real 2-rank gloo serve
whose decision collectives pay it; and one small end-to-end sweep (slow).
"""

from __future__ import annotations

import json
import math
import sys
import time
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from bench.analysis import sweep
from bench.plan.options import RunOptions
from bench.plan.resolve import build_plan
from hicache.comm.comm import (
    CALIBRATION,
    DECISION,
    HIT_QUERY,
    MODEL_ALLREDUCE,
    PER_STEP_MIN,
    CollectiveCounter,
    Comm,
)
from hicache.comm.groups import Groups, Layout
from hicache.spec.config import HiCacheConfig
from sglang_adapter.door import Door
from sglang_adapter.source import DEFAULT_CACHE
from tests.doubles import ThreadWorld, patch_dist
from tests.helpers import run_scenario

DELAY_MS = 30.0


@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf])
def test_config_refuses_a_negative_or_unbounded_delay(bad):
    with pytest.raises(ValueError, match="collective_delay_ms must be finite and >= 0"):
        HiCacheConfig(collective_delay_ms=bad)


def test_one_cost_is_the_systems_and_is_recorded_in_the_plan():
    plan = build_plan(RunOptions(preset="ci", collective_delay_ms="2.5"))
    assert plan.delays_ms == () and dict(plan.system)["collective_delay_ms"] == 2.5
    assert plan.delay_ms == 2.5
    assert {plan.config(c).collective_delay_ms for c in plan.cells()} == {2.5}


def test_a_cost_list_is_a_sweep_interleaved_in_every_repeat():
    """Every repeat serves every cost, the cost order rotated per repeat and the protocols
    of one configuration back to back; each cost's plan writes its own run directory."""
    plan = build_plan(RunOptions(preset="delay-sweep", repeats=2,
                                 collective_delay_ms="0,1,3"))
    cells = plan.cells()
    assert len(cells) == 2 * 3 * 2 * 2
    firsts = [c.delay_ms for c in cells if c.policy == "wait_complete"
              and c.protocol == "pr27010"]
    assert firsts == [0.0, 1.0, 3.0, 1.0, 3.0, 0.0]
    assert [(c.protocol, c.delay_ms) for c in cells[:2]] == [("pr27010", 0.0),
                                                             ("pr36425", 0.0)]
    per = {d: p for d, p in build_plan(RunOptions(preset="delay-sweep",
                                                  collective_delay_ms="0,1")).per_delay().items()}
    assert set(per) == {0.0, 1.0} and per[1.0].delay_ms == 1.0 and per[1.0].delays_ms == ()
    assert {plan.config(c).collective_delay_ms for c in cells} == {0.0, 1.0, 3.0}


def test_the_preset_sweeps_five_costs_of_make_benchs_workload():
    plan, bench = build_plan(RunOptions(preset="delay-sweep")), build_plan(RunOptions())
    assert plan.delays_ms == (0.0, 0.5, 1.0, 2.0, 3.0)
    assert plan.workload == bench.workload and plan.schedule == bench.schedule == "free"
    assert plan.protocols == ("pr27010", "pr36425")


def _timed(comm: Comm, site: str, group: str) -> float:
    t, t0 = torch.zeros(2, dtype=torch.int32), time.monotonic()
    comm.all_reduce(t, dist.ReduceOp.MAX, group, site)
    return time.monotonic() - t0


def test_comm_delays_control_plane_sites_only(monkeypatch):
    """Decision, hit-query (a background thread's) and calibration collectives wait the
    added cost, on every rank, inside the span the counter records; the model's data-plane
    all-reduce and the harness's end-of-serve agreement do not."""
    world = ThreadWorld(2)
    patch_dist(monkeypatch, world)

    def on_rank(rank):
        layout = Layout(rank, 2, 1)
        comm = Comm(layout, Groups(layout, "gloo", 10.0), CollectiveCounter(), DELAY_MS)
        out = {s: _timed(comm, s, g) for s, g in ((DECISION, "tp_cpu"), (HIT_QUERY, "prefetch"),
                                                   (CALIBRATION, "tp_cpu"),
                                                   (MODEL_ALLREDUCE, "data"))}
        t0 = time.monotonic()
        comm.all_idle(False)
        return out | {"harness_stop": time.monotonic() - t0,
                      "recorded": comm.counter.sched_seconds_by_step[-1]}

    for out in world.run(on_rank):
        assert not isinstance(out, Exception), out
        delay = DELAY_MS / 1e3
        assert min(out[DECISION], out[HIT_QUERY], out[CALIBRATION]) >= delay
        assert out[MODEL_ALLREDUCE] < delay and out["harness_stop"] < delay
        assert out["recorded"] >= delay  # the decision's span includes its wait


class _Work:
    def wait(self) -> None:
        pass


def test_a_pipelined_min_pays_the_delay_from_its_issue(monkeypatch):
    """PR #39903's per-step MIN: issued at one step's end, waited on at the next; a forward
    that outlasts the added cost hides it, as it would hide a slow link's latency."""
    fake = SimpleNamespace(all_reduce=lambda *a, **k: _Work(), ReduceOp=dist.ReduceOp)
    patch_dist(monkeypatch, fake)
    groups = SimpleNamespace(size=lambda g: 2, pg={"tp_cpu": None}, backend=lambda g: "gloo")
    comm = Comm(Layout(0, 2, 1), groups, CollectiveCounter(), DELAY_MS)
    t0 = time.monotonic()
    wait = comm.start_all_reduce(torch.zeros(1), dist.ReduceOp.MIN, "tp_cpu", PER_STEP_MIN)
    assert time.monotonic() - t0 < DELAY_MS / 1e3  # the issue does not block
    wait()
    assert time.monotonic() - t0 >= DELAY_MS / 1e3
    wait = comm.start_all_reduce(torch.zeros(1), dist.ReduceOp.MIN, "tp_cpu", PER_STEP_MIN)
    time.sleep(DELAY_MS / 1e3)  # the forward outlasts it
    t1 = time.monotonic()
    wait()
    assert time.monotonic() - t1 < DELAY_MS / 2e3


def test_the_door_delays_sglangs_calls_and_not_the_harness(tmp_path):
    """SGLang's collectives (a frame under its sglang/srt/) wait the added cost; a call from
    anywhere else passes straight through."""
    door = Door(str(tmp_path))
    door.delay_s = DELAY_MS / 1e3

    def real(tensor, op=None, group=None, async_op=False):
        return None

    counted = door._wrap("all_reduce", real)
    sglang_file = f"{tmp_path}/sglang/srt/mem_cache/x.py"
    code = compile("def poll(f):\n    return f(None)\n", sglang_file, "exec")
    space: dict = {}
    exec(code, space)  # a function whose frame reads as SGLang's
    t0 = time.monotonic()
    space["poll"](counted)
    assert time.monotonic() - t0 >= DELAY_MS / 1e3
    t0 = time.monotonic()
    counted(None)
    assert time.monotonic() - t0 < DELAY_MS / 1e3 and sum(door.calls.values()) == 1


@pytest.mark.slow
def test_a_real_serves_decision_collectives_pay_the_delay():
    """2 gloo ranks, pr27010 under wait_complete at +5 ms: every decision collective's time
    on the scheduler is at least the added cost."""
    ranks = run_scenario(2, {"protocol": "pr27010", "policy": "wait_complete", "tp": 2,
                             "collective_delay_ms": 5.0}, n=4)
    for r in ranks:
        steps = [s for s in r["steps"] if s.get("coll_decision")]
        assert steps, "no step polled with a collective"
        assert all(s["decision_sync_s"] >= 0.005 * s["coll_decision"] for s in steps)


def _summary(policy: str, step27: float, step36: float, e27: float, e36: float,
             ci: tuple[float, float]) -> pd.DataFrame:
    base = {"policy": policy, "c_insitu_ms": 1.2, "polls_per_step": 3.0}
    ratio = {f"{m}_ratio": step36 / step27 for m in sweep.METRICS}
    ratio |= {f"{m}_ratio_ci_low": ci[0] for m in sweep.METRICS}
    ratio |= {f"{m}_ratio_ci_high": ci[1] for m in sweep.METRICS}
    return pd.DataFrame([
        base | {"protocol": "pr27010", "step_mean_ms": step27, "predicted_extra_step_ms": e27,
                "predicted_extra_step_low_ms": e27 * 0.9,
                "predicted_extra_step_high_ms": e27 * 1.1},
        base | ratio | {"protocol": "pr36425", "step_mean_ms": step36,
                        "predicted_extra_step_ms": e36,
                        "predicted_extra_step_low_ms": e36 * 0.9,
                        "predicted_extra_step_high_ms": e36 * 1.1,
                        "step_mean_ratio_repeats": 10}])


def test_the_models_step_ratio_takes_pr27010s_collectives_out_of_its_step():
    """pr27010 steps 20 ms of which the model, at the c before the cells (1 ms), says 5 ms
    are decision collectives, pr36425 0 ms. c beside the cells is 2 ms, so the model's
    extra time doubles to 10 ms: it expects 10 / 20 = 0.5, band (20 - 11) / 20 to
    (20 - 9) / 20."""
    calib = {"allreduce": {"mean_ms": 1.0}, "beside": {"c_ms": 2.0, "c_ci_low_ms": 1.8,
                                                       "c_ci_high_ms": 2.3}}
    row = sweep.cost_row(1.0, "wait_complete", _summary("wait_complete", 20, 14, 5, 0,
                                                        (0.66, 0.74)), calib)
    assert row["model_step_ratio"] == pytest.approx(0.5)
    assert (row["model_step_low"], row["model_step_high"]) == (pytest.approx(0.45),
                                                               pytest.approx(0.55))
    assert row["model_inside"] is False and (row["c_ms"], row["c_upfront_ms"]) == (2.0, 1.0)
    assert row["per_poll_ms"] == 1.2 and row["step_mean_ratio"] == pytest.approx(0.7)
    lines = sweep.model_lines([row])
    assert "0 of 1" in lines[0] and "took 1.20 ms in the run against c = 2.00 ms" in lines[1]
    no_beside = sweep.cost_row(1.0, "wait_complete", _summary("wait_complete", 20, 14, 5, 0,
                                                              (0.7, 0.8)),
                               {"allreduce": {"mean_ms": 1.0}})
    assert no_beside["model_step_ratio"] == pytest.approx(0.75) and no_beside["model_inside"]


def _row(delay, policy, ratio, low, high):
    return {"delay_ms": delay, "policy": policy, "step_mean_ratio": ratio,
            "step_mean_ratio_ci_low": low, "step_mean_ratio_ci_high": high}


def test_the_trend_and_timeout_checks():
    falls = [_row(0, "wait_complete", 0.9, 0.85, 0.95), _row(1, "wait_complete", 0.93, 0.9, 1),
             _row(2, "wait_complete", 0.7, 0.65, 0.75)]
    assert "each falls" in sweep.trend_line(falls) and "the effect grows" in \
        sweep.trend_line(falls)
    flat = [_row(0, "wait_complete", 0.7, 0.65, 0.75), _row(1, "wait_complete", 0.68, 0.6, 0.8)]
    assert "does not grow beyond the intervals" in sweep.trend_line(flat)
    rises = falls + [_row(3, "wait_complete", 0.8, 0.75, 0.85)]
    assert "RISES" in sweep.trend_line(rises) and "+3 ms 0.80 above +2 ms's" in \
        sweep.trend_line(rises)
    held = [_row(0, "timeout", 1.02, 0.95, 1.1), _row(1, "timeout", 0.98, 0.9, 1.01)]
    assert "holds 1 at all 2 costs" in sweep.timeout_line(held)
    assert "excludes 1 at +2 ms of 3" in sweep.timeout_line(
        held + [_row(2, "timeout", 0.9, 0.85, 0.95)])


@pytest.mark.long  # make test-long: a delay sweep served end to end
@pytest.mark.slow
def test_a_small_sweep_end_to_end(tmp_path, monkeypatch):
    """Two costs, one repeat of a small burst: every cost a run directory of its own whose
    env.json, calibration and rows carry the cost (c includes it), and the sweep's report."""
    from bench.commands.run import main as main_run

    monkeypatch.setenv("BENCH_NO_PLOTS", "1")
    out = tmp_path / "sw"
    rc = main_run(["--preset", "delay-sweep", "--repeats", "1", "--requests", "4",
                   "--bystanders", "2", "--collective-delay-ms", "0,3", "--out", str(out)])
    assert rc in (0, 1)  # 1 only if a cost's own verdict failed: its rows are still there
    for delay, sub in ((0.0, "delay_0ms"), (3.0, "delay_3ms")):
        env = json.loads((out / sub / "env.json").read_text())
        assert env["collective_delay_ms"] == delay
        assert env["plan"]["system"]["collective_delay_ms"] == delay
        calib = json.loads((out / sub / "calibration.json").read_text())
        assert calib["collective_delay_ms"] == delay
        assert calib["allreduce"]["p50_ms"] >= delay
        rows = pd.read_csv(out / sub / "requests.csv")
        assert set(rows["collective_delay_ms"]) == {delay}
    got = pd.read_csv(out / "sweep.csv")
    assert sorted(set(got["delay_ms"])) == [0.0, 3.0] and (out / "sweep.md").exists()
    print((out / "sweep.md").read_text(), file=sys.stderr)


def test_a_named_hosts_cost_is_read_off_the_curve_between_measured_costs():
    """Linear between the costs whose c bracket it; at an end point when c lies inside that
    point's interval of c; else not read."""
    rows = [_row(0, "wait_complete", 0.9, 0.8, 1.0) | {"c_ms": 1.0, "c_beside_ci_low_ms": 0.7,
                                                       "c_beside_ci_high_ms": 1.4},
            _row(2, "wait_complete", 0.7, 0.6, 0.8) | {"c_ms": 3.0, "c_beside_ci_low_ms": 2.5,
                                                       "c_beside_ci_high_ms": 3.5}]
    assert sweep.read_at(rows, "wait_complete", 2.0) == pytest.approx((0.8, 0.7, 0.9))
    assert sweep.read_at(rows, "wait_complete", 3.0) == pytest.approx((0.7, 0.6, 0.8))
    assert sweep.read_at(rows, "wait_complete", 0.8) == pytest.approx((0.9, 0.8, 1.0))
    assert sweep.read_at(rows, "wait_complete", 3.4) == pytest.approx((0.7, 0.6, 0.8))
    assert sweep.read_at(rows, "wait_complete", 0.5) is None
    assert sweep.read_at(rows, "wait_complete", 3.6) is None
    assert sweep.read_at(rows, "timeout", 2.0) is None


@pytest.mark.long  # make test-long: SGLang's own poll served at a delay
@pytest.mark.slow  # a 2-rank serve importing SGLang on each rank: about a minute
def test_sglangs_own_decision_collectives_pay_the_delay(tmp_path, monkeypatch):
    """--cache sglang: SGLang 0.5.23's timeout poll all-reduces through the door, and each
    of those collectives takes at least the added cost on the scheduler."""
    from bench.commands.run import main as main_run

    wheels = sorted(DEFAULT_CACHE.glob("sglang-0.5.23-*.whl"))
    if not wheels:
        pytest.skip(f"no sglang 0.5.23 wheel in {DEFAULT_CACHE} (make sglang-fetch)")
    monkeypatch.setenv("BENCH_NO_PLOTS", "1")
    out = tmp_path / "sgl"
    assert main_run(["--cache", "sglang", "--sglang", str(wheels[-1]), "--preset", "ci",
                     "--policies", "timeout", "--requests", "6", "--bystanders", "2",
                     "--output-tokens", "4", "--repeats", "1", "--seed", "3",
                     "--timeout-base", "0.004", "--storage-latency-ms", "60",
                     "--collective-delay-ms", "4", "--out", str(out)]) == 0
    steps = pd.read_csv(out / "steps.csv")
    polled = steps[steps["decision"] > 0]
    assert len(polled) and (polled["decision_sync_ms"] >= 4 * polled["decision"]).all()
    assert set(pd.read_csv(out / "requests.csv")["collective_delay_ms"]) == {4.0}
