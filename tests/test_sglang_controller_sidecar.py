"""A side-car pool on SGLang's controller path (docs/sglang.md, "A side-car pool"): SGLang's
own sidecar spec and host-pool-group entry (`register_sidecar_pool`) over the harness's
side-car pool, its hit query through the backend's `batch_exists_v2`, its IO thread reading
the side-car with each KV batch through `batch_get_v2` (`_page_transfer_kv_batch`), the
side-car ack its sync thread MIN-reduces after the batches, and `_check_hybrid_prefetch_result`
at the end of every prefetch.

Tiers: which runs the path accepts now (no process group); `bench run --cache sglang
--extra-pool` at TP2 on the free schedule, every request's collectives on rank 0 held
against the model of 0.5.23 priced on what SGLang did (slow). The wheel comes from the
release cache (absent: skipped, never passed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hicache.spec.cost_model import IO_BATCH_PAGES, Setting, expected_per_request
from sglang_adapter import Target, controller_unfit, run_unfit
from sglang_adapter.target import pick_path
from tests.sglang_wheels import sglang_wheel
from tests.test_sglang_controller import _wheel

REPO = Path(__file__).resolve().parent.parent
UNIFIED = Target("/nowhere", "0.5.23", "0.5.23", "unified", "sglang-0.5.23")
SIDECAR = {"extra_pool": True}


# ---- which runs the path accepts (no process group) ----------------------------------------

@pytest.mark.parametrize("pp", [1, 2])
def test_a_sidecar_pool_takes_the_controller_path(pp):
    assert run_unfit(pp, SIDECAR) is None and controller_unfit(UNIFIED, pp, SIDECAR) is None
    assert pick_path(UNIFIED, "controller", pp, SIDECAR).controller
    assert pick_path(UNIFIED, None, pp, SIDECAR).controller  # auto takes it too


def test_a_sidecar_pool_stays_refused_before_0523_and_with_buffer_only():
    for version in ("0.5.19", "0.5.22"):
        old = Target("/nowhere", version, version, "unified", "pr36425")
        why = controller_unfit(old, 1, SIDECAR)
        assert why is not None and "0.5.23" in why and "\n" not in why, why
        assert not pick_path(old, None, 1, SIDECAR).controller
    why = run_unfit(2, {**SIDECAR, "host_memory": "buffer_only"})
    assert why is not None and "--host-memory cache" in why


# ---- bench run at TP2 with a side-car pool, on SGLang's controller path --------------------

RUN = ["--preset", "ci", "--requests", "6", "--bystanders", "2", "--output-tokens", "4",
       "--repeats", "1", "--seed", "3", "--storage-latency-ms", "60", "--policies", "timeout",
       "--tp", "2", "--extra-pool"]
# the side-car ack's MIN: the hybrid controller's own _all_reduce in _reduce_prefetch_ack
# (a KV batch's goes through the base class's _reduce_prefetch_ack under it)
SIDECAR_ACK = r"all_reduce@sglang_ack [^;]*_all_reduce:\d+ < _reduce_prefetch_ack:\d+ < " \
    r"prefetch_sync_thread_func"


@pytest.fixture(scope="module")
def sidecar_run(tmp_path_factory) -> Path:
    wheel = sglang_wheel("0.5.23")
    _wheel("0.5.23")  # skips where SGLang's page-hash extension cannot build
    out = tmp_path_factory.mktemp("ctl_sidecar") / "run"
    done = subprocess.run([sys.executable, "-m", "bench", "run", *RUN, "--cache", "sglang",
                           "--sglang", str(wheel), "--sglang-path", "controller",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("OK"), done.stdout[-2000:]
    return out


@pytest.mark.long  # make test-long: SGLang's controller path with a side-car pool
@pytest.mark.dist
@pytest.mark.slow  # two ranks, each importing SGLang
@pytest.mark.timeout(360)
def test_a_sidecar_pool_at_tp2_costs_what_the_model_says_per_request(sidecar_run):
    """Rank 0's decision, hit-query and ack collectives per request, SGLang's own, against
    the model of 0.5.23 at TP2 with a side-car pool: one ack per KV batch plus the
    side-car's (reduced), whatever the side-car holds."""
    assert json.loads((sidecar_run / "env.json").read_text())["plan"]["sglang"]["controller"]
    rows = pd.read_csv(sidecar_run / "requests.csv").set_index("rid")
    assert rows["extra_pool"].all()
    for rid, r in rows.iterrows():
        hit_pages = r["hit_tokens"] // r["page_size"] if r["io_issued"] else 0
        want = expected_per_request(Setting("sglang-0.5.23", r["policy"], 2, 1, extra_pool=True),
                                    r["polls"], hit_pages, r["op_issued"], r["io_issued"],
                                    r["terminated_by"] == "poll", ops=int(r["prefetch_ops"]))
        got = (r["decision_collectives"], r["completion_collectives"], r["pp_hops"],
               r["hit_query_collectives"], r["ack_collectives"])
        assert got == (want.decision, want.completion, want.pp_hops, want.hit_query,
                       want.ack), (rid, r["polls"], r["hit_tokens"])
    io = rows[rows["io_issued"]]
    assert len(io) > 0
    batches = -(-(io["hit_tokens"] // io["page_size"]) // IO_BATCH_PAGES)
    assert (io["ack_collectives"] == batches + 1).all()  # the side-car's ack
    assert io["call_sites"].str.contains(SIDECAR_ACK, regex=True).all(), \
        io["call_sites"].iloc[0]


@pytest.mark.long  # make test-long: the same side-car serve
@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_sidecar_pool_at_tp2_self_checks_hold(sidecar_run):
    """The counter equals torch's sequence numbers on every group; no host slot leaked;
    every rank ended every request alike; what the harness loaded back (KV and side-car
    pages SGLang's IO thread read) is what storage holds."""
    ranks = pd.read_csv(sidecar_run / "ranks.csv")
    assert ranks["crosscheck_ok"].all() and (ranks["host_slots_unaccounted"] == 0).all()
    requests = pd.read_csv(sidecar_run / "requests.csv")
    assert requests["ranks_agree"].all() and requests["data_ok"].all()
    assert (requests.loc[requests["io_issued"], "prefetched_tokens"] > 0).all()
    assert json.loads((sidecar_run / "verdict.json").read_text())["ok"]


# ---- bench hazards --cache sglang: span-skew on the controller path -----------------------

@pytest.mark.long  # make test-long: a 4-rank cell twice on SGLang's controller path
@pytest.mark.dist
@pytest.mark.slow  # one 4-rank cell, twice, importing SGLang on each rank
@pytest.mark.timeout(420)
def test_span_skew_aborts_in_sglangs_own_hit_query_on_the_controller_path(tmp_path):
    """PR #39267's report on SGLang's own controller path at TP2 x PP2: each stage's
    `_sync_prefetch_hit_query` sizes its TRAILING_PAGES mask by its own request span, so the
    MIN over SGLang's copy of the PP group pairs tensors of two sizes; gloo aborts stage 0's
    ranks, and stage 1's name SGLang's hit query on that group. The same twice; exit 0."""
    sglang_wheel("0.5.23")
    _wheel("0.5.23")
    done = subprocess.run([sys.executable, "-m", "bench", "hazards", "--cache", "sglang",
                           "--sglang", "0.5.23", "--scenarios", "span-skew", "--twice",
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = pd.read_csv(tmp_path / "hazards.csv").iloc[0]
    assert (row["outcome"], row["site"]) == ("abort", "hit_query"), row["detail"]
    assert "hit_query on sglang_hit_pp" in row["detail"] and " vs " in row["detail"]
    assert bool(row["same_twice"])
