"""The CI gate on a synthetic, self-consistent run directory and on doctored copies of it."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from bench.analysis.summarize import summarize
from bench.commands.gate import main as main_gate
from bench.gate.evaluate import load_run
from bench.rundir.files import write_csv_atomic, write_json_atomic
from bench.rundir.schema import REQUEST_COLUMNS, STEP_COLUMNS, SUMMARY_COLUMNS
from hicache.spec.cost_model import POLICIES, Setting, expected_per_request

PROTOCOLS = ("pr27010", "pr36425", "step-clock")
CONFIG = dict(preset="ci", tp=2, pp=1, world_size=2, device="cpu", backend="gloo",
              storage="sim", rate_rps=8.0, seed=0, page_size=64, extra_pool=False,
              race_guard=True)
REPEATS, PER_CELL = 3, 12


def request_row(rng, protocol, policy, repeat, i):
    """One request whose collective counts are exactly what the cost model predicts."""
    hit_pages = int(rng.integers(0, 300)) if i % 4 else 0
    op, io = hit_pages > 0, hit_pages > 0 and i % 7 != 3
    polls = int(rng.integers(1, 6)) if io else 0
    e = expected_per_request(Setting(protocol, policy, 2, 1), polls, hit_pages, op, io)
    return dict(CONFIG, protocol=protocol, policy=policy, repeat=repeat, rid=f"r{repeat}-{i}",
                arrival_s=0.01 * i, ttft_ms=float(rng.lognormal(np.log(100), 0.2)),
                queue_ms=5.0, prefetch_io_ms=20.0, sched_lag_ms=3.0, sync_ms=1.0,
                load_back_ms=4.0, prefill_ms=30.0, polls=polls, decision_collectives=e.decision,
                completion_collectives=e.completion, hit_query_collectives=e.hit_query,
                ack_collectives=e.ack, pp_hops=e.pp_hops,
                terminated_by="poll" if polls else "none", op_issued=op, io_issued=io,
                prefetch_requested_tokens=hit_pages * 64, hit_tokens=hit_pages * 64,
                prefetched_tokens=hit_pages * 64 if io else 0, ranks_agree=True, data_ok=True)


def make_requests(seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame([request_row(rng, pro, pol, rep, i) for rep in range(REPEATS)
                         for pro in PROTOCOLS for pol in POLICIES for i in range(PER_CELL)],
                        columns=REQUEST_COLUMNS)


def make_steps():
    return pd.DataFrame([dict(CONFIG, protocol=pro, policy=pol, repeat=rep, step=s, t_s=s * 0.01,
                              waiting=2, polled=2, scheduled=1, request_broadcast=1,
                              per_step_min=1, model_allreduce=8, decision=0, completion=0,
                              pp_hop=0, sync_ms=0.5)
                         for rep in range(REPEATS) for pro in PROTOCOLS for pol in POLICIES
                         for s in range(4)], columns=STEP_COLUMNS)


def write_run(run_dir, requests, steps, with_summary=True):
    run_dir.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(run_dir / "requests.csv", requests.to_dict("records"), REQUEST_COLUMNS)
    write_csv_atomic(run_dir / "steps.csv", steps.to_dict("records"), STEP_COLUMNS)
    write_json_atomic(run_dir / "env.json", {"git": {"commit": "0" * 40, "dirty": False}})
    if with_summary:
        write_csv_atomic(run_dir / "summary.csv",
                         summarize(requests, steps).to_dict("records"), SUMMARY_COLUMNS)
    return run_dir


def gated_run(root):
    """A consistent run and a baseline made from it with --update-baseline."""
    run = write_run(root / "run", make_requests(), make_steps())
    assert main_gate([str(run), "--baseline", str(root / "baseline"), "--update-baseline"]) == 0
    return run, root / "baseline"


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return gated_run(tmp_path_factory.mktemp("gate"))


def doctored(clean, tmp_path, edit, with_summary=True):
    """A copy of the clean run with requests.csv edited by `edit(frame) -> frame`."""
    requests = edit(pd.read_csv(clean[0] / "requests.csv"))
    return write_run(tmp_path / "doctored", requests, make_steps(), with_summary)


def gate(run, baseline, *extra):
    return main_gate([str(run), "--baseline", str(baseline), *extra])


def test_clean_run_passes(clean, capsys):
    assert gate(*clean) == 0
    out = capsys.readouterr().out
    for check in ("decision_exact", "background_exact", "ranks_agree", "data_errors",
                  "per_poll_vs_baseline", "ttft_ratio_vs_baseline"):
        assert check in out
    assert "PASS" in out and out.strip().splitlines()[-1].startswith("OK: ttft PASS;")


def test_baseline_files_written(clean):
    baseline = clean[1]
    assert sorted(p.name for p in baseline.iterdir()) == ["env.json", "gate.json", "summary.csv"]
    settings = json.loads((baseline / "gate.json").read_text())
    # The run's commit becomes the revision `bench gate --ab` runs beside a gated tree.
    assert settings["ab"]["revision"] == "0" * 40 and settings["source_run"] == "run"
    assert len(pd.read_csv(baseline / "summary.csv")) == len(PROTOCOLS) * len(POLICIES)


def test_missing_summary_is_rebuilt(clean, tmp_path, capsys):
    """Without summary.csv the gate summarizes requests.csv and steps.csv itself: the same
    summary rows the run wrote, so the same checks with the same numbers."""
    run = doctored(clean, tmp_path, lambda f: f, with_summary=False)
    assert not (run / "summary.csv").exists()
    assert gate(run, clean[1]) == 0
    rebuilt_out = capsys.readouterr().out
    assert gate(*clean) == 0
    assert rebuilt_out.replace(str(run), "RUN") == capsys.readouterr().out.replace(
        str(clean[0]), "RUN")
    rebuilt = load_run(run).summary
    written = pd.read_csv(clean[0] / "summary.csv")
    assert len(rebuilt) == len(written) == len(PROTOCOLS) * len(POLICIES)
    numeric = [c for c in SUMMARY_COLUMNS if pd.api.types.is_numeric_dtype(written[c])
               and written[c].notna().any()]
    assert "step_collectives_per_step" in numeric  # steps.csv was read, not skipped
    pd.testing.assert_frame_equal(rebuilt[numeric].reset_index(drop=True),
                                  written[numeric], check_dtype=False)


def add_decision(frame):
    frame.loc[frame.protocol == "pr36425", "decision_collectives"] += 1
    return frame


def test_extra_decision_collective_fails(clean, tmp_path, capsys):
    assert gate(doctored(clean, tmp_path, add_decision), clean[1]) == 1
    out = capsys.readouterr().out
    failing = [line for line in out.splitlines() if line.startswith("decision_exact")]
    assert failing and all("pr36425" in line for line in failing)
    assert "a collective was added to the hot path" in out
    assert "per_poll_vs_baseline" in out  # more per poll than the baseline too
    assert out.strip().splitlines()[-1].startswith("FAILED")


def _drop_one_decision(frame, protocol="pr27010"):
    """One polled request of `protocol` lost a decision collective (a poll that skipped its
    agreement); returns the frame and that request's (rid, repeat)."""
    i = frame.index[(frame.protocol == protocol) & (frame.decision_collectives > 0)][0]
    frame.loc[i, "decision_collectives"] -= 1
    return frame, (frame.loc[i, "rid"], frame.loc[i, "repeat"])


