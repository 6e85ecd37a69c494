"""bench ab and bench bisect without running the benchmark: the block order, pairing by
block, verdicts on made-up runs, the binary search with a fake ab, and the revision checks
on a scratch git repository."""

import json
import subprocess
from pathlib import Path

import pytest

from bench.ab import blocks as ab
from bench.ab.bisect import Step, search, step_of
from bench.ab.blocks import AbPlan, Outcome, comparison, merged, run_blocks
from bench.ab.revisions import WORKTREE, Revision, RevisionError, commits_between, resolve
from bench.commands.ab import main as main_ab
from tests.test_gate import write_run
from tests.test_gate_quiet import serving_requests, serving_steps

TREE = Revision(WORKTREE, None)


def test_the_order_in_each_block_is_drawn_from_the_seed_and_balanced():
    orders = {}
    for seed in range(20):
        plan = AbPlan(TREE, TREE, "ci", 6, seed=seed)
        firsts = plan.first_sides()
        assert sorted(firsts) == ["a"] * 3 + ["b"] * 3  # as many A B blocks as B A
        assert plan.order() == [(k, s) for k, f in enumerate(firsts)
                                for s in (f, "b" if f == "a" else "a")]
        assert AbPlan(TREE, TREE, "ci", 6, seed=seed).first_sides() == firsts  # the seed's
        orders[seed] = tuple(firsts)
    assert len(set(orders.values())) > 5  # drawn, not a fixed alternation
    odd = AbPlan(TREE, TREE, "ci", 5, seed=3).first_sides()
    assert abs(odd.count("a") - odd.count("b")) == 1
    plan = AbPlan(TREE, TREE, "ci", 4, seed=10)
    cmd = plan.command(2, Path("/x"))
    assert cmd[cmd.index("--seed") + 1] == "12" and cmd[cmd.index("--repeats") + 1] == "1"
    assert cmd[cmd.index("--preset") + 1] == "ci"


def fake_runner(factor=lambda side, k: 1.0, log=None, second=1.0):
    """Writes a one-repeat run per block from the synthetic serving run: side B's step times
    and ITL gaps scaled by factor(side, k), and the run second in its block's by `second`
    (a planted order effect: as if that run slept)."""
    def run(plan, k, side, root):
        f = factor(side, k) * (second if plan.first_sides()[k] != side else 1.0)
        if log is not None:
            log.append((k, side))

        def slow(protocol, repeat):
            return f
        requests = serving_requests(slow)
        steps = serving_steps(slow)
        path = plan.run_dir(k, side)
        write_run(path, requests[requests.repeat == k % 3].assign(repeat=0),
                  steps[steps.repeat == k % 3].assign(repeat=0), with_summary=False)
        return Outcome(path, 0, "OK (fake)", 0.0)
    return run


def test_runs_interleave_and_pair_by_block(tmp_path):
    order = []
    plan = AbPlan(TREE, TREE, "ci", 4, out=tmp_path)
    runs = run_blocks(plan, fake_runner(log=order), log=lambda line: None)
    assert order == plan.order()
    a = merged(runs.a)
    assert sorted(a.requests.repeat.unique()) == [0, 1, 2, 3]  # repeat k is block k
    # Block k's rows are exactly its own run's.
    assert (a.steps[a.steps.repeat == 2].step_ms.to_numpy() ==
            pd_steps(runs.a[2].path).step_ms.to_numpy()).all()


def pd_steps(path):
    import pandas as pd

    return pd.read_csv(path / "steps.csv")


def test_merged_per_block_repeats_number_block_major(tmp_path):
    write_run(tmp_path / "r0", serving_requests(), serving_steps(), with_summary=False)
    write_run(tmp_path / "r1", serving_requests(), serving_steps(), with_summary=False)
    outcomes = [Outcome(tmp_path / f"r{k}", 0, "", 0.0) for k in range(2)]
    assert sorted(merged(outcomes, per_block=3).requests.repeat.unique()) == list(range(6))


def verdicts(comp, metric):
    return {f"{r['protocol']}/{r['policy']}": r["verdict"] for r in comp.rows
            if r.get("metric") == metric}


