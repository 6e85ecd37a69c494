"""Several SGLangs in one run (`bench run --cache sglang --sglang a=SPEC,b=SPEC`:
sglang_adapter.side_specs, bench.run.sglang_worlds, bench.analysis.side_lead;
docs/before-after.md): bad lists are one line and exit 2 before any rank starts, with nothing
written; a new user's venv is told the command that fixes it; and one end-to-end run of
0.5.23 against a planted copy of its tree, each side on ranks of its own, rows labelled,
paired by seed and interleaved, the planted call site named on its side alone.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hicache.spec.cost_model import modelled
from sglang_adapter.side_specs import parse
from sglang_adapter.source import DEFAULT_CACHE
from sglang_adapter.target import ChoiceError

REPO = Path(__file__).resolve().parent.parent


def _cached(version: str) -> bool:
    return any(DEFAULT_CACHE.glob(f"sglang-{version}-*.whl"))


def test_a_list_parses_into_labelled_and_unlabelled_sides():
    assert parse("base=0.5.23, pr=~/sglang-pr/python,0.5.19") == [
        ("base", "0.5.23"), ("pr", "~/sglang-pr/python"), (None, "0.5.19")]
    assert parse("a=0.5.23,b=0.5.23") == [("a", "0.5.23"), ("b", "0.5.23")]  # an A/A


@pytest.mark.parametrize("text, says", [
    ("a=", "label 'a' has no SPEC"),
    ("=0.5.23", "a label before '='"),
    ("0.5.23,", "an empty SPEC in the list"),
    ("a=0.5.23,a=0.5.19", "label 'a' names two sides"),
    ("a b=0.5.23", "a label is a letter")])
def test_a_bad_list_is_one_line(text, says):
    with pytest.raises(ChoiceError, match=re.escape(says)):
        parse(text)


def test_a_labelled_side_is_modelled_by_its_release():
    assert modelled("base=sglang-0.5.19@unified") == "pr36425"
    assert modelled("old=sglang-0.5.18@hiradix") == "pre27010"
    assert modelled("pr=sglang-tree:python@unified") == "sglang-0.5.23"


def _lead(schedule: str) -> list[str]:
    """The sides' lead of a hand-made run: pr issues one more decision collective a poll
    than its model expects, at a site of its own."""
    from bench.analysis.side_lead import lead_text

    ref, pr = "base=sglang-0.5.23@unified", "pr=sglang-tree:python@unified"
    site = "all_reduce@tp_cpu mem_cache/unified_radix_cache.py:_can_terminate_prefetch:{} < " \
        "check_prefetch_progress:{}"
    row = {"policy": "wait_complete", "schedule": schedule, "polls_per_step": 2.0,
           "step_mean_ms": 10.0, "polls_per_req": 4.0, "step_collectives_per_step": 5.0,
           "step_mean_ratio": 1.2, "step_mean_ratio_ci_low": 0.9,
           "step_mean_ratio_ci_high": 1.5, "step_mean_ratio_mdd": 0.25,
           "expected_decision_collectives_per_req": 0.0}
    summary = pd.DataFrame([
        {**row, "protocol": ref, "decision_collectives_per_req": 0.0,
         "decision_collectives_per_poll": 0.0},
        {**row, "protocol": pr, "decision_collectives_per_req": 4.0,
         "decision_collectives_per_poll": 1.0}])
    requests = pd.DataFrame([
        {"protocol": ref, "policy": "wait_complete", "repeat": 0, "rid": "r0", "polls": 4,
         "decision_collectives": 0, "call_sites": ""},
        {"protocol": pr, "policy": "wait_complete", "repeat": 0, "rid": "r0", "polls": 4,
         "decision_collectives": 4, "call_sites": "4x " + site.format(2320, 2414)}])
    plan = {"pp": 1, "system": {}, "sides": [
        {"name": ref, "root": "/wheels/0.5.23", "controller": True, "family": "unified"},
        {"name": pr, "root": "/src/pr/python", "controller": True, "family": "unified"}]}
    return lead_text(summary, requests, plan)


def test_the_sides_lead_says_path_ratios_counts_and_the_unexpected_site():
    text = " ".join(" ".join(_lead("pinned")).split())  # wrapped lines read as one
    assert "ratios to base=sglang-0.5.23@unified" in text and "pinned schedule" in text
    assert "every side on SGLang's controller path" in text
    assert "1.20 [0.90, 1.50]" in text and "Every ratio's interval holds 1." in text
    assert "pr=sglang-tree:python@unified under /src/pr/python" in text
    assert "pr=sglang-tree:python@unified/wait_complete: 1.000 per poll (+1.000)" in text
    assert "wait_complete: all_reduce@tp_cpu mem_cache/unified_radix_cache.py:" \
        "_can_terminate_prefetch < check_prefetch_progress: " \
        "base=sglang-0.5.23@unified -, pr=sglang-tree:python@unified 1.000" in text
    assert "Per request, pr=sglang-tree:python@unified against base=sglang-0.5.23@unified: " \
        "0 of 1 equal" in text
    assert "pr=sglang-tree:python@unified under wait_complete: +1.000 decision collectives " \
        "per poll its release's model (sglang-0.5.23) does not expect, at all_reduce@tp_cpu " \
        "mem_cache/unified_radix_cache.py:_can_terminate_prefetch:2320" in text


def test_on_the_free_schedule_the_lead_is_end_to_end_and_pairs_no_requests():
    text = "\n".join(_lead("free"))
    assert "end to end, free schedule" in text and "TTFT p50 x prefetch" in text
    assert "Per request" not in text  # polls follow timing: counts per poll and per step



@pytest.mark.parametrize("note", ["scipy is not installed",
                                  "too few repeats for an interval (2 paired, needs 3)"])
def test_a_run_without_intervals_says_why_as_its_intervals_did(note):
    """No interval anywhere: the line gives the intervals' own reason (no scipy is not too
    few repeats), as the model's headline does."""
    from bench.analysis.side_lead import resolution

    ref = {"protocol": "a", "policy": "timeout", "step_mean_ratio_mdd": math.nan}
    other = {**ref, "protocol": "b", "interval_note": note}
    assert resolution([ref, other], "a", ["step_mean"]) == [f"No intervals: {note}."]


