"""The hazard matrix's skew scenarios on SGLang's own poll (bench.hazards.sglang,
docs/sglang.md "Hazards"): two gloo ranks (spawn, a free port, the launcher's hard bound, a
4 s collective timeout) run SGLang's check_hicache_events and check_prefetch_progress with
the skew planted in the walk, and the project's classifier names the cell.

A test whose wheel is absent is skipped, never passed (make sglang-fetch fills the cache)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.hazards.sglang import HazardCase, run_hazard
from sglang_adapter.source import DEFAULT_CACHE, resolve
from tests.sglang_wheels import sglang_wheel

REPO = Path(__file__).resolve().parent.parent
DECIDE = {"0.5.23": "_can_terminate_prefetch:2311 < check_prefetch_progress:2405",
          "0.5.19": "_can_terminate_prefetch:1857 < check_prefetch_progress:1870",
          "0.5.18": "can_terminate_prefetch:1617 < check_prefetch_progress:1643"}
STEP_MIN = {"0.5.23": "_sync_hicache_ready_counts:3459 < check_hicache_events:3681",
            "0.5.19": "_sync_hicache_ready_counts:2609 < check_hicache_events:2828",
            "0.5.18": "_sync_hicache_ready_counts:1023 < check_hicache_events:1535"}


def _source(version: str):
    return resolve(str(sglang_wheel(version)))


@pytest.mark.parametrize("kw, words", [
    ({"scenario": "pp-stages", "policy": "timeout"}, "hazard 'pp-stages'"),
    ({"scenario": "walk-skew", "policy": "eager"}, "policy 'eager'"),
    ({"scenario": "walk-skew", "policy": "timeout", "timeout_s": 0.1}, "collective timeout")])
def test_a_bad_case_is_refused(kw, words):
    with pytest.raises(ValueError, match=words):
        HazardCase(**kw)


def _verb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", "sglang-poll", *args],
                          cwd=REPO, text=True, capture_output=True, timeout=120,
                          env={**os.environ, "HICACHE_BENCH_SGLANG_CACHE": str(DEFAULT_CACHE)})


@pytest.mark.parametrize("args, words", [
    (("--tp", "4"), "--hazard runs at TP2 x PP1"),
    (("--policies", "eager"), "policy 'eager'"),
    (("--collective-timeout", "0"), "collective timeout 0")])
def test_the_verb_refuses_bad_hazard_options_in_one_line(args, words):
    done = _verb("--sglang", "9.9.9", "--hazard", "walk-skew", *args)  # never fetched
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr


def _first_unpaired(row: dict, version: str, index: int) -> None:
    """Rank 0's poll MAX (SGLang's decision) met rank 1's next-step packed MIN."""
    assert row["outcome"] == "deadlock" and row["step"] == 0, row
    assert row["site"].endswith(DECIDE[version]), row["site"]
    assert f"first unpaired collective: #{index} on tp [0, 1]" in row["detail"]
    assert f"{STEP_MIN[version]} at step 1" in row["detail"]


def test_ongoing_skew_under_timeout_mispairs_sglangs_decision_max(tmp_path):
    """#38273 on 0.5.23: rank 0's poll issues the MAX, rank 1 returned early without it;
    rank 0's MAX pairs with rank 1's next per-step MIN and gloo aborts on their sizes."""
    row = run_hazard(_source("0.5.23"), HazardCase("ongoing-skew", "timeout"), tmp_path,
                     bound_s=240)
    _first_unpaired(row, "0.5.23", 1)
    assert row["poll_collectives"][1] == 0  # rank 1 never reached the decision
    assert row["gloo"].startswith("aborted rank 0: op.preamble.length <= op.nbytes"), row


# (scenario, policy) -> outcome on 0.5.19 and 0.5.23, each observed twice alike
# (docs/sglang.md, "Hazards"); 0.5.18 (pre27010) also agrees every wait_complete poll.
MATRIX = {
    ("walk-skew", "timeout"): "deadlock", ("walk-skew", "wait_complete"): "divergence",
    ("walk-skew", "best_effort"): "OK", ("ongoing-skew", "timeout"): "deadlock",
    ("ongoing-skew", "wait_complete"): "divergence", ("ongoing-skew", "best_effort"): "OK"}


def _expected(version: str, scenario: str, policy: str) -> str:
    return "deadlock" if version == "0.5.18" and policy != "best_effort" else \
        MATRIX[scenario, policy]


@pytest.mark.slow
@pytest.mark.sglang_matrix
@pytest.mark.parametrize("version", ["0.5.23", "0.5.19", "0.5.18"])
@pytest.mark.parametrize("scenario, policy", list(MATRIX))
def test_each_cell_names_one_outcome_twice(tmp_path, version, scenario, policy):
    src, case = _source(version), HazardCase(scenario, policy)
    rows = [run_hazard(src, case, tmp_path, bound_s=240, tag=t) for t in ("", "__again")]
    want = _expected(version, scenario, policy)
    assert [r["outcome"] for r in rows] == [want] * 2, rows
    if want == "deadlock":
        _first_unpaired(rows[0], version, 2 if scenario == "walk-skew" else 1)
    else:  # no poll collective: best_effort, and wait_complete from 0.5.19 (PR #36425)
        assert rows[0]["poll_collectives"] == [0, 0], rows[0]
    if want == "divergence":  # the poll log (what @rank_consensus compares), at step 0
        assert rows[0]["site"] == "consensus" and rows[0]["step"] == 0, rows[0]