def test_b_slower_in_every_block_is_worse_and_counts_are_exact(tmp_path):
    def factor(side, k):  # B 30% slower; the machine's speed drifts from block to block
        return (1.3 if side == "b" else 1.0) * (1 + 0.05 * k)
    plan = AbPlan(TREE, TREE, "ci", 4, out=tmp_path)
    comp = comparison(plan, run_blocks(plan, fake_runner(factor), log=lambda line: None))
    assert set(verdicts(comp, "step_mean_ms").values()) == {"worse"}
    assert set(verdicts(comp, "itl_p50_ms").values()) == {"worse"}
    assert set(verdicts(comp, "decision_collectives_per_req").values()) == {"same"}
    row = next(r for r in comp.rows if r.get("metric") == "step_mean_ms")
    assert row["ratio_b_over_a"] == pytest.approx(1.3, rel=0.02) and row["repeats"] == 4
    assert comp.final_line().startswith("ab: 0 better, ")


def test_same_code_is_same_and_too_few_blocks_say_so(tmp_path):
    plan = AbPlan(TREE, TREE, "ci", 3, out=tmp_path / "three")
    comp = comparison(plan, run_blocks(plan, fake_runner(), log=lambda line: None))
    assert comp.tally()["worse"] == 0 and comp.tally()["better"] == 0
    two = AbPlan(TREE, TREE, "ci", 2, out=tmp_path / "two")
    comp = comparison(two, run_blocks(two, fake_runner(), log=lambda line: None))
    timing = [r for r in comp.rows if r["kind"] == "timing"]
    assert {r["verdict"] for r in timing} == {"not comparable"}
    assert all(r["note"].startswith("too few repeats") for r in timing)


def test_a_revision_that_writes_nothing_stops_ab(tmp_path):
    def broken(plan, k, side, root):
        return Outcome(plan.run_dir(k, side), 2, "bench run: unknown preset 'gate'", 0.0)
    plan = AbPlan(Revision("old", "a" * 40), TREE, "gate", 2, out=tmp_path)
    with pytest.raises(ab.AbError, match="refused the flags: bench run: unknown preset"):
        ab.checked(plan.a, broken(plan, 0, "a", tmp_path))


def test_block_runs_are_started_without_plots(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cmd, cwd, env, log, timeout):
        seen.update(env)
        return 0, 0
    monkeypatch.setattr(ab.procs, "run_in_session", fake_run)
    ab.run_one(AbPlan(TREE, TREE, "ci", 1, out=tmp_path), 0, "a", tmp_path)
    assert seen["BENCH_NO_PLOTS"] == "1"


# ---- gate.json's ab: what the gate's served A/B passes both sides -----------------------------
# (the gate on a fake served A/B: tests/test_gate_decision.py)

def test_gate_json_sizes_both_sides_serve(tmp_path, monkeypatch):
    """gate.json's ab.requests / ab.bystanders reach both sides' `bench run` alike."""
    from bench.gate import ab as gate_ab

    monkeypatch.setattr(gate_ab, "resolve", lambda name, repo: Revision(name, "0" * 40))
    settings = {"ab": {"design": "served", "revision": "base", "preset": "ci", "requests": 8,
                       "bystanders": 0}}
    plan = gate_ab.served_plan(settings, tmp_path)
    assert plan.run_args == ("--requests", "8", "--bystanders", "0")
    command = plan.command(3, 0)
    assert command[command.index("--requests") + 1] == "8"


@pytest.mark.parametrize("key,value", [("requests", 0), ("requests", "8"), ("requests", True),
                                       ("bystanders", -1), ("bystanders", 2.5)])
def test_gate_json_refuses_a_bad_serve_size(tmp_path, key, value):
    from bench.gate.baseline import read_settings
    from bench.rundir.files import ResultFileError

    (tmp_path / "gate.json").write_text(json.dumps(
        {"ab": {"revision": "base", "preset": "ci", key: value}}))
    with pytest.raises(ResultFileError, match=f"ab.{key}.*must be an integer"):
        read_settings(tmp_path)


# ---- bisect's search, with a fake ab --------------------------------------------------------

def fake_judge(commits, first_bad, asked):
    def judge(commit):
        asked.append(commit)
        bad = commits.index(commit) >= commits.index(first_bad)
        return Step(commit, "worse" if bad else "same", "")
    return judge


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_search_finds_every_first_bad_commit(n):
    commits = [f"c{i}" for i in range(n)]
    for bad in commits:
        asked = []
        found, steps = search(commits, fake_judge(commits, bad, asked))
        assert found == bad
        assert asked[0] == commits[-1]  # BAD is checked first
        assert len(asked) <= 1 + max(1, (n - 1).bit_length())
        assert [s.commit for s in steps] == asked


