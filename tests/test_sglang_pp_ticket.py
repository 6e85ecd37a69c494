"""SGLang 0.5.23's PP-ticket poll as the `--cache sglang` decisions path holds it
(docs/results/2026-12-06_pp_busy_d92feda.md): a ticketed prefetch must reach SGLang's
`_check_pp_prefetch_progress`, which ends it once the ticket's ready event is set; held in
SGLang's `ongoing_prefetch` instead, a wait_complete poll answers False whatever happens,
and `pp-busy` runs past its bound.

SGLang runs in a child process (one SGLang per interpreter: sglang_adapter.loader), on one
rank with no groups: `_all_reduce` skips the groups it is not given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.sglang_wheels import sglang_wheel

REPO = Path(__file__).resolve().parent.parent

# Polls SGLang's own check_prefetch_progress on a ticketed prefetch (register_ticket) and
# on one held as cache mode holds it (register), under wait_complete; prints JSON.
CHILD = """
import json, sys, threading
from sglang_adapter.loader import load
from sglang_adapter.decisions.poll import make_rig
from sglang_adapter.source import resolve
rig = make_rig(load(resolve(sys.argv[1])), 0, 1, 1, None, None)
rig.configure("wait_complete", 64, 30.0, 0.0)
ready = threading.Event()
ticket = rig.register_ticket("t", list(range(128)), ready)
cache_mode = rig.register("c", list(range(128)))
out = {"ticket_before": [rig.cache.check_prefetch_progress(ticket) for _ in range(3)],
       "cache_mode": [rig.cache.check_prefetch_progress(cache_mode) for _ in range(3)]}
out["pending_before"] = rig.pending(ticket)
ready.set()  # the data path's final ack (SGLang: prefetch_sync_thread_func)
out["ticket_after"] = rig.cache.check_prefetch_progress(ticket)
out["pending_after"] = rig.pending(ticket)
rig.forget(ticket)
out["states_left"] = sorted(rig.cache.cache_controller.pp_prefetch_states)
print(json.dumps(out))
"""


def test_a_ticketed_prefetch_ends_on_sglangs_ticket_path_once_ready():
    sglang_wheel("0.5.23")
    done = subprocess.run([sys.executable, "-c", CHILD, "0.5.23"], cwd=REPO, text=True,
                          capture_output=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ticket_before"] == [False] * 3 and out["pending_before"]
    assert out["ticket_after"] is True and not out["pending_after"]
    assert out["states_left"] == []  # taken, then retired as at the request's end
    # Held in ongoing_prefetch instead (cache mode), the wait_complete vote never lets a
    # poll end it (only the ack drain would, which a ticket's acks skip).
    assert out["cache_mode"] == [False] * 3


@pytest.mark.dist
@pytest.mark.slow  # one 4-rank cell importing SGLang on each rank
@pytest.mark.sglang_matrix
@pytest.mark.timeout(500)
def test_the_pp_busy_cell_ends_on_sglangs_ticket_path(tmp_path):
    """buffer_only at TP2 x PP2 on SGLang's own PP-ticket path (the controller path: its
    command thread broadcasts each ticket on its own group): every request's poll ends by
    the ticket, each at the price the model says (stage 0: one decision MAX a poll,
    relayed to stage 1 by a PP hop; stage 1: none)."""
    sglang_wheel("0.5.23")
    done = subprocess.run([sys.executable, "-m", "bench", "hazards", "--cache", "sglang",
                           "--sglang", "0.5.23", "--scenarios", "pp-busy", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=480, env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = pd.read_csv(tmp_path / "hazards.csv").iloc[0]
    assert row["outcome"] == "OK" and row["decision_per_poll"] == 1.0, row.to_dict()
    ranks = [json.loads((Path(row["cell_dir"]) / f"rank{r}.json").read_text())
             for r in range(4)]
    assert all(r["decisions"] == ranks[0]["decisions"] for r in ranks)
    assert len(ranks[0]["decisions"]) == 8
    assert [r["decision_collectives"] for r in ranks] == [ranks[0]["polls"]] * 2 + [0, 0]
    for r in ranks:  # SGLang's ticket broadcasts, counted as torch counts them
        assert r["crosscheck"]["sglang_ticket"][0] == r["crosscheck"]["sglang_ticket"][1] > 0
