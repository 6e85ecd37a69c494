"""The gate's step time and ITL p50 checks (ratios to pr27010 against the baseline's, paired
by repeat) on a synthetic serving run: a slowdown of every step in every repeat fails, one
noisy repeat is UNRESOLVED (its interval is wider than the threshold), not PASS."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from bench.rundir.schema import STEP_COLUMNS
from hicache.spec.cost_model import POLICIES
from tests.test_gate import CONFIG, PROTOCOLS, REPEATS, gate, make_requests, write_run


def serving_steps(slow=lambda protocol, repeat: 1.0):
    """Decode steps of 10 ms (pr27010 pays 5 ms more), scaled by slow(protocol, repeat)."""
    rng = np.random.default_rng(1)
    rows = []
    for rep in range(REPEATS):
        for pro in PROTOCOLS:
            for pol in POLICIES:
                for s in range(40):
                    ms = (15.0 if pro == "pr27010" else 10.0) * slow(pro, rep)
                    ms *= float(rng.normal(1, 0.01))
                    rows.append(dict(CONFIG, protocol=pro, policy=pol, repeat=rep, step=s,
                                     t_s=s * 0.01, kind="decode", step_ms=ms, forward_ms=8.0,
                                     waiting=2, prefetching=1, polled=1, scheduled=0,
                                     running=4, prefill_tokens=0, context_tokens=4000,
                                     request_broadcast=1, per_step_min=1, model_allreduce=2,
                                     decision=0, completion=0, pp_hop=0, sync_ms=0.5,
                                     decision_sync_ms=0.0))
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def serving_requests(slow=lambda protocol, repeat: 1.0):
    frame = make_requests()
    gaps = [";".join(f"{(15.0 if p == 'pr27010' else 10.0) * slow(p, r):.3f}"
                     for _ in range(4)) for p, r in zip(frame.protocol, frame.repeat,
                                                        strict=True)]
    return frame.assign(itl_ms=gaps, request_class="prefetch")


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    root = tmp_path_factory.mktemp("quiet")
    run = write_run(root / "run", serving_requests(), serving_steps())
    assert gate(run, root / "baseline", "--update-baseline") == 0
    return run, root / "baseline"


def test_clean_serving_run_passes_quiet_checks(serving, capsys):
    assert gate(*serving) == 0
    out = capsys.readouterr().out
    assert "step_mean_ratio_vs_baseline" in out and "itl_p50_ratio_vs_baseline" in out


def test_every_step_slower_in_every_repeat_fails(serving, tmp_path, capsys):
    def slow(protocol, repeat):  # pr36425 got 30% slower per step: its ratio 0.67 -> 0.87
        return 1.3 if protocol == "pr36425" else 1.0
    run = write_run(tmp_path / "slow", serving_requests(slow), serving_steps(slow))
    assert gate(run, serving[1]) == 1
    out = capsys.readouterr().out
    failing = [line for line in out.splitlines() if "ratio_vs_baseline" in line]
    assert any(line.startswith("step_mean_ratio_vs_baseline") and "pr36425" in line
               for line in failing)
    assert any(line.startswith("itl_p50_ratio_vs_baseline") for line in failing)
    assert "mean step time grew beyond 1.05x the baseline's" in out


def test_one_slow_repeat_is_undecided_not_passed(serving, tmp_path, capsys):
    """One repeat's steps 1.3x slower: no interval above 1 + threshold, but the step
    interval holds 1 + threshold: undecided, which never reads PASS, and with no disturbance
    measured fails the gate (FAIL, not INCONCLUSIVE)."""
    def slow(protocol, repeat):
        return 1.3 if protocol == "pr36425" and repeat == 0 else 1.0
    run = write_run(tmp_path / "noisy", serving_requests(slow), serving_steps(slow))
    assert gate(run, serving[1]) == 1
    out = capsys.readouterr().out
    step = [x for x in out.splitlines() if x.startswith("step_mean_ratio_vs_baseline")]
    assert step and all(x.endswith("FAIL") and "pr36425" in x for x in step), out
    assert "got slower" not in out  # not judged slower: its interval is not above 1.05
    flat = " ".join(out.split())  # resolution lines wrap below their own
    assert "resolution: step_mean_ratio_vs_baseline pr36425/" in flat, out
    assert flat.count("threshold 5.0%: FAIL") >= len(step), out
    last = out.strip().splitlines()[-1]
    assert last.startswith("FAIL") and "step_mean FAIL" in last and "(needed " in out, last


def test_thresholds_come_from_gate_json(serving, tmp_path, capsys):
    def slow(protocol, repeat):
        return 1.3 if protocol == "pr36425" else 1.0
    run = write_run(tmp_path / "slow2", serving_requests(slow), serving_steps(slow))
    base = tmp_path / "lenient"
    shutil.copytree(serving[1], base)
    settings = json.loads((base / "gate.json").read_text())
    lenient = {"step_mean": 0.5, "itl_p50": 0.5}
    (base / "gate.json").write_text(json.dumps({**settings, "thresholds": lenient}))
    assert gate(run, base) == 0
    (base / "gate.json").write_text(json.dumps({**settings, "thresholds": {"itl_p50": -1}}))
    assert gate(run, base) == 2