def test_search_stops_when_bad_is_not_worse():
    asked = []
    found, steps = search(["c0", "c1"], lambda c: asked.append(c) or Step(c, "same", ""))
    assert found is None and asked == ["c1"]
    found, _ = search(["c0", "c1", "c2"], fake_judge(["c0", "c1", "c2"], "c1", []),
                      verify=False)
    assert found == "c1"


def test_step_reads_the_metric_of_the_configuration():
    class Comp:
        rows = [{"metric": "step_mean_ms", "protocol": "pr36425", "policy": "wait_complete",
                 "verdict": "worse", "ratio_b_over_a": 1.2, "ratio_ci_low": 1.1,
                 "ratio_ci_high": 1.3},
                {"metric": "step_mean_ms", "protocol": "pr27010", "policy": "wait_complete",
                 "verdict": "same", "ratio_b_over_a": 1.0, "ratio_ci_low": 0.9,
                 "ratio_ci_high": 1.1}]
    assert step_of("c", Comp(), "step_mean_ms", "pr27010/wait_complete").verdict == "same"
    step = step_of("c", Comp(), "step_mean_ms", None)
    assert step.verdict == "worse" and "B/A 1.200 [1.100, 1.300]" in step.detail
    assert step_of("c", Comp(), "itl_p50_ms", None).verdict == "not comparable"


# ---- revisions on a scratch repository ------------------------------------------------------

def git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def scratch(tmp_path):
    git(tmp_path, "init", "-q")
    for i in range(3):
        (tmp_path / "f.txt").write_text(str(i))
        git(tmp_path, "add", "f.txt")
        git(tmp_path, "commit", "-qm", f"c{i}")
    return tmp_path


def test_revisions_resolve_refuse_and_list(scratch):
    head = git(scratch, "rev-parse", "HEAD")
    assert resolve("HEAD", scratch).sha == head
    assert resolve(WORKTREE, scratch).sha is None
    with pytest.raises(RevisionError, match="unknown revision 'nope'"):
        resolve("nope", scratch)
    first = resolve("HEAD~2", scratch)
    assert [git(scratch, "log", "-1", "--format=%s", c)
            for c in commits_between(first, resolve("HEAD", scratch), scratch)] == ["c1", "c2"]
    with pytest.raises(RevisionError, match="not an ancestor"):
        commits_between(resolve("HEAD", scratch), first, scratch)
    (scratch / "f.txt").write_text("edited")
    with pytest.raises(RevisionError, match="HEAD .* but the working tree has changes"):
        resolve("HEAD", scratch)
    assert resolve("HEAD~1", scratch).sha != head  # another commit: fine while dirty


