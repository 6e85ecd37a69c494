"""The gate's verdict: decision.json (its schema, round trip and refusals), the rule for a
check left undecided (INCONCLUSIVE on a disturbed machine, FAIL on a quiet one, never PASS),
and every exit code of `bench gate --ab` with the served A/B replaced by a fake (bench.ab.
served.run: made-up stages whose ranks.csv carry the disturbance the test chooses)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bench.ab.blocks import AbPlan, comparison, run_blocks
from bench.ab.revisions import WORKTREE, Revision
from bench.commands.gate import main as main_gate
from bench.gate.baseline import DEFAULT_AB
from bench.gate.timing import judge, settle
from bench.report.printer import WIDTH
from bench.rundir import decision
from bench.rundir.decision import Decision, Disturbance, Exact, Metric, Side
from bench.rundir.files import ResultFileError, write_csv_atomic, write_json_atomic
from bench.rundir.schema import DISTURBED_LIMIT
from bench.stats import Interval
from bench.verdict import words
from bench.verdict.checks import state
from tests.test_ab import fake_runner
from tests.test_gate import clean  # noqa: F401 (the gate's fixture)

QUIET, DISTURBED = [0.01, 0.02, 0.03], [0.12, 0.2, 0.3]
ROW = {"protocol": "pr36425", "policy": "wait_complete", "tp": 2, "pp": 1, "storage": "sim",
       "rate_rps": "inf", "extra_pool": False}


# ---- decision.json ----------------------------------------------------------------------

def a_decision(**kw) -> Decision:
    metric = Metric("step_mean", "pr36425", "wait_complete", "tp2 pp1 sim inf/s", 1.003, 0.991,
                    1.015, 0.012, None, 0.03, "PASS", 24)
    fields = dict(
        kind="gate", verdict="PASS", exit_code=0, created="2026-12-07T06:01:02Z", host="h",
        cores=2, commit="1" * 40, dirty=False, branch="main", a=Side("baseline", "2" * 40),
        b=Side("worktree", "1" * 40), preset="default", schedule="pinned",
        protocols=["pr27010", "pr36425"], policies=["wait_complete"],
        thresholds={"step_mean": 0.03}, estimator="t-mean-log", level=0.95, pairs=24,
        pairs_kept=24, seconds=265.0, disturbance=Disturbance(0.01, 0.03, True, 0.05),
        exact=Exact(136, 0), metrics=[metric])
    return Decision(**{**fields, **kw})


def test_a_decision_round_trips_with_the_schemas_keys(tmp_path):
    d = a_decision()
    path = decision.write(d, tmp_path)
    assert path == tmp_path / "decision.json"
    assert decision.read(tmp_path) == d and decision.read(path) == d
    obj = json.loads(path.read_text())
    assert obj["schema"] == decision.SCHEMA == 1
    assert set(obj) == {
        "schema", "kind", "verdict", "exit_code", "created", "host", "cores", "commit",
        "dirty", "branch", "a", "b", "preset", "schedule", "protocols", "policies",
        "thresholds", "estimator", "level", "pairs", "pairs_kept", "seconds", "disturbance",
        "exact", "metrics", "others", "stages", "refused"}
    assert set(obj["disturbance"]) == {"cpu_lost_p50", "cpu_lost_p90", "quiet", "quiet_limit"}
    assert set(obj["metrics"][0]) == {
        "metric", "protocol", "policy", "layout", "ratio", "low", "high", "half_width",
        "needed_half_width", "threshold", "verdict", "pairs", "note"}
    assert obj["a"] == {"label": "baseline", "commit": "2" * 40, "spec": None}


@pytest.mark.parametrize("content, says", [
    (None, "no decision.json"),
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "decision.json"),
    ('{"schema": 1, "kind": "ab"}', "not a gate's or a review's decision"),
    ('{"kind": "gate"}', "not a gate's or a review's decision"),
    ('{"schema": 1, "kind": "gate", "verdict": "PASS"}', "missing or unknown keys"),
])
def test_a_missing_or_foreign_file_is_refused_in_one_line(tmp_path, content, says):
    if content is not None:
        (tmp_path / "decision.json").write_text(content)
    with pytest.raises(ResultFileError, match=says) as e:
        decision.read(tmp_path)
    assert "\n" not in str(e.value)


def test_a_newer_schema_is_refused_saying_to_update(tmp_path):
    obj = json.loads(decision.write(a_decision(), tmp_path).read_text())
    write_json_atomic(tmp_path / "decision.json", {**obj, "schema": 2, "new_key": 1})
    with pytest.raises(ResultFileError) as e:
        decision.read(tmp_path)
    assert str(e.value) == (f"{tmp_path}/decision.json: schema 2 is newer than this bench "
                            "reads (1): update hicache-bench")


@pytest.mark.parametrize("verdicts, exact_failed, whole", [
    (["PASS", "PASS"], 0, "PASS"),
    (["PASS", "NOT JUDGED", "REFUSED"], 0, "PASS"),
    (["PASS", "INCONCLUSIVE"], 0, "INCONCLUSIVE"),
    (["INCONCLUSIVE", "FAIL"], 0, "FAIL"),  # any FAIL wins
    (["INCONCLUSIVE"], 1, "FAIL"),  # an exact check too
    ([], 0, "PASS"),
])
def test_the_whole_decision(verdicts, exact_failed, whole):
    assert words.overall(verdicts, exact_failed) == whole
    assert words.EXIT_CODES[whole] == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 77}[whole]


def test_the_disturbance_is_the_serves_cpu_lost_against_a_limit_fixed_in_advance():
    import pandas as pd

    assert DISTURBED_LIMIT == 0.05
    quiet = Disturbance.measured(QUIET)
    assert (quiet.cpu_lost_p50, quiet.quiet, quiet.quiet_limit) == (0.02, True, 0.05)
    assert Disturbance.measured([0.04, 0.05, 0.06]).quiet  # p50 at the limit: quiet
    loud = Disturbance.measured(DISTURBED)
    assert loud.cpu_lost_p50 == 0.2 and not loud.quiet and loud.cpu_lost_p90 == pytest.approx(0.28)
    none = Disturbance.measured([float("nan")])
    assert none.cpu_lost_p50 is None and none.quiet  # unmeasured: no excuse
    # rank 0's row per serve: rank 1's (another process's view of the same serve) not counted
    ranks = pd.DataFrame({"rank": [0, 1, 0, 1], "cpu_lost": [0.01, 0.9, 0.03, 0.9]})
    assert Disturbance.from_ranks([ranks, None]).cpu_lost_p50 == 0.02


# ---- the rule for a check left undecided ------------------------------------------------

@pytest.mark.parametrize("iv, decided", [
    ((0.99, 0.97, 1.01), "PASS"), ((1.10, 1.06, 1.14), "FAIL"),
    ((1.01, 0.97, 1.05), None), ((1.04, 1.02, 1.06), None), ((1.2, 0.7, 2.0), None)])
def test_an_undecided_check_is_fail_when_quiet_inconclusive_when_disturbed_never_pass(iv, decided):
    check = judge(ROW, "step_mean_ab", "step_mean", Interval(*iv, n=24), 0.03, "A's")
    quiet = settle([check], Disturbance.measured(QUIET))[0]
    loud = settle([check], Disturbance.measured(DISTURBED))[0]
    if decided:  # a decided check reads the same on either machine
        assert state(quiet) == state(loud) == decided and check.needed is None
        return
    assert state(quiet) == "FAIL" and state(loud) == "INCONCLUSIVE"
    assert not quiet.passed and not loud.passed
    edge = 1.03
    assert check.needed == pytest.approx(max(iv[0] / edge, edge / iv[0]) - 1)
    assert check.resolves > check.needed  # it did not reach what would have decided it
    assert "too noisy to decide" in loud.meaning and "quiet" in quiet.meaning


# ---- bench gate --ab with a fake served A/B ----------------------------------------------

TREE = Revision(WORKTREE, None)


def fake_served(monkeypatch, factor, cpu_lost):
    """bench.ab.served.run replaced: 4 pairs from tests.test_ab's fake runs (B's step time
    and ITL times factor(side, k)), and one stage whose sides' ranks.csv say `cpu_lost`."""
    from bench.ab import served
    from bench.gate import ab as gate_ab

    def run(plan, budget, states, log=print, header=None):
        blocks = AbPlan(TREE, TREE, "ci", 4, out=plan.out)
        comp = comparison(blocks, run_blocks(blocks, fake_runner(factor), log=log))
        states(comp)  # what the sequential rule would be asked
        stage = served.Stage(0, 0, 4, served.stage_dirs(plan.out, 0), {"a": 0, "b": 0},
                             list("abab"), seconds=60.0)
        for side in stage.dirs.values():
            rows = [{"rank": 0, "repeat": i, "cpu_lost": x} for i, x in enumerate(cpu_lost)]
            side.mkdir(parents=True)
            write_csv_atomic(side / "ranks.csv", rows, ["rank", "repeat", "cpu_lost"])
        return [stage], comp
    monkeypatch.setattr(served, "run", run)
    monkeypatch.setattr(gate_ab, "resolve", lambda name, repo: Revision(name, "0" * 40))


