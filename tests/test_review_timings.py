"""`bench review`'s timing verdicts, its refused cells and its decision.json (docs/sglang-ci.md),
without serving: hand-made summaries and rows, fake stages, and the PP-ticket pipeline's
builder held against each cached release's own signature (read from its wheel, never
imported).
"""

from __future__ import annotations

import ast
import json
import math
import sys
import types
import zipfile

import numpy as np
import pandas as pd
import pytest

from bench.ab import sequential
from bench.ab.sides import Verdict, at_budget, verdicts
from bench.analysis import estimate
from bench.hazards import matrix, review_decision, review_stages
from bench.hazards.classify import REFUSED
from bench.hazards.report import exit_code
from bench.hazards.review import Findings, Part, RunRows, page, verdict
from bench.hazards.scenarios import SCENARIOS
from bench.hazards.side_changes import worse
from bench.rundir.decision import Disturbance
from bench.rundir.schema import COUNT_COLUMNS as COUNTS
from bench.rundir.schema import STEP_SITES

BASE, HEAD = "base=sglang-0.5.22@unified", "head=sglang-0.5.23@unified"
LIMITS = {"step_mean": 0.03, "itl_p50": 0.05, "prefetch_ttft_p50": 0.05,
          "bystander_ttft_p50": 0.10}


KEYS = {"tp": 2, "pp": 1, "storage": "sim", "rate_rps": float("inf"), "extra_pool": False,
        "race_guard": True}


def _stage(folder, ratios: list[float], lost: tuple[list[float], list[float]] | None = None):
    """A run of a base and a head (folder, its repeats): per repeat 4 steps of 10 ms on
    the base and 10 ms x ratio on the head, equal TTFTs, no collectives; ranks.csv's
    cpu_lost per serve where `lost` gives (base's, head's) per repeat."""
    folder.mkdir(parents=True)
    reqs, steps, ranks = [], [], []
    for r, ratio in enumerate(ratios):
        for side, ms in ((BASE, 10.0), (HEAD, 10.0 * ratio)):
            reqs += [{**KEYS, "protocol": side, "policy": "wait_complete", "repeat": r,
                      "rid": f"r{i}", "ttft_ms": 50.0 + i, **dict.fromkeys(COUNTS, 0)}
                     for i in range(3)]
            steps += [{**KEYS, "protocol": side, "policy": "wait_complete", "repeat": r,
                       "step": k, "step_ms": ms, **dict.fromkeys(STEP_SITES, 0)}
                      for k in range(4)]
            if lost is not None:
                ranks.append({**KEYS, "protocol": side, "policy": "wait_complete",
                              "repeat": r, "rank": 0,
                              "cpu_lost": lost[side == HEAD][r]})
    pd.DataFrame(reqs).to_csv(folder / "requests.csv", index=False)
    pd.DataFrame(steps).to_csv(folder / "steps.csv", index=False)
    if ranks:
        pd.DataFrame(ranks).to_csv(folder / "ranks.csv", index=False)
    (folder / "env.json").write_text(json.dumps({"plan": {"tp": 2, "pp": 1, "sides": [
        {"name": BASE}, {"name": HEAD}]}}))
    return folder, len(ratios)


def test_stages_pool_their_pairs_into_one_interval(tmp_path):
    """Two stages read as one run of each side, repeats continuing: the interval pools all
    12 pairs (the geometric mean of the step ratios, the t interval on a quiet machine) and
    narrows, and a check undecided on the first stage's 4 pairs is decided on all 12."""
    first = [1.00, 1.04, 0.97, 1.02]
    one = _stage(tmp_path / "s0", first)
    alone = verdicts([one], [BASE, HEAD], LIMITS)
    both = verdicts([one, _stage(tmp_path / "s1", first * 2)], [BASE, HEAD], LIMITS)
    step = {v.metric: v for v in both}["step_mean"]
    assert step.pairs == 12 and {v.metric: v for v in alone}["step_mean"].pairs == 4
    assert step.point == pytest.approx(math.exp(np.mean(np.log(first * 3))))
    assert step.half_width < {v.metric: v for v in alone}["step_mean"].half_width
    assert {v.metric: v.state for v in alone}["step_mean"] == "UNRESOLVED"
    assert step.state == "PASS" and step.high < 1.03 and step.method == "t-mean 0.95"
    assert {v.side for v in both} == {HEAD}


