"""No line a verb prints is wider than 120 characters (bench.report.printer.WIDTH): the tables
stack their columns in groups led by the row's names, prose wraps, a run of several
SGLangs names its call sites short (every chain in full in call_sites.txt). Built from
small fixed rows: the run's table and lead, the sides' lead with long names and long
chains, compare's table, the gate's, bench review's closing lines, bench devcheck's
output and bench microbench's last line; the real runs' output is held where they run (the
slow sides run in tests/test_sglang_sides.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.report.printer import WIDTH, fit, fitted_table, wrapped
from tests.test_summarize import requests_frame, steps_frame

LONG = "sglang-tree:/home/someone/src/sglang-with-a-long-branch-name/python@unified"


def _widest(lines: list[str]) -> str:
    return max(lines, key=len, default="")


def test_a_wide_table_stacks_its_columns_led_by_the_names():
    headers = ["protocol", "policy", *[f"column {i} with a long name" for i in range(9)]]
    rows = [["pr27010", "wait_complete", *[f"{i}.00 [0.90, 1.10]" for i in range(9)]]]
    lines = fitted_table(headers, rows)
    assert len(_widest(lines)) <= WIDTH < len("  ".join(headers))
    heads = [line for line in lines if line.startswith("protocol")]
    assert len(heads) == len(lines) // 2 > 1  # a header and its row per group
    assert all(line.split()[:2] == ["pr27010", "wait_complete"] for line in lines[1::2])
    for h in headers[2:]:  # every column once, in order
        assert sum(h in line for line in heads) == 1


def test_a_table_that_fits_is_left_whole():
    lines = fitted_table(["a", "b", "c"], [["1", "2", "3"]])
    assert lines == ["a  b  c", "1  2  3"]


def test_prose_wraps_with_an_indent_and_a_line_that_fits_is_kept():
    long = "word " * 60
    out = wrapped(["short", long, "  indented " + long])
    assert out[0] == "short" and len(_widest(out)) <= WIDTH
    assert out[1].startswith("word") and out[2].startswith("  word")
    assert any(line.startswith("    word") for line in out)  # the indented line's own


def test_the_runs_table_and_lead_fit():
    from bench.analysis.lead import lead_text
    from bench.analysis.summarize import format_table, summarize

    summary = summarize(requests_frame(), steps_frame())
    for schedule in ("pinned", "free"):
        summary["schedule"] = schedule
        lines = format_table(summary).splitlines() + lead_text(summary, None)
        assert len(_widest(lines)) <= WIDTH, _widest(lines)


def _sides(schedule: str, names: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """A run of three sides with long names; the last issues a decision collective a poll
    at a deep call site of its own."""
    chain = " < ".join(["all_reduce@tp_cpu mem_cache/unified_radix_cache.py:"
                        "_all_reduce_attn_groups:359", "_all_reduce:386",
                        "_can_terminate_prefetch:2311", "check_prefetch_progress:2405",
                        "process_prefetch_queue:1210", "event_loop_normal:998"])
    ratio = {f"{n}_ratio{s}": v for n in ("step_mean", "prefetch_ttft_p50", "bystander_ttft_p50",
                                          "itl_p50", "e2e_p50", "prefetch_ttft_p99",
                                          "bystander_ttft_p99", "itl_p99")
             for s, v in (("", 1.2), ("_ci_low", 0.9), ("_ci_high", 1.5), ("_mdd", 0.25))}
    row = {"schedule": schedule, "polls_per_step": 2.0, "step_mean_ms": 10.0,
           "polls_per_req": 4.0, "step_collectives_per_step": 5.0,
           "expected_decision_collectives_per_req": 0.0, **ratio}
    summary = pd.DataFrame([
        {**row, "protocol": n, "policy": policy,
         "decision_collectives_per_req": 4.0 * (n == names[-1]),
         "decision_collectives_per_poll": 1.0 * (n == names[-1])}
        for policy in ("wait_complete", "timeout") for n in names])
    requests = pd.DataFrame([
        {"protocol": n, "policy": policy, "repeat": 0, "rid": "r0", "polls": 4,
         "decision_collectives": 4 * (n == names[-1]),
         "call_sites": f"4x {chain}" if n == names[-1] else ""}
        for policy in ("wait_complete", "timeout") for n in names])
    plan = {"pp": 1, "system": {}, "sides": [
        {"name": n, "root": f"/home/someone/.cache/hicache-bench/sglang/unpacked/{n}",
         "controller": True, "family": "unified"} for n in names]}
    return summary, requests, plan


@pytest.mark.parametrize("schedule", ["pinned", "free"])
def test_the_sides_lead_fits_and_names_the_chains_file(schedule):
    from bench.analysis.side_lead import SITES_FILE, lead_text, site_lines

    names = ["base=sglang-0.5.23@unified", "a=" + LONG, "b=" + LONG]
    summary, requests, plan = _sides(schedule, names)
    lines = lead_text(summary, requests, plan)
    assert len(_widest(lines)) <= WIDTH, _widest(lines)
    text = "\n".join(lines)
    assert SITES_FILE in text and "check_prefetch_progress:2405" not in \
        text.split("Call sites, collectives per poll")[1].split("under wait_complete")[0]
    assert any("check_prefetch_progress:2405" in line for line in site_lines(requests, names))


def test_compares_table_fits():
    from bench.compare.report import format_table

    rows = [[f"{LONG}/wait_complete", "bystander_ttft_p99_ms", "132.16", "140.01", "+7.85",
             "1.059 [0.990, 1.130]", "not comparable",
             "too few repeats for an interval (1 paired, needs 3)"],
            ["", "decision_collectives_per_req", "0", "0", "+0", "-", "same", ""]]
    lines = format_table(rows).splitlines()
    assert len(_widest(lines)) <= WIDTH, _widest(lines)
    assert f"{LONG}/wait_complete" in lines and any("needs 3" in line for line in lines)


def test_a_table_with_call_site_chains_names_them_below_it():
    """sglang-poll's tables: the chains (or gloo's text) are not columns a terminal can hold,
    so each goes on wrapped lines below the table, named by its row."""
    from bench.commands.sglang_poll import COLUMNS
    from bench.report.printer import console_table

    chain = ("9x all_reduce@tp_cpu mem_cache/unified_radix_cache.py:_all_reduce_attn_groups:359 < "
             "_all_reduce:386 < _can_terminate_prefetch:2311 < check_prefetch_progress:2405; "
             "4x all_reduce@tp_cpu mem_cache/unified_radix_cache.py:_sync_hicache_ready_counts:"
             "3459 < check_hicache_events:3681")
    rows = [["r0", "timeout", "3", "1", "1", "2", "2", "True", chain]]
    lines = console_table(list(COLUMNS), rows, long=("call_sites",), keys=2)
    assert len(_widest(lines)) <= WIDTH, _widest(lines)
    assert lines[0].split()[:2] == ["request", "policy"] and "call_sites" not in lines[0]
    below = " ".join(" ".join(lines[2:]).split())
    assert below.startswith("r0 timeout call_sites: 9x all_reduce@tp_cpu") and \
        "check_hicache_events:3681" in below


# ---- bench gate: its table, notes, resolution lines, context and last line ------------------
from tests.test_gate import (  # noqa: E402,F401 (clean: the gate's fixture)
    REPEATS,
    clean,
    doctored,
    gate,
    triple_ttft,
)


def _fits(out: str) -> list[str]:
    lines = out.splitlines()
    assert len(_widest(lines)) <= WIDTH, _widest(lines)
    return lines


def _add_decision_and_slow(frame):
    frame.loc[frame.polls > 0, "decision_collectives"] += 1
    return triple_ttft(range(REPEATS))(frame)


@pytest.mark.parametrize("case, code", [("pass", 0), ("fail", 1), ("unresolved", 1),
                                        ("not judged", 0)])
def test_the_gates_output_fits(clean, tmp_path, capsys, case, code):  # noqa: F811
    """A passing gate, one failing count and timing checks, one undecided (FAIL: no
    disturbance measured), one with too few repeats: every line fits, the last line keeps
    its form."""
    run, baseline = clean
    if case == "fail":
        run = doctored(clean, tmp_path, _add_decision_and_slow)
    elif case == "unresolved":
        run = doctored(clean, tmp_path, triple_ttft([1]))
    elif case == "not judged":
        baseline = tmp_path / "baseline"
        few = doctored(clean, tmp_path / "few", lambda f: f[f.repeat < 1])
        assert gate(few, baseline, "--update-baseline") == 0
        run = doctored(clean, tmp_path / "slow", triple_ttft(range(REPEATS)))
    capsys.readouterr()
    assert gate(run, baseline, "--tolerance", "0.05") == code
    lines = _fits(capsys.readouterr().out)
    assert lines[-1].startswith("OK: " if code == 0 else "FAIL")


@pytest.mark.parametrize("factor, lost, code", [("same", "quiet", 0), ("slower", "quiet", 1),
                                                ("swing", "noisy", 77)])
def test_the_gates_ab_output_fits(clean, tmp_path, monkeypatch, capsys, factor, lost,  # noqa: F811
                                  code):
    """gate --ab (its served A/B faked): the A/B's log lines, the timings lines, the last."""
    import shutil

    from bench.commands.gate import main as main_gate
    from tests import test_gate_decision as fake

    factors = {"same": lambda side, k: 1.0, "slower": fake.slower, "swing": fake.swing}
    fake.fake_served(monkeypatch, factors[factor], fake.QUIET if lost == "quiet" else
                     fake.DISTURBED)
    run = tmp_path / "a-run-directory-with-a-long-name-as-ci-makes-them" / "run"
    shutil.copytree(clean[0], run)
    assert main_gate([str(run), "--baseline", str(clean[1]), "--ab"]) == code
    captured = capsys.readouterr()
    _fits(captured.out)
    _fits(captured.err)


