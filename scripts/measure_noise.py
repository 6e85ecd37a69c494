"""Usage: python scripts/measure_noise.py [--runs K] [--baseline results/baseline]
                                         [--from RUN_DIR ...] [--dry-run]

Measures the run-to-run noise of the CI preset's ratios vs pr27010 on this machine and derives
the perf gate's tolerances from it: `tolerance` from the TTFT p50 ratios, `quiet_tolerance`
from the mean step time and ITL p50 ratios (the quiet metrics). TTFT is taken per request
class (prefetching, bystander) where the runs have classes.

Runs `python -m bench run --preset ci` K times (default 4) back to back (or reads the runs
given with --from), and for every protocol other than pr27010 x policy collects each run's
pooled TTFT p50 ratio vs pr27010 and its per-repeat ratios (summary.csv). Figures, per
configuration and overall:
  run_to_run: max over runs of |ratio_run / median over runs - 1|
  per_repeat: max over runs and repeats of |ratio_repeat / ratio_run - 1|
Each tolerance is 2 x the largest run-to-run deviation of its metrics, rounded up to a
multiple of 0.05: the baseline run and a gated run may each sit that far from the median,
on opposite sides. Writes tolerance, quiet_tolerance, per-metric `tolerances` (which the
gate prefers), noise, method and runs into BASELINE/gate.json, keeping its other keys
(`bench gate --update-baseline` keeps them in turn). --dry-run prints instead of writing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.result_files import parse_list_cell, write_json_atomic  # noqa: E402
from bench.schema import REFERENCE_PROTOCOL  # noqa: E402

STEP = 0.05  # tolerance granularity
FACTOR = 2.0  # tolerance = FACTOR x the largest run-to-run deviation
METHOD = (f"K back-to-back `bench run --preset ci` runs; per protocol != {REFERENCE_PROTOCOL} "
          "x policy, run_to_run = max over runs of |pooled ratio / median over runs - 1|, "
          "per_repeat = max over runs and repeats of |repeat ratio / pooled ratio - 1|; "
          f"tolerance = {FACTOR:g} x max run_to_run of the TTFT p50 ratios (per request class "
          "where the runs have classes), quiet_tolerance "
          f"= {FACTOR:g} x max run_to_run of the mean step time and ITL p50 ratios, each "
          f"rounded up to {STEP:g}")


def run_ci(index: int) -> Path:
    """One CI-preset run into its own results directory; exits on a failed run."""
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                         capture_output=True).stdout.strip() or "nogit"
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = REPO / "results" / f"{stamp}_ci-noise{index}_{sha}"
    code = subprocess.run([sys.executable, "-m", "bench", "run", "--preset", "ci",
                           "--out", str(out)], cwd=REPO).returncode
    if code != 0:
        sys.exit(f"measure_noise: run {index} failed (exit {code}); see {out}")
    return out


# metric -> (pooled ratio column, per-repeat ratios column) in summary.csv
METRICS = {"ttft_p50": ("ttft_p50_ratio_vs_pr27010", "ttft_p50_ratio_per_repeat"),
           "step_mean": ("step_mean_ratio", "step_mean_ratio_per_repeat"),
           "itl_p50": ("itl_p50_ratio", "itl_p50_ratio_per_repeat"),
           "prefetch_ttft_p50": ("prefetch_ttft_p50_ratio", "prefetch_ttft_p50_ratio_per_repeat"),
           "bystander_ttft_p50": ("bystander_ttft_p50_ratio",
                                  "bystander_ttft_p50_ratio_per_repeat")}
QUIET = ("step_mean", "itl_p50")
TTFT = ("prefetch_ttft_p50", "bystander_ttft_p50")  # per class; pooled TTFT in older runs


def ratios(run_dir: Path, metric: str = "ttft_p50") -> dict[str, tuple[float, list[float]]]:
    """'protocol/policy' -> (pooled ratio, per-repeat ratios) from a run's summary.csv."""
    summary = pd.read_csv(run_dir / "summary.csv")
    pooled, per_repeat = METRICS[metric]
    out = {}
    for row in summary.to_dict("records"):
        if row["protocol"] == REFERENCE_PROTOCOL or pd.isna(row.get(pooled)):
            continue
        cell = row[per_repeat]
        reps = parse_list_cell(cell, "summary.csv", per_repeat)
        out[f"{row['protocol']}/{row['policy']}"] = (float(row[pooled]), reps)
    return out