def test_a_disturbed_reviews_interval_is_adjusted_for_each_pairs_lost_cpu(tmp_path):
    """Serves that lost more than 5 % of the CPU (median, both sides): the served A/B's
    cpu-adjusted interval, the one bench.analysis.estimate.served makes by hand from the pairs
    and their cpu_lost (rank 0's row), named on the verdict."""
    rng = np.random.default_rng(3)
    lost_base = list(rng.uniform(0.1, 0.4, 10))
    lost_head = list(rng.uniform(0.1, 0.4, 10))
    ratios = [math.exp(0.4 * (h - b)) * (1 + 0.003 * (-1) ** r)
              for r, (b, h) in enumerate(zip(lost_base, lost_head, strict=True))]
    found = verdicts([_stage(tmp_path / "s0", ratios, (lost_base, lost_head))],
                     [BASE, HEAD], LIMITS)
    step = {v.metric: v for v in found}["step_mean"]
    by_hand = estimate.served(dict(enumerate(ratios)), dict.fromkeys(range(10), 1.0),
                              dict(enumerate(lost_head)), dict(enumerate(lost_base)))
    assert step.method == by_hand.method == "cpu-adjusted 0.95"
    assert (step.point, step.low, step.high) == pytest.approx(
        (by_hand.point, by_hand.low, by_hand.high))
    assert step.point == pytest.approx(1.0, abs=0.005) and step.state == "PASS"


@pytest.mark.parametrize("quiet, becomes", [(True, "FAIL"), (False, "INCONCLUSIVE")])
def test_an_undecided_check_at_the_budget_fails_on_a_quiet_machine_only(quiet, becomes):
    """The schema's rule: undecided at the budget is FAIL when quiet, INCONCLUSIVE when
    disturbed; decided checks and NOT JUDGED keep their state; none reads PASS."""
    undecided = Verdict(HEAD, "wait_complete", "step_mean", "UNRESOLVED", 1.02, 0.99, 1.05,
                        0.03, 24)
    kept = [Verdict(HEAD, "timeout", "step_mean", s, 1.0, lo, hi, 0.03, 24)
            for s, lo, hi in (("PASS", 0.98, 1.02), ("NOT JUDGED", None, None))]
    got = at_budget([undecided, *kept], Disturbance.measured([0.01 if quiet else 0.2]))
    assert [v.state for v in got] == [becomes, "PASS", "NOT JUDGED"]
    assert got[0].needed_half_width == pytest.approx(1.03 / 1.02 - 1)
    assert got[1].needed_half_width is None


def _ranks(folder, lost: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"rank": 0, "cpu_lost": lost}, {"rank": 1, "cpu_lost": 0.9}]).to_csv(
        folder / "ranks.csv", index=False)


