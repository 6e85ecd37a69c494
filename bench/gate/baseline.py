"""The gate's committed baseline (results/baseline): its summary and gate.json settings,
read and checked; a run's row looked up in it; updating it; and whether a run may be gated
against it at all."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from bench.ab import RUN_SIZES
from bench.run.plan import plan_differences
from bench.rundir.files import (
    ResultFileError,
    numeric_columns,
    read_csv_checked,
    read_json_object,
    write_csv_atomic,
    write_json_atomic,
    write_text_atomic,
)
from bench.rundir.rundir import RunDir
from bench.rundir.schema import SUMMARY_COLUMNS

BASELINE_KEY = ["protocol", "policy", "tp", "pp"]
BASELINE_NUMERIC = ["tp", "pp", "decision_collectives_per_poll", "ttft_p50_ratio_vs_pr27010"]


def check_comparable(run_env: dict, baseline_dir: Path) -> None:
    """Refuse (ResultFileError, one line) a run whose plan is not the baseline's: its timing
    ratios and tolerances were measured for that plan only."""
    path = RunDir(baseline_dir).file("env")
    if not path.exists() or "plan" not in run_env:
        return  # a run or baseline from before plans were recorded: nothing to compare
    diffs = plan_differences(run_env["plan"], read_json_object(path).get("plan"), "vs")
    if diffs:
        more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise ResultFileError(f"refused: the run's plan differs from the baseline's "
                              f"({path}): {'; '.join(diffs[:3])}{more}")


def check_tolerance(value: object, where: str) -> float:
    """A finite tolerance >= 0, else ResultFileError naming where it came from."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise ResultFileError(f"{where}: tolerance must be a finite number >= 0, got {value!r}")
    return float(value)


def load_baseline(baseline_dir: Path) -> tuple[pd.DataFrame, dict]:
    """The baseline's summary (checked) and its gate.json settings ({} when absent)."""
    path = RunDir(baseline_dir).file("summary")
    if not path.exists():
        raise ResultFileError(f"{path}: no baseline (create one with --update-baseline)")
    summary = read_csv_checked(path, BASELINE_KEY + BASELINE_NUMERIC[2:])
    if summary.empty:
        raise ResultFileError(f"{path}: baseline has no rows")
    summary = numeric_columns(summary, BASELINE_NUMERIC, path, ["tp", "pp"])
    return summary, read_settings(baseline_dir)


def baseline_value(baseline: pd.DataFrame, row: dict, column: str) -> float:
    """The baseline's most lenient finite `column` for the row's (protocol, policy, tp, pp);
    NaN when the baseline has no such row or column."""
    if column not in baseline:
        return math.nan
    match = baseline
    for k in BASELINE_KEY:
        match = match[match[k] == row[k]]
    values = pd.to_numeric(match[column], errors="coerce").dropna()
    return float(values.max()) if len(values) else math.nan


def baseline_match(baseline: pd.DataFrame, row: dict) -> dict | None:
    """The baseline's row for the row's (protocol, policy, tp, pp); None when it has none."""
    match = baseline
    for k in BASELINE_KEY:
        if k not in match:
            return None
        match = match[match[k].astype(str) == str(row[k])]
    return match.iloc[0].to_dict() if len(match) else None