def test_unknown_revision_exits_2_with_one_line(capsys):
    assert main_ab(["no-such-revision-xyz", WORKTREE]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown revision 'no-such-revision-xyz'" in err
    assert main_ab([WORKTREE, WORKTREE, "--repeats", "0"]) == 2


def test_ab_and_bisect_size_every_run_alike(tmp_path, capsys):
    from bench.commands.ab import build_plan
    from bench.commands.bisect import main as main_bisect

    plan = build_plan([WORKTREE, WORKTREE, "--requests", "12", "--bystanders", "0",
                       "--out", str(tmp_path / "ab")])
    for k in range(plan.blocks):
        command = plan.command(k, tmp_path)
        assert command[-4:] == ["--requests", "12", "--bystanders", "0"]
    assert main_ab([WORKTREE, WORKTREE, "--requests", "0"]) == 2
    assert main_bisect(["HEAD", "HEAD", "--metric", "step_mean_ms", "--bystanders", "-1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["bench ab: --requests must be >= 1, got 0",
                   "bench bisect: --bystanders must be >= 0, got -1"]


# ---- the order effect, the blocks' sides, the rank tests -------------------------------------

def _ab_md(tmp_path, comp):
    from bench.compare.report import write_outputs

    write_outputs(comp, tmp_path / "out")
    import pandas as pd

    return (tmp_path / "out" / "ab.md").read_text(), pd.read_csv(tmp_path / "out" / "ab.csv")


def test_a_planted_order_effect_is_reported_and_b_over_a_stays_clean(tmp_path):
    plan = AbPlan(TREE, TREE, "ci", 6, seed=4, out=tmp_path / "ab")
    comp = comparison(plan, run_blocks(plan, fake_runner(second=1.3), log=lambda line: None))
    md, csv = _ab_md(tmp_path, comp)
    step = csv[(csv.metric == "step_mean_ms") & (csv.kind == "timing")]
    assert step.second_over_first.to_numpy() == pytest.approx(1.3, rel=0.02)
    assert (step.order_ci_low > 1).all()
    assert step.ratio_b_over_a.to_numpy() == pytest.approx(1.0, abs=0.02)  # balanced order
    assert set(step.verdict) == {"same"}
    assert "Order effect: " in md and "flagged" in md
    line = next(x for x in md.splitlines() if x.startswith("Order effect: "))
    assert int(line.split()[2]) >= 2  # step_mean_ms and itl_p50_ms, per configuration
    assert "order effect: the run second in a block is 1.30" in md
    assert any("order effect" in h for h in comp.header)  # and on the console


def test_no_order_effect_no_warning(tmp_path):
    plan = AbPlan(TREE, TREE, "ci", 6, seed=4, out=tmp_path / "ab")
    comp = comparison(plan, run_blocks(plan, fake_runner(), log=lambda line: None))
    md, _ = _ab_md(tmp_path, comp)
    assert "Order effect: 0 gated metric(s) flagged." in md
    assert not any("order effect" in h or "favour" in h for h in comp.header)


def test_every_block_on_one_side_is_flagged(tmp_path):
    def factor(side, k):  # B slower in every block, by a little that varies
        return 1.0 + (0.01 + 0.002 * k if side == "b" else 0.0)
    plan = AbPlan(TREE, TREE, "ci", 6, seed=1, out=tmp_path / "ab")
    comp = comparison(plan, run_blocks(plan, fake_runner(factor), log=lambda line: None))
    md, csv = _ab_md(tmp_path, comp)
    step = csv[(csv.metric == "step_mean_ms") & (csv.kind == "timing")]
    assert (step.blocks_favour_a == 6).all() and (step.blocks_favour_b == 0).all()
    assert "all 6 blocks favour A" in md
    assert step.wilcoxon_p.to_numpy() == pytest.approx(0.03125)  # exact, 6 of 6 one way
    assert step.sign_p.to_numpy() == pytest.approx(0.03125)


def test_block_runs_are_logged_with_their_times_in_ab_csv_and_md(tmp_path):
    plan = AbPlan(TREE, TREE, "ci", 3, seed=2, out=tmp_path / "ab")
    runs = run_blocks(plan, fake_runner(), log=lambda line: None)
    for o in runs.a + runs.b:
        o.start_utc, o.end_utc = "2026-12-02T06:00:00+00:00", "2026-12-02T06:01:00+00:00"
    md, csv = _ab_md(tmp_path, comparison(plan, runs))
    blocks = csv[csv.kind == "block"]
    assert list(zip(blocks.block, blocks.side.str.lower(), strict=True)) == plan.order()
    assert list(blocks.position) == ["first", "second"] * 3
    assert (blocks.start_utc == "2026-12-02T06:00:00+00:00").all()
    assert "## Block runs" in md


def test_rank_tests():
    from bench.ab.order import rank_tests

    w, s = rank_tests([1.1, 1.2, 0.9, 1.05, 0.95, 1.3])
    assert 0.1 < w < 1 and s == pytest.approx(0.6875)  # 4 of 6 above: binomial two-sided
    assert rank_tests([1.0, 1.0]) == (None, None)


def test_a_run_in_its_session_is_waited_for_until_its_leftovers_are_gone(tmp_path):
    from bench.ab import procs

    with open(tmp_path / "log", "w") as log:  # the child outlives its parent by 1 s
        code, lingered = procs.run_in_session(["sh", "-c", "sleep 1 & exit 0"], tmp_path,
                                              {"PATH": "/usr/bin:/bin"}, log, 30.0)
    assert code == 0 and lingered == 1


def test_worktree_is_snapshotted_with_its_changes_and_untracked_files(scratch):
    from bench.ab.revisions import checked_out

    (scratch / "f.txt").write_text("edited")
    (scratch / "new.txt").write_text("untracked")
    with checked_out(TREE, scratch, scratch / "snap") as tree:
        assert tree != scratch
        assert (tree / "f.txt").read_text() == "edited"
        assert (tree / "new.txt").read_text() == "untracked"
    assert not tree.exists()
