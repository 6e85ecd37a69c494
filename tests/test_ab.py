"""bench ab and bench bisect without running the benchmark: the block order, pairing by
block, verdicts on made-up runs, the binary search with a fake ab, and the revision checks
on a scratch git repository."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.ab import blocks as ab
from bench.ab.bisect import Step, search, step_of
from bench.ab.blocks import AbPlan, Outcome, comparison, merged, run_blocks
from bench.ab.revisions import WORKTREE, Revision, RevisionError, commits_between, resolve
from bench.commands.ab import main as main_ab
from bench.commands.gate import main as main_gate
from tests.test_gate import clean, write_run  # noqa: F401 (clean: the gate's fixture)
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


# ---- the gate on ab, with a fake ab ---------------------------------------------------------

@pytest.fixture
def blocks(clean, tmp_path):  # noqa: F811
    """The clean run and a copy of its baseline whose gate.json asks for blocks of 6."""
    baseline = tmp_path / "blocks_baseline"
    shutil.copytree(clean[1], baseline)
    settings = json.loads((baseline / "gate.json").read_text())
    settings["ab"] = {**settings["ab"], "design": "blocks", "blocks": 6}
    (baseline / "gate.json").write_text(json.dumps(settings))
    return clean[0], baseline


def fake_gate(monkeypatch, slower_in, calls):
    """gate.run_gate_ab replaced by an A/B of 4 fake blocks whose B is slower_in(seed) times
    A in every block (step times and ITL only); calls gets each A/B's seed."""
    from bench.gate import evaluate as gate

    def fake_gate_ab(settings, out, seed=0):
        calls.append(seed)
        plan = AbPlan(TREE, TREE, "ci", 4, seed=seed, out=out)
        factor = lambda side, k: slower_in(seed) if side == "b" else 1.0  # noqa: E731
        return comparison(plan, run_blocks(plan, fake_runner(factor), log=print)), out
    monkeypatch.setattr(gate, "run_gate_ab", fake_gate_ab)


def failing_rows(out: str) -> list[str]:
    """The rows of the failing-checks table (between its "check" header and the notes,
    resolution lines or "timings:" line after it), each failing check's own line (its
    expected, observed and meaning indented below it are not rows)."""
    lines = out.splitlines()
    table = lines[lines.index(next(x for x in lines if x.startswith("check "))) + 1:]
    return [x for x in table[:next(i for i, x in enumerate(table)
                                   if x.startswith(("note: ", "resolution: ", "timings:")))]
            if not x.startswith(" ")]


def failing_checks(out: str) -> set[str]:
    return {x.split()[0] for x in failing_rows(out)}


@pytest.mark.parametrize("slower, code", [(1.0, 0), (1.3, 1)])
def test_gate_ab_fails_a_slower_tree_on_its_timings_only(blocks, slower, code, tmp_path,
                                                         monkeypatch, capsys):
    """`bench gate --ab` judges the A/B's intervals (bench.gate.timing.ab_checks): this tree
    30% slower in every block fails on step time and ITL, and the second A/B (the next
    seeds, after the gate.json's blocks) confirms it; the same code passes without a second
    A/B; the exact count checks of the run hold either way."""
    calls = []
    fake_gate(monkeypatch, lambda seed: slower, calls)
    run = tmp_path / "run"
    shutil.copytree(blocks[0], run)
    assert main_gate([str(run), "--baseline", str(blocks[1]), "--ab"]) == code
    out = capsys.readouterr().out
    assert "interleaved on this machine" in out
    if code:
        assert failing_checks(out) == {"step_mean_ab", "itl_p50_ab"}, out  # TTFT not scaled
        assert calls == [0, 6]  # gate.json's 6 blocks, then seeds 6..
        n = len(failing_rows(out))
        assert f"confirmation: {n} of {n} failing timing checks failed again" in out
        assert "; again 1.3" in out and str(run / "ab_confirm" / "ab.md") in out
        assert out.splitlines()[-1].startswith("FAILED: ") and "ab: 0 better" in out
    else:
        assert calls == [0] and "confirmation" not in out
        assert "ab: 0 better, 0 worse" in out and out.splitlines()[-1].startswith("OK: "), out


def test_gate_ab_passes_a_failure_the_second_ab_does_not_confirm(blocks, tmp_path,
                                                                 monkeypatch, capsys):
    """A tree slower only in the first A/B (a burst of load on the machine) passes, each
    check it failed there noted with the second A/B's interval; with --no-confirm the first
    A/B alone decides."""
    calls = []
    fake_gate(monkeypatch, lambda seed: 1.3 if seed == 0 else 1.0, calls)
    run = tmp_path / "run"
    shutil.copytree(blocks[0], run)
    assert main_gate([str(run), "--baseline", str(blocks[1]), "--ab"]) == 0
    out = capsys.readouterr().out
    assert calls == [0, 6] and out.splitlines()[-1].startswith("OK: step_mean PASS"), out
    lines = out.splitlines()  # each note's check on its line, what it notes indented below
    notes = [x for x, below in zip(lines, lines[1:], strict=False)
             if x.startswith("note: ") and "not confirmed by the second" in below]
    assert {x.split()[1] for x in notes} == {"step_mean_ab", "itl_p50_ab"}, out
    assert f"confirmation: 0 of {len(notes)} failing timing checks failed again" in out
    calls.clear()
    assert main_gate([str(run), "--baseline", str(blocks[1]), "--ab", "--no-confirm"]) == 1
    out = capsys.readouterr().out
    assert calls == [0] and failing_checks(out) == {"step_mean_ab", "itl_p50_ab"}, out