def slower(side, k):
    return 1.3 if side == "b" else 1.0


def swing(side, k):  # B/A 1.25, 0.8, ...: no interval above 1.03, but one holding it
    return (1.25 if k % 2 == 0 else 0.8) if side == "b" else 1.0


def gate_ab(clean, tmp_path, *extra):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(clean[0], run)
    return main_gate([str(run), "--baseline", str(clean[1]), "--ab", *extra]), run


@pytest.mark.parametrize("factor, lost, code, verdict", [
    (lambda side, k: 1.0, DISTURBED, 0, "PASS"),  # decided: the noise excuses nothing
    (slower, QUIET, 1, "FAIL"),
    (swing, QUIET, 1, "FAIL"),  # undecided on a quiet machine: not shown within 3%
    (swing, DISTURBED, 77, "INCONCLUSIVE"),
])
def test_every_exit_code_of_the_ab_gate_and_its_decision(clean, tmp_path, monkeypatch,  # noqa: F811
                                                          capsys, factor, lost, code, verdict):
    fake_served(monkeypatch, factor, lost)
    got, run = gate_ab(clean, tmp_path)
    out = capsys.readouterr().out
    assert got == code, out
    lines = out.splitlines()
    assert all(len(x) <= WIDTH for x in lines)
    last = lines[-1]
    assert last.startswith({"PASS": "OK: ", "FAIL": "FAIL", "INCONCLUSIVE": "INCONCLUSIVE"}[
        verdict]), last
    assert "cpu lost " + ("2.0% (quiet)" if lost is QUIET else "20.0% (noisy)") in last
    d = decision.read(run / "ab")
    assert (d.verdict, d.exit_code, d.kind, d.pairs, d.seconds) == (verdict, code, "gate", 4,
                                                                     60.0)
    assert d.disturbance == Disturbance.measured(lost * 2)  # both sides' serves
    assert d.exact.checks > 0 and d.exact.failed == 0
    assert d.a == Side("0" * 40, "0" * 40)
    assert d.protocols == DEFAULT_AB["protocols"].split(",")  # what the gate served
    step = [m for m in d.metrics if m.metric == "step_mean"]
    assert step and all(m.pairs == 4 and m.threshold == 0.05 for m in step)  # the default
    assert "PASS" not in {m.verdict for m in d.metrics if m.needed_half_width is not None}
    if factor is swing:
        assert {m.verdict for m in step} == {verdict}
        assert all(m.needed_half_width < m.half_width for m in step)
        assert "undecided: " in out and "% (needed " in out and "% vs " in last
    else:
        assert all(m.needed_half_width is None for m in d.metrics)


