"""SGLang's PP-ticket path on the controller path (docs/sglang.md, "buffer_only at PP > 1"):
buffer_only host memory at TP2 x PP2 served by SGLang's own command thread (the ticket's
broadcast on its gloo copy of the PP group, the hit query and the host slots), IO and ack
threads (the final ack makes the ticket ready), `_check_pp_prefetch_progress` on every poll
and `BufferModePipeline` parking the bounce, with stage 0's decision relayed as SGLang's
scheduler relays it (sglang_adapter.controller.tickets).

Tiers: which runs the path accepts now (no process group); `bench run --cache sglang` at
TP2 x PP2 with buffer_only on the pinned schedule (the ticket's query, reads and readiness
gated on the virtual clock: sglang_adapter.controller.pinned.TicketPin), every request's
collectives on rank 0 held against the model of 0.5.23 priced on what SGLang did (four
ranks: slow). The wheel comes from the release cache
(absent: skipped, never passed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hicache.spec.cost_model import Setting, expected_per_request
from sglang_adapter import Target, controller_unfit, run_unfit
from sglang_adapter.target import pick_path
from tests.sglang_wheels import sglang_wheel
from tests.test_sglang_controller import _wheel

REPO = Path(__file__).resolve().parent.parent
UNIFIED = Target("/nowhere", "0.5.23", "0.5.23", "unified", "sglang-0.5.23")
BUFFER = {"host_memory": "buffer_only"}

# ---- which runs the path accepts (no process group) ----------------------------------------


@pytest.mark.parametrize("pp", [2, 4])
def test_buffer_only_at_pp_above_1_takes_the_controller_path(pp):
    assert run_unfit(pp, BUFFER) is None and controller_unfit(UNIFIED, pp, BUFFER) is None
    assert pick_path(UNIFIED, "controller", pp, BUFFER).controller
    assert pick_path(UNIFIED, None, pp, BUFFER).controller  # auto takes it too


def test_buffer_only_at_pp1_and_releases_without_tickets_stay_refused():
    why = run_unfit(1, BUFFER)
    assert why is not None and "BufferModePipeline" in why and "\n" not in why
    for version in ("0.5.19", "0.5.20"):
        old = Target("/nowhere", version, version, "unified", "pr36425")
        why = controller_unfit(old, 2, BUFFER)
        assert why is not None and "PP-ticket" in why and "0.5.21" in why, why
        assert not pick_path(old, None, 2, BUFFER).controller
    assert controller_unfit(UNIFIED, 2, {**BUFFER, "extra_pool": True}) is not None


def test_a_pinned_schedule_pins_the_ticket_path_on_sglangs_controller_path_only():
    """The project's data path does not pin its PP-ticket path; SGLang's controller path
    does (its plan sets pin_tickets: bench.run.plan)."""
    from hicache.spec.config import HiCacheConfig
    from hicache.spec.step_time import StepTimeModel

    step = StepTimeModel(prefill_base_ms=3.0, prefill_ms_per_token=0.001, decode_base_ms=3.0)
    base = dict(protocol="sglang-0.5.23", tp=2, pp=2, host_memory="buffer_only",
                schedule="pinned", step_time=step)
    with pytest.raises(ValueError, match="does not pin 0.5.23's PP-ticket path"):
        HiCacheConfig(**base)
    assert HiCacheConfig(**base, pin_tickets=True).schedule == "pinned"


# ---- bench run at TP2 x PP2, buffer_only, on SGLang's PP-ticket path ------------------------

RUN = ["--preset", "ci", "--requests", "6", "--bystanders", "2", "--output-tokens", "4",
       "--repeats", "1", "--seed", "3", "--schedule", "pinned", "--storage-latency-ms", "60",
       "--policies", "timeout", "--tp", "2", "--pp", "2", "--host-memory", "buffer_only"]
TICKET = "broadcast@sglang_ticket utils/common.py:broadcast_pyobj:"
READY = "_check_pp_prefetch_progress:"


@pytest.fixture(scope="module")
def ticket_run(tmp_path_factory) -> Path:
    wheel = sglang_wheel("0.5.23")
    _wheel("0.5.23")  # skips where SGLang's page-hash extension cannot build
    out = tmp_path_factory.mktemp("ctl_tickets") / "run"
    done = subprocess.run([sys.executable, "-m", "bench", "run", *RUN, "--cache", "sglang",
                           "--sglang", str(wheel), "--sglang-path", "controller",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=400, env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("OK"), done.stdout[-2000:]
    return out


@pytest.mark.long  # make test-long: SGLang's PP tickets at TP2 x PP2
@pytest.mark.dist
@pytest.mark.slow  # four ranks, each importing SGLang
@pytest.mark.timeout(420)
def test_tickets_at_tp2_pp2_cost_what_the_model_says_per_request(ticket_run):
    """Rank 0's decision, PP-hop, hit-query, ack and ticket collectives per request,
    SGLang's own, against the model of 0.5.23 at TP2 x PP2 with buffer_only."""
    assert json.loads((ticket_run / "env.json").read_text())["plan"]["sglang"]["controller"]
    rows = pd.read_csv(ticket_run / "requests.csv").set_index("rid")
    for rid, r in rows.iterrows():
        hit_pages = r["hit_tokens"] // r["page_size"] if r["io_issued"] else 0
        want = expected_per_request(Setting("sglang-0.5.23", r["policy"], 2, 2,
                                            host_memory="buffer_only"),
                                    r["polls"], hit_pages, r["op_issued"], r["io_issued"],
                                    r["terminated_by"] == "poll")
        got = (r["decision_collectives"], r["completion_collectives"], r["pp_hops"],
               r["hit_query_collectives"], r["ack_collectives"], r["ticket_collectives"])
        assert got == (want.decision, want.completion, want.pp_hops, want.hit_query,
                       want.ack, want.ticket), (rid, r["polls"], r["hit_tokens"])
    issued = rows[rows["op_issued"]]
    assert len(issued) == 6 and (issued["ticket_collectives"] == 1).all()
    # every poll of a ticket asks stage 0's readiness: a MAX over TP, relayed down the stages
    assert (issued["decision_collectives"] == issued["polls"]).all()
    assert (issued["pp_hops"] == issued["polls"]).all() and (issued["polls"] > 0).all()
    assert (issued["hit_query_collectives"] == 2).all()  # TP, then PP: the command thread's
    for site in (TICKET, READY):
        assert issued["call_sites"].str.contains(site, regex=False).all(), \
            (site, issued["call_sites"].iloc[0])


@pytest.mark.long  # make test-long: the same ticket serve
@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_tickets_at_tp2_pp2_self_checks_hold(ticket_run):
    """The counter equals torch's sequence numbers on every group, the ticket group
    included; no host slot leaked; every rank ended every request alike; the pages the
    harness loaded back from SGLang's bounce are what storage holds."""
    ranks = pd.read_csv(ticket_run / "ranks.csv")
    assert list(ranks["rank"]) == [0, 1, 2, 3]
    assert ranks["crosscheck_ok"].all() and (ranks["host_slots_unaccounted"] == 0).all()
    # each stage-0 rank broadcasts its column's six tickets, then its stop; a later stage
    # receives them (no request in hand)
    assert list(ranks["ticket"]) == [7, 7, 7, 7]
    requests = pd.read_csv(ticket_run / "requests.csv")
    assert requests["ranks_agree"].all() and requests["data_ok"].all()
    assert (requests.loc[requests["op_issued"], "prefetched_tokens"] > 0).all()
    assert json.loads((ticket_run / "verdict.json").read_text())["ok"]
