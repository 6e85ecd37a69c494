"""SGLang's own controller path at PP > 1 (docs/sglang.md, "SGLang's own controller path",
"Its layouts"): the HybridCacheController's threads with the hit-query and ack MINs over
both groups its `_create_sync_groups` copies (the stage's TP ranks, then the TP column's PP
ranks), UnifiedRadixCache's per-step reduce and timeout verdict all-reduced on stage 0 and
relayed down the stages by `_pp_sync`, the later stages draining exactly stage 0's counts.

Tiers: which runs the path accepts (no process group); `bench run --cache sglang` at TP1 x
PP2 on the controller path, every request held against the project's model of 0.5.23 (in
make test, about 15 s); the controller rig (sglang_adapter.controller.rig) at TP1 x PP2 and TP2
x PP2, every rank's collectives per request by call site against the model of its stage
(make sglang-check). The wheel comes from the release cache (absent: skipped, never
passed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from bench.run.launch import launch
from bench.sglang_poll import controller as check
from hicache.spec.cost_model import Setting, expected_per_request
from sglang_adapter import Target, controller_unfit, run_unfit
from sglang_adapter.controller.rank import controller_rank
from sglang_adapter.target import pick_path
from tests.sglang_wheels import sglang_wheel
from tests.test_sglang_controller import ACK, DECISION, HIT, STEP, _wheel

REPO = Path(__file__).resolve().parent.parent
UNIFIED = Target("/nowhere", "0.5.23", "0.5.23", "unified", "sglang-0.5.23")
BUFFER_ONLY = "serves buffer_only host memory at --pp > 1 only"

# ---- which runs the path accepts (no process group) ----------------------------------------


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_the_controller_path_serves_every_pp_layout_with_host_memory_a_cache(pp):
    assert run_unfit(pp, {}) is None and controller_unfit(UNIFIED, pp, {}) is None
    assert pick_path(UNIFIED, None, pp, {}).controller  # auto takes it
    assert not pick_path(UNIFIED, "decisions", pp, {}).controller


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
@pytest.mark.parametrize("pp", [1, 2])
def test_the_controller_path_serves_the_write_path(pp, policy):
    system = {"write_policy": policy}
    assert run_unfit(pp, system) is None and controller_unfit(UNIFIED, pp, system) is None
    assert pick_path(UNIFIED, "controller", pp, system).controller


@pytest.mark.parametrize("pp, system, says", [
    (1, {"host_memory": "buffer_only"}, BUFFER_ONLY),
    (2, {"extra_pool": True, "host_memory": "buffer_only"}, "serves a side-car pool"),
    (1, {"write_policy": "write_back", "host_memory": "buffer_only"}, BUFFER_ONLY)])
def test_what_it_cannot_serve_stays_refused_in_one_line(pp, system, says):
    why = run_unfit(pp, system)
    assert why is not None and says in why and "\n" not in why
    assert not pick_path(UNIFIED, None, pp, system).controller  # auto: the decisions path
    with pytest.raises(ValueError, match=f"^--sglang-path controller {says}"):
        pick_path(UNIFIED, "controller", pp, system)


def test_buffer_only_at_pp1_is_refused_before_sglang_is_read(tmp_path, capsys):
    """buffer_only at PP 1 (BufferModePipeline's hit drain; at PP > 1 SGLang's PP-ticket
    path serves: tests/test_sglang_controller_tickets.py) is refused with its reason, one
    line, exit 2, before SPEC is resolved (no such SGLang here) and before any rank starts."""
    from bench.commands.run import main

    argv = ["--cache", "sglang", "--sglang", str(tmp_path / "no-sglang-here"),
            "--sglang-path", "controller", "--tp", "2", "--pp", "1", "--host-memory",
            "buffer_only", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and f"--sglang-path controller {BUFFER_ONLY}" in err
    assert "BufferModePipeline" in err, err
    assert not (tmp_path / "out").exists()


# ---- bench run at TP1 x PP2 on the controller path (make test) ------------------------------

# As tests/test_sglang_run.py's serve, timeout only: polls reach SGLang's relayed verdict,
# some prefetches end at their final ack, the rest at a poll past the budget.
RUN = ["--preset", "ci", "--requests", "6", "--bystanders", "2", "--output-tokens", "4",
       "--repeats", "1", "--seed", "3", "--schedule", "pinned", "--timeout-base", "0.004",
       "--storage-latency-ms", "60", "--policies", "timeout", "--tp", "1", "--pp", "2"]
RELAY = ("isend@pp_cpu mem_cache/unified_radix_cache.py:_pp_sync:404 < _all_reduce:387 < "
         "_can_terminate_prefetch:2311 < check_prefetch_progress:2405")
HIT_PP = f"all_reduce@sglang_hit_pp {HIT[0]} < {HIT[1]}"
ACK_PP = f"all_reduce@sglang_ack_pp {ACK[0]} < {ACK[1]}"


@pytest.fixture(scope="module")
def pp_run(tmp_path_factory) -> Path:
    wheel = sglang_wheel("0.5.23")
    _wheel("0.5.23")  # skips where SGLang's page-hash extension cannot build
    out = tmp_path_factory.mktemp("ctl_pp") / "run"
    done = subprocess.run([sys.executable, "-m", "bench", "run", *RUN, "--cache", "sglang",
                           "--sglang", str(wheel), "--sglang-path", "controller",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.long  # make test-long: SGLang's controller path at PP2 (TP2 stays in make test)
@pytest.mark.dist
@pytest.mark.timeout(260)
def test_bench_run_at_pp2_costs_what_the_model_says_per_request(pp_run):
    """Rank 0's decision, completion, PP-hop, hit-query and ack collectives per request,
    SGLang's own, against the model of 0.5.23 at TP1 x PP2 priced on what SGLang did."""
    assert json.loads((pp_run / "env.json").read_text())["plan"]["sglang"]["controller"]
    rows = pd.read_csv(pp_run / "requests.csv").set_index("rid")
    assert set(rows["protocol"]) == {"sglang-0.5.23@unified"}
    for rid, r in rows.iterrows():
        hit_pages = r["hit_tokens"] // r["page_size"] if r["io_issued"] else 0
        want = expected_per_request(Setting("sglang-0.5.23", r["policy"], 1, 2), r["polls"],
                                    hit_pages, r["op_issued"], r["io_issued"],
                                    r["terminated_by"] == "poll")
        got = (r["decision_collectives"], r["completion_collectives"], r["pp_hops"],
               r["hit_query_collectives"], r["ack_collectives"])
        assert got == (want.decision, want.completion, want.pp_hops, want.hit_query,
                       want.ack), (rid, r["terminated_by"], r["polls"])
    issued = rows[rows["op_issued"]]
    # TP1: no TP group to reduce over; the verdict is relayed (one send a poll on stage 0),
    # the hit query and acks reduce once, over SGLang's copy of the PP group.
    assert len(issued) == 6 and (issued["decision_collectives"] == 0).all()
    assert (issued["pp_hops"] == issued["polls"]).all() and (issued["polls"] > 0).all()
    assert (issued["hit_query_collectives"] == 1).all() and (issued["ack_collectives"] == 1).all()
    for col, site in (("call_sites", RELAY), ("call_sites", HIT_PP), ("call_sites", ACK_PP)):
        assert issued[col].str.contains(site, regex=False).all(), (site, issued[col].iloc[0])
    assert set(issued["terminated_by"]) == {"poll", "ack"}


