"""Hazards on both sides (docs/hazards.md, "Before and after"): `bench
hazards --cache sglang --sglang base=SPEC,head=SPEC` runs every cell on every side and names
the cells whose outcome changed from the first side's first; `bench review` writes the one
page a reviewer reads. Fast tests on hand-made rows and bad input (no ranks), then a real
A/A of 0.5.23 at TP2 and a planted head whose cell gets worse.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.hazards.review import Findings, Part, RunRows, page, strict_counts, verdict
from bench.hazards.side_changes import changed_first, changes, summary_lines, worse

REPO = Path(__file__).resolve().parent.parent
BASE, HEAD = "base=sglang-0.5.23@unified", "head=sglang-tree:tree@unified"


def _row(scenario: str, side: str, outcome: str, **kw) -> dict:
    return {"scenario": scenario, "issue": "#1", "protocol": side, "policy": "timeout",
            "tp": 2, "pp": 1, "seed": 0, "outcome": outcome,
            "site": None if outcome == "OK" else "decision", "step": None if outcome == "OK"
            else 1, "decision_per_poll": 0.0 if outcome == "OK" else None,
            "collectives_per_step": 1.0 if outcome == "OK" else None, "detail": "",
            "named_s": None, "exit_codes": "0 0", "wall_s": 1.0, "collective_timeout_s": 2.0,
            "cell_dir": f"cells/{scenario}__{side}", **kw}


ROWS = [_row("walk-skew", BASE, "deadlock"), _row("walk-skew", HEAD, "deadlock"),
        _row("ongoing-skew", BASE, "deadlock"), _row("ongoing-skew", HEAD, "divergence"),
        _row("sidecar-race", BASE, "OK"), _row("sidecar-race", HEAD, "abort"),
        _row("span-skew", BASE, "abort")]  # on the reference only


def test_the_changed_cells_come_first_and_the_worse_are_named():
    found = changes(ROWS)
    assert [(c.scenario, c.side) for c in found] == [
        ("ongoing-skew", HEAD), ("sidecar-race", HEAD), ("span-skew", HEAD)]
    assert [c.scenario for c in worse(ROWS)] == ["sidecar-race"]  # deadlock -> divergence: better
    assert [r["scenario"] for r in changed_first(ROWS)] == [
        "ongoing-skew", "ongoing-skew", "sidecar-race", "sidecar-race", "span-skew",
        "walk-skew", "walk-skew"]
    text = summary_lines(ROWS)
    assert text[0] == f"Changed from {BASE} (3):"
    assert text[2].split() == ["sidecar-race", "OK", "0/poll", "1/step", "->", HEAD,
                               "abort", "decision@1", "WORSE"]
    assert text[4] == "The rest (alike on every side):" and "walk-skew" in text[5]


def test_sglangs_checker_counts_only_when_asked():
    rows = [_row("ongoing-skew", BASE, "deadlock", sglang_consensus="fired: f"),
            _row("ongoing-skew", HEAD, "deadlock", sglang_consensus="silent")]
    assert changes(rows) == [] and len(changes(rows, consensus=True)) == 1
    assert worse(rows, consensus=True) == []  # worse is judged by the outcome alone


def test_an_aa_changes_nothing_and_says_so():
    rows = [r for r in ROWS if r["scenario"] == "walk-skew"]
    assert changes(rows) == [] and summary_lines(rows)[0] == f"No cell changed from {BASE}."


def test_the_matrix_page_of_sides_puts_the_changed_cells_first(tmp_path):
    from bench.hazards.report import write

    write(tmp_path, ROWS, ["Commit x."], sides=True)
    text = (tmp_path / "hazards.md").read_text()
    changed, every = text.index("## Changed between the sides"), text.index("## Every cell")
    assert changed < every
    assert f"| sidecar-race | OK 0/poll 1/step | {HEAD} | abort decision@1 | **worse** |" \
        in text
    table = [line for line in text[every:].splitlines() if line.startswith("| ")]
    assert [line.split(" (")[0] for line in table[1:]] == [
        "| ongoing-skew", "| sidecar-race", "| span-skew", "| walk-skew"]
    csv = pd.read_csv(tmp_path / "hazards.csv")  # a row per cell per side
    assert list(csv["protocol"]) == [r["protocol"] for r in ROWS]


def test_one_side_keeps_the_matrix_page_as_it_was(tmp_path):
    from bench.hazards.report import write

    rows = [_row("walk-skew", "sglang-0.5.23@unified", "deadlock")]
    write(tmp_path, rows, ["Commit x."])
    text = (tmp_path / "hazards.md").read_text()
    assert "Changed" not in text and "## Every cell" not in text
    assert text.startswith("# Hazard matrix\n\nCommit x.\n\n| scenario | sglang-0.5.23@unified |")


def _got() -> RunRows:
    """A run of the two sides, hand-made (as test_sglang_sides' lead)."""
    row = {"policy": "wait_complete", "schedule": "pinned", "polls_per_step": 2.0,
           "step_mean_ms": 10.0, "polls_per_req": 4.0, "step_collectives_per_step": 5.0,
           "step_mean_ratio": 1.2, "step_mean_ratio_ci_low": 0.9,
           "step_mean_ratio_ci_high": 1.5, "step_mean_ratio_mdd": 0.25,
           "expected_decision_collectives_per_req": 0.0}
    summary = pd.DataFrame([
        {**row, "protocol": BASE, "decision_collectives_per_req": 0.0,
         "decision_collectives_per_poll": 0.0},
        {**row, "protocol": HEAD, "decision_collectives_per_req": 4.0,
         "decision_collectives_per_poll": 1.0}])
    site = "4x all_reduce@tp_cpu mem_cache/unified_radix_cache.py:_can_terminate_prefetch:2299"
    requests = pd.DataFrame([
        {"protocol": BASE, "policy": "wait_complete", "repeat": 0, "rid": "r0", "polls": 4,
         "decision_collectives": 0, "call_sites": ""},
        {"protocol": HEAD, "policy": "wait_complete", "repeat": 0, "rid": "r0", "polls": 4,
         "decision_collectives": 4, "call_sites": site}])
    plan = {"pp": 1, "system": {}, "sides": [
        {"name": BASE, "root": "/w/0.5.23", "controller": True, "family": "unified"},
        {"name": HEAD, "root": "/t/tree", "controller": True, "family": "unified"}]}
    return RunRows(summary, requests, plan)


def test_the_review_page_has_the_headline_the_counts_and_the_changed_cells():
    run, haz = Part("python -m bench run ...", "r/run", 0), Part("...", "r/hazards", 1)
    lines = page(["base", "head"], Findings(run, haz, ROWS), _got())
    text = "\n".join(lines)
    assert lines[0] == "# Review: head against base"
    assert lines[2] == f"**FAILED**: hazard cell sidecar-race is worse on {HEAD}: OK -> abort."
    order = [text.index(h) for h in ("## The run's headline", "## Counts side by side",
                                     "## Hazard cells that changed")]
    assert order == sorted(order)
    assert f"SGLang sides, ratios to {BASE}" in text and "1.20 [0.90, 1.50]" in text
    assert f"wait_complete site (only {HEAD}): " in text
    assert f"| ongoing-skew | deadlock decision@1 | {HEAD} | divergence decision@1 | changed |" \
        in text
    assert "walk-skew" not in text.split("## Hazard cells that changed")[1].split("Every")[0]


def test_the_review_fails_on_a_failed_run_and_passes_an_aa():
    aa = [r for r in ROWS if r["scenario"] == "walk-skew"]
    ok = Part("c", "f", 0)
    assert verdict(ok, ok, aa, False) == []
    assert "**OK**: the run ended OK and no hazard cell got worse (0 changed)." in \
        page(["a", "b"], Findings(ok, ok, aa), _got())
    assert verdict(Part("c", "r/run", 1), ok, aa, False) == ["the run FAILED (exit 1): r/run"]
    text = "\n".join(page(["a", "b"], Findings(ok, ok, aa), RunRows(None, None, None)))
    assert "The run wrote no summary" in text and "No cell changed" in text


SITE = "all_reduce@tp_cpu mem_cache/unified_radix_cache.py:_can_terminate_prefetch"


def test_a_strict_review_fails_on_a_count_difference_nobody_explained():
    """The head's planted all-reduce: a call site on the head alone, and collectives its
    release's model does not expect; explained by the site it was meant to touch."""
    ok = Part("c", "f", 0)
    found = strict_counts(_got(), ())
    assert found == [f"wait_complete: call site {SITE} on {HEAD} only ({SITE}:2299)",
                     f"{HEAD} under wait_complete: decision collectives its release's model "
                     f"(sglang-0.5.23) does not expect, at {SITE}:2299"], found
    why = verdict(ok, ok, [], False, found)
    assert len(why) == 2 and why[0].startswith("count difference not explained: ")
    assert strict_counts(_got(), ("unified_radix_cache.py:_can_terminate_prefetch",)) == []
    assert strict_counts(_got(), ("hiradix_cache.py",)) == found  # another site explains none
    text = "\n".join(page(["a", "b"], Findings(ok, ok, [], counts=[]), _got(),
                          explained=("unified_radix_cache.py",)))
    assert "## Count differences (--strict-counts)" in text
    assert "None unexplained (explained: unified_radix_cache.py)" in text
    assert "Count differences" not in "\n".join(page(["a", "b"], Findings(ok, ok, []), _got()))


def test_a_strict_review_holds_a_sites_rate_per_poll_only_when_pinned():
    got = _got()
    requests = got.requests.copy()
    requests.loc[0, ["decision_collectives", "call_sites"]] = \
        [2, f"2x {SITE}:2299"]  # the base: the same site, half the rate per poll
    pinned = RunRows(got.summary, requests, got.plan)
    found = strict_counts(pinned, ())
    assert f"wait_complete: {HEAD} 1.000/poll at {SITE} against {BASE}'s 0.500" in found
    free = RunRows(got.summary.assign(schedule="free"), requests, got.plan)
    assert not any("/poll at" in f for f in strict_counts(free, ()))
    same = requests.copy()
    same.loc[0] = {**same.loc[1].to_dict(), "protocol": BASE}
    summary = got.summary.assign(decision_collectives_per_req=0.0)
    assert strict_counts(RunRows(summary, same, got.plan), ()) == []  # an A/A


def test_an_extra_is_put_on_decision_sites_not_on_a_thread_site_whose_rate_moved():
    """Free schedule: the head polls half as often, so the ack thread's one all-reduce a
    request is twice as many a poll; the extra decision collectives are the planted site's
    alone, and explaining it passes the strict review (measured: docs/sglang-ci.md)."""
    got = _got()
    ack = "1x all_reduce@sglang_ack managers/cache_controller.py:_all_reduce:447 < " \
        "prefetch_sync_thread_func:1947"
    requests = got.requests.copy()
    requests["call_sites"] = [ack, f"{ack}; 4x {SITE}:2299"]
    requests["polls"] = [8, 4]
    free = RunRows(got.summary.assign(schedule="free"), requests, got.plan)
    assert strict_counts(free, ("_can_terminate_prefetch",)) == []
    found = strict_counts(free, ())
    assert found[-1].endswith(f"does not expect, at {SITE}:2299"), found


# ---- bad input: one line, exit 2, nothing written, no SGLang imported ---------------------

BAD = [(["--sglang", "a="], "label 'a' has no SPEC"),
       (["--sglang", "a=0.5.23,a=0.5.23"], "label 'a' names two sides"),
       (["--sglang", "a=0.5.23,b=nonsense"], "no such release, wheel or source tree")]


@pytest.mark.parametrize("argv, says", BAD)
@pytest.mark.timeout(60)
def test_bad_sides_are_one_line_exit_2_and_nothing_written(argv, says, tmp_path, capsys):
    from bench.commands.hazards import main as hazards
    from bench.commands.review import main as review

    for main, extra in ((hazards, ["--cache", "sglang"]), (review, [])):
        out = tmp_path / "out"
        assert main([*extra, *argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
        assert not out.exists()
    assert "sglang" not in sys.modules


@pytest.mark.parametrize("argv, says", [
    (["--sglang", "a=0.5.23"], "a review needs two sides or more"),
    (["--sglang", "a=0.5.23,b=0.5.23", "--run-args", "--out x"], "--out is the review's own"),
    (["--sglang", "a=0.5.23,b=0.5.23", "--scenarios", "nope"], "unknown scenario 'nope'"),
    (["--sglang", "a=0.5.23,b=0.5.23", "--explained", "x.py:f"], "it needs --strict-counts")])
@pytest.mark.timeout(60)
def test_a_review_refuses_what_it_cannot_review(argv, says, tmp_path, capsys):
    from bench.commands.review import main
    from tests.sglang_wheels import sglang_wheel

    sglang_wheel("0.5.23")  # resolved, never fetched, in a test
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "out").exists()


def test_the_launching_process_refuses_to_hold_an_sglang(monkeypatch):
    import types

    from bench.hazards.matrix import MatrixSpec, run_sides
    from bench.hazards.scenarios import SCENARIOS

    monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
    spec = MatrixSpec(("sglang-0.5.23",), (SCENARIOS["walk-skew"],))
    with pytest.raises(RuntimeError, match="an sglang is imported in the launching process"):
        run_sides([spec, spec], log=lambda _: None)


# ---- real sides: an A/A of 0.5.23, and a head whose cell gets worse ------------------------

# Rank 0 alone all-reduces in every wait_complete poll: sidecar-race (OK on 0.5.23) breaks.
PLANT_AFTER = '        if self.prefetch_stop_policy == "wait_complete":\n'
PLANTED = ("            if torch.distributed.get_rank() == 0:  # planted\n"
           "                torch.distributed.all_reduce(torch.zeros(1), group=self.tp_group)\n")


def _planted_tree(wheel: Path, dest: Path) -> None:
    from sglang_adapter.source import unpack

    unpack(wheel, dest)
    path = dest / "sglang" / "srt" / "mem_cache" / "unified_radix_cache.py"
    text = path.read_text()
    at = text.index(PLANT_AFTER, text.index("def _can_terminate_prefetch")) + len(PLANT_AFTER)
    path.write_text(text[:at] + PLANTED + text[at:])


def _hazards(out: Path, sides: str, scenarios: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", "hazards", "--cache", "sglang",
                           "--sglang", sides, "--scenarios", scenarios, "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=540)


@pytest.mark.long  # make test-long: an A/A of 0.5.23 over two hazard cells
@pytest.mark.slow  # 2 cells x 2 sides, each cell 2 ranks importing SGLang: about a minute
@pytest.mark.timeout(600)
def test_an_aa_of_0523_changes_no_cell(tmp_path):
    from tests.sglang_wheels import sglang_wheel

    sglang_wheel("0.5.23")
    done = _hazards(tmp_path, "a=0.5.23,b=0.5.23", "ongoing-skew,sidecar-race")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "hazards.csv")
    assert list(zip(rows["scenario"], rows["protocol"], strict=True)) == [
        ("ongoing-skew", "a=sglang-0.5.23@unified"), ("ongoing-skew", "b=sglang-0.5.23@unified"),
        ("sidecar-race", "a=sglang-0.5.23@unified"), ("sidecar-race", "b=sglang-0.5.23@unified")]
    assert list(rows["outcome"]) == ["deadlock", "deadlock", "OK", "OK"]
    assert "No cell changed from a=sglang-0.5.23@unified." in done.stdout
    assert "No cell changed between" in (tmp_path / "hazards.md").read_text()


@pytest.mark.slow  # 1 cell x 2 sides, one of them a copied tree: about a minute
@pytest.mark.sglang_matrix  # make sglang-check
@pytest.mark.timeout(600)
def test_a_planted_head_whose_cell_gets_worse_is_named_first_and_fails(tmp_path):
    from tests.sglang_wheels import sglang_wheel

    _planted_tree(sglang_wheel("0.5.23"), tmp_path / "tree")
    done = _hazards(tmp_path / "h", f"base=0.5.23,head={tmp_path / 'tree'}", "sidecar-race")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "h" / "hazards.csv").set_index("protocol")
    assert rows.loc["base=sglang-0.5.23@unified", "outcome"] == "OK"
    assert rows.loc["head=sglang-tree:tree@unified", "outcome"] != "OK"
    assert "Changed from base=sglang-0.5.23@unified (1):" in done.stdout
    assert "WORSE" in done.stdout and "1 worse than base=sglang-0.5.23@unified" in done.stdout


@pytest.mark.slow  # a two-side run (2 repeats, pinned) and 2 cells x 2 sides: about a minute
@pytest.mark.sglang_matrix  # make sglang-check
@pytest.mark.timeout(900)
def test_the_review_of_a_head_that_costs_a_collective_names_its_site(tmp_path):
    """The head all-reduces in every wait_complete poll on both ranks: the run ends OK, the
    page names the planted site on the head alone, and no hazard cell's outcome changes."""
    from tests.sglang_wheels import sglang_wheel
    from tests.test_sglang_adapter import _planted_tree as symmetric_plant

    line = symmetric_plant(sglang_wheel("0.5.23"), tmp_path / "tree")
    run = "--preset ci --requests 3 --bystanders 1 --output-tokens 4 --repeats 2 " \
        "--repeat-seeds same --seed 3 --schedule pinned --policies wait_complete " \
        "--storage-latency-ms 60 --tp 2"
    done = subprocess.run([sys.executable, "-m", "bench", "review", "--sglang",
                           f"base=0.5.23,head={tmp_path / 'tree'}", "--scenarios",
                           "sidecar-race", "--run-args", run, "--out", str(tmp_path / "r")],
                          cwd=REPO, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (tmp_path / "r" / "review.md").read_text()
    assert text.splitlines()[2].startswith("**OK**")
    assert f"wait_complete site (only {HEAD}): {HEAD} 1.000/poll at all_reduce@tp_cpu " \
        f"mem_cache/unified_radix_cache.py:_can_terminate_prefetch:{line}" in text
    assert f"No cell changed between base=sglang-0.5.23@unified and {HEAD}" in text


def _timed(step: tuple, bystander: tuple) -> list:
    """The head's gated rows (row, metric, Interval of head / base) for its step and
    bystander TTFT, each (point, low, high); None: too few repeats for an interval."""
    from bench.stats import Interval

    def iv(given):
        point, low, high = given if given else (1.01, None, None)
        return Interval(point, low, high, 12 if given else 2, None,
                        "" if given else "2 paired repeats: too few", "t-mean 0.95")
    row = {"protocol": BASE, "policy": "wait_complete"}
    return [(row, "step_mean", iv(step)), (row, "bystander_ttft_p50", iv(bystander))]


@pytest.mark.parametrize("step, bystander, states", [
    ((1.00, 0.99, 1.01), (1.02, 0.95, 1.09), ["PASS", "PASS"]),
    ((1.06, 1.04, 1.08), (1.02, 0.95, 1.09), ["FAIL", "PASS"]),
    ((1.02, 0.99, 1.05), (1.02, 0.95, 1.12), ["UNRESOLVED", "UNRESOLVED"]),
    (None, None, ["NOT JUDGED", "NOT JUDGED"]),
])
def test_the_review_judges_each_sides_timings_as_the_gate_does(step, bystander, states):
    """The head's step (threshold 3 %) and bystander TTFT (10 %) against the base: PASS
    below 1 + threshold, FAIL above, UNRESOLVED between; FAIL and UNRESOLVED fail the
    review, NOT JUDGED (no interval) does not."""
    from bench.ab.sides import from_rows

    limits = {"step_mean": 0.03, "bystander_ttft_p50": 0.10}
    found = from_rows(HEAD, _timed(step, bystander), limits)
    assert [v.state for v in found] == states and {v.side for v in found} == {HEAD}
    ok = Part("c", "f", 0)
    why = verdict(ok, ok, [], False, timings=found)
    assert len(why) == sum(s in ("FAIL", "UNRESOLVED") for s in states), why
    text = "\n".join(page(["base", "head"], Findings(ok, ok, [], timings=found), _got()))
    assert "## Timings at the gate's thresholds" in text
    assert f"- {HEAD} wait_complete step_mean: {states[0]}" in text