def _timing(metric: str, protocol: str, s: str):
    from bench.stats import Interval
    from bench.verdict.checks import Check

    layout = "tp2 pp2 sim 8/s extra_pool"
    idle = s == "NOT JUDGED"
    return Check(f"{metric}_ratio_vs_baseline", protocol, "wait_complete", layout,
                 passed=idle, judged=not idle, unresolved=not idle,
                 inconclusive=s == "INCONCLUSIVE", needed=None if idle else 0.373,
                 interval=Interval(1.442, None if idle else 0.298, None if idle else 6.972, 3),
                 resolves=None if idle else 1.234, threshold=0.05,
                 expected="x the baseline's: passes below 1.05, fails above it",
                 observed="1.442 [0.298, 6.972], 3 paired repeats",
                 meaning=f"{protocol}'s bystanders' TTFT p50: its 95% interval holds 1.05, so a "
                         "change of 5.0% could not be told from none: not passed",
                 note="not judged: too few repeats for an interval (2 paired, needs 3)"
                 if idle else "undecided: its interval holds 1.05 (half-width 123.4%, needed "
                 "37.3%)")


@pytest.mark.parametrize("s", ["FAIL", "INCONCLUSIVE", "NOT JUDGED"])
def test_every_metric_undecided_keeps_a_last_line_of_verdicts_that_fits(s):
    """Four gated metrics undecided (quiet: FAIL; disturbed: INCONCLUSIVE) or not judged
    over a long protocol's checks: the table, notes and resolution lines fit; the last line
    still names every metric's verdict and the disturbance, the counts and each undecided
    check's half-widths on the lines above."""
    from bench.gate.console import format_checks, last_line
    from bench.rundir.decision import Disturbance
    from bench.verdict.checks import Check

    metrics = ["step_mean", "itl_p50", "prefetch_ttft_p50", "bystander_ttft_p50"]
    checks = [_timing(m, "step-clock", s) for m in metrics]
    checks += [Check("decision_exact", "step-clock", "timeout", "tp2 pp2 sim 8/s", True)] * 100
    noise = Disturbance.measured([0.2 if s == "INCONCLUSIVE" else 0.01])
    lines = _fits(format_checks(checks) + "\n" + last_line(checks, noise))
    assert any(x.startswith("resolution: bystander_ttft_p50_ratio_vs_baseline step-clock/")
               for x in lines) or s == "NOT JUDGED"
    last = lines[-1]
    assert last.startswith({"FAIL": "FAIL", "INCONCLUSIVE": "INCONCLUSIVE",
                            "NOT JUDGED": "OK: "}[s])
    assert all(m in last for m in metrics) and "cpu lost " in last and "PASS" not in last
    below = lines[next(i for i, x in enumerate(lines) if "100 exact checks pass" in x):]
    if s != "NOT JUDGED":
        assert " ".join(" ".join(below).split()).count("123.4% (needed 37.3%)") == 4