def test_a_fail_wins_over_inconclusive(clean, tmp_path, monkeypatch, capsys):  # noqa: F811
    """An exact check failing beside a timing check left undecided on a disturbed machine:
    the gate fails (1), and decision.json says so."""
    import pandas as pd

    fake_served(monkeypatch, swing, DISTURBED)
    run = tmp_path / "run"
    shutil.copytree(clean[0], run)
    frame = pd.read_csv(run / "requests.csv")
    frame.loc[frame.index[0], "data_ok"] = False
    write_csv_atomic(run / "requests.csv", frame.to_dict("records"), list(frame.columns))
    assert main_gate([str(run), "--baseline", str(clean[1]), "--ab"]) == 1
    d = decision.read(run / "ab")
    assert d.verdict == "FAIL" and d.exact.failed >= 1
    assert "INCONCLUSIVE" in {m.verdict for m in d.metrics}
    assert capsys.readouterr().out.splitlines()[-1].startswith("FAIL")


@pytest.mark.parametrize("ab, says", [
    ({"design": None}, "gate.json's ab has no design"),
    ({"design": "blocks", "blocks": 6}, "gate.json's ab has design 'blocks'"),
])
def test_a_baseline_of_the_blocks_design_is_refused_saying_how_to_re_record(
        clean, tmp_path, monkeypatch, capsys, ab, says):  # noqa: F811
    fake_served(monkeypatch, slower, QUIET)
    baseline = tmp_path / "baseline"
    shutil.copytree(clean[1], baseline)
    settings = json.loads((baseline / "gate.json").read_text())
    settings["ab"] = {k: v for k, v in {**settings["ab"], **ab}.items() if v is not None}
    write_json_atomic(baseline / "gate.json", settings)
    assert main_gate([str(clean[0]), "--baseline", str(baseline), "--ab"]) == 2
    err = capsys.readouterr().err
    assert says in err and "--update-baseline" in err and err.count("\n") == 1, err
    assert not (clean[0] / "ab").exists()
    # re-recording carries the served design over, the blocks' keys dropped
    assert main_gate([str(clean[0]), "--baseline", str(baseline), "--update-baseline"]) == 0
    ab = json.loads((baseline / "gate.json").read_text())["ab"]
    assert ab["design"] == "served" and "blocks" not in ab
    capsys.readouterr()


