"""bench report: summary.csv, plots and report.md rebuilt from a synthetic run directory."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.analysis.report import write_report
from bench.commands.report import main as main_report
from bench.rundir.env import collect_env
from bench.rundir.files import write_csv_atomic, write_json_atomic
from bench.rundir.schema import REQUEST_COLUMNS, STEP_COLUMNS, SUMMARY_COLUMNS
from hicache.spec.cost_model import Setting, expected_per_request

REPO = Path(__file__).resolve().parent.parent

PROTOCOLS = ("pr27010", "pr36425", "step-batched")
POLICIES = ("best_effort", "timeout")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONFIG = dict(preset="t", tp=2, pp=2, world_size=4, device="cpu", backend="gloo",
              storage="sim", seed=0, page_size=64, extra_pool=False, race_guard=True)


def request(rng, protocol, policy, rate, repeat, i):
    polls, hit_pages = int(rng.integers(0, 4)), int(rng.integers(1, 200))
    e = expected_per_request(Setting(protocol, policy, 2, 2), polls, hit_pages, True, True)
    return dict(CONFIG, protocol=protocol, policy=policy, rate_rps=rate, repeat=repeat,
                rid=f"{repeat}-{i}", arrival_s=i * 0.1, ttft_ms=float(rng.gamma(4, 25)) * rate,
                queue_ms=2.0, prefetch_io_ms=10.0, sched_lag_ms=5.0, sync_ms=1.0,
                load_back_ms=3.0, prefill_ms=40.0, polls=polls, decision_collectives=e.decision,
                completion_collectives=e.completion, hit_query_collectives=e.hit_query,
                ack_collectives=e.ack, pp_hops=e.pp_hops, terminated_by="ack",
                op_issued=True, io_issued=True, prefetch_requested_tokens=hit_pages * 64,
                hit_tokens=hit_pages * 64, prefetched_tokens=hit_pages * 64,
                ranks_agree=not (protocol == "pr36425" and policy == "timeout" and i == 0),
                data_ok=True)


def make_run(run_dir, rates=(2.0, 8.0)):
    rng = np.random.default_rng(0)
    rows = [request(rng, pro, pol, rate, rep, i) for rate in rates for rep in range(2)
            for pro in PROTOCOLS for pol in POLICIES for i in range(10)]
    steps = [dict(CONFIG, protocol=pro, policy=pol, rate_rps=rate, repeat=0, step=0, t_s=0.0,
                  waiting=1, polled=1, scheduled=1, request_broadcast=1, per_step_min=1,
                  model_allreduce=4, decision=0, completion=0, pp_hop=0, sync_ms=0.2)
             for rate in rates for pro in PROTOCOLS for pol in POLICIES]
    run_dir.mkdir()
    write_csv_atomic(run_dir / "requests.csv", rows, REQUEST_COLUMNS)
    write_csv_atomic(run_dir / "steps.csv", steps, STEP_COLUMNS)
    return run_dir


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("report") / "20261130T101500Z_sweep_abc1234")
    write_json_atomic(run / "env.json", collect_env("gloo", {"world_size": 4, "tp": 2, "pp": 2}))
    write_csv_atomic(run / "failures.csv", [dict(protocol="pr27010", policy="timeout", repeat=1,
                                                 error="rank 3 died | exit 9")],
                     ["protocol", "policy", "repeat", "error"])
    assert main_report([str(run)]) == 0
    return run, (run / "report.md").read_text()


def test_all_files_produced(sweep):
    run, _ = sweep
    for name in ("collectives_per_request.png", "ttft_cdf.png", "ttft_breakdown.png",
                 "ttft_vs_rate.png"):
        assert (run / name).read_bytes()[:8] == PNG_MAGIC, name
    summary = pd.read_csv(run / "summary.csv")
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert len(summary) == len(PROTOCOLS) * len(POLICIES) * 2  # two rates
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def test_report_contents(sweep):
    run, text = sweep
    assert text.startswith(f"# hicache-bench report: {run.name}")
    for protocol in PROTOCOLS:
        assert protocol in text
    for png in ("collectives_per_request.png", "ttft_cdf.png", "ttft_breakdown.png",
                "ttft_vs_rate.png"):
        assert f"]({png})" in text
    assert "global rank 0 (PP stage 0, TP rank 0)" in text and "ranks.csv" in text
    assert "linear interpolation" in text and "n = 20" in text
    assert "GPUs: none (" in text  # no GPU on the test machine: the reason is given
    assert "rate_rps" in text  # the sweep's rates are told apart in the table


def test_divergence_and_failures_listed(sweep):
    _, text = sweep
    section = text.split("## Divergence / failures", 1)[1]
    assert "pr36425 / timeout" in section and "ranks_agree False" in section
    assert "rank 3 died \\| exit 9" in section  # failures.csv, pipe escaped for markdown
    assert "FAILED: the run stopped: rank 3 died | exit 9" in text
    assert "(see Divergence / failures below)" in text


def test_single_rate_run_has_no_rate_plot(tmp_path):
    run = make_run(tmp_path / "one", rates=(4.0,))
    report = write_report(run, "nearest-rank")
    text = report.path.read_text()
    assert not (run / "ttft_vs_rate.png").exists()
    assert "env.json is missing" in text and "nearest rank" in text
    assert (run / "ttft_cdf.png").exists()


def test_without_plots_the_report_says_so_and_draws_none(tmp_path):
    """bench ab's block runs (BENCH_NO_PLOTS=1): the same summary, verdict and report, no
    PNG, and the report says how to draw them."""
    run = make_run(tmp_path / "bare", rates=(4.0,))
    report = write_report(run, plots=False)
    assert not list(run.glob("*.png")) and (run / "summary.csv").exists()
    assert "Not drawn: BENCH_NO_PLOTS=1" in report.path.read_text()
    drawn = write_report(run)
    assert (run / "ttft_cdf.png").exists() and drawn.summary.equals(report.summary)


def test_a_run_without_plots_never_imports_matplotlib(tmp_path):
    """The end of a `bench run` with BENCH_NO_PLOTS=1 (every bench ab block, every test's
    run) writes its report without importing matplotlib (about 0.6 s a process)."""
    run = make_run(tmp_path / "bare", rates=(4.0,))
    code = ("import sys; from bench.analysis.report import write_report; "
            f"write_report({str(run)!r}, plots=False); print('matplotlib' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_bad_input_exits_2(tmp_path, capsys):
    assert main_report([str(tmp_path / "missing")]) == 2
    assert main_report([str(tmp_path)]) == 2  # a directory without requests.csv
    (tmp_path / "requests.csv").write_text("protocol,policy\npr27010,timeout\n")
    assert main_report([str(tmp_path)]) == 2  # missing columns
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("bench report: ") for line in err)