def test_abs_progress_lines_fit(tmp_path, capsys):
    """bench ab's (and the gate's A/B's) lines while it runs: a block's run ends with a long
    line of its own (the run's verdict), wrapped below the block's."""
    from bench.ab.blocks import AbPlan, Outcome, run_blocks
    from bench.report.printer import progress
    from tests.test_ab import TREE, fake_runner

    verdict = ("FAILED: ranks disagreed in 3 of 120 requests (pr36425/timeout tp2 pp2 sim "
               "rate=8; see failures.csv); data errors in 2 requests (step-clock/best_effort "
               "tp2 pp2 sim rate=8; see failures.csv)")

    def runner(plan, k, side, root):
        o = fake_runner()(plan, k, side, root)
        return Outcome(o.path, 1, verdict, 12.5, "2026-12-06T14:00:00Z", "2026-12-06T14:00:12Z")
    run_blocks(AbPlan(TREE, TREE, "ci", 2, out=tmp_path), runner, log=progress)
    err = _fits(capsys.readouterr().err)
    assert err[0].startswith("ab: [ 1/4] block 0 ") and err[1].startswith("  FAILED: ranks")


def test_noises_table_and_last_lines_fit(tmp_path, capsys):
    """bench noise: its table of every metric (and the bootstrap's), the files, the coverage
    line over every metric, the schedules' FAILED lines."""
    from bench.ab.noise import METRICS
    from bench.ab.noise_report import print_figures

    figures = {"coverage": 0.875, "trials": 120, "half_width_median": 0.0412,
               "half_width_max": 0.1234, "run_to_run_max": 0.2345, "repeats": 12, "configs": 9}
    per_metric = dict.fromkeys(METRICS, figures)
    written = [tmp_path / "a-long-results-folder-name" / n for n in ("noise.json", "noise.md")]
    print_figures(per_metric, per_metric, written, ["pinned runs of seed 0 ran different "
                                                    "schedules: " + "x" * 150])
    out = _fits(capsys.readouterr().out)
    assert any(x.startswith("noise: coverage step_mean 87.5%") for x in out)