@pytest.mark.long  # make test-long: the same PP2 serve
@pytest.mark.dist
@pytest.mark.timeout(260)
def test_bench_run_at_pp2_self_checks_hold(pp_run):
    ranks = pd.read_csv(pp_run / "ranks.csv")
    assert list(ranks["rank"]) == [0, 1]
    # the counter equals torch's sequence numbers on the harness's groups and SGLang's own
    assert ranks["crosscheck_ok"].all() and (ranks["host_slots_unaccounted"] == 0).all()
    assert (ranks["hit_query"] == 6).all() and (ranks["ack"] == 6).all()
    requests = pd.read_csv(pp_run / "requests.csv")
    assert requests["ranks_agree"].all() and requests["data_ok"].all()
    assert json.loads((pp_run / "verdict.json").read_text())["ok"]


# ---- the controller rig at TP1 x PP2 and TP2 x PP2 (make sglang-check) ----------------------

CASES = check.CASES
RECV = "mem_cache/unified_radix_cache.py:_pp_sync:396"
SEND = "mem_cache/unified_radix_cache.py:_pp_sync:404"
TP_SITE = "mem_cache/unified_radix_cache.py:_all_reduce_attn_groups:359"
RELAYED_DECISION = DECISION.replace("_all_reduce:386", "_all_reduce:387")
RELAYED_STEP = STEP.replace("_all_reduce:386", "_all_reduce:387")


