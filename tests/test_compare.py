"""`bench compare` on two real small runs and on doctored copies of them."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.commands.compare import main as main_compare
from bench.compare.metrics import METRIC_NAMES
from bench.rundir.schema import SCHEMA_VERSION

RUN = ["--preset", "ci", "--requests", "4", "--bystanders", "0", "--repeats", "3",
       "--protocols", "before,after", "--policies", "wait_complete"]
FINAL = re.compile(r"^compare: (\d+) better, (\d+) worse, (\d+) same$")
JUDGED_COUNTS = ["decision_collectives_per_req", "critical_collectives_per_req",
                 "background_collectives_per_req", "step_collectives_per_step"]


@pytest.fixture(scope="module")
def run_a(bench_run):
    """A real run (built once per session, conftest.py; no plots: compare draws its own),
    compared with itself and with doctored copies of it."""
    return bench_run("compare_a", *RUN)


@pytest.fixture(scope="module")
def runs(run_a, bench_run):
    """Two real runs of the same code, A and B: B is a second real run, so the tests that
    read it are slow."""
    return run_a, bench_run("compare_b", *RUN)


def doctor(src: Path, dst: Path, requests=None, steps=None, env=None) -> Path:
    """A copy of run `src` with its CSVs / env.json edited by frame -> frame (dict -> dict)."""
    shutil.copytree(src, dst)
    for name, edit in (("requests.csv", requests), ("steps.csv", steps)):
        if edit is not None:
            edit(pd.read_csv(dst / name)).to_csv(dst / name, index=False)
    if env is not None:
        (dst / "env.json").write_text(json.dumps(env(json.loads((dst / "env.json").read_text()))))
    return dst


def compare(capsys, a, b, *extra, out=None):
    """(exit code, stdout lines, stderr, compare.csv frame or None)."""
    out = out or Path(b).parent / f"cmp_{Path(a).name}_{Path(b).name}"
    code = main_compare([str(a), str(b), "--out", str(out), *extra])
    captured = capsys.readouterr()
    csv = pd.read_csv(out / "compare.csv") if (out / "compare.csv").exists() else None
    return code, captured.out.splitlines(), captured.err, csv


def verdicts(csv, metric, protocol=None):
    rows = csv[csv.metric == metric]
    if protocol:
        rows = rows[rows.protocol == protocol]
    return set(rows.verdict)


@pytest.mark.slow  # a second real run of the same code (about 15 s)
def test_real_runs_compare_counts_exactly(runs, capsys):
    code, out, err, csv = compare(capsys, *runs)
    assert code in (0, 1) and not err  # two runs of one commit: timings may drift
    assert FINAL.match(out[-1])
    for metric in JUDGED_COUNTS:  # the same code issues the same collectives, polls or not
        assert verdicts(csv, metric) == {"same"}, csv[csv.metric == metric].to_string()
    assert verdicts(csv, "polls_per_req") == {"info"}
    # no bystanders in these runs: their TTFT has no samples on either side and is left out
    timings = {m for m in METRIC_NAMES if not m.startswith("bystander_")}
    assert set(csv.metric) == {"polls_per_req", *JUDGED_COUNTS, *timings}
    assert len(csv) == 2 * (5 + len(timings))  # two configurations x (counts + timings)
    assert json.loads((runs[0] / "env.json").read_text())["schema_version"] == SCHEMA_VERSION


def test_identical_runs_are_all_same(run_a, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_NO_PLOTS", "0")  # this test reads the plot (conftest.py)
    code, out, _, csv = compare(capsys, run_a, run_a, out=tmp_path / "out")
    assert code == 0
    assert out[-1] == "compare: 0 better, 0 worse, 26 same"
    assert set(csv.verdict) == {"same", "info"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "compare.csv", "compare.md", "compare_ratios.png"]
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "**compare: 0 better, 0 worse, 26 same** (exit status 0)" in md
    assert "![timing ratios B/A](compare_ratios.png)" in md


def test_no_plots_draws_none_and_says_so(run_a, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_NO_PLOTS", "1")
    assert compare(capsys, run_a, run_a, out=tmp_path / "out")[0] == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["compare.csv", "compare.md"]
    assert "Not drawn: BENCH_NO_PLOTS=1." in (tmp_path / "out" / "compare.md").read_text()


@pytest.mark.slow  # the same second real run (B)
def test_timings_are_paired_by_repeat_and_drift_is_named(runs, capsys, tmp_path):
    code, out, _, csv = compare(capsys, *runs, out=tmp_path / "out")
    text = " ".join(line.strip() for line in out)  # the note wraps at 120 columns
    note = text.index("note: the two runs were made at different times: drift")
    assert "bench ab" in text[note:note + 400]
    timing = csv[csv.kind == "timing"]
    assert (timing.repeats == 3).all() and timing.ratio_mdd.notna().all()


def test_too_few_repeats_are_not_comparable(run_a, capsys, tmp_path):
    def two(frame):
        return frame[frame.repeat < 2]
    a = doctor(run_a, tmp_path / "a", requests=two, steps=two)
    b = doctor(run_a, tmp_path / "b", requests=two, steps=two)
    code, out, _, csv = compare(capsys, a, b, out=tmp_path / "out")
    timing = csv[csv.kind == "timing"]
    assert set(timing.verdict) == {"not comparable"} and timing.ratio_ci_low.isna().all()
    assert timing.note.str.startswith("too few repeats for an interval (2 paired").all()
    assert timing.ratio_b_over_a.notna().all()  # the point is still there


def add_decision(frame):
    frame["decision_collectives"] += 1
    return frame


def test_extra_decision_collective_is_worse(run_a, capsys, tmp_path):
    b = doctor(run_a, tmp_path / "b", requests=add_decision)
    code, out, _, csv = compare(capsys, run_a, b)
    assert code == 1
    assert verdicts(csv, "decision_collectives_per_req") == {"worse"}
    assert verdicts(csv, "critical_collectives_per_req") == {"worse"}
    assert set(csv[csv.metric == "decision_collectives_per_req"].b_minus_a) == {1.0}
    assert out[-1] == "compare: 0 better, 4 worse, 22 same"  # 2 configurations x 2 counts


def test_fewer_collectives_are_better_whatever_the_threshold(run_a, capsys, tmp_path):
    def drop_acks(frame):
        frame["ack_collectives"] -= 1
        return frame
    b = doctor(run_a, tmp_path / "b", requests=drop_acks)
    code, out, _, csv = compare(capsys, run_a, b, "--threshold", "10")
    assert code == 0
    assert verdicts(csv, "background_collectives_per_req") == {"better"}


def test_more_polls_at_the_same_cost_per_poll_are_same(run_a, capsys, tmp_path):
    def one_more_poll(frame):  # pr27010 at TP2: one decision all-reduce per poll
        frame["polls"] += 1
        frame.loc[frame.protocol == "pr27010", "decision_collectives"] += 1
        return frame
    b = doctor(run_a, tmp_path / "b", requests=one_more_poll)
    code, out, _, csv = compare(capsys, run_a, b)
    assert code == 0
    rows = csv[csv.metric == "decision_collectives_per_req"].set_index("protocol")
    assert rows.loc["pr27010", "b_minus_a"] == 1.0 and rows.loc["pr27010", "verdict"] == "same"
    assert "judged per poll" in rows.loc["pr27010", "note"]
    assert rows.loc["pr36425", "verdict"] == "same"
    # ... but one more decision collective than polls is a change per poll: worse.
    b2 = doctor(b, tmp_path / "b2", requests=add_decision)
    assert compare(capsys, run_a, b2)[0] == 1


def scale_ttft(factor):
    def edit(frame):
        frame["ttft_ms"] *= factor
        return frame
    return edit


def test_doubled_ttft_is_worse_with_ci_excluding_1(run_a, capsys, tmp_path):
    b = doctor(run_a, tmp_path / "b", requests=scale_ttft(2.0))
    code, out, _, csv = compare(capsys, run_a, b)
    assert code == 1
    ttft = csv[csv.metric.str.startswith("ttft_")]
    assert set(ttft.verdict) == {"worse"} and (ttft.ratio_ci_low > 1.05).all()
    assert np.allclose(ttft.ratio_b_over_a, 2.0)
    # overall and prefetch-class TTFT p50/p99 (this run has no bystanders), 2 configurations
    assert out[-1] == "compare: 0 better, 8 worse, 18 same"


def test_halved_ttft_is_better(run_a, capsys, tmp_path):
    b = doctor(run_a, tmp_path / "b", requests=scale_ttft(0.5))
    code, _, _, csv = compare(capsys, run_a, b)
    assert code == 0
    assert verdicts(csv, "ttft_p50_ms") == {"better"}


def set_env(**changes):
    def edit(env):
        for path, value in changes.items():
            node = env
            *parents, leaf = path.split("__")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        return env
    return edit


@pytest.mark.parametrize(("env", "message"), [
    (set_env(plan__tp=4, world__tp=4), "different layouts (tp): A 2, B 4"),
    (set_env(plan__pp=2), "different layouts (pp): A 1, B 2"),
    (set_env(plan__preset="default"), "different presets: A ci, B default"),
    (set_env(schema_version=SCHEMA_VERSION + 1), "schema versions differ"),
    (lambda env: {k: v for k, v in env.items() if k != "schema_version"},
     f"schema versions differ (A {SCHEMA_VERSION}, B 2)"),
])
def test_mismatched_runs_exit_2(run_a, capsys, tmp_path, env, message):
    b = doctor(run_a, tmp_path / "b", env=env)
    code, out, err, csv = compare(capsys, run_a, b)
    assert code == 2 and not out and csv is None
    assert err.count("\n") == 1 and err.startswith("bench compare: refused: ")
    assert message in err


def test_row_on_one_side_is_listed(run_a, capsys, tmp_path):
    def drop_after(frame):
        return frame[frame.protocol != "pr36425"]
    b = doctor(run_a, tmp_path / "b", requests=drop_after, steps=drop_after)
    code, out, _, csv = compare(capsys, run_a, b, out=tmp_path / "out")
    assert code == 0
    assert any(line.startswith("only in A: pr36425/wait_complete") for line in out)
    assert "- only in A: pr36425/wait_complete" in (tmp_path / "out" / "compare.md").read_text()
    assert list(csv[csv.kind == "configuration"].verdict) == ["only in A"]
    assert out[-1] == "compare: 0 better, 0 worse, 13 same"


def test_env_differences_warned_at_the_top(run_a, capsys, tmp_path):
    b = doctor(run_a, tmp_path / "b", env=set_env(host="elsewhere", cpu_count=64))
    code, out, _, _ = compare(capsys, run_a, b)
    assert code == 0
    assert out[0].startswith("warning: timings may not be comparable: host ")
    assert "-> elsewhere" in out[0] and "CPU count" in out[0]


def serving_columns(step_factor=1.0):
    """Add the serving regime's columns: classes, ITL gaps, step kinds and step times."""
    def requests(frame):
        frame["request_class"] = np.where(frame.index % 2, "bystander", "prefetch")
        frame["itl_ms"] = [";".join(f"{20 + (i * 7 + j) % 5:.1f}" for j in range(6))
                           for i in range(len(frame))]
        frame.loc[0, "itl_ms"] = None  # a request with one token: no gaps
        return frame

    def steps(frame):
        frame["kind"] = np.where(frame.index % 3, "decode", "prefill")
        frame["step_ms"] = (10.0 + frame.index % 4) * step_factor
        return frame
    return requests, steps


