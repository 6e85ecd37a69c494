"""`bench run --resolve` (make bench's default): a run's protocols served in stages until the
headline's p50 ratios resolve a half-width, on the sequential A/B's loop and sizing, its
stages merged into one run directory, its intervals the served A/B's. Fake stages (written
run folders) for the loop; one real staged run of two stages."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from bench.ab import protocols, sequential
from bench.ab.sequential import Budget, to_resolve
from bench.analysis import estimate, lead
from bench.analysis.conditions import stage_line
from bench.analysis.summarize import summarize
from bench.errors import UserError
from bench.plan import resolve
from bench.plan.options import RunOptions
from bench.rundir.files import write_json_atomic
from bench.rundir.rundir import RunDir
from tests.test_gate import CONFIG, write_run
from tests.test_gate_quiet import serving_requests, serving_steps

REPO = Path(__file__).resolve().parent.parent
ROOMY = Budget(repeats=96, seconds=1e9)


# ---- the sizing rule ----------------------------------------------------------------------

@pytest.mark.parametrize("halves, n, budget, add", [
    ([0.02, 0.03], 12, ROOMY, 0),                 # every ratio resolved: stop
    ([0.02, 0.06], 12, ROOMY, 12),                # needs 4x the pairs: at most double
    ([0.02, 0.033], 12, ROOMY, 6),                # 14.5 in all, a fifth more: 18 - 12
    ([0.02, None], 12, ROOMY, 4),                 # no interval yet: the least stage
    ([0.02, 0.06], 12, Budget(20, 1e9), 8),       # the repeats left
    ([0.02, 0.06], 12, Budget(96, 130.0), 1),     # 10 s a repeat so far: 1 more fits
    ([0.02, 0.06], 12, Budget(96, 120.0), 0),     # no second left
    ([0.02, 0.06], 12, Budget(12, 1e9), 0),       # no repeat left
])
def test_a_stage_is_sized_to_the_widest_ratio_within_the_budget(halves, n, budget, add):
    assert to_resolve(halves, 0.03, n, 10.0 * n, budget) == add


def test_the_stage_loop_takes_its_sizing_and_says_why():
    """staged() with `resolving`: the half-widths size each stage, and the reason is logged."""
    said, served = [], []

    class Stage:
        def __init__(self, repeats):
            self.repeats = repeats

    def serve(index, repeats, seed):
        served.append((index, repeats, seed))
        return Stage(repeats)

    def judge(stages):
        n = sum(s.repeats for s in stages)
        return {"step": 0.1 / math.sqrt(n)}, n

    stages, last = sequential.staged(3, 7, serve, judge, sequential.resolving(0.03, ROOMY),
                                     said.append, "t")
    assert [s for _, s, _ in served][:2] == [3, 4] and [x for *_, x in served][:2] == [7, 8]
    assert 0.1 / math.sqrt(last) <= 0.03 < 0.1 / math.sqrt(last - served[-1][1])
    assert said[0] == ("t: 1 headline ratio(s) not yet resolved to 3.0% after 3 paired "
                       "repeats: a stage of 4 more (seed 8)")


# ---- the plan ------------------------------------------------------------------------------

def _plan(**kw):
    return resolve.build_plan(RunOptions(**kw))


def test_make_bench_stages_and_a_fixed_repeat_count_does_not():
    default = _plan()
    assert (default.resolve, default.budget_s, default.budget_repeats, default.repeats) == \
        (0.03, 300.0, 96, 12)
    fixed = _plan(repeats=20)  # the gate's and bench ab's sides: fixed, no budget recorded
    assert (fixed.resolve, fixed.budget_s, fixed.budget_repeats) == (None, None, None)
    assert _plan(resolve=0.0).resolve is None
    assert _plan(repeats=4, resolve=0.05, budget_s=60).budget_s == 60
    for preset in ("delay-sweep", "ci", "cost"):
        assert _plan(preset=preset).resolve is None


@pytest.mark.parametrize("kw, said", [
    ({"resolve": 1.5}, "--resolve must lie in [0, 1)"),
    ({"resolve": -0.1}, "--resolve must lie in [0, 1)"),
    ({"preset": "ci", "budget_s": 60.0}, "need --resolve F"),
    ({"repeats": 5, "budget_repeats": 10}, "need --resolve F"),
    ({"budget_repeats": 4}, "below the first stage's 12 repeats"),
    ({"budget_s": 0.0, "resolve": 0.03}, "--budget-s must be > 0"),
    ({"resolve": 0.03, "collective_delay_ms": "0,1"}, "a cost sweep"),
])
def test_bad_staging_options_are_refused_in_one_line(kw, said):
    with pytest.raises(UserError, match=re.escape(said)):
        _plan(**kw)


# ---- stages of written runs ------------------------------------------------------------------

def _noisy(protocol, repeat):
    return (1 + 0.04 * math.sin(3 * repeat)) * (1.02 if protocol == "pr36425" else 1.0)


def _fake_serve(fail_at: int | None = None):
    """A stage's serve that writes a run folder of the plan's repeats (each a copy of one of
    three serving repeats, its requests half bystanders), or fails at stage `fail_at`."""
    reqs, steps = serving_requests(_noisy), serving_steps(_noisy)
    reqs = reqs.assign(request_class=["bystander" if i % 2 else "prefetch"
                                      for i in range(len(reqs))])
    calls = []

    def serve(plan) -> str | None:
        calls.append(plan)
        if fail_at is not None and len(calls) == fail_at + 1:
            return "rank 1 died"
        pick = lambda f: pd.concat([f[f.repeat == r % 3].assign(repeat=r)  # noqa: E731
                                    for r in range(plan.repeats)], ignore_index=True)
        folder = Path(plan.out_dir)
        write_run(folder, pick(reqs), pick(steps), with_summary=False)
        write_json_atomic(folder / "env.json", {"plan": {"repeats": plan.repeats,
                                                         "seed": plan.seed}})
        return None

    return serve, calls


def _staged_plan(tmp_path, **kw):
    return replace(_plan(preset="default", resolve=kw.pop("resolve", 0.03), repeats=3,
                         budget_repeats=kw.pop("budget_repeats", 10), seed=5),
                   out_dir=str(tmp_path / "run"))


def test_a_resolved_first_stage_is_the_whole_run(tmp_path):
    serve, calls = _fake_serve()
    assert protocols.serve_staged(_staged_plan(tmp_path, resolve=0.9), serve, print) is None
    assert [p.repeats for p in calls] == [3]
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert [s["repeats"] for s in env["stages"]] == [3] and env["plan"]["repeats"] == 3


def test_stages_are_merged_with_their_repeats_numbered_on_until_the_budget(tmp_path):
    """A target no run reaches: stages of 3, 4 and 3 repeats (the budget's 10), on seeds
    5, 6, 7, merged into one run whose repeats run 0-9; its summary pools them all."""
    serve, calls = _fake_serve()
    plan = _staged_plan(tmp_path, resolve=1e-6)
    assert protocols.serve_staged(plan, serve, print) is None
    assert [(p.repeats, p.seed) for p in calls] == [(3, 5), (4, 6), (3, 7)]
    assert [Path(p.out_dir).name for p in calls] == ["00", "01", "02"]
    assert {(p.resolve, p.budget_s) for p in calls} == {(None, None)}  # one fixed run each
    run = RunDir(tmp_path / "run")
    assert sorted(run.requests("report").repeat.unique()) == list(range(10))
    assert sorted(run.steps("report").repeat.unique()) == list(range(10))
    env = run.env()
    assert env["plan"].items() >= {"repeats": 10, "seed": 5, "resolve": 1e-6}.items()
    assert [s["seed"] for s in env["stages"]] == [5, 6, 7]
    line = stage_line(env)
    assert line.startswith("Staged to resolve 0.0% on the headline's p50s (no stage started "
                           "after 300 s, at most 10 repeats)")
    assert "3 stage(s), repeats 3 on seed 5, 4 on seed 6, 3 on seed 7; 10 repeats in" in line
    widths = lead.half_widths(summarize(run.requests("report"), run.steps("report")))
    assert len(widths) == 2 * 2 * 4 and all(h is not None for h in widths.values())


def test_a_failed_stage_ends_the_run_and_the_stages_before_it_stand(tmp_path):
    serve, calls = _fake_serve(fail_at=1)
    error = protocols.serve_staged(_staged_plan(tmp_path, resolve=1e-6), serve, print)
    assert error == "rank 1 died" and len(calls) == 2
    run = RunDir(tmp_path / "run")
    assert sorted(run.requests("report").repeat.unique()) == [0, 1, 2]
    assert [s.get("error") for s in run.env()["stages"]] == [None, "rank 1 died"]


def test_without_scipy_a_staged_run_is_its_first_stage(tmp_path, monkeypatch):
    from bench import stats

    monkeypatch.setattr(stats, "_scipy_stats", lambda: None)
    serve, calls = _fake_serve()
    said = []
    assert protocols.serve_staged(_staged_plan(tmp_path, resolve=1e-6), serve, said.append) \
        is None
    assert len(calls) == 1 and "scipy is not installed" in said[0]


# ---- the summary's intervals are the served A/B's ---------------------------------------------

def test_a_disturbed_runs_headline_intervals_are_cpu_adjusted(tmp_path):
    """Where more than a tenth of a row's serves lost over 5 % of the CPU (ranks.csv), its
    ratios' intervals are the served A/B's cpu-adjusted ones, named in interval_method and
    in the resolution line; without cpu_lost, the t-mean of before."""
    lost = {("pr36425", 1): 0.30}

    def slow(protocol, repeat):
        return (1 + 0.5 * lost.get((protocol, repeat), 0.0)) * _noisy(protocol, repeat)

    reqs, steps = serving_requests(slow), serving_steps(slow)
    ranks = pd.DataFrame([{**CONFIG, "protocol": p, "policy": pol, "repeat": r, "rank": k,
                           "cpu_s": 1.0, "wall_s": 1.0,
                           "cpu_lost": lost.get((p, r), 0.01) if k == 0 else 0.5}
                          for p, pol, r in steps[["protocol", "policy", "repeat"]]
                          .drop_duplicates().itertuples(index=False) for k in (0, 1)])
    quiet, adjusted = summarize(reqs, steps), summarize(reqs, steps, ranks=ranks)
    key = (adjusted.protocol == "pr36425") & (adjusted.policy == "wait_complete")
    row = adjusted[key].iloc[0]
    assert row.interval_method == "cpu-adjusted 0.95"
    assert quiet[key].iloc[0].interval_method == "t-mean 0.95"
    step = lambda p: steps[(steps.protocol == p) & (steps.policy == "wait_complete")] \
        .groupby("repeat").step_ms.mean().to_dict()  # noqa: E731
    by_hand = estimate.served(step("pr36425"), step("pr27010"),
                              {1: 0.30, 0: 0.01, 2: 0.01}, dict.fromkeys(range(3), 0.01))
    assert (row.step_mean_ratio, row.step_mean_ratio_ci_low) == \
        pytest.approx((by_hand.point, by_hand.low))
    assert adjusted[adjusted.protocol == "step-clock"].interval_method.eq("t-mean 0.95").all()
    line = lead.resolution_lines(adjusted)[0]
    assert "Intervals cpu-adjusted in 2 of 4 rows: more than a tenth of their serves" in line
    assert "cpu-adjusted" not in lead.resolution_lines(quiet)[0]


# ---- one real staged run ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.dist
def test_make_bench_serves_a_second_stage_and_reports_one_run(tmp_path):
    """The default preset, small: 2 repeats (no interval yet), then a stage of 1 (the
    budget's 3), merged; the run checks itself as any run (OK line), its report names the
    stages."""
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--protocols", "pr27010,pr36425",
         "--policies", "wait_complete", "--requests", "2", "--bystanders", "1",
         "--output-tokens", "2", "--repeats", "2", "--resolve", "0.0001",
         "--budget-repeats", "3", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "a stage of 1 more (seed 1)" in done.stderr
    run = RunDir(out)
    assert sorted(run.requests("report").repeat.unique()) == [0, 1, 2]
    assert [s["repeats"] for s in run.env()["stages"]] == [2, 1]
    assert "Staged to resolve 0.0% on the headline's p50s" in (out / "report.md").read_text()
    assert done.stdout.splitlines()[-1].startswith("OK")


def test_a_plan_that_does_not_stage_reads_as_a_plan_from_before_staging():
    """The gate compares the ci run's plan with the committed baseline's (written before
    staging existed): a fixed plan records no target and no budget, so they agree."""
    from bench.run.plan import plan_differences
    from bench.run.sink import _plan_dict

    now = _plan_dict(_plan(preset="ci"))
    before = {k: v for k, v in now.items() if k not in ("resolve", "budget_s", "budget_repeats")}
    assert plan_differences(now, before, "vs") == []
    staged_plan = _plan_dict(_plan())  # a staged one differs by its staging alone
    unstaged = {k: v for k, v in staged_plan.items()
                if k not in ("resolve", "budget_s", "budget_repeats")}
    assert plan_differences(staged_plan, unstaged, "vs") == [
        "budget_repeats 96 vs (unset)", "budget_s 300.0 vs (unset)", "resolve 0.03 vs (unset)"]