def _positive_int(value: object, where: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ResultFileError(f"{where}: must be an integer >= {least}, got {value!r}")
    return value



def check_ab(ab: object, where: str) -> dict:
    """gate.json's `ab`: how `bench gate --ab` runs the baseline revision beside this tree."""
    if not isinstance(ab, dict):
        raise ResultFileError(f"{where}: ab must be an object")
    for key in ("revision", "preset"):
        if not isinstance(ab.get(key), str) or not ab[key]:
            raise ResultFileError(f"{where}: ab.{key} must be a non-empty string")
    for key in ("protocols", "policies"):
        if key in ab and not isinstance(ab[key], str):
            raise ResultFileError(f"{where}: ab.{key} must be a comma list")
    if ab.get("schedule") not in (None, "free", "pinned"):
        raise ResultFileError(f"{where}: ab.schedule must be free or pinned, got "
                              f"{ab['schedule']!r}")
    for key in ("repeats", "budget_repeats"):
        _positive_int(ab.get(key, 1), f"{where} (ab.{key})")
    if not isinstance(ab.get("budget_s", 1), int | float) or ab.get("budget_s", 1) <= 0:
        raise ResultFileError(f"{where}: ab.budget_s must be a number of seconds > 0")
    for key, least in RUN_SIZES.items():  # ab.requests / ab.bystanders size both sides
        if key in ab:
            _positive_int(ab[key], f"{where} (ab.{key})", least)
    return ab


def read_settings(baseline_dir: Path) -> dict:
    """The baseline's gate.json ({} when absent), its thresholds and ab settings checked."""
    gate_json = RunDir(baseline_dir).file("gate")
    if not gate_json.exists():
        return {}
    settings = read_json_object(gate_json)
    per_metric = settings.get("thresholds", {})
    if not isinstance(per_metric, dict):
        raise ResultFileError(f"{gate_json}: thresholds must be an object")
    for key, value in per_metric.items():
        check_tolerance(value, f"{gate_json} (thresholds.{key})")
    if "ab" in settings:
        check_ab(settings["ab"], str(gate_json))
    if "unresolved_ok" in settings:
        raise ResultFileError(f"{gate_json}: unresolved_ok is no longer read: an undecided "
                              "timing check fails on a quiet machine and is INCONCLUSIVE on a "
                              "disturbed one (docs/gate-ci.md); remove the key")
    return settings


# What `bench gate --ab` runs when gate.json names no other: make bench's burst of 24 on the
# pinned schedule (about 10 waiting requests polled per step, so a slower poll shows: the
# gate checks host cost, not the end-to-end effect) under pr36425, the protocol SGLang ships,
# and wait_complete, both revisions as sides of one run (bench.ab.served): each cell served
# by A and B back to back; a first stage of `repeats`, more while a check is undecided, up to
# `budget_repeats` and `budget_s` (bench.ab.sequential). One configuration, not pr27010 too:
# pr27010's serves take 1.6x as long and half their step is gloo's all-reduce wait, so a
# pair of both bought 2.5x fewer pairs in the budget for no check the counts lack
# (docs/results/2026-12-07_gate_one_config_a13e348.md).
BLOCKS_KEYS = ("blocks", "repeats_per_block")  # an older design's, dropped on --update-baseline
DEFAULT_AB = {"design": "served", "preset": "default", "schedule": "pinned",
              "protocols": "pr36425", "policies": "wait_complete", "repeats": 12,
              "budget_repeats": 80, "budget_s": 420}


def update_baseline(run_dir: Path, baseline_dir: Path, summary: pd.DataFrame,
                    settings: dict, env: dict) -> str:
    """Write the run's summary and env.json, and gate.json (the run's commit becomes the
    revision `--ab` runs beside a gated tree), into the baseline directory; says what."""
    env_path = RunDir(run_dir).file("env")
    try:
        env_text = env_path.read_text()
        json.loads(env_text)
    except (OSError, ValueError) as e:
        raise ResultFileError(f"{env_path}: a baseline needs the run's env.json ({e})") from e
    git = env.get("git") or {}
    if not git.get("commit"):
        raise ResultFileError(f"{env_path}: no git commit: the baseline needs a revision")
    baseline_dir.mkdir(parents=True, exist_ok=True)
    # Each file is replaced atomically; all inputs were read and checked before the first.
    run, base = RunDir(run_dir), RunDir(baseline_dir)
    if run.has("summary"):  # a byte-for-byte copy of what was gated
        write_text_atomic(base.file("summary"), run.file("summary").read_text())
    else:
        write_csv_atomic(base.file("summary"), summary.to_dict("records"),
                         [c for c in SUMMARY_COLUMNS if c in summary.columns])
    write_text_atomic(base.file("env"), env_text)
    # the gate serves both revisions as sides: an older blocks design is not carried over
    ab = {k: v for k, v in {**DEFAULT_AB, **settings.get("ab", {})}.items()
          if k not in BLOCKS_KEYS} | {"design": "served", "revision": git["commit"]}
    write_json_atomic(base.file("gate"),
                      {**settings, "ab": ab, "source_run": run_dir.resolve().name})
    dirty = (" (its tree was dirty: the revision is its commit, not what ran; commit first)"
             if git.get("dirty") else "")
    return f"baseline updated: {baseline_dir}, revision {git['commit'][:10]}{dirty}"
