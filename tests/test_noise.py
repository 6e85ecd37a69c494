"""bench noise on made-up runs: coverage counted by hand, half-widths, run-to-run spread,
the gate's thresholds derived from them, and the command on existing run directories."""

import json
import math

import pytest

from bench.ab import noise
from bench.ab.noise import Estimate
from bench.commands.noise import main as main_noise
from bench.rundir.files import write_csv_atomic
from bench.rundir.schema import SUMMARY_COLUMNS


def est(point, half):
    return Estimate(point, point / (1 + half), point * (1 + half), half, 6)


def test_coverage_by_hand():
    # Run 0's interval [0.909, 1.1] holds run 1's 1.05 but not run 2's 1.2; run 1's
    # [0.955, 1.155] holds 1.0, not 1.2; run 2's [1.09, 1.32] holds neither: 2 of 6.
    runs = [{("p/w", "step_mean"): est(1.0, 0.1)}, {("p/w", "step_mean"): est(1.05, 0.1)},
            {("p/w", "step_mean"): est(1.2, 0.1)}]
    assert noise.coverage(runs, "step_mean") == (2, 6)
    f = noise.metric_figures(runs, "step_mean")
    assert f["coverage"] == pytest.approx(1 / 3) and f["half_width_max"] == pytest.approx(0.1)
    assert f["run_to_run_max"] == pytest.approx(1.2 / 1.05 - 1)
    # A run without an interval is no trial, but its point still counts against others.
    runs[2] = {("p/w", "step_mean"): Estimate(1.2, None, None, None, 2)}
    assert noise.coverage(runs, "step_mean") == (2, 4)


def test_thresholds_are_the_widest_half_width_rounded_up():
    per_metric = {"step_mean": {"half_width_max": 0.0231}, "itl_p50": {"half_width_max": 0.004},
                  "prefetch_ttft_p50": {"half_width_max": None}}
    assert noise.thresholds(per_metric) == {"step_mean": 0.03, "itl_p50": 0.02}


def summary_rows(shift):
    """pr27010 (the reference, skipped) and pr36425 rows with step ratio 0.8 x shift."""
    rows = []
    for protocol, point in (("pr27010", 1.0), ("pr36425", 0.8 * shift)):
        rows.append({c: None for c in SUMMARY_COLUMNS} | {
            "protocol": protocol, "policy": "wait_complete", "step_mean_ratio": point,
            "step_mean_ratio_ci_low": point / 1.05, "step_mean_ratio_ci_high": point * 1.05,
            "step_mean_ratio_mdd": 0.05, "step_mean_ratio_repeats": 6})
    return rows


def test_command_reads_runs_and_updates_the_gate(tmp_path, capsys):
    dirs = []
    for i, shift in enumerate((1.0, 1.01, 1.2)):
        d = tmp_path / f"run{i}"
        d.mkdir()
        write_csv_atomic(d / "summary.csv", summary_rows(shift), SUMMARY_COLUMNS)
        dirs.append(str(d))
    base = tmp_path / "baseline"
    base.mkdir()
    (base / "gate.json").write_text(json.dumps({"ab": {"revision": "x", "preset": "ci"}}))
    code = main_noise(["--from", *dirs, "--out", str(tmp_path / "out"), "--update-gate",
                       str(base)])
    out = capsys.readouterr().out
    assert code == 1  # run 2 lies outside both others' intervals: coverage 2 of 6
    assert out.strip().splitlines()[-1].startswith("noise: coverage step_mean 33.3%")
    settings = json.loads((base / "gate.json").read_text())
    assert settings["thresholds"] == {"step_mean": 0.05} and settings["ab"]["revision"] == "x"
    data = json.loads((tmp_path / "out" / "noise.json").read_text())
    assert data["per_metric"]["step_mean"]["trials"] == 6
    assert math.isclose(data["per_metric"]["step_mean"]["half_width_median"], 0.05)
    assert main_noise(["--from", dirs[0]]) == 2
