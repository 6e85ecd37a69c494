"""Project the overhead model (docs/design.md section 8) to scales this machine cannot run:
the engine of `python -m bench project` (usage and method: bench.commands.project)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bench.analysis.overhead import hop_ms, scaled_allreduce_ms
from bench.analysis.provenance import provenance_lines
from bench.project.grid import (
    COLUMNS,
    MEASURED,
    PPS,
    QS,
    TPS,
    Assumptions,
    cost_classes,
    finite,
    grid_rows,
    measured_rows,
    members_text,
)
from bench.project.plot import plot_projection
from bench.report.printer import markdown_table
from bench.rundir.env import git_info
from bench.rundir.files import (
    ResultFileError,
    read_csv_checked,
    read_json_object,
    write_csv_atomic,
    write_text_atomic,
)
from bench.rundir.rundir import RunDir, utc_time
from hicache.spec.cost_model import POLICIES, PROTOCOLS, decision_per_poll

SUMMARY_NUMERIC = ["tp", "pp", "polls_per_step", "decode_step_p50_ms", *MEASURED]
SCALING_TEXT = {
    "ring": "ring: c(TP) = c x (TP - 1) / (TP0 - 1), since gloo's small-message ring "
            "all-reduce sends 2 (TP - 1) messages one after another",
    "log2": "log2: c(TP) = c x log2(TP) / log2(TP0), as a tree or recursive-doubling "
            "all-reduce would take",
}


def _positive_number(value: object) -> bool:
    return finite(value) and value > 0


def read_calibration(run_dir: Path) -> dict:
    """calibration.json, with its TP checked; ResultFileError when unusable."""
    path = RunDir(run_dir).file("calibration")
    if not path.is_file():
        raise ResultFileError(f"{path}: no such file (the run predates calibration)")
    calib = read_json_object(path)
    tp = calib.get("tp")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ResultFileError(f"{path}: expected an object with an integer tp >= 1")
    return calib


def _calibrated_c(calib: dict) -> tuple[float, str]:
    """The calibration's mean all-reduce (ms) and a sentence saying so."""
    stats = calib.get("allreduce")
    stats = stats if isinstance(stats, dict) else {}
    mean = stats.get("mean_ms")
    if not _positive_number(mean):
        raise ResultFileError(f"calibration.json: no positive allreduce mean_ms at TP "
                              f"{calib['tp']}; pass --latency-us")
    text = (f"c = {mean:.4g} ms, the mean of the run's {calib.get('n', 'unknown number of')} "
            f"calibration all-reduces over TP{calib['tp']} ({calib.get('group', 'tp_cpu')}; "
            "the mean, not the median, since a step pays the tail too)")
    low, high = stats.get("mean_ci_low_ms"), stats.get("mean_ci_high_ms")
    if finite(low) and finite(high):
        text += (f", 95% CI [{low:.4g}, {high:.4g}] ms; every projected time is proportional "
                 f"to c, so it moves by {low / mean - 1:+.0%} / {high / mean - 1:+.0%} within it")
    if finite(stats.get("p50_ms")) and finite(stats.get("p99_ms")):
        text += f" (p50 {stats['p50_ms']:.4g} ms, p99 {stats['p99_ms']:.4g} ms)"
    return float(mean), text + "."


def _hop(calib: dict, c_ms: float, tp0: int, scaling: str, given: bool) -> tuple[float, str]:
    """The PP hop: measured when the run measured it (and c is the run's), else half a
    2-rank all-reduce scaled from c."""
    measured = calib.get("pp_hop_ms")
    if not given and finite(measured):
        return float(measured), f"c_hop = {measured:.4g} ms, measured by the run."
    c2 = scaled_allreduce_ms(c_ms, tp0, 2, scaling)
    value = hop_ms(c2, 2, None)
    why = "--latency-us replaces the run's network" if given else "the run did not measure it"
    return value, (f"c_hop = {value:.4g} ms, half a 2-rank all-reduce (one message instead of "
                   f"a round trip; {why}), the same at every TP.")


def latency(calib: dict, latency_us: float | None) -> tuple[float, int, str]:
    """(c ms, the TP it is over, a sentence) from --latency-us or the calibration."""
    if latency_us is not None:
        tp0 = max(calib["tp"], 2)
        why = "the run has TP 1, so TP2 is assumed" if calib["tp"] == 1 else "the run's TP"
        return latency_us / 1e3, tp0, (f"c = {latency_us / 1e3:.4g} ms, given by --latency-us "
                                       f"{latency_us:g}: one small all-reduce over TP{tp0} "
                                       f"ranks ({why}).")
    if calib["tp"] == 1:
        raise ResultFileError("calibration.json: the run has TP 1, so it measured no "
                              "all-reduce (c = 0); pass --latency-us for a 2-rank all-reduce")
    c_ms, text = _calibrated_c(calib)
    return c_ms, calib["tp"], text