@pytest.mark.parametrize("lost, final, code", [(0.01, "FAIL", 1), (0.20, "INCONCLUSIVE", 77)])
def test_stages_are_added_while_undecided_and_stop_at_the_budget(tmp_path, monkeypatch, lost,
                                                                 final, code):
    """A check undecided at every stage: stages of the rule's size are added up to the
    repeats' budget, then the machine's cpu_lost (rank 0's rows) decides FAIL or
    INCONCLUSIVE, and decision.json carries the verdict and exit code."""
    undecided = [Verdict(HEAD, "wait_complete", "step_mean", "UNRESOLVED", 1.029, 0.98, 1.08,
                         0.03, 0)]
    levels, ran = [], []
    monkeypatch.setattr(sequential, "PLAN_LOOKS", True)  # the looks at their spent levels
    monkeypatch.setattr(review_stages, "_verdicts",
                        lambda stages, limits, level: levels.append(level) or undecided)

    def stage(index, repeats, seed):
        ran.append((index, repeats, seed))
        _ranks(tmp_path / f"s{index}", lost)
        return str(tmp_path / f"s{index}"), 0

    plan = review_stages.StagePlan(repeats=4, seed=7, budget_repeats=12, budget_s=1e6)
    t = review_stages.run(plan, stage, LIMITS, log=lambda line: None)
    assert [r[2] for r in ran] == [7, 8, 9][:len(ran)] and sum(r[1] for r in ran) == 12
    # the planned looks (4, 8, 12), each at its alpha-spending level, together at most 5 %
    assert len(levels) == 3 and all(x > 0.95 for x in levels)
    assert sum(1 - x for x in levels) == pytest.approx(0.05)
    assert [v.state for v in t.verdicts] == [final] and t.pairs == 12
    assert t.disturbance.cpu_lost_p50 == pytest.approx(lost)
    out = review_decision.write(tmp_path, review_decision.Review(
        [("base", "0.5.22"), ("head", "0.5.23")], {"schedule": "pinned", "tp": 2}, t, 5, 0,
        LIMITS, []))
    on_disk = json.loads((tmp_path / "decision.json").read_text())
    assert on_disk["verdict"] == final and on_disk["exit_code"] == code == out["exit_code"]


SCHEMA_KEYS = {"schema", "kind", "verdict", "exit_code", "created", "host", "cores", "commit",
               "dirty", "branch", "a", "b", "preset", "schedule", "protocols", "policies",
               "thresholds", "estimator", "level", "pairs", "pairs_kept", "seconds",
               "disturbance", "exact", "metrics", "others", "stages", "refused"}
METRIC_KEYS = {"metric", "protocol", "policy", "layout", "ratio", "low", "high", "half_width",
               "needed_half_width", "threshold", "verdict", "pairs", "note"}


@pytest.mark.parametrize("exact_failed, states, whole", [
    (0, ["PASS", "NOT JUDGED"], "PASS"), (0, ["PASS", "INCONCLUSIVE"], "INCONCLUSIVE"),
    (1, ["PASS", "INCONCLUSIVE"], "FAIL"), (0, ["FAIL", "INCONCLUSIVE"], "FAIL")])
def test_the_decision_follows_the_schema_and_its_whole_rule(exact_failed, states, whole):
    found = [Verdict(HEAD, "wait_complete", m, s, 1.0, 0.98, 1.02, 0.03, 12)
             for m, s in zip(("step_mean", "itl_p50"), states, strict=True)]
    t = review_stages.Timings([review_stages.Stage("r/run", 0, 12, 0, 60.0)], found,
                              Disturbance(0.2, 0.3, False), 61.0)
    got = review_decision.record(review_decision.Review(
        [("base", "0.5.22"), ("head", "0.5.23")], {"schedule": "pinned"}, t, 4, exact_failed,
        LIMITS, []))
    assert SCHEMA_KEYS <= set(got) and got["schema"] == 1 and got["kind"] == "review"
    assert got["verdict"] == whole and got["exit_code"] == {"PASS": 0, "FAIL": 1,
                                                            "INCONCLUSIVE": 77}[whole]
    assert all(set(m) == METRIC_KEYS for m in got["metrics"]) and got["pairs"] == 12
    assert got["a"] == {"label": "base", "commit": None, "spec": "0.5.22"}
    assert got["created"].endswith("Z")


def _target(version: str):
    from sglang_adapter import Target

    return Target(f"/wheels/{version}", version, version, "unified", "sglang-0.5.23",
                  side="head")