def test_no_confirm_is_gone(clean, capsys):  # noqa: F811
    assert main_gate([str(clean[0]), "--baseline", str(clean[1]), "--ab", "--no-confirm"]) == 2
    assert "unrecognized arguments: --no-confirm" in capsys.readouterr().err


# ---- the last line ---------------------------------------------------------------------

def _timing(metric: str, protocol: str, iv, disturbance):
    return settle([judge(dict(ROW, protocol=protocol), f"{metric}_ab", metric,
                         Interval(*iv, n=24), 0.03, "A's")], disturbance)[0]


@pytest.mark.parametrize("lost", [QUIET, DISTURBED])
@pytest.mark.parametrize("undecided", [1, 4, 8])
def test_the_last_line_names_each_metrics_verdict_and_the_disturbance_and_fits(
        lost, undecided):
    from bench.gate.console import format_checks, last_line
    from bench.verdict.checks import Check

    d = Disturbance.measured(lost)
    metrics = ["step_mean", "itl_p50", "prefetch_ttft_p50", "bystander_ttft_p50"]
    checks = [_timing(m, p, (1.01, 0.97, 1.05) if i < undecided else (1.0, 0.99, 1.01), d)
              for i, (m, p) in enumerate((m, p) for p in ("pr27010", "pr36425")
                                         for m in metrics)]
    checks += [Check("decision_exact", "pr36425", "wait_complete", "tp2 pp1", True)] * 9
    lines = (format_checks(checks) + "\n" + last_line(checks, d)).splitlines()
    assert all(len(x) <= WIDTH for x in lines), max(lines, key=len)
    last, word = lines[-1], "FAIL" if d.quiet else "INCONCLUSIVE"
    assert last.startswith(word), last  # FAILED or FAIL, INCONCLUSIVE
    assert f"cpu lost {d.cpu_lost_p50:.1%} ({'quiet' if d.quiet else 'noisy'})" in last
    assert all(m in last for m in metrics) and f"{word} " in last
    if undecided < 4:  # a metric whose every check decided reads PASS; no other does
        assert "PASS" in last
    else:
        assert "PASS" not in last
    told = " ".join(" ".join(lines[-6:]).split())
    assert told.count("4.1% (needed 2.0%)") == undecided  # 1.03 / 1.01: each check's own
    if undecided == 1:  # the common case: on the last line too
        assert "step_mean (4.1% vs 2.0%)" in last


