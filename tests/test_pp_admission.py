"""PD prefill's bootstrap admission at PP > 1 (SGLang issue #34572, PR #34568;
hicache.agreement.pd_admission): the admission rule as a decision table (no process
group), the configuration's bad input, which cells the hazard matrix has, and the
`pp-admission` cells on real gloo ranks (TP 2 x PP 2): the rule before the PR deadlocks in
the PP forward's hand-over, the PR's is OK, with the ring's sends and receives counted and
no decision collective added."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.hazards.matrix import MatrixSpec, run_one
from bench.hazards.scenarios import SCENARIOS, runs
from hicache.agreement.pd_admission import ready_filter, stage_sets
from hicache.agreement.protocols import REGISTRY
from hicache.spec.config import HiCacheConfig


class Ready:
    """A readiness answer per rid, remembering every rid it was asked about, in order."""

    def __init__(self, *ready: str):
        self.ready, self.asked = set(ready), []

    def __call__(self, rid: str) -> bool:
        self.asked.append(rid)
        return rid in self.ready


def test_stage_0_filters_its_good_set_in_order_checking_every_candidate():
    ready = Ready("r3", "r1")
    assert stage_sets(None, ["r3", "r2", "r1"], [], ready, 2, True) == (["r3", "r1"], [])
    assert ready.asked == ["r3", "r2", "r1"]  # no early stop at the first one not ready


def test_a_later_stage_keeps_the_previous_order_and_its_own_ready_members():
    ready = Ready("r1", "r2", "r4")
    prev = (["r2", "r1", "r3"], [])
    # r3: not in this stage's good set; r4: here but not in the previous stage's list
    assert stage_sets(prev, ["r1", "r3", "r4", "r2"], [], ready, 2, True)[0] == ["r2", "r1"]
    # r3 is in both good sets but not ready here: every stage must be ready
    assert stage_sets(prev, ["r1", "r2", "r3"], [], Ready("r1", "r2"), 2, True)[0] == \
        ["r2", "r1"]


def test_the_bad_set_is_the_previous_one_then_new_local_ones():
    prev = (["r1"], ["b2", "b1"])
    assert stage_sets(prev, ["r1"], ["b1", "b3", "b3"], Ready("r1"), 2, True)[1] == \
        ["b2", "b1", "b3"]
    assert stage_sets(None, [], ["b1", "b1"], Ready(), 2, True)[1] == ["b1"]


def test_before_the_pr_the_ring_ignores_readiness():
    ready = Ready()
    assert stage_sets((["r2", "r1"], []), ["r1", "r2"], [], ready, 2, False) == (["r2", "r1"], [])
    assert ready.asked == []


def test_pp_1_is_unchanged():
    ready = Ready()
    assert ready_filter(["r2", "r1"], ready, 1) == ["r2", "r1"] and ready.asked == []
    assert stage_sets(None, ["r2", "r1"], [], ready, 1, True) == (["r2", "r1"], [])


def test_only_pr34568_folds_readiness_into_the_ring():
    assert [name for name, p in REGISTRY.items() if p.ready_in_ring] == ["pr34568"]


@pytest.mark.parametrize(("fields", "says"), [
    ({"pd_admission": True, "pp": 1}, "pd_admission needs PP > 1"),
    ({"pd_stage_lag_steps": 2, "pp": 2}, "needs pd_admission"),
    ({"pd_admission": True, "pd_stage_lag_steps": -1, "pp": 2}, "must be >= 0"),
])
def test_bad_configuration_is_one_line(fields, says):
    with pytest.raises(ValueError, match=says) as e:
        HiCacheConfig(protocol="pr34568", tp=2, **fields)
    assert "\n" not in str(e.value)


def test_the_matrix_runs_pr34568_only_where_the_admission_stage_is_on():
    s = SCENARIOS["pp-admission"]
    assert s.system["pd_admission"] and s.pp == 2
    assert [p for p in REGISTRY if runs(s, p)] == ["pr36425", "pr34568"]
    assert [name for name, other in SCENARIOS.items() if runs(other, "pr34568")] == \
        ["pp-admission"]
    assert not runs(s, "pr36425", sglang=True)  # no SGLang release has the stage
    assert runs(SCENARIOS["pp-stages"], "pr36425", sglang=True)


@pytest.fixture(scope="module")
def cells(tmp_path_factory) -> tuple[MatrixSpec, dict[str, dict]]:
    spec = MatrixSpec((), (), seed=0, timeout_s=2.0, out=tmp_path_factory.mktemp("ppadmit"))
    return spec, {p: run_one(spec, SCENARIOS["pp-admission"], p) for p in ("pr36425", "pr34568")}


def _rank0(row: dict) -> dict:
    import json

    return json.loads((Path(row["cell_dir"]) / "rank0.json").read_text())


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_before_the_pr_the_stages_part_and_the_pp_hand_over_hangs(cells):
    spec, rows = cells
    row = rows["pr36425"]
    assert (row["outcome"], row["site"]) == ("deadlock", "pp_proxy"), row
    # stage 0 ran a prefill stage 1 did not: its hand-over met the next ring message
    assert "rank 0: pp_proxy" in row["detail"] and "rank 2: pp_hop" in row["detail"]
    assert row["named_s"] is not None and row["named_s"] <= 2 * spec.timeout_s


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_pr34568_admits_alike_with_the_ring_counted_and_no_decision_added(cells):
    _, rows = cells
    row = rows["pr34568"]
    assert row["outcome"] == "OK", row
    rep = _rank0(row)
    sites = rep["by_site"]
    # rank 0 (stage 0, TP rank 0) per step: pass 1 send, pass 2 receive and its TP
    # broadcast, pass 2 send; every prefill handed to stage 1
    assert sites["bootstrap_ring"] == 4 * rep["steps"] and row["ring_per_step"] == 4.0
    assert "decision" not in sites and row["decision_per_poll"] == 0.0
    assert sites["pp_proxy"] >= 1
    assert all(ours == torch for ours, torch in rep["crosscheck"].values()), rep["crosscheck"]


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(180)
def test_the_cells_repeat(cells):
    spec, rows = cells
    for protocol, first in rows.items():
        again = run_one(spec, SCENARIOS["pp-admission"], protocol, tag="__again")
        assert (again["outcome"], again["site"]) == (first["outcome"], first["site"])