def _by_request(calls) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for site, group, op, rid, via, n in calls:
        out.setdefault(rid, Counter())[(group, op, site, via)] += n
    return out


def _serve(tp: int, pp: int) -> list[dict]:
    return launch(tp * pp, controller_rank, (_wheel("0.5.23"), tp, CASES, 0.5, 0, pp),
                  timeout_s=400)


@pytest.fixture(scope="module")
def tp1pp2():
    return _serve(1, 2)


@pytest.fixture(scope="module")
def tp2pp2():
    return _serve(2, 2)


def _held(served: list[dict], tp: int, pp: int) -> None:
    """Every rank ended every prefetch at the same poll the same way; its collectives per
    request equal the model of its stage; what it loaded is what storage holds; the door
    equals torch's sequence numbers on every group, SGLang's own included."""
    assert all(r["outcomes"] == served[0]["outcomes"] for r in served)
    out = served[0]["outcomes"]
    assert (out["wc-part"]["hit_pages"], out["wc-long"]["hit_pages"]) == (3, 130)
    assert not out["wc-miss"]["io_issued"] and out["to-cut"]["ended_by"] == "poll"
    groups = {"pp", "sglang_hit_pp", "sglang_ack_pp"} | \
        ({"tp", "sglang_hit", "sglang_ack"} if tp > 1 else set())
    for r in served:
        assert r["layout"][1:] == (tp, pp)
        assert r["sglang"] == r["model"], {k: (r["sglang"][k], r["model"][k])
                                           for k in r["model"]}
        pages, good = r["loaded"]
        assert pages >= 3 + 130 and good == pages
        assert set(r["crosscheck"]) == groups, r["crosscheck"]
        assert all(counted == seen for counted, seen in r["crosscheck"].values())
        # Only stage 0 reduces the step's counts and the timeout verdict over its TP group
        # (the later stages receive them): a later stage's TP group carries none of SGLang's.
        stage = r["layout"][0] // tp
        assert {g for g, (n, _) in r["crosscheck"].items() if n == 0} == \
            ({"tp"} if stage > 0 and tp > 1 else set()), r["crosscheck"]