def test_hazards_cell_and_sides_lines_fit():
    """bench hazards: a cell's line (a failed cell's detail) and the sides' summary, with
    long side names."""
    from bench.hazards.matrix import _line
    from bench.hazards.side_changes import summary_lines
    from tests.test_hazard_sides import _row

    base, head = "base=sglang-0.5.23@unified", "b=" + LONG
    rows = [_row("walk-skew", base, "deadlock"), _row("walk-skew", head, "abort"),
            _row("sidecar-race", base, "OK"), _row("sidecar-race", head, "OK")]
    rows[1]["detail"] = "rank 1 aborted: " + "gloo timeout on all_reduce after 2.0 s " * 6
    lines = [x for r in rows for x in _line(r).splitlines()]
    lines += fit(*summary_lines(rows)).splitlines()
    assert len(_widest(lines)) <= WIDTH, _widest(lines)


# ---- bench review's closing lines and bench devcheck's output ------------------------------

@pytest.mark.parametrize("failing", [False, True])
def test_reviews_closing_lines_fit_and_the_last_keeps_its_form(failing):
    """bench review's timing verdicts (long side names) and its last line, OK or FAILED with
    every reason (a hazard cell, a count site, a timing), naming the page under a long folder."""
    from bench.ab.sides import Verdict
    from bench.hazards.review import closing_lines

    side = "head=" + LONG
    timings = [Verdict(side, "wait_complete", "prefetch_ttft_p50", "UNRESOLVED", 1.0423,
                       0.9876, 1.1012, 0.05)] * 2
    why = [f"timing {side} wait_complete prefetch_ttft_p50: UNRESOLVED",
           f"count difference not explained: {side} all_reduce@tp_cpu mem_cache/"
           "unified_radix_cache.py:_can_terminate_prefetch (+1.0 a poll)",
           f"hazard cell walk-skew is worse on {side}: OK -> deadlock"] if failing else []
    path = ("/home/someone/ci/results/review_of-a-pull-request-with-a-long-branch-name_"
            "2026-12-06T16:00:00Z/review.md")
    lines = closing_lines("bench review", why, timings, path)
    assert len(_widest(lines)) <= WIDTH, _widest(lines)
    assert lines[-1] == ("bench review: FAILED: 3 reasons above" if failing
                         else "bench review: OK") + " (the page above)"
    assert any(x.strip() == path for x in lines[-3:-1])  # whole, on a line of its own
    assert sum(x.startswith("bench review: why: ") for x in lines) == len(why)
    assert closing_lines("bench review", why, [], "r/review.md")[-1] == \
        ("bench review: FAILED: 3 reasons above" if failing else "bench review: OK") + \
        " -> r/review.md"
    short = closing_lines("bench review", ["the run FAILED (exit 1): r/run"], [], "r/review.md")
    assert short == ["bench review: FAILED: the run FAILED (exit 1): r/run -> r/review.md"]


