"""The fidelity check (bench.compare.fidelity, `bench fidelity`): a run's ratios to pr27010 held
against a free-running run of the same workload; a pinned headline (prefetching TTFT 0.45x
against the server's 0.91x: docs/results/2026-12-03_headline_end_to_end.md) must fail it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from bench.commands import fidelity as cli
from bench.compare import fidelity

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(60)
# default workload, pr36425 / pr27010 under wait_complete, pinned against free
# (docs/results/2026-12-03_headline_end_to_end.md)
PINNED = {"prefetch_ttft_p50": (0.45, 0.43, 0.48), "bystander_ttft_p50": (0.74, 0.69, 0.79),
          "itl_p50": (0.79, 0.76, 0.82), "step_mean": (0.63, 0.61, 0.65)}
FREE = {"prefetch_ttft_p50": (0.91, 0.89, 0.93), "bystander_ttft_p50": (0.58, 0.52, 0.64),
        "itl_p50": (0.99, 0.95, 1.02), "step_mean": (0.75, 0.72, 0.78)}


def _summary(ratios: dict, schedule: str) -> pd.DataFrame:
    rows = []
    for protocol in ("pr27010", "pr36425"):
        row = {"protocol": protocol, "policy": "wait_complete", "schedule": schedule}
        for m, (p, lo, hi) in ratios.items():
            one = protocol == "pr27010"
            row |= {f"{m}_ratio": 1.0 if one else p, f"{m}_ratio_ci_low": 1.0 if one else lo,
                    f"{m}_ratio_ci_high": 1.0 if one else hi}
        rows.append(row)
    return pd.DataFrame(rows)


def test_the_pinned_headline_fails_against_the_free_run():
    rows = fidelity.fidelity_rows(_summary(PINNED, "pinned"), _summary(FREE, "free"))
    assert [(r.protocol, r.metric) for r in rows] == [("pr36425", m) for m in fidelity.METRICS]
    assert {r.metric: r.inside for r in rows} == {
        "prefetch_ttft_p50": False, "bystander_ttft_p50": False, "itl_p50": False,
        "step_mean": False}
    ok, line = fidelity.verdict(rows)
    assert not ok and line == ("fidelity: 0 of 4 ratios inside the free run's intervals; "
                               "pr36425/wait_complete prefetch_ttft_p50 0.45 against 0.91: "
                               "FAILED")


def test_a_mode_inside_the_free_intervals_passes_and_one_miss_fails():
    # the candidate's own interval may be wide or off: only its ratio is held in the free one
    near = {m: (p * 1.01, lo * 0.5, hi * 1.5) for m, (p, lo, hi) in FREE.items()}
    ok, line = fidelity.verdict(fidelity.fidelity_rows(_summary(near, "free"),
                                                       _summary(FREE, "free")))
    assert ok and line.endswith("4 of 4 ratios inside the free run's intervals: OK")
    near["itl_p50"] = (1.03, 0.9, 1.17)  # just past the free interval's 1.02, though the
    # candidate's own interval holds the free ratio
    ok, line = fidelity.verdict(fidelity.fidelity_rows(_summary(near, "free"),
                                                       _summary(FREE, "free")))
    assert not ok and "3 of 4" in line and "itl_p50 1.03 against 0.99" in line


def test_a_metric_without_a_free_interval_or_a_ratio_is_not_judged():
    gap = {**PINNED, "step_mean": (math.nan, math.nan, math.nan),
           "itl_p50": (0.79, math.nan, math.nan)}  # a ratio without its own interval: judged
    free = {**FREE, "prefetch_ttft_p50": (0.91, math.nan, math.nan)}
    rows = fidelity.fidelity_rows(_summary(gap, "pinned"), _summary(free, "free"))
    assert [r.metric for r in rows if not r.judged] == ["prefetch_ttft_p50", "step_mean"]
    blank = {m: (1.0, math.nan, math.nan) for m in FREE}
    ok, line = fidelity.verdict(fidelity.fidelity_rows(_summary(FREE, "free"),
                                                       _summary(blank, "free")))
    assert not ok and line == ("fidelity: nothing to judge (no free interval to hold a ratio "
                               "in): FAILED")


PLAN = {"preset": "default", "repeats": 20, "workload": {"requests": 24, "seed": 0},
        "system": {"schedule": "free"}}


def test_only_the_schedule_and_the_repeats_may_differ():
    free = _summary(FREE, "free")
    pinned_plan = {**PLAN, "repeats": 6, "system": {"schedule": "pinned"}}
    fidelity.check_comparable(pinned_plan, PLAN, free)  # no error
    other = {**PLAN, "workload": {"requests": 48, "seed": 0}}
    with pytest.raises(ValueError, match="differ in more than their schedule: "
                                         "workload.requests 24 vs 48"):
        fidelity.check_comparable(pinned_plan, other, free)
    with pytest.raises(ValueError, match="must be free-running .* pinned"):
        fidelity.check_comparable(PLAN, pinned_plan, _summary(FREE, "pinned"))
    with pytest.raises(ValueError, match="env.json's plan"):
        fidelity.check_comparable(None, PLAN, free)


def _run(tmp_path: Path, name: str, ratios: dict, schedule: str) -> Path:
    run = tmp_path / name
    run.mkdir()
    env = json.loads((REPO / "results" / "baseline" / "env.json").read_text())
    env["plan"] = {**PLAN, "system": {"schedule": schedule}}
    (run / "env.json").write_text(json.dumps(env))
    base = pd.read_csv(REPO / "results" / "baseline" / "summary.csv")
    base = base[(base.policy == "wait_complete") & base.protocol.isin(["pr27010", "pr36425"])]
    base = base.drop(columns=[c for c in base if c.endswith(("_ratio", "_ratio_ci_low",
                                                             "_ratio_ci_high"))])
    keys = ["protocol", "policy"]
    base.drop(columns="schedule").merge(_summary(ratios, schedule), on=keys) \
        .to_csv(run / "summary.csv", index=False)
    return run


def test_the_verb_exits_1_on_a_miss_0_on_a_match_2_on_bad_input(tmp_path, capsys):
    free = _run(tmp_path, "free", FREE, "free")
    assert cli.main([str(_run(tmp_path, "pinned", PINNED, "pinned")), str(free)]) == 1
    out = capsys.readouterr().out
    assert "| pr36425 | wait_complete | prefetch_ttft_p50 | 0.45 [0.43, 0.48] | " \
           "0.91 [0.89, 0.93] | NO |" in out and out.rstrip().endswith(": FAILED")
    assert cli.main([str(_run(tmp_path, "again", FREE, "free")), str(free)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("4 of 4 ratios inside the free run's "
                                                     "intervals: OK")
    assert cli.main([str(free), str(tmp_path / "absent")]) == 2
    assert cli.main([str(free), str(tmp_path / "pinned")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"bench fidelity: {tmp_path / 'absent'}: no such directory",
                   "bench fidelity: the reference run must be free-running (its schedule: "
                   "pinned)"]


@pytest.mark.long  # make test-long: a pinned headline against a free run
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_real_pinned_headline_fails_against_a_free_run_of_its_seed(tmp_path, capsys):
    """The check catches a pinned headline: make bench's burst, one seed, pinned
    and free; the pinned prefetching TTFT ratio (about 0.45) lies far below the free one
    (about 0.9), below any free interval the machine's noise can make of 3 repeats (the
    fewest an interval needs)."""
    from bench.commands.run import main as main_run

    common = ["--protocols", "pr27010,pr36425", "--policies", "wait_complete",
              "--repeats", "3"]
    for schedule in ("pinned", "free"):
        argv = [*common, "--schedule", schedule, "--out", str(tmp_path / schedule)]
        assert main_run(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert cli.main([str(tmp_path / "pinned"), str(tmp_path / "free")]) == 1
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if "| prefetch_ttft_p50 |" in line]
    assert len(row) == 1 and row[0].endswith("| NO |"), out
    assert out.rstrip().endswith(": FAILED")
