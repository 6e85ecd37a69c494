"""`bench run --workload trace`: its flags, refusals (one line, exit 2, nothing written), the
plan they build, and one short replay end to end on 2 ranks (the result files a user sets
beside a real engine's run)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from bench.analysis.serving_json import STATS
from bench.commands.run import build_plan, parser
from bench.commands.run import main as main_run
from bench.run.plan import TRACE_EXCERPT
from bench.run.trace import TraceSpec


def _trace(tmp_path, rows) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _row(ts, ids, n_in=None, n_out=3):
    n_in = n_in or 512 * len(ids)
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


BAD = [
    (["--workload", "trace", "--rate", "4"], "--rate sets the synthetic workload"),
    (["--preset", "trace", "--requests", "4"], "--requests sets the synthetic workload"),
    (["--time-scale", "2"], "--time-scale needs --workload trace"),
    (["--preset", "trace", "--time-scale", "0"], "--time-scale values must be finite and > 0"),
    (["--preset", "trace", "--time-scale", "fast"], "--time-scale takes numbers"),
    (["--preset", "trace", "--trace-skip", "-1"], "--trace-skip must be >= 0"),
    (["--preset", "trace", "--trace-requests", "0"], "--trace-requests must be >= 1"),
    (["--preset", "trace", "--trace-skip", "399", "--trace-requests", "5"], "fewer than"),
    (["--unbounded-pools"], "--unbounded-pools needs --workload trace"),
    (["--preset", "trace", "--write-policy", "none", "--unbounded-pools"],
     "--unbounded-pools needs a write policy"),
    (["--preset", "trace", "--page-size", "0"], "--page-size must be >= 1"),
]


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_trace_option_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    out = tmp_path / "run"
    assert main_run([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_bad_trace_file_names_its_line(capsys, tmp_path):
    path = _trace(tmp_path, [_row(0, [0]), _row(10, [0, 1], n_in=100)])
    assert main_run(["--trace", path, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{path}: line 2: 2 hash_ids do not fit input_length 100" in err and "\n" not in err


def test_trace_preset_plan():
    plan = build_plan(parser().parse_args(["--preset", "trace"]))
    base = TraceSpec(str(TRACE_EXCERPT), 300, 32).base_rate_rps()
    assert plan.trace == TraceSpec(str(TRACE_EXCERPT), 300, 32)
    assert plan.rates == (2 * base,) and plan.time_scale(plan.cells()[0]) == 2.0
    assert dict(plan.system)["write_policy"] == "write_through"
    # 2 protocols x 2 policies x 3 repeats: the fewest repeats an interval needs.
    assert len(plan.cells()) == 12 and plan.repeats == 3 and plan.threads_per_rank == 5
    sweep = build_plan(parser().parse_args(["--preset", "trace", "--time-scale", "1,2,4,8"]))
    assert [r / base for r in sweep.rates] == pytest.approx([1, 2, 4, 8])
    preset = build_plan(parser().parse_args(["--preset", "trace-sweep"]))
    assert preset.trace == TraceSpec(str(TRACE_EXCERPT), 300, 40) and len(preset.cells()) == 24


def test_synthetic_presets_keep_the_write_path_off():
    for preset in ("default", "queue", "ci", "sweep", "pp", "race"):
        plan = build_plan(parser().parse_args(["--preset", preset]))
        assert plan.trace is None and "write_policy" not in dict(plan.system)
        assert plan.threads_per_rank == 4


def test_unbounded_pools_hold_the_whole_replay(tmp_path):
    path = _trace(tmp_path, [_row(i * 100, [0, i + 1]) for i in range(4)])
    plan = build_plan(parser().parse_args(["--trace", path, "--trace-skip", "1",
                                           "--unbounded-pools"]))
    system = dict(plan.system)
    assert system["unbounded_pools"] and system["device_pool_pages"] == 3 * (1024 // 64 + 1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_short_replay_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BENCH_NO_PLOTS", "0")  # a real run's plots, drawn (tests/conftest.py)
    # Two conversations; each next turn extends the last one's blocks. Short answers.
    rows = [_row(0, [0, 1]), _row(200, [0, 2]), _row(400, [0, 1, 3]), _row(600, [0, 2, 4]),
            _row(800, [0, 1, 3, 5], n_in=1800), _row(1000, [0, 2, 4, 6], n_in=1900)]
    out = tmp_path / "run"
    argv = ["--trace", _trace(tmp_path, rows), "--trace-skip", "2", "--time-scale", "2,4",
            "--protocols", "pr36425", "--policies", "wait_complete", "--repeats", "1",
            "--gpu", "none", "--out", str(out)]
    assert main_run(argv) == 0, capsys.readouterr().err
    req = pd.read_csv(out / "requests.csv")
    assert set(req["rid"]) == {f"t{i:05d}" for i in range(3, 7)}
    assert (req[["device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                 "computed_tokens"]].sum(axis=1) == req["prompt_tokens"]).all()
    reused = req["device_hit_tokens"] + req["host_hit_tokens"] + req["storage_hit_tokens"]
    assert (reused <= req["reuse_bound_tokens"]).all() and reused.sum() > 0
    summary = pd.read_csv(out / "summary.csv")
    assert summary["reuse_bound_ratio"].notna().all() and len(summary) == 2
    lines = (out / "bench_serving_pr36425_wait_complete.jsonl").read_text().splitlines()
    results = [json.loads(x) for x in lines]
    assert [r["time_scale"] for r in results] == [2.0, 4.0]
    for r in results:
        assert r["completed"] == 4 and r["total_output_tokens"] == 12
        assert math.isclose(r["request_throughput"], 4 / r["duration"])
        for name in ("ttft", "itl", "tpot", "e2e_latency"):
            assert all(r[f"{s}_{name}_ms"] is not None for s in STATS)
    assert (out / "load_sweep.png").exists() and "## Cache tiers" in \
        (out / "report.md").read_text()