@pytest.mark.parametrize("summary", ["rebuilt", "stale"])
def test_fewer_decision_collectives_are_diagnosed_per_request(clean, tmp_path, capsys,
                                                              summary):
    """Diagnosed by the per-request check, naming the request and what "fewer" means,
    whether summary.csv was rebuilt from the doctored requests or is the run's own."""
    if summary == "rebuilt":
        where = {}

        def edit(frame):
            frame, where["rid"] = _drop_one_decision(frame)
            return frame
        run = doctored(clean, tmp_path, edit)
        rid, repeat = where["rid"]
    else:
        run = tmp_path / "run"
        shutil.copytree(clean[0], run)
        frame, (rid, repeat) = _drop_one_decision(pd.read_csv(run / "requests.csv"))
        frame.to_csv(run / "requests.csv", index=False)
    assert gate(run, clean[1]) == 1
    out = capsys.readouterr().out
    failing = [line for line in out.splitlines() if line.startswith(("decision_exact",
                                                                     "summary_covers"))]
    assert len(failing) == 1, failing
    lines = out.splitlines()  # the check's line, its expected, observed, meaning below it
    below = lines[lines.index(failing[0]) + 1:]
    below = below[:next(i for i, x in enumerate(below) if not x.startswith(" "))]
    failing = [" ".join(" ".join([failing[0], *below]).split())]
    assert "pr27010" in failing[0] and f"(rid {rid}, repeat {repeat})" in failing[0]
    assert "1 requests off" in failing[0]
    assert "fewer decision collectives than the model: a poll skipped" in failing[0]
    assert "stale" not in out