BAD = [
    (["--sglang", "a="], "label 'a' has no SPEC"),
    (["--sglang", "a=0.5.23,a=0.5.23"], "label 'a' names two sides"),
    (["--sglang", "0.5.23,nonsense"], "no such release, wheel or source tree"),
    (["--sglang", "a=0.5.23,b=0.5.23", "--protocols", "pr36425"], "no --protocols"),
]


@pytest.mark.parametrize("argv, says", BAD)
@pytest.mark.timeout(60)
def test_bad_sides_are_one_line_and_exit_2_with_nothing_written(argv, says, tmp_path,
                                                                 capsys):
    from bench.commands.run import main

    out = tmp_path / "run"
    assert main(["--cache", "sglang", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not out.exists()
    assert "sglang" not in sys.modules


@pytest.mark.slow  # imports 0.5.23 (and 0.5.18) in this process to learn their classes
@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv, says", [
    (["--sglang", "0.5.23,0.5.23"], "two sides are both sglang-0.5.23@unified; label them"),
    (["--sglang", "new=0.5.23,old=0.5.18", "--sglang-path", "controller"],
     "--sglang-path controller needs a release with UnifiedRadixCache (0.5.19 on) "
     "(side old)")])
def test_sides_that_cannot_share_a_run_are_one_line(argv, says, tmp_path, capsys):
    from bench.commands.run import main

    if not (_cached("0.5.23") and _cached("0.5.18")):
        pytest.skip("0.5.23 and 0.5.18 not cached (python -m sglang_adapter.source ...)")
    out = tmp_path / "run"
    assert main(["--cache", "sglang", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not out.exists()


@pytest.mark.slow  # imports 0.5.23 and 0.5.18 in this process to learn their classes
@pytest.mark.timeout(120)
def test_where_one_side_cannot_take_the_controller_path_no_side_does():
    from sglang_adapter.side_specs import choose_sides

    if not (_cached("0.5.23") and _cached("0.5.18")):
        pytest.skip("0.5.23 and 0.5.18 not cached (python -m sglang_adapter.source ...)")
    new, old = choose_sides("new=0.5.23,old=0.5.18", False, False, None, 1, {})
    assert (new.name, old.name) == ("new=sglang-0.5.23@unified", "old=sglang-0.5.18@hiradix")
    assert not new.controller and not old.controller  # both on the decisions path
    assert "sglang" not in sys.modules


@pytest.mark.timeout(120)
def test_a_venv_without_dill_is_told_make_sglang_fetch():
    if not _cached("0.5.23"):
        pytest.skip("no sglang 0.5.23 wheel cached (make sglang-fetch)")
    code = ("import sys; sys.modules['dill'] = None\n"
            "from bench.commands.run import main\n"
            "sys.exit(main(['--cache', 'sglang', '--sglang', '0.5.23', '--out', sys.argv[1]]))")
    done = subprocess.run([sys.executable, "-c", code, "/nonexistent/never"], cwd=REPO,
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 2, done.stderr
    assert "lacks dill: run `make sglang-fetch`" in done.stderr.strip().splitlines()[-1]


# ---- end to end: 0.5.23 against a planted copy of its tree, each side on its own ranks ---

RUN = ["--preset", "ci", "--requests", "3", "--bystanders", "1", "--output-tokens", "4",
       "--repeats", "2", "--repeat-seeds", "same", "--seed", "3", "--schedule", "pinned",
       "--policies", "wait_complete", "--storage-latency-ms", "60", "--tp", "2"]
REF, PR = "ref=sglang-0.5.23@unified", "pr=sglang-tree:tree@unified"


@pytest.fixture(scope="module")
def sides_run(tmp_path_factory):
    from tests.test_sglang_adapter import _planted_tree

    wheels = sorted(DEFAULT_CACHE.glob("sglang-0.5.23-*.whl"))
    if not wheels:
        pytest.skip("no sglang 0.5.23 wheel cached (make sglang-fetch)")
    base = tmp_path_factory.mktemp("sides")
    line = _planted_tree(wheels[-1], base / "tree")
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", *RUN, "--cache", "sglang", "--sglang",
         f"ref=0.5.23,pr={base / 'tree'}", "--out", str(base / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=560,
        env={**__import__("os").environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return base / "run", line, done.stdout + done.stderr


@pytest.mark.long  # make test-long: two SGLangs served as sides end to end
@pytest.mark.slow  # two sides x 2 ranks, each importing its SGLang: about 2 minutes
@pytest.mark.timeout(600)
def test_each_side_is_a_labelled_row_paired_by_seed_and_interleaved(sides_run):
    run, _, out = sides_run
    rows = pd.read_csv(run / "requests.csv")
    assert list(dict.fromkeys(rows["protocol"])) == [REF, PR] or \
        set(rows["protocol"]) == {REF, PR}
    for _, g in rows.groupby("repeat"):  # one seed: the same requests on both sides
        rids = [set(g[g["protocol"] == p]["rid"]) for p in (REF, PR)]
        assert rids[0] == rids[1] and rids[0]
    assert set(pd.read_csv(run / "summary.csv")["protocol"]) == {REF, PR}
    # Served in turns, the order rotated per repeat as make bench rotates protocols.
    order = re.findall(r"\[\s*\d+/4\] (\S+) wait_complete .* repeat=(\d)", out)
    assert order == [(REF, "0"), (PR, "0"), (PR, "1"), (REF, "1")], order
    assert "SGLang sides, ratios to ref=sglang-0.5.23@unified" in out
    assert "every side on SGLang's controller path" in out
    # each side's rank processes as they were before every serve (SGLang's teardown)
    ranks = pd.read_csv(run / "ranks.csv")
    assert (ranks.groupby(["protocol", "rank"])["threads"].nunique() == 1).all()
    assert f"Per request, {PR} against {REF}: " in out


@pytest.mark.long  # make test-long: the same two-side run
@pytest.mark.slow  # the same run (module fixture)
@pytest.mark.timeout(600)
def test_each_sides_call_sites_are_its_own_and_the_planted_one_is_named(sides_run):
    run, line, out = sides_run
    rows = pd.read_csv(run / "requests.csv")
    planted = f"mem_cache/unified_radix_cache.py:_can_terminate_prefetch:{line} < " \
        "check_prefetch_progress:"
    ref_sites = " ".join(rows[rows["protocol"] == REF]["call_sites"].fillna(""))
    pr = rows[(rows["protocol"] == PR) & (rows["polls"] > 0)]
    assert planted not in ref_sites and len(pr)
    for polls, sites in zip(pr["polls"], pr["call_sites"], strict=True):
        assert f"{polls}x all_reduce@tp_cpu {planted}" in sites, sites
    assert re.search(rf"wait_complete site \(only {re.escape(PR)}\): {re.escape(PR)} "
                     rf"1\.000/poll at all_reduce@tp_cpu {re.escape(planted)}",
                     (run / "call_sites.txt").read_text())
    assert max(map(len, out.splitlines())) <= 120, max(out.splitlines(), key=len)
    out = " ".join(out.split())  # the console's lines wrap at 120
    assert re.search(rf"{re.escape(PR)} under wait_complete: \+1\.000 decision collectives "
                     rf"per poll its release's model \(sglang-0.5.23\) does not expect, at "
                     rf"all_reduce@tp_cpu {re.escape(planted)}", out), out
    assert f"{PR} under {run.parent / 'tree'}" in out  # its SPEC, checked on every rank
    assert pd.read_csv(run / "ranks.csv")["crosscheck_ok"].all()


def test_sglang_code_from_outside_the_sides_spec_is_named(monkeypatch):
    import types

    from sglang_adapter.door import Door

    door = Door("/wheels/a")
    assert door.own_files() is None
    here = types.ModuleType("sglang.srt.stray")
    here.__file__ = "/wheels/b/sglang/srt/stray.py"
    monkeypatch.setitem(sys.modules, "sglang.srt.stray", here)  # another SGLang's module
    assert door.own_files() == ("SGLang code outside /wheels/a ran here: module "
                                "sglang.srt.stray from /wheels/b/sglang/srt/stray.py")
    monkeypatch.delitem(sys.modules, "sglang.srt.stray")
    door.strays.add("/wheels/b/sglang/srt/managers/cache_controller.py")  # its collective
    assert "/wheels/b/sglang/srt/managers/cache_controller.py" in door.own_files()
