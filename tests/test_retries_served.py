"""SGLang 0.5.23's storage prefetch retries served on real ranks: the retry scenarios' counts
request by request against the cost model, the hazard matrix's retry cells, and SGLang's own
retries against the model (pinned). The one-process checks of the retry set and of where
HiCache arms a retry are in tests/test_retries.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import astuple
from pathlib import Path

import pandas as pd
import pytest

from hicache.spec.cost_model import Setting, expected_per_request
from hicache.spec.step_time import StepTimeModel
from tests.helpers import case, run_cases

REPO = Path(__file__).resolve().parent.parent
PAGE = 64
# make test-long: every test here serves real ranks through the retry cells, SGLang's among
# them (about 2 minutes of serves); tests/test_retries.py checks the retry set in one process
pytestmark = pytest.mark.long


# ---- real ranks: the retry scenarios' counts, request by request ---------------------------

SITES = ("decision", "completion", "pp_hop", "hit_query", "ack", "ticket")
# The matrix's retry scenarios (bench/hazards/scenarios.py), on 2 ranks (TP2): one request
# a step, so the tail still waits when its retry falls due; every prefix lands at step 4
# ("late"), or on TP rank 1 only at step 6 ("skew").
LANDING = {"late": {"land_step": 4}, "skew": {"land_skew_steps": 6}}
PINNED = {"schedule": "pinned", "step_time": StepTimeModel(prefill_base_ms=5.0,
                                                           decode_base_ms=1.0)}


def _retry_cases(protocol: str) -> list[dict]:
    base = {"protocol": protocol, "policy": "timeout", "tp": 2, "max_prefill_tokens": 2048,
            "timeout_base_s": 30.0, "timeout_per_ki_token_s": 0.0}
    return [case({**base, **LANDING[land], **(PINNED if sched == "pinned" else {})},
                 {"latency_ms": 20.0}, n=16, prefix_tokens=512, new_tokens=1536, gap_s=0.0)
            for land in LANDING for sched in ("free", "pinned", "pinned")]


@pytest.fixture(scope="module")
def retry_runs():
    return {p: run_cases(2, _retry_cases(p), timeout_s=150)
            for p in ("sglang-0.5.23", "pr36425")}


def _expected_row(protocol: str, row: dict) -> tuple:
    e = expected_per_request(Setting(protocol, "timeout", 2, 1), row["polls"],
                             row["hit_tokens"] // PAGE, row["op_issued"], row["io_issued"],
                             row["terminated_by"] == "poll", ops=row["prefetch_ops"])
    return astuple(e)


@pytest.mark.dist
@pytest.mark.parametrize("protocol", ["sglang-0.5.23", "pr36425"])
def test_retry_scenarios_cost_what_the_model_says_request_by_request(retry_runs, protocol):
    for i, per_rank in enumerate(retry_runs[protocol]):
        for res in per_rank:
            for row in res["rows"]:
                got = tuple(row.get(f"coll_{s}", 0) for s in SITES)
                assert got == _expected_row(protocol, row), (i, res["layout"], row["rid"])
            for group, (counted, seq) in res["crosscheck"].items():
                assert counted == seq, (i, group)
        assert per_rank[0]["decisions"] == per_rank[1]["decisions"], i  # the ranks agree


@pytest.mark.dist
def test_0523_retries_turn_the_late_misses_into_hits_and_0519_never_does(retry_runs):
    for new, old in zip(retry_runs["sglang-0.5.23"], retry_runs["pr36425"], strict=True):
        retried = [r for r in new[0]["rows"] if r["prefetch_ops"] > 1]
        assert retried, "no request waited long enough for its retry"
        assert all(r["retries"] == r["prefetch_ops"] - 1 for r in new[0]["rows"])
        assert all(r["terminated_by"] == "ack" and r["hit_tokens"] == 512 for r in retried)
        assert all(r["prefetch_ops"] == 1 and r["retries"] == 0 for r in old[0]["rows"])
        assert any(r["hit_tokens"] == 0 for r in old[0]["rows"])  # its misses stay misses
        # each retry is one more hit query, on the prefetch thread's groups, on both ranks
        extra = sum(r.get("coll_hit_query", 0) for r in new[0]["rows"]) - len(new[0]["rows"])
        assert extra == len(retried)


@pytest.mark.dist
def test_pinned_retry_scenarios_repeat_request_by_request(retry_runs):
    runs = retry_runs["sglang-0.5.23"]
    for first, second in ((runs[1], runs[2]), (runs[4], runs[5])):
        keys = ("rid", "polls", "prefetch_ops", "retries", "terminated_by", "hit_tokens",
                *(f"coll_{s}" for s in SITES))
        rows = [[{k: r.get(k, 0) for k in keys} for r in res["rows"]] for res in (first[0],
                                                                                  second[0])]
        assert rows[0] == rows[1]


# ---- the hazard matrix's retry cells on the model ------------------------------------------

@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", ["late-write", "miss-skew"])
def test_the_retry_cells_are_ok_and_only_0523_fetches_what_landed(scenario, tmp_path):
    """The ranks part nowhere: the miss reaches the retry set only through the agreed
    (MIN) hit, so a rank that held the pages (miss-skew) arms the same retry as its peer."""
    from bench.hazards.matrix import MatrixSpec, run_one
    from bench.hazards.scenarios import RETRY_PROTOCOLS, SCENARIOS

    spec = MatrixSpec((), (), seed=0, timeout_s=2.0, out=tmp_path)
    fetched = {}
    for protocol in RETRY_PROTOCOLS:
        row = run_one(spec, SCENARIOS[scenario], protocol)
        assert row["outcome"] == "OK", (protocol, row)
        cell = tmp_path / "cells" / f"{scenario}__{protocol}"
        ranks = [json.loads((cell / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert ranks[0]["decisions"] == ranks[1]["decisions"]
        fetched[protocol] = sum(d[0] == "ack" for d in ranks[0]["decisions"].values())
    assert fetched == {"pr36425": 0, "sglang-0.5.23": fetched["sglang-0.5.23"]}
    assert fetched["sglang-0.5.23"] > 0


# ---- SGLang 0.5.23's own retries against the model, request by request (pinned) -------------

# A burst of 8 whose first lookups miss; two running at a time (12 tokens each), so the
# tail waits past its retry's due pass. The SGLang side runs SGLang's controller path (its
# hit drain arms SGLang's own StoragePrefetchRetries, the harness's scheduler pops it as
# SGLang's does, its prefetch_from_storage re-issues, its prefetch thread's MIN agrees).
RETRY_RUN = ["--preset", "ci", "--policies", "timeout,wait_complete", "--requests", "8",
             "--bystanders", "0", "--output-tokens", "12", "--max-running", "2",
             "--repeats", "1", "--seed", "3", "--schedule", "pinned"]
PER_REQUEST = ["polls", "prefetch_ops", "retries", "decision_collectives",
               "completion_collectives", "hit_query_collectives", "ack_collectives", "pp_hops",
               "terminated_by", "hit_tokens", "prefetched_tokens", "schedule_digest"]
SGLANG_HIT = ("2x all_reduce@sglang_hit managers/cache_controller.py:_all_reduce:447 < "
              "_sync_prefetch_hit_query:1502 < prefetch_thread_func:1356")


def _bench_run(out: Path, *argv: str) -> pd.DataFrame:
    done = subprocess.run([sys.executable, "-m", "bench", "run", *argv, "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=500,
                          env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return pd.read_csv(out / "requests.csv").set_index(["policy", "rid"]).sort_index()


@pytest.mark.dist
@pytest.mark.timeout(600)
@pytest.mark.parametrize("landing", [["--land-step", "4"], ["--land-skew-steps", "6"]],
                         ids=["late-write", "miss-skew"])
def test_sglang_0523s_own_retries_cost_what_the_model_does_per_request(landing, tmp_path):
    from tests.sglang_wheels import sglang_wheel

    sglang_wheel("0.5.23")
    model = _bench_run(tmp_path / "model", *RETRY_RUN, *landing, "--protocols", "sglang-0.5.23")
    sgl = _bench_run(tmp_path / "sglang", *RETRY_RUN, *landing, "--cache", "sglang",
                     "--sglang", "0.5.23")
    plan = json.loads((tmp_path / "sglang" / "env.json").read_text())["plan"]
    assert plan["sglang"]["controller"], "SGLang's controller path did not serve the run"
    retried = sgl[sgl["prefetch_ops"] > 1]
    assert len(retried) and (retried["terminated_by"] == "ack").all()
    assert retried["call_sites"].str.contains(SGLANG_HIT, regex=False).all()
    differ = sgl[PER_REQUEST] != model[PER_REQUEST]
    assert not differ.any().any(), sgl[PER_REQUEST][differ.any(axis=1)].join(
        model[PER_REQUEST][differ.any(axis=1)], rsuffix="_model").to_string()
    assert sgl["ranks_agree"].all() and sgl["data_ok"].all()


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_the_retry_cells_on_sglangs_own_controller_path_are_ok_with_its_retries(tmp_path):
    """`bench hazards --cache sglang --sglang 0.5.23 --twice` serves the retry cells on
    SGLang's controller path: its hit drain arms its own retry set, the harness pops it as
    SGLang's scheduler does, and each re-issue is one more MIN on SGLang's own hit-query
    group; OK in both serves (the second serve runs the release's protocol, not the column's
    label)."""
    from tests.sglang_wheels import sglang_wheel

    sglang_wheel("0.5.23")
    done = subprocess.run([sys.executable, "-m", "bench", "hazards", "--cache", "sglang",
                           "--sglang", "0.5.23", "--scenarios", "late-write,miss-skew",
                           "--twice", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True,
                          timeout=500, env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "hazards.csv")
    assert list(rows["outcome"]) == ["OK", "OK"] and rows["same_twice"].all()
    for cell in rows["cell_dir"]:
        ranks = [json.loads((Path(cell) / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert ranks[0]["decisions"] == ranks[1]["decisions"]
        fetched = sum(d[0] == "ack" for d in ranks[0]["decisions"].values())
        hit_mins = [sum("sglang_hit" in str(c) for c in r["sequence"]) for r in ranks]
        assert fetched > 0 and hit_mins[0] == hit_mins[1] == 16 + fetched, (cell, hit_mins)
