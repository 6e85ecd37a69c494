"""SGLang's own rank-consensus checker as the hazard matrix's second judge
(sglang_adapter.judge.consensus; `bench hazards --cache sglang --sglang-consensus`).

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

from sglang_adapter.judge import consensus
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


# ---- bench run --sglang-consensus: the checker in every serve of a run ----


def _serve_folder(run: Path, side: str, name: str, meta: dict, journals: list[list[list]],
                  fired: bool = False, counts: tuple[int, ...] = (3, 3)) -> None:
    folder = run / "consensus" / side / name
    folder.mkdir(parents=True)
    (folder / "serve.json").write_text(json.dumps(meta))
    for rank, records in enumerate(journals):
        _journal(folder, rank, records, fired)
        consensus.write_count(folder, rank, counts[rank])


def _meta(root: Path, repeat: int, serve: str = "main") -> dict:
    return {"protocol": "sglang-0.5.23@unified", "policy": "timeout", "repeat": repeat,
            "rate_rps": 16.0, "serve": serve, "world": 2, "root": str(root)}


def _ships(tmp_path: Path) -> Path:
    """A stand-in SGLang root that ships the checker's file (ships_checker reads the path)."""
    root = tmp_path / "root"
    (root / "sglang" / "srt" / "utils").mkdir(parents=True)
    (root / "sglang" / "srt" / "utils" / "rank_consensus_checker.py").write_text("")
    return root


def test_a_run_reads_a_row_per_serve_and_fails_where_the_checker_fired(tmp_path):
    from bench.analysis import consensus_serves
    from bench.verdict.run_rules import findings, judge

    root, run = _ships(tmp_path), tmp_path / "run"
    same = [[[0, "r00", CALL], [0, "r00", BACK % True]]] * 2
    _serve_folder(run, "side0", "000-warm", _meta(root, 0, "warm"), same)
    _serve_folder(run, "side0", "000-main", _meta(root, 0), same)
    _serve_folder(run, "side0", "001-main", _meta(root, 1),
                  [[[0, "r00", CALL], [0, "r00", BACK % False]], same[1]], fired=True)
    frame = consensus_serves.tabulate(run)
    assert list(frame["sglang_consensus"]) == ["silent", "silent",
                                               "fired: check_prefetch_progress"]
    assert list(frame["serve"]) == ["warm", "main", "main"]
    assert (run / "consensus.csv").exists() and list(frame["checker_collectives"]) == [6] * 3
    reasons, notes = findings(frame)
    assert len(reasons) == 1 and "fired in 1 serve(s) (first: sglang-0.5.23@unified timeout " \
        "repeat 1 main: fired: check_prefetch_progress, at r00's poll 1" in reasons[0]
    assert notes == ["SGLang's rank-consensus checker was silent in 2 of 3 serve(s); its 12 "
                     "collectives on its own groups are counted apart"]
    import pandas as pd

    verdict = judge(pd.DataFrame(), consensus=frame)
    assert not verdict.ok and verdict.reasons[0] == reasons[0]


def test_a_release_without_the_checker_is_a_note_not_a_failure(tmp_path):
    from bench.analysis import consensus_serves
    from bench.verdict.run_rules import findings

    run = tmp_path / "run"
    _serve_folder(run, "side0", "000-main", _meta(tmp_path / "old", 0), [[], []])
    reasons, notes = findings(consensus_serves.tabulate(run))
    assert reasons == [] and notes == ["1 serve(s) ran an SGLang that ships no rank-consensus "
                                       "checker (sglang-0.5.23@unified)"]


def test_a_run_without_the_checker_has_no_table(tmp_path):
    from bench.analysis import consensus_serves
    from bench.verdict.run_rules import findings

    assert consensus_serves.tabulate(tmp_path) is None
    assert findings(None) == ([], [])
    assert not (tmp_path / "consensus.csv").exists()


def test_bench_run_refuses_the_checker_without_sglang(tmp_path, capsys):
    from bench.commands.run import main

    assert main(["--sglang-consensus", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs --cache sglang --sglang SPEC" in err, err
    assert not (tmp_path / "r").exists()


PINNED = ["--preset", "ci", "--requests", "6", "--bystanders", "2", "--output-tokens", "4",
          "--repeats", "1", "--seed", "3", "--schedule", "pinned", "--policies", "timeout",
          "--timeout-base", "0.004", "--storage-latency-ms", "60", "--cache", "sglang",
          "--sglang", "0.5.23"]
COUNTS = ["polls", "decision_collectives", "completion_collectives", "hit_query_collectives",
          "ack_collectives", "terminated_by"]


@pytest.mark.slow
@pytest.mark.sglang_matrix  # two pinned runs on SGLang 0.5.23 at TP2: about a minute
@pytest.mark.timeout(600)
def test_bench_run_with_sglangs_checker_is_silent_and_costs_no_counted_collective(tmp_path):
    """A pinned run with the checker on: silent in every serve, its collectives counted
    apart (above 0), and every request's counts those of the same run without it."""
    import pandas as pd

    sglang_wheel("0.5.23")
    env = {**__import__("os").environ, "BENCH_NO_PLOTS": "1"}
    runs = {}
    for name, extra in (("plain", []), ("checked", ["--sglang-consensus"])):
        done = subprocess.run([sys.executable, "-m", "bench", "run", *PINNED, *extra, "--out",
                               str(tmp_path / name)], cwd=REPO, capture_output=True,
                              text=True, timeout=280, env=env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[name] = pd.read_csv(tmp_path / name / "requests.csv")
    table = pd.read_csv(tmp_path / "checked" / "consensus.csv")
    assert set(table["sglang_consensus"]) == {"silent"} and len(table) >= 2, table
    assert (table["checker_collectives"] > 0).all(), table
    key = ["rid", "rank"] if "rank" in runs["plain"] else ["rid"]
    plain, checked = (runs[n].sort_values(key)[COUNTS].reset_index(drop=True) for n in runs)
    pd.testing.assert_frame_equal(plain, checked)
    assert not (tmp_path / "plain" / "consensus.csv").exists()