def test_serving_columns_are_compared_when_present(run_a, capsys, tmp_path):
    ra, sa = serving_columns()
    rb, sb = serving_columns(step_factor=1.5)
    a = doctor(run_a, tmp_path / "a", requests=ra, steps=sa)
    b = doctor(run_a, tmp_path / "b", requests=rb, steps=sb)
    code, out, _, csv = compare(capsys, a, b)
    assert code == 1
    assert verdicts(csv, "decode_step_p50_ms") == {"worse"}
    assert verdicts(csv, "decode_step_p99_ms") == {"worse"}
    for metric in ("itl_p50_ms", "itl_p99_ms", "prefetch_ttft_p50_ms", "bystander_ttft_p99_ms"):
        assert verdicts(csv, metric) == {"same"}, metric
    itl = csv[csv.metric == "itl_p50_ms"].iloc[0]
    assert itl.n_a == (len(pd.read_csv(a / "requests.csv")) // 2 - 1) * 6  # gaps, one config


def test_metric_on_one_side_only_is_not_comparable(run_a, capsys, tmp_path):
    """A from before the serving regime (no classes, ITL or step times) against B."""
    def old_requests(frame):
        return frame.drop(columns=["itl_ms", "request_class"])

    def old_steps(frame):
        return frame.drop(columns=["step_ms", "kind"])
    a = doctor(run_a, tmp_path / "a", requests=old_requests, steps=old_steps)
    code, out, _, csv = compare(capsys, a, run_a)
    assert code == 0
    for metric in ("itl_p50_ms", "decode_step_p99_ms"):
        assert verdicts(csv, metric) == {"not comparable"}, metric
    assert verdicts(csv, "prefetch_ttft_p50_ms") == {"same"}  # A without classes: all prefetch
    assert verdicts(csv, "bystander_ttft_p50_ms") == {"not comparable"}  # A has no classes
    assert "only B carries ('itl_ms',)" in set(csv.note.dropna())


def test_metric_selection(run_a, capsys, tmp_path):
    code, out, _, csv = compare(capsys, run_a, run_a, "--metric", "ttft_p99_ms")
    assert code == 0 and set(csv[csv.kind == "timing"].metric) == {"ttft_p99_ms"}
    code, _, err, _ = compare(capsys, run_a, run_a, "--metric", "ttft_p42_ms",
                              out=tmp_path / "x")
    assert code == 2 and "unknown --metric ttft_p42_ms" in err


def break_columns(run):
    pd.read_csv(run / "requests.csv").drop(columns=["polls"]).to_csv(run / "requests.csv",
                                                                     index=False)


def break_numbers(run):
    frame = pd.read_csv(run / "requests.csv")
    frame["decision_collectives"] = frame["decision_collectives"].astype(object)
    frame.loc[1, "decision_collectives"] = "many"
    frame.to_csv(run / "requests.csv", index=False)


def break_itl(run):
    frame = pd.read_csv(run / "requests.csv")
    frame["itl_ms"] = "1.0;x"
    frame.to_csv(run / "requests.csv", index=False)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda run: shutil.rmtree(run), "no such directory"),
    (lambda run: (run / "requests.csv").write_text(""), "unreadable CSV"),
    (lambda run: (run / "env.json").unlink(), "env.json: no such file"),
    (lambda run: (run / "env.json").write_text("{"), "unreadable JSON"),
    (break_columns, "missing columns polls"),
    (break_numbers, "non-numeric values in column decision_collectives"),
    (break_itl, "bad itl_ms cell"),
])
def test_bad_input_exits_2_with_one_line(run_a, capsys, tmp_path, damage, message):
    b = doctor(run_a, tmp_path / "b")
    damage(b)
    code, out, err, _ = compare(capsys, run_a, b, out=tmp_path / "out")
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("bench compare: ") and message in err


