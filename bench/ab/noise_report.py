"""`bench noise`'s outputs: the terminal table, noise.json, noise.md, and the gate's
thresholds in gate.json, all from the same figures (bench.ab.noise)."""

from __future__ import annotations

import os
from pathlib import Path

from bench.ab import noise
from bench.report.printer import fit, fitted_table, markdown_table, say
from bench.rundir.files import read_json_object, write_json_atomic, write_text_atomic
from bench.rundir.rundir import RunDir, utc_time

HEADERS = ["metric", "coverage", "pairs", "half-width median", "half-width max",
           "run-to-run max", "repeats", "configs", ""]
METHOD = ("per headline metric, every run's 95% t interval over its paired repeats "
          "(summary.csv) against every other run's point, per configuration; the gate's "
          "threshold per gated metric is the largest half-width over the runs, rounded up "
          f"to {noise.THRESHOLD_STEP:g}, at least {noise.THRESHOLD_FLOOR:g}")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def rows(per_metric: dict[str, dict]) -> list[list[str]]:
    out = []
    for m, f in per_metric.items():
        flag = "" if f["coverage"] is None or f["coverage"] >= noise.TARGET else "LOW"
        out.append([m, _pct(f["coverage"]), str(f["trials"]), _pct(f["half_width_median"]),
                    _pct(f["half_width_max"]), _pct(f["run_to_run_max"]), str(f["repeats"]),
                    str(f["configs"]), flag])
    return out


def _fixed(table: list[list[str]]) -> str:
    """A table for a terminal: stacked in groups led by the metric when too wide."""
    return "\n".join(fitted_table(table[0], table[1:], keys=1))


def final_line(per_metric: dict[str, dict]) -> str:
    shown = [f"{m} {_pct(f['coverage'])}" for m, f in per_metric.items()]
    return (f"noise: coverage {', '.join(shown)} (honest: about {100 * noise.EXPECTED:.0f}%,"
            f" target {100 * noise.TARGET:.0f}%)")


def low_metrics(per_metric: dict[str, dict]) -> list[str]:
    return [m for m, f in per_metric.items()
            if f["coverage"] is not None and f["coverage"] < noise.TARGET]


def print_figures(per_metric: dict, boot: dict | None, written: list[Path],
                  schedule: list[str] = ()) -> int:
    """The tables, the files, the final line; 1 when a metric's coverage is below target
    or when pinned runs of one seed ran different schedules (`schedule`'s lines)."""
    say(_fixed([HEADERS, *rows(per_metric)]))
    if boot is not None:
        say("\ntwo-stage bootstrap (cross-check):")
        say(_fixed([HEADERS, *rows(boot)]))
    say(fit(f"wrote {', '.join(str(p) for p in written)}", final_line(per_metric),
            *(f"FAILED: {line}" for line in schedule[:3])))
    return 1 if low_metrics(per_metric) or schedule else 0


def _text(dirs: list[Path], per_metric: dict, boot: dict | None, load: dict) -> str:
    lines = ["# bench noise", "", f"Runs: {', '.join(d.name for d in dirs)}"
             + (f" (1-minute load average after each: {load})" if load else ""), "",
             f"Method: {METHOD}.", "", markdown_table(HEADERS, rows(per_metric)), "",
             f"**{final_line(per_metric)}**", ""]
    if boot is not None:
        lines += ["## Two-stage bootstrap (cross-check)", "",
                  markdown_table(HEADERS, rows(boot)), ""]
    return "\n".join(lines)


def write_outputs(out: Path, dirs: list[Path], runs: list[noise.Estimates], per_metric: dict,
                  boot: dict | None, load: dict) -> list[Path]:
    """noise.json (figures and every estimate) and noise.md into `out`."""
    data = {"runs": [str(d) for d in dirs], "per_metric": per_metric, "bootstrap": boot,
            "thresholds": noise.thresholds(per_metric), "method": METHOD,
            "load_avg_1m_after_run": load or None, "cpu_count": os.cpu_count(),
            "estimates": noise.per_config_table(runs, [d.name for d in dirs])}
    write_json_atomic(out / "noise.json", data)
    write_text_atomic(out / "noise.md", _text(dirs, per_metric, boot, load))
    return [out / "noise.json", out / "noise.md"]


def update_gate(baseline: Path, per_metric: dict, dirs: list[Path], load: dict) -> Path:
    """The derived thresholds (and what they came from) into baseline/gate.json, keeping
    its other keys."""
    path = RunDir(baseline).file("gate")
    old = read_json_object(path) if path.exists() else {}
    summary = {m: {k: f[k] for k in ("coverage", "half_width_median", "half_width_max",
                                     "run_to_run_max", "repeats")}
               for m, f in per_metric.items()}
    baseline.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {**old, "thresholds": noise.thresholds(per_metric),
                             "noise": summary, "noise_method": METHOD,
                             "noise_runs": [d.name for d in dirs],
                             "load_avg_1m_after_run": load or None,
                             "cpu_count": os.cpu_count(), "measured_at":
                             utc_time()})
    return path
