"""The seed PR as SGLang shipped it, with the model beside (`bench run --model-beside`, preset
seed-pr, `make bench SGLANG=0.5.18,0.5.19`: bench.run.sglang_worlds, bench.analysis.beside;
docs/sglang.md, "The seed PR as released"): the fidelity lines on hand-made summaries
(inside, outside, no interval: what a node without scipy gives), the model's world in the
turns, bad input, and one real small run of 0.5.18 against 0.5.19 with pre27010 / pr36425
beside them.
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from bench.analysis import beside
from bench.run import sglang_worlds
from bench.run.plan import RunPlan

REPO = Path(__file__).resolve().parent.parent
BEFORE, AFTER = "before=sglang-0.5.18@hiradix", "after=sglang-0.5.19@unified"
PLAN = {"sides": [{"name": BEFORE}, {"name": AFTER}], "beside": ["pre27010", "pr36425"]}
NAN = math.nan


def _row(protocol: str, policy: str, ratios: dict[str, tuple], schedule: str = "free") -> dict:
    row = {"protocol": protocol, "policy": policy, "schedule": schedule,
           "polls_per_step": 2.0, "step_mean_ms": 8.0}
    for metric, (point, low, high) in ratios.items():
        row |= {f"{metric}_ratio": point, f"{metric}_ratio_ci_low": low,
                f"{metric}_ratio_ci_high": high}
    return row


def _summaries(sglang: dict, model: dict, schedule: str = "free"):
    """The sides' summary (ratios to BEFORE) and the model's (ratios to pre27010)."""
    ones = {m: (1.0, NAN, NAN) for m in sglang}
    return (pd.DataFrame([_row(BEFORE, "wait_complete", ones, schedule),
                          _row(AFTER, "wait_complete", sglang, schedule)]),
            pd.DataFrame([_row("pre27010", "wait_complete", ones, schedule),
                          _row("pr36425", "wait_complete", model, schedule)]))


def test_a_model_ratio_inside_outside_or_without_an_interval():
    summary, model = _summaries(
        {"prefetch_ttft_p50": (0.95, 0.90, 1.01), "bystander_ttft_p50": (0.80, 0.70, 0.90),
         "itl_p50": (1.00, NAN, NAN), "step_mean": (0.88, 0.83, 0.94)},
        {"prefetch_ttft_p50": (0.93, 0.90, 0.96), "bystander_ttft_p50": (0.95, 0.9, 1.0),
         "itl_p50": (1.01, 0.95, 1.07), "step_mean": (0.83, 0.80, 0.86)})
    lines, rows = beside.lead_and_rows(summary, model, PLAN)
    text = "\n".join(lines)
    assert "fidelity: wait_complete TTFT p50 prefetch model 0.93 SGLang 0.95 [0.90, 1.01]: " \
        "inside" in text
    assert "fidelity: wait_complete TTFT p50 bystander model 0.95 SGLang 0.80 [0.70, 0.90]: " \
        "outside" in text
    # No interval (one repeat, or no scipy: docs/metrics.md, "Without scipy"): not judged.
    assert "fidelity: wait_complete ITL p50 model 1.01 SGLang 1.00 [no CI]: not judged" in text
    assert "fidelity: wait_complete step model 0.83 SGLang 0.88 [0.83, 0.94]: inside" in text
    assert text.splitlines()[-1] == ("fidelity: 2 of 3 model ratios inside SGLang's intervals; "
                                     "outside: wait_complete TTFT p50 bystander (reported, "
                                     "not a failure)")
    assert "pr36425 / pre27010 against after=sglang-0.5.19@unified / " \
        "before=sglang-0.5.18@hiradix" in text
    assert "0.83 [0.80, 0.86]" in text  # the model's own headline, its interval whole
    itl = next(r for r in rows if r["metric"] == "itl_p50")
    assert itl["judged"] is False and itl["inside"] is None and itl["sglang_ci_low"] is None
    assert [r["inside"] for r in rows if r["judged"]] == [True, False, True]
    assert set(rows[0]) == set(beside.FIDELITY_COLUMNS)


def test_nothing_judged_is_reported_not_failed_and_a_missing_model_row_is_not_judged():
    summary, model = _summaries({m: (0.9, NAN, NAN) for m in beside.METRICS},
                                {m: (0.9, NAN, NAN) for m in beside.METRICS})
    lines, _ = beside.lead_and_rows(summary, model.iloc[:1], PLAN)  # no pr36425 row
    assert "fidelity: wait_complete step model - SGLang 0.90 [no CI]: not judged" in \
        "\n".join(lines)
    assert lines[-1].startswith("fidelity: nothing judged") and "not a failure" in lines[-1]


def test_on_a_pinned_schedule_step_time_alone_is_held():
    summary, model = _summaries({"step_mean": (0.9, 0.8, 1.0)}, {"step_mean": (0.95, 0.9, 1)},
                                schedule="pinned")
    lines, rows = beside.lead_and_rows(summary, model, PLAN)
    assert [r["metric"] for r in rows] == ["step_mean"]
    assert lines[-1] == "fidelity: 1 of 1 model ratios inside SGLang's intervals"


@dataclass(frozen=True)
class _Target:  # what the turns read of a side's sglang_adapter Target
    name: str


def _plan(*names: str) -> RunPlan:
    targets = tuple(_Target(n) for n in names)
    return RunPlan(protocols=names, policies=("wait_complete",), repeats=2, sides=targets,
                   sglang=targets[0], out_dir="/tmp/run")


def test_the_model_is_one_more_world_serving_its_protocols_in_the_same_turns():
    plan = sglang_worlds.with_model(_plan(BEFORE, AFTER))
    assert plan.beside == ("pre27010", "pr36425")
    assert plan.protocols == (BEFORE, AFTER, "pre27010", "pr36425")
    worlds = sglang_worlds.worlds(plan)
    assert [(p.sglang and p.sglang.name, served) for p, served in worlds] == [
        (BEFORE, (BEFORE,)), (AFTER, (AFTER,)), (None, ("pre27010", "pr36425"))]
    assert [d.name for d in sglang_worlds.side_dirs(plan)] == ["side0", "side1", "model"]
    cells = plan.cells()
    model = sglang_worlds.Side(2, 3, None, 1.0, ("pre27010", "pr36425")).cells(worlds[2][0])
    assert [c.protocol for c in model] == [c.protocol for c in cells
                                           if c.protocol in ("pre27010", "pr36425")]
    assert {plan.repeat_seed(c) for c in cells if c.repeat == 0} == {0}  # one seed a repeat
    assert worlds[2][0].target(model[0]) is None  # the project's cache serves the model
    # Only the model's world pads its steps with the MIN SGLang's own step adds.
    assert [dict(p.system).get("step_pad_min", False) for p, _ in worlds] == \
        [False, False, True]


def _steps(sglang_mins: int, model_mins: int) -> pd.DataFrame:
    return pd.DataFrame([{"protocol": p, "per_step_min": n} for p, n in
                         ((BEFORE, sglang_mins), (AFTER, sglang_mins),
                          ("pre27010", model_mins), ("pr36425", model_mins))] * 3)


def test_the_lead_says_whether_the_model_paid_the_sides_collectives_a_step():
    summary, model = _summaries({"step_mean": (0.9, 0.8, 1.0)}, {"step_mean": (0.95, 0.9, 1)})
    lines, _ = beside.lead_and_rows(summary, model, PLAN, _steps(2, 2))
    said = [line for line in lines if line.startswith("per-step MINs a step")]
    assert said == ["per-step MINs a step: SGLang's sides 2.00, the model 2.00 (one a pad for "
                    "the MIN SGLang's own step adds beside the harness's): the same "
                    "collectives a step"]
    lines, _ = beside.lead_and_rows(summary, model, PLAN, _steps(2, 1))
    assert any("SGLang's sides 2.00, the model 1.00" in line and "they differ" in line
               for line in lines)
    lines, _ = beside.lead_and_rows(summary, model, PLAN)  # no steps: no line
    assert not any(line.startswith("per-step MINs") for line in lines)


@pytest.mark.parametrize("names, says", [
    ((BEFORE,), "needs several SGLangs"),
    (("a=sglang-0.5.23@unified", "b=sglang-tree:pr@unified"),
     "two sides are modelled by sglang-0.5.23")])
def test_a_model_that_cannot_stand_beside_is_refused(names, says):
    with pytest.raises(ValueError, match=says):
        sglang_worlds.with_model(_plan(*names))


@pytest.mark.timeout(60)
def test_model_beside_without_sglang_sides_is_one_line_exit_2_nothing_written(tmp_path,
                                                                               capsys):
    from bench.commands.run import main

    out = tmp_path / "run"
    assert main(["--model-beside", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs several SGLangs" in err, err
    assert not out.exists()


# ---- one real small run: 0.5.18 against 0.5.19, pre27010 / pr36425 beside them ------------

RUN = ["--preset", "seed-pr", "--requests", "4", "--bystanders", "2", "--output-tokens", "8",
       "--repeats", "3"]


@pytest.mark.sglang_matrix  # needs 0.5.18's and 0.5.19's wheels (make sglang-check fetches)
@pytest.mark.timeout(300)
def test_the_seed_pr_run_prints_both_headlines_and_a_fidelity_line_per_metric(tmp_path):
    from tests.sglang_wheels import sglang_wheel

    sglang_wheel("0.5.18"), sglang_wheel("0.5.19")
    done = subprocess.run([sys.executable, "-m", "bench", "run", *RUN, "--out",
                           str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True,
                          timeout=280, env={**__import__("os").environ, "BENCH_NO_PLOTS": "1"})
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    flat = " ".join(out.split())  # the console wraps at 120 columns
    assert f"SGLang sides, ratios to {BEFORE}" in flat
    assert "every side on SGLang's decisions path" in flat
    assert "The model beside, ratios to pre27010" in flat
    for policy in ("wait_complete", "timeout"):
        for label in ("TTFT p50 prefetch", "TTFT p50 bystander", "ITL p50", "step"):
            assert f"fidelity: {policy} {label} model " in flat, out[-3000:]
    assert "model ratios inside SGLang's intervals" in flat
    assert out.strip().splitlines()[-1].startswith("OK")
    fidelity = pd.read_csv(tmp_path / "run" / "fidelity.csv")
    assert len(fidelity) == 8 and fidelity["judged"].all()
    requests = pd.read_csv(tmp_path / "run" / "requests.csv")
    assert set(requests["protocol"]) == {BEFORE, AFTER, "pre27010", "pr36425"}
    for _, g in requests.groupby("repeat"):  # one seed: the same requests in all four
        rids = [frozenset(g[g["protocol"] == p]["rid"]) for p in set(g["protocol"])]
        assert len(set(rids)) == 1


@pytest.mark.slow  # imports 0.5.23 in this process to learn its class
@pytest.mark.timeout(120)
def test_sides_of_one_model_are_refused_before_any_rank_starts(tmp_path, capsys):
    from bench.commands.run import main
    from tests.sglang_wheels import sglang_wheel

    sglang_wheel("0.5.23")
    out = tmp_path / "run"
    assert main(["--cache", "sglang", "--sglang", "a=0.5.23,b=0.5.23", "--model-beside",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "two sides are modelled by sglang-0.5.23" in err
    assert not out.exists()


@pytest.mark.long  # make test-long: imports 0.5.18 and 0.5.19 to plan the preset
@pytest.mark.slow  # imports 0.5.18 and 0.5.19 in this process to learn their classes
@pytest.mark.timeout(120)
def test_the_preset_serves_sglang_with_its_sides_or_those_given():
    from bench.plan import options, resolve
    from tests.sglang_wheels import sglang_wheel

    sglang_wheel("0.5.18"), sglang_wheel("0.5.19")
    for given, names in [(None, (BEFORE, AFTER)),
                         ("0.5.18,0.5.19", ("sglang-0.5.18@hiradix", "sglang-0.5.19@unified"))]:
        plan = resolve.build_plan(options.RunOptions(preset="seed-pr", sglang=given,
                                                     device="cpu"))
        assert plan.protocols == (*names, "pre27010", "pr36425") and plan.schedule == "free"
