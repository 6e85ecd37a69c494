"""bench history on synthetic gate results (tests/history_fakes.py; no serving): a planted
step is named at its commit, a planted creep is flagged while every gate passed, identical
commits flag nothing, bad input is one line and exit 2, and the history keeps machines and
reruns apart. Every generator is seeded: the numbers are the same on every run."""

from __future__ import annotations

import json
import math
import random
import subprocess
from pathlib import Path

import pytest

from bench.commands.history import main
from bench.history import rules, series, store
from bench.history.page import PageOptions, render
from bench.report.printer import WIDTH
from tests.history_fakes import decision, sha, write

pytestmark = pytest.mark.timeout(300)
STEP_AT = 10


def history(tmp: Path, decisions: list[dict], machine: str | None = None) -> Path:
    hist = tmp / "hist"
    for d in decisions:
        store.add(hist, write(tmp / "in", d), machine)
    return hist


def page(hist: Path, tmp: Path, figures: bool = False):
    """The page without figures, unless asked: the figures cost seconds a busy machine
    stretches to minutes, and the rules' tests do not read them."""
    return render(PageOptions(hist, tmp / "rules_page", repo=None, figures=figures))


def step_truth(i: int):
    return lambda m, p: 1.05 if (m, p, i >= STEP_AT) == ("step_mean", "pr36425", True) else 1.0


def command_after(lead: str, out: str) -> str:
    """The command printed (bench.report.printer.command_lines) after the line ending in
    `lead`, joined back as the shell joins its ` \\` lines."""
    lines = out.splitlines()
    i = next(n for n, line in enumerate(lines) if line.endswith(lead)) + 1
    parts = []
    while True:
        parts.append(lines[i].strip().removesuffix(" \\"))
        if not lines[i].endswith(" \\"):
            return " ".join(parts)
        i += 1

def test_a_planted_5pc_step_is_named_at_its_commit(tmp_path, capsys):
    rng = random.Random(11)
    hist = history(tmp_path, [decision(i, step_truth(i), rng, n_metrics=2) for i in range(20)])
    assert main([str(hist), "--out", str(tmp_path / "page"), "--no-git"]) == 0
    out = capsys.readouterr().out
    done = page(hist, tmp_path)
    assert [(f.series.name, f.commit) for f in done.steps] == [
        ("step_mean pr36425/wait_complete", sha(STEP_AT))]
    step = done.steps[0]
    assert step.before == sha(STEP_AT - 1) and step.low > 0.005
    assert "step +" in out and sha(STEP_AT)[:10] in out
    cmd = command_after("confirm with:", out)
    assert max(map(len, out.splitlines())) <= WIDTH
    assert cmd.startswith(f"python -m bench bisect {sha(STEP_AT - 1)[:12]} ")
    assert "--metric step_mean_ms --config pr36425/wait_complete --preset default" in cmd
    from bench.commands.options_doc import verb_parser  # the command parses as bisect's

    verb_parser("bisect").parse_args(cmd.split()[4:])
    md = (tmp_path / "page" / "history.md").read_text()
    assert "### Steps" in md and sha(STEP_AT)[:10] in md and not done.creeps
    pngs = sorted(p.name for p in (tmp_path / "page").glob("*.png"))
    assert len(pngs) == 4 and all(f"]({p})" in md for p in pngs)


def creep_truth(i: int):
    share = 0.01 * min(max(i - 5, 0), 6)  # 1 % a commit over commits 6..11, then held
    return lambda m, p: 1 + share if (m, p) == ("step_mean", "pr36425") else 1.0


def test_a_creep_of_1pc_a_commit_over_6_commits_is_flagged_while_every_gate_passed(tmp_path):
    rng = random.Random(5)
    loose = {"step_mean": 0.1, "itl_p50": 0.1, "prefetch_ttft_p50": 0.1,
             "bystander_ttft_p50": 0.1}
    ds = [decision(i, creep_truth(i), rng, n_metrics=2, thresholds=loose) for i in range(15)]
    assert all(d["verdict"] == "PASS" for d in ds)  # each gate passed
    done = page(history(tmp_path, ds), tmp_path)
    assert [(f.kind, f.series.name) for f in done.creeps] == [
        ("creep", "step_mean pr36425/wait_complete")]
    creep = done.creeps[0]
    assert creep.before == sha(0) and creep.low > 0.02 and 0.03 < creep.change < 0.09
    assert creep.commit in [sha(i) for i in range(11, 15)]  # resolved by the held commits
    assert "### Creep" in done.page.read_text()


def test_20_identical_commits_flag_nothing(tmp_path):
    rng = random.Random(3)
    done = page(history(tmp_path, [decision(i, lambda m, p: 1.0, rng) for i in range(20)]),
                tmp_path)
    assert done.steps == [] and done.creeps == []
    assert "None found." in done.page.read_text()