def test_gate_ab_calls_a_step_interval_wider_than_its_threshold_unresolved(
        blocks, tmp_path, monkeypatch, capsys):
    """Doctored blocks whose B/A swings 1.25, 0.8, ... (step time and ITL): no interval above
    1 + threshold, but one that holds it: UNRESOLVED, not PASS, failing the gate with no
    second A/B (a second only confirms a failure)."""
    from bench.gate import evaluate as gate

    calls = []

    def fake_gate_ab(settings, out, seed=0):
        calls.append(seed)
        plan = AbPlan(TREE, TREE, "ci", 4, seed=seed, out=out)
        swing = lambda side, k: (1.25 if k % 2 == 0 else 0.8) if side == "b" else 1.0  # noqa: E731
        return comparison(plan, run_blocks(plan, fake_runner(swing), log=print)), out
    monkeypatch.setattr(gate, "run_gate_ab", fake_gate_ab)
    run = tmp_path / "run"
    shutil.copytree(blocks[0], run)
    assert main_gate([str(run), "--baseline", str(blocks[1]), "--ab"]) == 1
    out = capsys.readouterr().out
    assert calls == [0] and "confirmation" not in out, out
    step = [x for x in failing_rows(out) if x.startswith("step_mean_ab")]
    assert step and all(x.endswith("UNRESOLVED") for x in step), out
    assert any(x.startswith("resolution: step_mean_ab ") and x.endswith(": UNRESOLVED")
               for x in out.splitlines()), out
    last = out.splitlines()[-1]
    assert last.startswith("FAILED: ") and "step_mean UNRESOLVED" in last, last


@pytest.mark.parametrize("first, again, fails", [
    # a 2 ms slower poll, its second A/B's 3 pairs widened by one slow block
    ((4.607, 3.736, 5.681), (3.465, 1.166, 10.299), True),
    # unchanged code, the second A/B's interval holds 1
    ((1.229, 1.080, 1.398), (1.184, 0.777, 1.807), False),
    # slower on new workloads, but by less than the threshold: a smaller change than gated
    ((1.10, 1.05, 1.15), (1.02, 1.01, 1.03), False),
    ((1.10, 1.05, 1.15), (1.10, 1.01, 1.20), True),
])
def test_a_failure_is_confirmed_when_the_second_ab_replicates_it(first, again, fails):
    """The second A/B replicates a failure when its whole interval lies above 1 and its point
    beyond 1 + threshold (bench.gate.timing.replicates): a real regression whose fresh blocks
    are noisier still fails; unchanged code whose second interval holds 1 passes."""
    from bench.gate.timing import confirmed, judge
    from bench.stats import Interval

    row = {"protocol": "pr36425", "policy": "wait_complete", "tp": 2, "pp": 1,
           "storage": "sim", "rate_rps": "inf", "extra_pool": False}

    def check(iv, again_=False):
        return judge(row, "step_mean_ab", "step_mean", Interval(*iv, n=3), 0.03, "A's",
                     again_)  # results/baseline's step threshold
    one = check(first)
    assert not one.passed  # the first A/B fails on its own rule
    [out] = confirmed([one], [check(again, again_=True)])
    assert out.passed is not fails, out
    assert ("again" in out.observed) if fails else ("not confirmed" in out.note)


def test_the_confirming_ab_runs_the_next_seeds(tmp_path, monkeypatch):
    """gate.json's 6 blocks are seeded 0..5; the confirming A/B's 6..11: new workloads."""
    from bench.gate import ab as gate_ab

    monkeypatch.setattr(gate_ab, "resolve", lambda name, repo: Revision(name, "0" * 40))
    settings = {"ab": {"revision": "base", "preset": "queue", "blocks": 6,
                       "protocols": "pr27010", "policies": "wait_complete"}}

    def seeds(plan):
        return [int((c := plan.command(k, tmp_path))[c.index("--seed") + 1])
                for k in range(plan.blocks)]
    first = gate_ab.gate_plan(settings, tmp_path)
    again = gate_ab.gate_plan(settings, tmp_path, gate_ab.confirmation_seed(settings))
    assert seeds(first) == [0, 1, 2, 3, 4, 5] and seeds(again) == [6, 7, 8, 9, 10, 11]
    assert again.run_args == ("--protocols", "pr27010", "--policies", "wait_complete")


def test_gate_json_sizes_both_sides_serve(tmp_path, monkeypatch):
    """gate.json's ab.requests / ab.bystanders reach both sides' `bench run` alike."""
    from bench.gate import ab as gate_ab

    monkeypatch.setattr(gate_ab, "resolve", lambda name, repo: Revision(name, "0" * 40))
    settings = {"ab": {"revision": "base", "preset": "ci", "blocks": 2, "requests": 8,
                       "bystanders": 0}}
    plan = gate_ab.gate_plan(settings, tmp_path)
    assert plan.run_args == ("--requests", "8", "--bystanders", "0")
    for k in range(plan.blocks):
        command = plan.command(k, tmp_path)
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


def test_no_confirm_needs_ab(clean, capsys):  # noqa: F811
    assert main_gate([str(clean[0]), "--baseline", str(clean[1]), "--no-confirm"]) == 2
    assert "--no-confirm needs --ab" in capsys.readouterr().err


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