def test_a_cell_a_side_cannot_run_is_refused_before_serving_and_never_fails(monkeypatch):
    """pp-busy (buffer_only at PP 2) on 0.5.20, which has no PP-ticket path on either of its
    SGLang paths: one REFUSED row without a serve (run_one is never called), the matrix's
    exit 0, not worse than the reference's OK, no reason to fail the review, on the page;
    0.5.21 on runs it."""
    monkeypatch.setattr(matrix, "_preload", lambda: None)
    monkeypatch.setattr(matrix, "run_one", lambda *a, **k: pytest.fail("a refused cell served"))
    busy = SCENARIOS["pp-busy"]
    assert [matrix.refusal(_target(v), busy) is None for v in ("0.5.20", "0.5.21", "0.5.23")] \
        == [False, True, True]
    spec = matrix.MatrixSpec(("sglang-0.5.23",), (busy,), sglang=_target("0.5.20"))
    rows = matrix.run_matrix(spec, log=lambda line: None)
    assert [r["outcome"] for r in rows] == [REFUSED]
    assert rows[0]["detail"].startswith("sglang 0.5.20: buffer_only at --pp > 1 needs ")
    ok = {**rows[0], "protocol": "base=sglang-0.5.23@unified", "outcome": "OK",
          "decision_per_poll": 1.0, "collectives_per_step": 5.0}
    both = [ok, rows[0]]
    assert exit_code(both, True, len(worse(both))) == (0, "OK") and worse(both) == []
    fine = Part("c", "f", 0)
    assert verdict(fine, fine, both, False) == []
    text = "\n".join(page(["base", "head"], Findings(fine, fine, both), RunRows(None, None, None)))
    assert "Refused before serving" in text and "- pp-busy on head=sglang-0.5.20@" in text


# ---- the PP-ticket path's pipeline, against each release's own builder ---------------------

def _stub(node: ast.FunctionDef) -> types.FunctionType:
    """A function with `node`'s parameters (annotations and defaults' values dropped to
    None) and no body: the release's signature, without importing it."""
    node = ast.FunctionDef(node.name, node.args, [ast.Pass()], [], None)
    for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
        a.annotation = None
    node.args.defaults = [ast.Constant(None) for _ in node.args.defaults]
    node.args.kw_defaults = [None if d is None else ast.Constant(None)
                             for d in node.args.kw_defaults]
    module = ast.fix_missing_locations(ast.Module([node], []))
    scope: dict = {}
    exec(compile(module, "<release>", "exec"), scope)
    return scope[node.name]


def _find(source: str, owner: str | None, name: str) -> ast.FunctionDef | None:
    for cls in ast.walk(ast.parse(source)):
        if isinstance(cls, ast.ClassDef) and (owner is None or cls.name == owner):
            for f in cls.body:
                if isinstance(f, ast.FunctionDef) and f.name == name:
                    return f
    return None


@pytest.mark.parametrize("version", ["0.5.21", "0.5.22", "0.5.23"])
def test_the_pp_ticket_pipeline_builds_on_every_release_with_the_path(version, monkeypatch):
    """The FULL component's create_buffer_pipeline (0.5.22: swa_window_pages, 0.5.23:
    swa_component) or BufferModePipeline itself (0.5.21): every parameter the release wants
    gets a value, the SWA ones a FULL-only tree's."""
    pytest.importorskip("torch")
    from sglang_adapter.controller import tickets
    from tests.sglang_wheels import sglang_wheel

    with zipfile.ZipFile(sglang_wheel(version)) as wheel:
        base = wheel.read("sglang/srt/mem_cache/unified_cache/components/base.py").decode()
        pipe = wheel.read("sglang/srt/mem_cache/buffer_mode/pipeline.py").decode()
    build = _find(base, None, "create_buffer_pipeline")
    full = type("FullComponent", (), {} if build is None else
                {"create_buffer_pipeline": _stub(build)})
    init = _stub(_find(pipe, "BufferModePipeline", "__init__"))
    monkeypatch.setitem(sys.modules, tickets.PIPELINE, types.SimpleNamespace(
        BufferModePipeline=type("BufferModePipeline", (), {"__init__": init})))
    _, swa, gap = tickets._builder(full)
    assert gap is None, gap
    assert swa and set(swa.values()) <= {None, 0}
    assert (build is None) == (version == "0.5.21")


def test_a_builder_that_wants_an_unknown_value_is_refused_by_name():
    from sglang_adapter.controller import tickets

    def create_buffer_pipeline(self, *, write_backlog_cap, pool_layout, max_context_len=0):
        pass

    full = type("FullComponent", (), {"create_buffer_pipeline": create_buffer_pipeline})
    assert "'pool_layout'" in tickets._builder(full)[2]