def noise(per_run: list[dict[str, tuple[float, list[float]]]]) -> dict:
    """The figures of the docstring, per configuration and overall."""
    configs = sorted(set.intersection(*(set(r) for r in per_run)))
    table = {}
    for key in configs:
        pooled = [r[key][0] for r in per_run]
        med = statistics.median(pooled)
        table[key] = {
            "ratios": [round(p, 4) for p in pooled], "median": round(med, 4),
            "run_to_run": round(max(abs(p / med - 1) for p in pooled), 4),
            "per_repeat": round(max((abs(x / r[key][0] - 1) for r in per_run
                                     for x in r[key][1]), default=0.0), 4)}
    return {"configs": table,
            "max_run_to_run": max(v["run_to_run"] for v in table.values()),
            "max_per_repeat": max(v["per_repeat"] for v in table.values())}


def tolerance(max_run_to_run: float) -> float:
    steps = math.ceil(round(FACTOR * max_run_to_run / STEP, 9))
    return round(max(1, steps) * STEP, 2)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=4, help="CI-preset runs to make (K)")
    p.add_argument("--baseline", type=Path, default=REPO / "results" / "baseline")
    p.add_argument("--from", dest="runs_from", type=Path, nargs="+",
                   help="use these existing run directories instead of new runs")
    p.add_argument("--dry-run", action="store_true", help="print gate.json, write nothing")
    args = p.parse_args(argv)
    if (args.runs_from and len(args.runs_from) < 2) or (not args.runs_from and args.runs < 2):
        p.error("noise needs at least 2 runs")
    dirs, load = args.runs_from or [], {}
    for i in range(0 if args.runs_from else args.runs):
        dirs.append(run_ci(i))
        load[dirs[-1].name] = round(os.getloadavg()[0], 2)  # how shared the machine was
    per_class = [m for m in TTFT if ratios(dirs[0], m)]
    ttft = {m: noise([ratios(d, m) for d in dirs]) for m in per_class or ["ttft_p50"]}
    figures = {"per_metric": ttft,
               "max_run_to_run": max(f["max_run_to_run"] for f in ttft.values()),
               "max_per_repeat": max(f["max_per_repeat"] for f in ttft.values())}
    quiet = {m: noise([ratios(d, m) for d in dirs]) for m in QUIET}
    worst_quiet = max(q["max_run_to_run"] for q in quiet.values())
    per_metric = {m: tolerance(f["max_run_to_run"]) for m, f in {**ttft, **quiet}.items()}
    settings = {"tolerance": tolerance(figures["max_run_to_run"]),
                "quiet_tolerance": tolerance(worst_quiet), "tolerances": per_metric,
                "noise": figures,
                "quiet_noise": quiet,
                "method": METHOD, "runs": [d.name for d in dirs],
                "load_avg_1m_after_run": load or None, "cpu_count": os.cpu_count(),
                "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    gate_json = args.baseline / "gate.json"
    if args.dry_run:
        print(json.dumps(settings, indent=2))
        return 0
    old = json.loads(gate_json.read_text()) if gate_json.exists() else {}
    args.baseline.mkdir(parents=True, exist_ok=True)
    write_json_atomic(gate_json, {**old, **settings})
    print(f"TTFT: max run-to-run deviation {figures['max_run_to_run']:.3f}, max per-repeat "
          f"{figures['max_per_repeat']:.3f} over {len(dirs)} runs -> tolerance "
          f"{settings['tolerance']:g}; step time and ITL: max run-to-run {worst_quiet:.3f} -> "
          f"quiet_tolerance {settings['quiet_tolerance']:g}; per metric "
          f"{', '.join(f'{m} {t:g}' for m, t in per_metric.items())} ({gate_json})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