def test_a_check_not_judged_is_no_pass_and_no_failure():
    iv = Interval(1.4, None, None, 2, None, "too few repeats for an interval (2 paired)")
    check = judge(ROW, "step_mean_ab", "step_mean", iv, 0.03, "A's")
    assert state(settle([check], Disturbance.measured(DISTURBED))[0]) == "NOT JUDGED"
    assert words.overall([state(check)], 0) == "PASS" and check.passed


# ---- scripts/gate_power.py reads decision.json --------------------------------------------

def test_the_power_script_counts_each_gates_verdict_from_its_decision(tmp_path):
    """gate_power's tables over a results folder of gates that have decision.json: each
    gate's verdict and metric verdicts read from the file (never a console line),
    INCONCLUSIVE a column of its own; an older gate without one keeps its recorded states."""

    from tests.test_served import REPO

    sys.path.insert(0, str(REPO / "scripts"))
    import gate_power

    undecided = Metric("step_mean", "pr36425", "wait_complete", "tp2 pp1 sim inf/s", 1.01,
                       0.97, 1.05, 0.041, 0.02, 0.03, "INCONCLUSIVE", 24)
    results = []
    for i, d in enumerate([a_decision(), a_decision(verdict="INCONCLUSIVE", exit_code=77,
                                                    metrics=[undecided])]):
        gate = tmp_path / "study" / "gates" / f"{i:02d}_aa_quiet"
        decision.write(d, gate / "ab")
        results.append({"label": "A/A quiet", "exit": d.exit_code, "repeats": 24,
                        "seconds": 250.0, "dir": str(gate), "states": {}, "intervals": {}})
    results.append({"label": "A/A quiet", "exit": 1, "repeats": 80, "seconds": 420.0,
                    "states": {"step_mean": "UNRESOLVED"}, "intervals": {}})  # an older gate
    got = gate_power.read_decision(results[1]["dir"])
    assert got["verdict"] == "INCONCLUSIVE" and got["states"] == {"step_mean": "INCONCLUSIVE"}
    assert got["intervals"] == {"pr36425 step_mean_ms": "1.010 [0.970, 1.050], n=24"}
    assert [gate_power.verdict(r) for r in results] == ["PASS", "INCONCLUSIVE", "UNRESOLVED"]
    assert gate_power.table(results) == [
        "| gates | n | FAIL | INCONCLUSIVE | UNRESOLVED | PASS | paired repeats (median) | "
        "seconds (median) |", "|---|---|---|---|---|---|---|---|",
        "| A/A quiet | 3 | 0 | 1 | 1 | 1 | 24 | 250 |"]
    study = tmp_path / "study"
    (study / "baseline").mkdir()
    (study / "baseline" / "gate.json").write_text(json.dumps({"thresholds": {"step_mean": 0.03}}))
    (study / "gate_power.json").write_text(json.dumps({"results": results[:2]}))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gate_power.py"), "--tables",
                           str(study)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| A/A quiet | 2 | 0 | 1 | 1 | 24 | 250 |" in done.stdout