def test_the_rules_flag_nothing_on_simulated_identical_histories():
    from bench.history.simulate import false_alarms

    r = false_alarms(histories=40, commits=30, seed=0)
    assert r["step"] == 0 and r["creep"] == 0


@pytest.mark.parametrize("make", ["missing", "empty", "foreign"])
def test_an_empty_or_foreign_directory_is_refused_in_one_line(tmp_path, capsys, make):
    hist = tmp_path / "hist"
    if make != "missing":
        hist.mkdir()
    if make == "foreign":
        (hist / "notes.txt").write_text("not a history")
    assert main([str(hist)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench history: ") and "not a history" in err


def test_a_result_of_other_settings_is_refused_and_nothing_is_written(tmp_path, capsys):
    rng = random.Random(1)
    hist = history(tmp_path, [decision(i, lambda m, p: 1.0, rng) for i in range(3)])
    before = sorted(str(p) for p in hist.rglob("*"))
    other = write(tmp_path / "x", decision(3, lambda m, p: 1.0, rng, preset="ci"))
    assert main(["add", str(hist), str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "preset 'ci'" in err
    looser = write(tmp_path / "y", decision(3, lambda m, p: 1.0, rng,
                                            thresholds={"step_mean": 0.1, "itl_p50": 0.05,
                                                        "prefetch_ttft_p50": 0.05,
                                                        "bystander_ttft_p50": 0.1}))
    assert main(["add", str(hist), str(looser)]) == 2
    assert "thresholds" in capsys.readouterr().err
    assert sorted(str(p) for p in hist.rglob("*")) == before


def test_results_of_other_thresholds_mixed_by_hand_are_refused(tmp_path, capsys):
    rng = random.Random(1)
    hist = history(tmp_path, [decision(i, lambda m, p: 1.0, rng) for i in range(3)])
    d = decision(3, lambda m, p: 1.0, rng, thresholds={"step_mean": 0.2, "itl_p50": 0.05,
                                                       "prefetch_ttft_p50": 0.05,
                                                       "bystander_ttft_p50": 0.1})
    write(hist / "ci-box" / sha(3), d, "x.json")
    assert main([str(hist), "--no-git", "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mixed in one history" in err


def test_a_result_of_a_newer_schema_is_refused(tmp_path, capsys):
    d = decision(0, lambda m, p: 1.0, random.Random(0), schema=2)
    assert main(["add", str(tmp_path / "hist"), str(write(tmp_path, d))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "schema 2 is newer than this bench reads (1)" in err
    assert not (tmp_path / "hist").exists()


def test_a_dirty_trees_result_needs_its_commit_named(tmp_path, capsys):
    d = decision(0, lambda m, p: 1.0, random.Random(0), dirty=True)
    path = write(tmp_path, d)
    assert main(["add", str(tmp_path / "hist"), str(path)]) == 2
    assert "dirty" in capsys.readouterr().err and not (tmp_path / "hist").exists()
    assert main(["add", str(tmp_path / "hist"), str(path), "--commit", sha(5)]) == 0
    assert (tmp_path / "hist" / "ci-box" / sha(5)).is_dir()


def test_a_result_kept_under_another_commit_is_read_and_drawn_as_that_commit(tmp_path):
    """The gate that judged (decision.json's own commit) is not the commit gated: --commit
    names it, and the history reads, orders and prints the kept commit."""
    rng, hist = random.Random(3), tmp_path / "hist"
    for i in (1, 2):
        d = decision(i, lambda m, p: 1.0, rng, n_metrics=1, commit=sha(9))  # one judge
        assert main(["add", str(hist), str(write(tmp_path / str(i), d)), "--commit", sha(i)]) == 0
    assert {r["_commit"] for r in store.load(hist).machines["ci-box"]} == {sha(1), sha(2)}
    text = page(hist, tmp_path).page.read_text()
    assert f"| {sha(2)[:10]} |" in text and f"| {sha(9)[:10]} |" not in text


def test_machines_stay_apart_and_a_rerun_replaces_its_commit(tmp_path):
    rng = random.Random(2)
    hist = tmp_path / "hist"
    for i in range(4):
        store.add(hist, write(tmp_path / "a", decision(i, lambda m, p: 1.0, rng)))
        store.add(hist, write(tmp_path / "b", decision(i, lambda m, p: 1.0, rng)), "gpu-box")
    again = decision(2, lambda m, p: 1.0, rng, created="2026-12-08T00:00:00Z")
    message = store.add(hist, write(tmp_path / "c", again))
    assert "gated again: 1 earlier" in message
    h = store.load(hist)
    assert sorted(h.machines) == ["ci-box", "gpu-box"]
    assert [r["created"] for r in h.machines["ci-box"] if r["commit"] == sha(2)] == [
        "2026-12-08T00:00:00Z"]
    assert len(list((hist / "ci-box" / sha(2)).glob("*.json"))) == 2  # nothing deleted
    assert store.add(hist, write(tmp_path / "c", again)).endswith(")")  # already kept
    text = page(hist, tmp_path).page.read_text()
    assert "## ci-box" in text and "## gpu-box" in text


def test_a_moved_baseline_is_chained_through_its_own_gate():
    """A at commit 0 until commit 5, then the baseline re-recorded at commit 5: later ratios
    are read on commit 0's scale through commit 5's own ratio."""
    pts = [series.Point(i, sha(i), str(i), r, r / 1.01, r * 1.01, "PASS", 0.03,
                        sha(0) if i <= 5 else sha(5)) for i, r in
           enumerate([1.0, 1.0, 1.01, 1.01, 1.02, 1.02, 1.0, 1.01])]
    for p in pts:
        p.y, p.var = math.log(p.ratio), 1e-4
    series.chain(pts)
    assert {p.epoch for p in pts} == {0}
    assert pts[6].y == pytest.approx(math.log(1.02)) and pts[6].var == pytest.approx(2e-4)
    unkept = [series.Point(i, sha(i), str(i), 1.0, 0.99, 1.01, "PASS", 0.03,
                           sha(0) if i < 2 else sha(99), var=1e-4) for i in range(4)]
    series.chain(unkept)
    assert [p.epoch for p in unkept] == [0, 0, 1, 1]


def test_an_old_accepted_baseline_is_answered_with_the_commit_to_record(tmp_path, capsys):
    rng = random.Random(4)
    ds = [decision(i, lambda m, p: 0.97, rng, n_metrics=1) for i in range(14)]
    assert all(d["verdict"] == "PASS" for d in ds)
    hist = history(tmp_path, ds)
    assert main([str(hist), "--no-git", "--no-figures", "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert command_after(f"re-record the baseline at {sha(13)[:10]}:", out) == (
        f"git checkout {sha(13)[:12]} && python -m bench run --preset ci && "
        "python -m bench gate results/latest --update-baseline")
    assert max(map(len, out.splitlines())) <= WIDTH
    assert "13 commits old" in (tmp_path / "p" / "history.md").read_text()
    fail = decision(14, lambda m, p: 1.2, rng, n_metrics=1)
    store.add(hist, write(tmp_path / "f", fail))
    assert main([str(hist), "--no-git", "--no-figures", "--out", str(tmp_path / "p")]) == 0
    assert "re-record" not in capsys.readouterr().out  # a FAIL since: not accepted


def test_commits_follow_git_first_parents_not_created_time(tmp_path):
    repo = tmp_path / "repo"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    shas = []
    for i in range(4):
        subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", f"c{i}"], cwd=repo,
                       check=True)
        shas.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, text=True,
                                   capture_output=True, check=True).stdout.strip())
    rng = random.Random(0)
    results = []
    for i, c in enumerate(shas):  # created in the reverse order of the commits
        d = decision(3 - i, lambda m, p: 1.0, rng, n_metrics=1, commit=c)
        results.append({**d, "_commit": c})
    got, how = series.ordered(results, repo, "main")
    assert [r["commit"] for r in got] == shas and how.startswith("git's first-parent")
    got, how = series.ordered(results, None, "main")
    assert [r["commit"] for r in got] == shas[::-1] and how.startswith("created time")


def test_a_step_finding_faster_names_no_bisect():
    from bench.history.advice import bisect_command

    s = series.Series("m", "step_mean", "pr27010", "wait_complete", 0.03, [])
    down = rules.Finding("step", s, sha(3), sha(2), -0.05, -0.07, -0.03, sha(7), 8)
    assert bisect_command(down, {"preset": "default"}, [], []) is None
    up = rules.Finding("step", s, sha(3), sha(2), 0.05, 0.031, 0.07, sha(7), 8)
    assert "--threshold 0.015" in bisect_command(up, {"preset": "default"}, [], [])


def test_a_history_json_is_plain_and_says_where_it_came_from(tmp_path):
    rng = random.Random(0)
    hist = history(tmp_path, [decision(0, lambda m, p: 1.0, rng)])
    head = json.loads((hist / "history.json").read_text())
    assert head["settings"]["preset"] == "default" and head["kind"] == "gate"
    kept = json.loads(next((hist / "ci-box" / sha(0)).glob("*.json")).read_text())
    assert kept["kept"]["source"].endswith(".json") and kept["commit"] == sha(0)


def test_an_unkept_baseline_is_as_old_as_the_gates_run_against_it():
    from bench.history.advice import rebaseline

    rng = random.Random(6)
    results = [{**d, "_commit": d["commit"]} for d in
               (decision(i, lambda m, p: 0.97, rng, n_metrics=1, a=99) for i in range(1, 13))]
    assert rebaseline(results[:3], None) is None  # 3 gates: not yet old
    tip = rebaseline(results, None)
    assert tip is not None and tip.since is None and tip.gates == 12 and tip.a == sha(99)
    assert tip.commit == sha(12)