def read_summary(run_dir: Path) -> pd.DataFrame | None:
    """summary.csv's measured columns as numbers (missing columns empty); None when absent."""
    path = RunDir(run_dir).file("summary")
    if not path.exists():
        return None
    frame = read_csv_checked(path, ["protocol", "policy", "tp", "pp"])
    for col in SUMMARY_NUMERIC:
        raw = frame[col] if col in frame else pd.Series(np.nan, index=frame.index)
        values = pd.to_numeric(raw, errors="coerce")
        if (values.isna() & raw.notna()).any():
            raise ResultFileError(f"{path}: non-numeric values in column {col}")
        frame[col] = values
    if frame[["tp", "pp"]].isna().any().any():
        raise ResultFileError(f"{path}: empty cells in column tp or pp")
    return frame


def _pays_nothing(row: dict) -> bool:
    """The row's protocol issues no collective in the walk at its layout (pre27010 excluded:
    its completion MINs are collectives in the walk)."""
    if row["protocol"] not in PROTOCOLS or row["policy"] not in POLICIES or \
            row["protocol"] == "pre27010":
        return False
    return decision_per_poll(row["protocol"], row["policy"], int(row["tp"]),
                             int(row["pp"])) == (0, 0)


def base_step(summary: pd.DataFrame | None, given: float | None) -> tuple[float, str]:
    """The decode step without decision collectives (ms) and a sentence saying where from."""
    if given is not None:
        return given, f"base decode step = {given:g} ms, given by --base-step-ms."
    if summary is None:
        raise ResultFileError("no summary.csv, so no measured decode step: pass --base-step-ms")
    rows = [r for r in summary.to_dict("records")
            if _pays_nothing(r) and _positive_number(r["decode_step_p50_ms"])]
    if not rows:
        raise ResultFileError("summary.csv: no decode_step_p50_ms of a row without decision "
                              "collectives (step-clock, pr36425 wait_complete, ...): pass "
                              "--base-step-ms")
    value = float(np.median([r["decode_step_p50_ms"] for r in rows]))
    names = ", ".join(dict.fromkeys(f"{r['protocol']}/{r['policy']}" for r in rows))
    return value, (f"base decode step = {value:.4g} ms, the median of decode_step_p50_ms over "
                   f"the run's {len(rows)} rows that issue no decision collective ({names}).")


def assumptions(calib: dict, summary: pd.DataFrame | None, latency_us: float | None,
                scaling: str, base_step_ms: float | None) -> Assumptions:
    """The projection's inputs, each with the sentence that says where it came from."""
    c_ms, tp0, c_text = latency(calib, latency_us)
    hop, hop_text = _hop(calib, c_ms, tp0, scaling, latency_us is not None)
    base, base_text = base_step(summary, base_step_ms)
    return Assumptions(c_ms, tp0, hop, scaling, base, c_text, hop_text, base_text)


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def class_table(rows: list[dict], member: tuple[str, str]) -> list[str]:
    """Extra step ms (ITL inflation) of one protocol/policy, PP x TP down and Q across; a PP
    whose cells equal the first PP's is named in a sentence instead."""
    cells = {(r["pp"], r["tp"], r["polls_per_step"]): r for r in rows
             if r["source"] == "model" and (r["protocol"], r["policy"]) == member}
    blocks = {pp: [[f"{_ms(c['extra_step_ms'])} ({c['itl_inflation']:.2f}x)"
                    for c in (cells[(pp, tp, q)] for q in QS)] for tp in TPS] for pp in PPS}
    same = [pp for pp in PPS[1:] if blocks[pp] == blocks[PPS[0]]]
    body = [[str(pp), str(tp), *blocks[pp][i]] for pp in PPS if pp not in same
            for i, tp in enumerate(TPS)]
    table = markdown_table(["PP", "TP", *(f"Q={q}" for q in QS)], body)
    if not same:
        return [table]
    return [table, "", f"PP {', '.join(map(str, same))}: the same as PP {PPS[0]} (a poll "
                       "pays no PP hop)."]


def _cell(value: object, fmt: str = "{:.3g}") -> str:
    return fmt.format(value) if finite(value) else ""


def _interval(low: object, high: object) -> str:
    return f"[{_cell(low)}, {_cell(high)}]" if finite(low) or finite(high) else ""


