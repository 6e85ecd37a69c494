"""SGLang's own rank-consensus checker as the hazard matrix's second judge
(sglang_adapter.consensus; `bench hazards --cache sglang --sglang-consensus`).

Fast: the verdict read from the ranks' journals and logs (fired, silent, absent, and why a
silent checker missed records only some ranks made); the checker's wiring on a stand-in of
SGLang's module; bad input. Slow (the SGLang matrix): the real checker on 0.5.23's cells.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from sglang_adapter import consensus
from tests.sglang_wheels import sglang_wheel

REPO = Path(__file__).resolve().parent.parent
CALL = "check_prefetch_progress called params={'request': 'r00'}"
BACK = "check_prefetch_progress returns result=%s"

pytestmark = pytest.mark.timeout(60)


def _journal(folder: Path, rank: int, records: list[list], fired: bool = False) -> None:
    journal, log = consensus.paths(folder, rank)
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    log.write_text(f"{consensus.FIRED} for 2 events(s)! ..." if fired else "enabled\n")


def test_a_fired_checker_names_the_first_record_the_ranks_disagree_on(tmp_path):
    _journal(tmp_path, 0, [[0, "r00", CALL], [0, "r00", BACK % False]], fired=True)
    _journal(tmp_path, 1, [[0, "r00", CALL], [0, "r00", BACK % True]], fired=True)
    v = consensus.verdict(tmp_path, 2)
    assert v["sglang_consensus"] == "fired: check_prefetch_progress"
    assert v["consensus_detail"].startswith("at r00's poll 1, step 0, record 1;")
    assert "rank 0: check_prefetch_progress returns result=False" in v["consensus_detail"]
    assert "rank 1: check_prefetch_progress returns result=True" in v["consensus_detail"]


def test_a_silent_checker_says_which_records_it_could_not_compare(tmp_path):
    same = [[0, "r00", CALL], [0, "r00", BACK % False]]
    _journal(tmp_path, 0, same + [[1, "r01", CALL]])
    _journal(tmp_path, 1, same)
    v = consensus.verdict(tmp_path, 2)
    assert v["sglang_consensus"] == "silent"
    assert "rank 0 3, rank 1 2" in v["consensus_detail"] and "record 2" in v["consensus_detail"]
    _journal(tmp_path, 0, same)
    assert consensus.verdict(tmp_path, 2) == {"sglang_consensus": "silent",
                                              "consensus_detail": ""}


def test_a_release_without_the_checker_reads_absent(tmp_path):
    assert consensus.verdict(tmp_path, 2, present=False)["sglang_consensus"] == "absent"
    assert not consensus.ships_checker(str(tmp_path))
    (tmp_path / "sglang" / "srt" / "utils").mkdir(parents=True)
    (tmp_path / "sglang" / "srt" / "utils" / "rank_consensus_checker.py").write_text("")
    assert consensus.ships_checker(str(tmp_path))


def test_a_journal_cut_short_by_the_exit_keeps_its_whole_lines(tmp_path):
    journal, _ = consensus.paths(tmp_path, 0)
    journal.write_text(json.dumps([0, "r00", CALL]) + '\n[1, "r0')
    assert consensus.read_records(journal) == [[0, "r00", CALL]]


def test_the_checker_is_configured_with_the_groups_and_journals_each_record(tmp_path,
                                                                            monkeypatch):
    """On a stand-in of SGLang's module: configure gets one coordinator per group present
    (its CPU group), every queued record is journaled with the step and request in hand
    before SGLang sees it, and shutdown runs only after a serve that ended everywhere."""
    seen = {"configured": None, "queued": [], "shutdown": 0}
    fake = types.ModuleType(consensus.MODULE)
    fake.enabled = lambda: seen["configured"] is not None
    fake.assert_same = lambda fmt, *args: seen["queued"].append(fmt % args)
    fake.configure = lambda groups: seen.update(configured=[g.cpu_group for g in groups])
    fake.shutdown = lambda: seen.update(shutdown=seen["shutdown"] + 1)
    fake._sync_groups = ["dedicated"]
    monkeypatch.setitem(sys.modules, consensus.MODULE, fake)
    checker = consensus.Checker(tmp_path, 1, lambda: (7, "r03"))
    assert checker.present
    checker.start(["tp", None])
    assert seen["configured"] == ["tp"] and checker.groups == ["dedicated"]
    fake.assert_same("%s returns result=%s", "f", True)  # the decorators look it up
    assert seen["queued"] == ["f returns result=True"]
    assert consensus.read_records(consensus.paths(tmp_path, 1)[0]) == \
        [[7, "r03", "f returns result=True"]]
    checker.stop(wait=True)
    assert seen["shutdown"] == 1


def test_the_checker_needs_sglangs_code(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "hazards", "--sglang-consensus",
                           "--out", str(tmp_path / "h")], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs --cache sglang" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "h").exists()


@pytest.mark.slow
@pytest.mark.sglang_matrix  # two cells, each served twice on SGLang 0.5.23: about a minute
@pytest.mark.timeout(600)
def test_sglangs_checker_fires_where_ranks_decide_apart_and_stays_silent_where_ok(tmp_path):
    sglang_wheel("0.5.23")
    done = subprocess.run([sys.executable, "-m", "bench", "hazards", "--cache", "sglang",
                           "--sglang", "0.5.23", "--sglang-consensus", "--scenarios",
                           "ongoing-skew,sidecar-race", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    import pandas as pd

    rows = pd.read_csv(tmp_path / "hazards.csv").set_index("scenario")
    assert rows.loc["ongoing-skew", "outcome"] == "deadlock"
    # the function alone: where on the wall clock the records part (step 0 or 1, r00's
    # poll 1 or 2) varies between serves of the seed; the detail says where it was
    assert rows.loc["ongoing-skew", "sglang_consensus"] == "fired: _can_terminate_prefetch"
    assert rows.loc["ongoing-skew", "consensus_detail"].startswith("at r00's poll ")
    assert rows.loc["sidecar-race", "outcome"] == "OK"
    assert rows.loc["sidecar-race", "sglang_consensus"] == "silent"