def test_devchecks_summary_fits(tmp_path, monkeypatch):
    """gpu_check.sh's summary (bench devcheck summary) with both runs' figures, every step
    failed by its time limit and a long last line of the tests' log."""
    import json

    from bench import devcheck
    from tests.test_gpu_check import DEVCHECK, _work

    work = _work(tmp_path, dict.fromkeys(("setup", "tests", "devcheck", "tp1", "tp2"), 124))
    (work / "tests.log").write_text("= 12 passed, 30 skipped, 2 warnings, 1 error " * 4 + "=\n")
    bad = {**DEVCHECK, "load_back": {**DEVCHECK["load_back"], "consecutive_gbps": 1234.56,
                                     "scattered_bad_pages": 20, "consecutive_bad_pages": 20}}
    (work / "devcheck.json").write_text(json.dumps(bad))
    facts = {"decode_forward_ms": 1234.56, "prefill_ms": 12345.67, "load_back_gbps": 1234.5,
             "load_back_bytes": 300 << 20}
    monkeypatch.setattr(devcheck, "_run_facts", lambda run: facts)
    lines, ok = devcheck.summary_lines(work)
    assert len(_widest(lines)) <= WIDTH, _widest(lines)
    assert not ok and lines[-1] == "RESULT: FAILED" and "    bad pages 20/20" in "\n".join(lines)


def test_devchecks_measure_prints_its_figures_in_lines_that_fit(tmp_path, monkeypatch, capsys):
    """bench devcheck measure: its figures for people (the JSON goes to --out), on a CPU
    whose missing peak has a long reason."""
    import json

    from bench import devcheck
    from bench.commands.devcheck import main
    from tests.test_gpu_check import DEVCHECK

    result = {**DEVCHECK, "device": "cpu", "gpu": None, "h2d_peak_gbps": None,
              "h2d_reason": "no CUDA device: torch.cuda.is_available() is False " * 3}
    monkeypatch.setattr(devcheck, "measure", lambda device, model: result)
    out = tmp_path / "a-long-work-folder-name-as-gpu-check-makes-them" / "devcheck.json"
    out.parent.mkdir()
    assert main(["measure", "--device", "cpu", "--out", str(out)]) == 0
    lines = _fits(capsys.readouterr().out)
    assert lines[0].startswith("bench devcheck: measured on cpu") and \
        json.loads(out.read_text()) == result


def test_microbenchs_last_line_fits(tmp_path, capsys):
    """bench microbench: its last line (the markdown's verdict, the headline, the file),
    from a deep run directory."""
    import json

    from bench.commands.microbench import main
    from tests.test_microbench_report import data

    run = tmp_path / "a-long-results-folder-name-as-runs-make-them" / ("run-" + "x" * 60)
    run.mkdir(parents=True)
    (run / "microbench.json").write_text(json.dumps(data()))
    assert main([str(run), "--no-run"]) == 0
    lines = _fits(capsys.readouterr().out)
    assert lines[0].startswith("OK: 6 benchmarks; per-poll")


def test_help_projects_and_fidelitys_lines_fit(tmp_path, capsys):
    from bench.__main__ import main as bench_main
    from bench.commands.fidelity import main as fidelity_main
    from bench.commands.project import main as project_main
    from tests.test_fidelity import FREE, PINNED, _run
    from tests.test_project import make_run

    assert bench_main(["--help"]) == 0
    assert project_main([str(make_run(tmp_path / "run"))]) == 0
    free = _run(tmp_path, "free", FREE, "free")
    assert fidelity_main([str(_run(tmp_path, "pinned", PINNED, "pinned")), str(free)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(_widest(lines)) <= WIDTH, _widest(lines)