def measured_lines(summary: pd.DataFrame | None, rows: list[dict], shown: int) -> list[str]:
    """The run's measured points beside the model at the same (TP, PP, polls per step)."""
    if summary is None:
        return ["The run has no summary.csv: no measured points."]
    points = [r for r in rows if r["source"] == "measured"]
    if not points:
        return ["summary.csv has no row of a protocol and policy the model knows: no "
                "measured points."]
    body = [[r["protocol"], r["policy"], str(r["tp"]), str(r["pp"]),
             _cell(r["polls_per_step"]), _cell(r["extra_step_ms"]),
             _cell(r["measured_extra_step_ms"]),
             _interval(r["measured_extra_step_ci_low_ms"],
                       r["measured_extra_step_ci_high_ms"])] for r in points]
    return [markdown_table(["protocol", "policy", "tp", "pp", "polls_per_step",
                            "predicted_extra_step_ms", "measured_extra_step_ms", "95% CI"],
                           body), "",
            f"The prediction uses this projection's c. {shown} of {len(points)} points are "
            "marked in the plot: it shows only the protocols that pay per poll, and its log "
            "axes cannot show a measurement <= 0 or an empty one."]


def render(run_dir: Path, env: dict | None, a: Assumptions, rows: list[dict],
           measured: list[str]) -> str:
    """projection.md's text."""
    paying = [k for k in cost_classes() if k.pays]
    free = [m for k in cost_classes() if not k.pays for m in k.members]
    code = git_info()
    tables = [line for k in paying for line in
              (f"### {k.label}", "", "Cells: extra scheduler time per step in ms (ITL "
               "inflation).", "", *class_table(rows, k.members[0]), "")]
    return "\n".join([
        f"# Projected decision-collective overhead: {run_dir.resolve().name}", "",
        "## Provenance", "", "The run:", "", *provenance_lines(env), "",
        f"Projected {utc_time()} by `bench "
        f"project`, code at commit {code.get('commit') or 'unknown'}"
        f"{' (dirty working tree)' if code.get('dirty') else ''}.", "",
        "## Assumptions", "", *assumption_lines(a), "",
        "## Projected extra scheduler time per step", "", *tables,
        f"{members_text(free)} issue no decision collective in a poll: their projected extra "
        "step time is 0 ms (ITL inflation 1.00x) at every TP, PP and Q.", "",
        "## This run's measured points", "", *measured, "",
        "## Files", "", "- projection.csv: one row (source `model`) per protocol x policy x "
        "TP x PP x Q, and one (source `measured`) per summary row of the run, the "
        "measurement beside the model.", "", "![predicted step overhead](projection.png)", "",
    ])


def assumption_lines(a: Assumptions) -> list[str]:
    """The projection's assumptions, in sentences."""
    return [
        "- Model (docs/design.md section 8): extra scheduler time per step = Q x (T x c(TP) + P x "
        "(PP - 1) x c_hop), where Q is the number of waiting requests with a pending "
        "prefetch the walk polls in one step, and T and P the TP all-reduces and PP hops one "
        "poll costs (hicache.spec.cost_model). The walk's collectives run on the CPU before the "
        "forward is launched, so they lengthen the whole step.",
        f"- {a.c_text}",
        f"- Scaling from TP{a.tp0} to other TP sizes, {SCALING_TEXT[a.scaling]}. This is an "
        "assumption, not a measurement; across nodes every message also pays the network, "
        "so measure c there and pass it with --latency-us.",
        f"- {a.hop_text}",
        f"- {a.base_text} It is held the same at every TP and PP, though a real forward "
        "depends on the model and layout (Llama-3-8B on one H100 about 7 ms, Llama-3.1-70B "
        "at TP4 about 22-25 ms; pass --base-step-ms for the deployment in question). ITL "
        "inflation = 1 + extra / base: every running request's inter-token latency, and "
        "every waiting request's scheduling lag, stretch by it.",
        "- Not projected: pre27010's completion MIN (one per prefetch a poll ends, not per "
        "poll), the hit-query and ack collectives (background threads, outside the step), "
        "and CPU contention.",
    ]


def _read_env(run_dir: Path) -> dict | None:
    return RunDir(run_dir).env(optional=True)


def project(run_dir: Path, latency_us: float | None, scaling: str,
            base_step_ms: float | None, out: Path | None) -> tuple[str, list[Path]]:
    """Write projection.csv, .png and .md; returns the markdown and the paths written."""
    if not run_dir.is_dir():
        raise ResultFileError(f"{run_dir}: no such directory")
    calib, summary, env = read_calibration(run_dir), read_summary(run_dir), _read_env(run_dir)
    a = assumptions(calib, summary, latency_us, scaling, base_step_ms)
    rows = grid_rows(a) + measured_rows([] if summary is None else summary.to_dict("records"),
                                        a)
    out = run_dir / "projection" if out is None else out
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "projection.csv", out / "projection.png", out / "projection.md"]
    write_csv_atomic(paths[0], rows, COLUMNS)
    shown = plot_projection(rows, [k for k in cost_classes() if k.pays], a, paths[1])
    text = render(run_dir, env, a, rows, measured_lines(summary, rows, shown))
    write_text_atomic(paths[2], text)
    return text, paths