def _sites(served: list[dict], tp: int) -> None:
    """Per request and rank, by call site: the hit query and each 128-page batch's ack
    reduced over every group SGLang copied; the timeout verdict all-reduced on stage 0's
    TP group and relayed (send on stage 0, receive on stage 1); the step's reduce alike."""
    for r in served:
        stage = r["layout"][0] // tp
        calls = _by_request(r["calls"])
        for case in CASES:
            got, o = calls[case.rid], r["outcomes"][case.rid]
            acks = -(-o["hit_pages"] // 128) if o["io_issued"] else 0
            for suffix in ("_pp", "") if tp > 1 else ("_pp",):
                assert got[(f"sglang_hit{suffix}", "all_reduce", *HIT)] == 1, case.rid
                assert got[(f"sglang_ack{suffix}", "all_reduce", *ACK)] == acks, case.rid
            voted = o["ongoing_polls"] if case.policy == "timeout" else 0
            relay = ("isend", SEND) if stage == 0 else ("recv", RECV)
            assert got[("pp", *relay, RELAYED_DECISION)] == voted, (case.rid, stage)
            reduced = voted if stage == 0 and tp > 1 else 0
            assert got[("tp", "all_reduce", TP_SITE, DECISION)] == reduced, (case.rid, stage)
            step = calls[f"{case.rid}/step"]
            assert step[("pp", *relay, RELAYED_STEP)] == o["polls"], (case.rid, stage)
            assert step[("tp", "all_reduce", TP_SITE, STEP)] == \
                (o["polls"] if stage == 0 and tp > 1 else 0), (case.rid, stage)


@pytest.mark.dist
@pytest.mark.sglang_matrix
@pytest.mark.timeout(420)
def test_the_rig_at_tp1_pp2_costs_what_the_model_of_each_stage_says(tp1pp2):
    _held(tp1pp2, 1, 2)


@pytest.mark.dist
@pytest.mark.sglang_matrix
@pytest.mark.timeout(420)
def test_the_rig_at_tp1_pp2_issues_each_collective_on_sglangs_group(tp1pp2):
    _sites(tp1pp2, 1)


@pytest.mark.dist
@pytest.mark.slow  # four ranks, each importing SGLang
@pytest.mark.sglang_matrix
@pytest.mark.timeout(420)
def test_the_rig_at_tp2_pp2_costs_what_the_model_of_each_stage_says(tp2pp2):
    _held(tp2pp2, 2, 2)


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.sglang_matrix
@pytest.mark.timeout(420)
def test_the_rig_at_tp2_pp2_issues_each_collective_on_sglangs_group(tp2pp2):
    _sites(tp2pp2, 2)


# ---- bench hazards --cache sglang: the pp-stages cell on the controller path ---------------

def test_the_pp_stages_cell_takes_the_controller_path_where_it_fits():
    from bench.hazards.matrix import sglang_path
    from bench.hazards.scenarios import SCENARIOS

    # pp-busy: buffer_only at PP 2, SGLang's own PP-ticket path (its command thread);
    # span-skew: a side-car pool, SGLang's own sidecar spec and hit-query mask
    for name in ("pp-stages", "pp-busy", "span-skew"):
        assert sglang_path(UNIFIED, SCENARIOS[name]).controller, name
    # sidecar-race plants its hazard in the project's data path: SGLang's decisions
    assert not sglang_path(UNIFIED, SCENARIOS["sidecar-race"]).controller
    hiradix = Target("/nowhere", "0.5.18", "0.5.18", "hiradix", "pre27010")
    assert not sglang_path(hiradix, SCENARIOS["pp-stages"]).controller


@pytest.mark.dist
@pytest.mark.slow  # one 4-rank cell importing SGLang on each rank
@pytest.mark.sglang_matrix
@pytest.mark.timeout(500)
def test_the_pp_stages_cell_is_ok_on_sglangs_controller_path(tmp_path):
    """#22607 on SGLang's own controller path at TP2 x PP2: reads fail on some ranks and
    not others, SGLang's ack MINs (over the TP copy, then the PP copy) make the stages
    agree; the cell is OK, every rank decided every request alike."""
    sglang_wheel("0.5.23")
    _wheel("0.5.23")
    done = subprocess.run([sys.executable, "-m", "bench", "hazards", "--cache", "sglang",
                           "--sglang", "0.5.23", "--scenarios", "pp-stages", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=480, env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = pd.read_csv(tmp_path / "hazards.csv").iloc[0]
    assert (row["protocol"], row["outcome"]) == ("sglang-0.5.23@unified", "OK"), row.to_dict()
    ranks = [json.loads((Path(row["cell_dir"]) / f"rank{r}.json").read_text())
             for r in range(4)]
    assert all(r["decisions"] == ranks[0]["decisions"] for r in ranks)
    for r in ranks:  # SGLang's own ack MIN on both of its copies, on every rank alike
        acks = [sum(c[0] == g for c in r["sequence"]) for g in ("sglang_ack", "sglang_ack_pp")]
        assert acks[0] == acks[1] > 0, acks