@pytest.mark.parametrize("argv", [[], ["only_one"], ["a", "b", "--threshold", "-1"],
                                  ["a", "b", "--threshold", "nan"], ["a", "b", "--n-boot", "10"]])
def test_bad_arguments_exit_2(capsys, argv):
    assert main_compare(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench compare: ")


def test_mixed_worse_and_better_run_exits_1(run_a, capsys, tmp_path):
    """One collective more in one request of one configuration, one ack fewer in every
    request: background better everywhere, decision and critical worse in one
    configuration, and the run is worse (exit 1)."""
    def mixed(frame):
        frame.loc[frame.index[0], "decision_collectives"] += 1
        frame["ack_collectives"] -= 1
        return frame
    b = doctor(run_a, tmp_path / "b", requests=mixed)
    code, out, _, csv = compare(capsys, run_a, b)
    assert code == 1
    assert out[-1] == "compare: 2 better, 2 worse, 22 same"
    decision = csv[csv.metric == "decision_collectives_per_req"]
    assert sorted(decision.verdict) == ["same", "worse"]
    n = int(decision[decision.verdict == "worse"].n_b.iloc[0])
    assert decision.b_minus_a.max() == pytest.approx(1 / n)
    assert verdicts(csv, "background_collectives_per_req") == {"better"}


def _as_sglang(name: str):
    """A doctored requests/steps edit: every row as one SGLang's, `name`."""
    def edit(frame):
        return frame[frame.protocol == "pr36425"].assign(protocol=name)
    return edit


def test_two_runs_of_one_sglang_each_pair_as_sglang(run_a, capsys, tmp_path):
    """The before and after of a change made as two runs (0.5.18's, 0.5.19's): their rows
    pair under protocol `sglang`, said in the header, not `0 of 0` and nothing compared."""
    a = doctor(run_a, tmp_path / "a", requests=_as_sglang("sglang-0.5.18@hiradix"),
               steps=_as_sglang("sglang-0.5.18@hiradix"))
    b = doctor(run_a, tmp_path / "b", requests=_as_sglang("sglang-0.5.19@unified"),
               steps=_as_sglang("sglang-0.5.19@unified"))
    code, out, err, csv = compare(capsys, a, b, out=tmp_path / "out")
    assert code == 0 and not err
    assert "note: one SGLang in each run: A's sglang-0.5.18@hiradix paired with B's " \
        "sglang-0.5.19@unified as protocol `sglang`" in out
    assert set(csv.protocol) == {"sglang"} and "configuration" not in set(csv.kind)
    n = len(pd.read_csv(a / "requests.csv"))
    assert f"per request: {n} of {n} requests equal in every count" in "\n".join(out)


def test_labelled_sides_pair_by_label(run_a, capsys, tmp_path):
    a = doctor(run_a, tmp_path / "a", requests=_as_sglang("pr=sglang-tree:one@unified"),
               steps=_as_sglang("pr=sglang-tree:one@unified"))
    b = doctor(run_a, tmp_path / "b", requests=_as_sglang("pr=sglang-tree:two@unified"),
               steps=_as_sglang("pr=sglang-tree:two@unified"))
    code, out, _, csv = compare(capsys, a, b, out=tmp_path / "out")
    assert code == 0 and set(csv.protocol) == {"pr"}


def test_runs_with_no_configuration_in_common_are_refused(run_a, capsys, tmp_path):
    """Nothing pairs (a model run's pr36425 against pr27010 alone): one line, exit 2, and
    no compare.csv, never `0 better, 0 worse, 0 same` as if it had compared."""
    def only(protocol):
        return lambda frame: frame[frame.protocol == protocol]
    a = doctor(run_a, tmp_path / "a", requests=only("pr36425"), steps=only("pr36425"))
    b = doctor(run_a, tmp_path / "b", requests=only("pr27010"), steps=only("pr27010"))
    code, out, err, csv = compare(capsys, a, b, out=tmp_path / "out")
    assert code == 2 and not out and csv is None
    assert err.count("\n") == 1 and "no configuration is in both runs (A: " \
        "pr36425/wait_complete; B: pr27010/wait_complete): nothing to compare" in err