def test_extra_ack_fails_background(clean, tmp_path, capsys):
    def add_ack(frame):
        frame.loc[(frame.protocol == "step-clock") & frame.io_issued, "ack_collectives"] += 1
        return frame
    assert gate(doctored(clean, tmp_path, add_ack), clean[1]) == 1
    assert "background_exact" in capsys.readouterr().out


def test_ranks_disagree_in_one_request_fails(clean, tmp_path, capsys):
    def disagree(frame):
        frame.loc[5, "ranks_agree"] = False
        return frame
    assert gate(doctored(clean, tmp_path, disagree), clean[1]) == 1
    out = capsys.readouterr().out
    assert "ranks_agree" in out and "False in 1 of" in out


def test_ranks_disagree_in_summary_row_fails(clean, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(clean[0], run)
    summary = pd.read_csv(run / "summary.csv")
    summary.loc[2, "ranks_agree"] = False
    summary.to_csv(run / "summary.csv", index=False)
    assert gate(run, clean[1]) == 1
    assert "ranks_agree" in capsys.readouterr().out


def test_data_error_fails(clean, tmp_path, capsys):
    def corrupt(frame):
        frame.loc[7, "data_ok"] = False
        return frame
    assert gate(doctored(clean, tmp_path, corrupt), clean[1]) == 1
    assert "data_errors" in capsys.readouterr().out


def triple_ttft(repeats):
    def edit(frame):
        frame.loc[(frame.protocol == "pr36425") & frame.repeat.isin(repeats), "ttft_ms"] *= 3
        return frame
    return edit


def test_slower_in_every_repeat_fails(clean, tmp_path, capsys):
    assert gate(doctored(clean, tmp_path, triple_ttft(range(REPEATS))), clean[1]) == 1
    out = capsys.readouterr().out
    assert "ttft_ratio_vs_baseline" in out and "got slower" in out
    assert "decision_exact" not in out  # only the soft check fails


def test_slower_in_one_repeat_is_undecided_never_passed(clean, tmp_path, capsys):
    """One repeat 3x slower, the others as before: the per-repeat ratios spread so widely
    that the interval holds 1 + threshold: undecided, never PASS. No disturbance measured (no
    ranks.csv): FAIL; the run's serves disturbed (ranks.csv cpu_lost above the limit):
    INCONCLUSIVE, exit 77. A gate.json that still carries the old excuse (unresolved_ok) is
    refused."""
    run = doctored(clean, tmp_path, triple_ttft([1]))
    assert gate(run, clean[1], "--tolerance", "0.05") == 1
    out = capsys.readouterr().out
    assert "undecided: its interval holds 1.05 (half-width " in out
    flat = " ".join(out.split())  # resolution lines wrap below their own
    assert "needed 37.4%, threshold 5.0%: FAIL" in flat, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("FAIL") and "ttft FAIL" in last and "PASS" not in last, last
    assert "cpu lost not measured" in last
    rows = [dict(CONFIG, protocol="pr36425", policy=p, repeat=0, rank=0, crosscheck_ok=True,
                 host_slots_unaccounted=0, cpu_lost=0.2) for p in POLICIES]
    write_csv_atomic(run / "ranks.csv", rows, list(rows[0]))
    assert gate(run, clean[1], "--tolerance", "0.05") == 77
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("INCONCLUSIVE") and "cpu lost 20.0% (noisy)" in last, last
    baseline = tmp_path / "baseline"
    shutil.copytree(clean[1], baseline)
    settings = json.loads((baseline / "gate.json").read_text())
    settings["unresolved_ok"] = {"ttft": "three synthetic repeats cannot resolve 5 %"}
    write_json_atomic(baseline / "gate.json", settings)
    assert gate(run, baseline, "--tolerance", "0.05") == 2
    err = capsys.readouterr().err
    assert "unresolved_ok is no longer read" in err and len(err.strip().splitlines()) == 1


def test_threshold_from_gate_json_and_flag(clean, tmp_path, capsys):
    baseline = tmp_path / "baseline"
    shutil.copytree(clean[1], baseline)
    write_json_atomic(baseline / "gate.json", {"thresholds": {"ttft": 5.0}})
    run = doctored(clean, tmp_path, triple_ttft(range(REPEATS)))
    assert gate(run, baseline) == 0  # 3x, below 1 + 5
    assert gate(run, baseline, "--tolerance", "0.25") == 1


@pytest.mark.parametrize("repeats", [1, 2])
def test_too_few_repeats_are_not_judged_and_not_a_pass(clean, tmp_path, capsys, repeats):
    def few(frame):
        frame = frame[frame.repeat < repeats]
        return triple_ttft(range(REPEATS))(frame)
    baseline = tmp_path / "baseline"
    run = doctored(clean, tmp_path, few)
    assert gate(run, baseline, "--update-baseline") == 0
    capsys.readouterr()
    assert gate(doctored(clean, tmp_path / "slow", triple_ttft(range(REPEATS))), baseline,
                "--tolerance", "0") == 0  # tripled TTFTs, yet nothing to judge them on
    out = capsys.readouterr().out
    why = f"too few repeats for an interval ({repeats} paired, needs 3)"
    assert f"not judged: {why}" in out
    row = next(x for x in out.splitlines() if x.startswith("ttft_ratio_vs_baseline"))
    assert row.split()[-1] != "PASS" and f"NOT JUDGED ({why})" in row
    assert not any(x.startswith("ttft_ratio_vs_baseline") and x.endswith("PASS")
                   for x in out.splitlines())
    last = out.strip().splitlines()[-1]
    assert last.startswith("OK: ttft NOT JUDGED") and why in last, last


def test_update_refused_when_hard_checks_fail(clean, tmp_path, capsys):
    baseline = tmp_path / "baseline"
    shutil.copytree(clean[1], baseline)
    before = (baseline / "summary.csv").read_bytes()
    assert gate(doctored(clean, tmp_path, add_decision), baseline, "--update-baseline") == 1
    assert (baseline / "summary.csv").read_bytes() == before
    assert "baseline NOT updated" in capsys.readouterr().out


def test_stale_summary_fails(clean, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(clean[0], run)
    summary = pd.read_csv(run / "summary.csv")
    summary[summary.protocol != "step-clock"].to_csv(run / "summary.csv", index=False)
    assert gate(run, clean[1]) == 1
    assert "summary_covers_requests" in capsys.readouterr().out


def test_update_copies_summary_and_env(clean):
    run, baseline = clean
    assert (baseline / "summary.csv").read_text() == (run / "summary.csv").read_text()
    assert (baseline / "env.json").read_text() == (run / "env.json").read_text()
    assert json.loads((baseline / "gate.json").read_text())["source_run"] == run.name


def test_self_checks_of_the_ranks_are_gated(clean, tmp_path, capsys):
    """ranks.csv's counter cross-check and host-slot check fail the gate (run_rules)."""
    run = tmp_path / "run"
    shutil.copytree(clean[0], run)
    rows = [dict(CONFIG, protocol="pr36425", policy="timeout", repeat=0, rank=r,
                 crosscheck_ok=True, host_slots_unaccounted=2 * r) for r in range(2)]
    write_csv_atomic(run / "ranks.csv", rows, list(rows[0]))
    capsys.readouterr()
    assert gate(run, clean[1]) == 1
    out = capsys.readouterr().out
    assert "host_slots" in out and "1 rank row(s) with leaked slots" in out
    rows[1]["host_slots_unaccounted"], rows[0]["crosscheck_ok"] = 0, False
    write_csv_atomic(run / "ranks.csv", rows, list(rows[0]))
    assert gate(run, clean[1]) == 1
    assert "counter_crosscheck" in capsys.readouterr().out


def _serves(digests: dict, schedule: str = "pinned") -> pd.DataFrame:
    return pd.DataFrame([{"protocol": p, "policy": "wait_complete", "rate_rps": 16.0,
                          "repeat": 0, "schedule": schedule, "schedule_digest": d,
                          "rid": f"{p}-r0"} for p, d in digests.items()])


def test_the_gate_holds_pinned_schedules_to_the_verdicts_rule():
    """The gate judges the pinned-schedule rule with the verdict's own words (one rule list,
    bench.verdict.run_rules.RULES): decide-alike protocols on different schedules fail."""
    from bench.gate.evaluate import _schedule_checks
    from bench.verdict.run_rules import RULES

    differ = _schedule_checks(_serves({"pr27010": "aa", "pr36425": "bb"}))
    assert [c.check for c in differ] == ["schedule_digests"] and not differ[0].passed
    assert differ[0].meaning == RULES["schedule_digests"]
    same = _schedule_checks(_serves({"pr27010": "aa", "pr36425": "aa"}))
    assert [c.passed for c in same] == [True]
    assert _schedule_checks(_serves({"pr27010": "aa", "pr36425": "bb"}, "free")) == []
